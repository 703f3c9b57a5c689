#!/usr/bin/env bash
# The zsearch demo (`make demo`, <= 10 min on 2 idle cores): index the bundled corpus (BM25 +
# dense), serve it over HTTP and search it; evaluate the base smollm2 and the shipped
# format-warmed smollm2 (`--model smollm2-warm`, from stages/warmup.sh) side by side as search
# agents on the bundled test split; run RL that visibly learns (GRPO on the toy search task,
# a tiny model) and plot its reward curve; show one correct and one wrong trajectory of the
# warmed agent. Every path is a variable; override any of them from the environment.
set -euo pipefail

OUT=${OUT:-runs/demo}
INDEX=${INDEX:-$OUT/index}
PORT=${PORT:-8765}
EVAL_LIMIT=${EVAL_LIMIT:-}   # empty: the whole bundled test split (72 questions)
TURN_TOKENS=${TURN_TOKENS:-128}
# Torch on at most 2 threads: more only adds contention on the 2-core machines this targets.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

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

echo "== 4. the base smollm2 and the warmed agent (smollm2-warm) side by side:"
LIMIT_OPTS=()
if [ -n "$EVAL_LIMIT" ]; then LIMIT_OPTS=(--limit "$EVAL_LIMIT"); fi
echo "   agent method (search, read, answer) on ${EVAL_LIMIT:-all 72} questions of the bundled test split"
echo "   (held out: none is in the train split the warm-up used), $TURN_TOKENS tokens per turn"
for MODEL in smollm2 smollm2-warm; do
  zsearch eval --model "$MODEL" --method agent --search "http://127.0.0.1:$PORT" \
    --datasets demo "${LIMIT_OPTS[@]}" --max-turn-tokens "$TURN_TOKENS" --out "$OUT/eval/$MODEL"
done
python - "$OUT/eval" <<'PY'
import sys
from pathlib import Path
import pyarrow.parquet as pq
print(f"  {'model':<14}{'n':>4}{'EM':>8}{'F1':>8}{'subEM':>8}{'answered':>10}{'searches':>10}")
for model in ("smollm2", "smollm2-warm"):
    s = pq.read_table(Path(sys.argv[1]) / model / "demo" / "agent.summary.parquet").to_pylist()[0]
    print(f"  {model:<14}{s['n']:>4}{s['em']:>8.3f}{s['f1']:>8.3f}{s['subem']:>8.3f}{s['answered']:>10.2f}{s['avg_searches']:>10.2f}")
print("  smollm2 answers in prose, never in <answer> tags, so it scores 0 (docs/methods.md §1);")
print("  smollm2-warm is smollm2 + a 30-step LoRA format warm-up (stages/warmup.sh), no RL.")
PY

echo "== 5. RL that learns: GRPO on the toy search task, a tiny 2-layer model (not smollm2)"
echo "   (python -m zsearch_cli.train.toy; tests/test_learning.py runs the same code): 200 SFT"
echo "   steps of format warm-up, then 60 GRPO steps; the code word is only in the search result."
python -m zsearch_cli.train.toy --algo grpo --out "$OUT/rl"
zsearch plot "$OUT/rl/grpo" --out "$OUT/rl/reward.png" \
  --title "GRPO, tiny 2-layer model, toy search task (item N code?): reward rises as it learns to read the result"

echo "== 6. what the warmed agent did: one correct and one wrong trajectory, turn by turn"
zsearch show "$OUT/eval/smollm2-warm/demo/agent.examples.parquet" --where correct --limit 1
zsearch show "$OUT/eval/smollm2-warm/demo/agent.examples.parquet" --where wrong --limit 1
echo "== done: evals in $OUT/eval/{smollm2,smollm2-warm} (per-example Parquet, summaries, em.png),"
echo "   the RL reward curve in $OUT/rl/reward.png; wall time ${SECONDS} s"
