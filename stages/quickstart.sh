#!/usr/bin/env bash
# The zsearch demo: index the bundled corpus (BM25 + dense), serve it over HTTP, search it,
# evaluate the embedded smollm2 model on the bundled test split (agent and rag), and run a
# small RL job that visibly learns (the learning test's toy search task on a tiny model).
# Every path is a variable; override any of them from the environment.
set -euo pipefail

OUT=${OUT:-runs/demo}
INDEX=${INDEX:-$OUT/index}
PORT=${PORT:-8765}
MODEL=${MODEL:-smollm2}
EVAL_LIMIT=${EVAL_LIMIT:-16}
TURN_TOKENS=${TURN_TOKENS:-128}

echo "== 1. index the bundled corpus (BM25 + dense MiniLM)"
zsearch index --out "$INDEX" --kind bm25,dense

echo "== 2. search it (in-process, hybrid)"
zsearch search "Which river flows through Vienna?" --index "$INDEX" --topk 3

echo "== 3. serve it on 127.0.0.1:$PORT and query /retrieve"
zsearch serve --index "$INDEX" --port "$PORT" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true' EXIT
python - "$PORT" <<'PY'
import sys, time
from zsearch_cli.retrieval.client import RetrievalClient
client = RetrievalClient(f"http://127.0.0.1:{sys.argv[1]}", retries=20, backoff=0.25)
client.health()
for query, hits in zip(["who discovered polonium", "tallest mountain in the world"],
                       client.retrieve(["who discovered polonium", "tallest mountain in the world"], 2)):
    print(f"  {query!r}:")
    for h in hits:
        print(f"    {h.score:6.2f}  {h.title}: {h.text[:70]}...")
PY

echo "== 4. evaluate $MODEL on the bundled test split (first $EVAL_LIMIT questions)"
for METHOD in rag agent; do
  zsearch eval --model "$MODEL" --method "$METHOD" --search "http://127.0.0.1:$PORT" \
    --datasets demo --limit "$EVAL_LIMIT" --max-turn-tokens "$TURN_TOKENS" --out "$OUT/eval"
done
echo "== 4b. what the agent did: two of its trajectories, turn by turn"
zsearch show "$OUT/eval/demo/agent.examples.parquet" --limit 2
echo "== 5. RL that learns: GRPO on a tiny 2-layer model, toy search-dependent task (not smollm2)"
echo "   Task: 'item N code?' -> the only way to know the code word is the search result; a"
echo "   constant answer scores 0.25. 200 SFT steps of format warm-up, then 60 GRPO steps."
echo "   (tests/test_learning.py; prints the mean reward of the first 5 and last 5 steps)"
echo "   Note: smollm2 without a format warm-up never writes <answer> tags, hence the zeros above;"
echo "   see README 'What smollm2 scores' and stages/dspo.sh for a real DSPO run."
python -m pytest "$(dirname "$0")/../tests/test_learning.py" -k grpo -s -q -p no:cacheprovider
echo "== done: eval results in $OUT/eval (per-example Parquet, summaries, em.png)"
