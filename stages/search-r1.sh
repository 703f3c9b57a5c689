#!/usr/bin/env bash
# Search-R1 from the files you already have: adopt the E5 index, build BM25 beside it, serve
# both on 127.0.0.1, train with the paper's settings (--preset search-r1: PPO, lr 1e-6, EM,
# top-3, 4 turns, 500 steps) and evaluate the seven test sets (each scored on its own, then
# both averages: plain and weighted by n).
#
#   CORPUS=wiki-18.jsonl FAISS=e5_Flat.index TRAIN=nq_hotpotqa_train/train.parquet \
#   TEST=nq_hotpotqa_train/test.parquet MODEL=Qwen/Qwen2.5-3B DEVICE=cuda \
#   LAUNCH="accelerate launch --config_file stages/accelerate/ddp.yaml" bash stages/search-r1.sh
#
# --dry-run prints every command, the disk the index takes and the memory each process needs,
# and runs nothing. Without CORPUS/FAISS/TRAIN/TEST it runs a CPU demo in minutes: the bundled
# corpus (BM25 only), its train split, smollm2 with LoRA, a few short steps.
# Every step skips what a previous run finished (the index, the checkpoints: --resume).
set -euo pipefail

DRY_RUN=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY_RUN=1 ;;
    *) echo "stages/search-r1.sh: unknown argument $arg (only --dry-run)" >&2; exit 2 ;;
  esac
done

OUT=${OUT:-runs/search-r1}
CORPUS=${CORPUS:-}                  # Search-R1's wiki-18.jsonl(.gz); empty = the bundled demo corpus
FAISS=${FAISS:-}                    # its e5_Flat.index; empty = BM25 only
ENCODER=${ENCODER:-intfloat/e5-base-v2}
TRAIN=${TRAIN:-}                    # nq_hotpotqa_train/train.parquet; empty = the bundled train split
TEST=${TEST:-}                      # nq_hotpotqa_train/test.parquet (seven sets); empty = the bundled test split
INDEX=${INDEX:-$OUT/index}
PORT=${PORT:-8011}
LAUNCH=${LAUNCH:-}                  # e.g. "accelerate launch --config_file stages/accelerate/ddp.yaml"
PROCESSES=${PROCESSES:-1}           # for the dry run's memory line: processes LAUNCH starts
DEVICE=${DEVICE:-auto}
ALGO=${ALGO:-ppo}                   # ppo (the paper's) or grpo
if [ -n "$FAISS$TRAIN$TEST$CORPUS" ]; then  # the paper's run: the preset decides, unless you do
  MODEL=${MODEL:-Qwen/Qwen2.5-3B}; METHOD=${METHOD:-$([ -n "$FAISS" ] && echo dense || echo bm25)}
  STEPS=${STEPS:-}; BATCH=${BATCH:-512}; TURN_TOKENS=${TURN_TOKENS:-500}; LORA_R=${LORA_R:-0}
  EVAL_LIMIT=${EVAL_LIMIT:-}; SAVE_EVERY=${SAVE_EVERY:-50}
else                                # the CPU demo
  MODEL=${MODEL:-smollm2}; METHOD=${METHOD:-bm25}
  STEPS=${STEPS:-4}; BATCH=${BATCH:-4}; TURN_TOKENS=${TURN_TOKENS:-64}; LORA_R=${LORA_R:-16}
  EVAL_LIMIT=${EVAL_LIMIT:-8}; SAVE_EVERY=${SAVE_EVERY:-$STEPS}
fi

run() {  # print a command; run it unless --dry-run
  printf '  $'; printf ' %q' "$@"; printf '\n'
  if [ "$DRY_RUN" = 0 ]; then "$@"; fi
}

for f in "$CORPUS" "$FAISS" "$TRAIN" "$TEST"; do
  if [ -n "$f" ] && [ ! -e "$f" ]; then echo "stages/search-r1.sh: $f does not exist" >&2; exit 2; fi
done

if [ "$DRY_RUN" = 1 ]; then
  echo "== plan (estimates: src/zsearch_cli/recipe_plan.py says where each comes from)"
  python -m zsearch_cli.recipe_plan ${CORPUS:+--corpus "$CORPUS"} ${FAISS:+--faiss "$FAISS"} --model "$MODEL" \
    --lora-r "$LORA_R" --algo "$ALGO" --processes "$PROCESSES"
fi

echo "== 1. index: ${FAISS:+adopt $FAISS as the dense part, }BM25"
if [ -e "$INDEX/manifest.json" ]; then
  echo "  $INDEX is complete: kept"
elif [ -n "$FAISS" ]; then
  run zsearch index ${CORPUS:+"$CORPUS"} --adopt-faiss "$FAISS" --encoder "$ENCODER" --kind hybrid \
    --bm25-preset pyserini --out "$INDEX"
else
  run zsearch index ${CORPUS:+"$CORPUS"} --out "$INDEX" --kind bm25
fi

echo "== 2. serve it on 127.0.0.1:$PORT (--method $METHOD)"
SERVE=(zsearch serve --index "$INDEX" --method "$METHOD" --port "$PORT")
printf '  $'; printf ' %q' "${SERVE[@]}"; printf ' &\n'
if [ "$DRY_RUN" = 0 ]; then
  "${SERVE[@]}" &
  SERVER=$!  # the server itself (not a subshell), so that the trap ends it
  trap 'kill $SERVER 2>/dev/null || true' EXIT
  python - "$PORT" <<'PY'
import sys
from zsearch_cli.retrieval.client import RetrievalClient
RetrievalClient(f"http://127.0.0.1:{sys.argv[1]}", retries=60, backoff=0.5).health()
PY
fi
SEARCH="http://127.0.0.1:$PORT"

echo "== 3. train $MODEL (--preset search-r1 --algo $ALGO)"
ZSEARCH=$(command -v zsearch || echo zsearch)
# $LAUNCH is a command prefix: split on spaces on purpose
# shellcheck disable=SC2086
run $LAUNCH "$ZSEARCH" train --preset search-r1 --algo "$ALGO" --model "$MODEL" --search "$SEARCH" \
  --out "$OUT/train" --batch-size "$BATCH" --lora-r "$LORA_R" --device "$DEVICE" \
  ${STEPS:+--steps "$STEPS"} --max-turn-tokens "$TURN_TOKENS" ${TRAIN:+--train-data "$TRAIN"} \
  --save-every "$SAVE_EVERY" --resume

echo "== 4. evaluate $OUT/train/final on ${TEST:-the bundled test split} (each data_source on its own)"
# the preset's rollout (top-3, 4 turns, tags) with the training's turn budget: eval has no --preset
run zsearch eval --model "$OUT/train/final" --search "$SEARCH" --datasets "${TEST:-demo}" --topk 3 --max-turns 4 \
  --max-turn-tokens "$TURN_TOKENS" ${EVAL_LIMIT:+--limit "$EVAL_LIMIT"} --device "$DEVICE" --out "$OUT/eval"
run zsearch plot "$OUT/train"
echo "== done: model $OUT/train/final, metrics $OUT/train/metrics.parquet, eval $OUT/eval"
