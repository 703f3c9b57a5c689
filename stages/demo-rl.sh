#!/usr/bin/env bash
# RL from the warmed agent, longer than `make demo`: GRPO from smollm2-warm (the shipped
# format warm-up, stages/warmup.sh) on the bundled train split with real BM25 search, then the
# held-out bundled test split scored before and after. CPU-sized defaults (LoRA, a few short
# steps, about an hour on 2 loaded cores); the README reports what they measured. Every
# setting is a variable, e.g. ALGO=dspo STEPS=50 BATCH=8 DEVICE=cuda bash stages/demo-rl.sh.
set -euo pipefail

OUT=${OUT:-runs/demo-rl}
INDEX=${INDEX:-$OUT/index}
MODEL=${MODEL:-smollm2-warm}
ALGO=${ALGO:-grpo}            # grpo (EM reward) or dspo (subEM, dynamic filtering)
STEPS=${STEPS:-8}
BATCH=${BATCH:-4}             # prompts per step
GROUP=${GROUP:-4}             # G responses per prompt: mixed groups need a model right some of the time
LR=${LR:-2e-5}                # LoRA on a 135M model; the papers' 1e-6 moves nothing in a few steps
LORA_R=${LORA_R:-16}
TURN_TOKENS=${TURN_TOKENS:-128}
MAX_TURNS=${MAX_TURNS:-2}     # the warmed agent searches once, then answers
SEED=${SEED:-0}
SAVE_EVERY=${SAVE_EVERY:-1}  # a checkpoint per step: a stopped run goes on where it was (--resume)
EVAL_LIMIT=${EVAL_LIMIT:-72}  # the whole test split
DEVICE=${DEVICE:-cpu}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

echo "== 1. BM25 index of the bundled corpus"
if [ ! -e "$INDEX/manifest.json" ]; then
  zsearch index --out "$INDEX" --kind bm25
fi
EVAL_OPTS=(--method agent --index "$INDEX" --datasets demo --limit "$EVAL_LIMIT" --max-turns "$MAX_TURNS"
           --max-turn-tokens "$TURN_TOKENS" --device "$DEVICE")

echo "== 2. before: $MODEL on the held-out test split (a re-run keeps the questions already scored)"
zsearch eval --model "$MODEL" "${EVAL_OPTS[@]}" --out "$OUT/eval-before"

echo "== 3. $ALGO from $MODEL on the bundled train split: $STEPS steps x $BATCH prompts x G $GROUP"
start=$SECONDS
zsearch train --algo "$ALGO" --model "$MODEL" --index "$INDEX" --out "$OUT/train" --steps "$STEPS" \
  --batch-size "$BATCH" --group-size "$GROUP" --lr "$LR" --lora-r "$LORA_R" --max-turns "$MAX_TURNS" \
  --max-turn-tokens "$TURN_TOKENS" --seed "$SEED" --device "$DEVICE" --save-every "$SAVE_EVERY" --resume
echo "   train wall time: $((SECONDS - start)) s"
zsearch plot "$OUT/train" --title "$ALGO from $MODEL, bundled train split ($STEPS steps)"

echo "== 4. after: the trained model on the same questions"
zsearch eval --model "$OUT/train/final" "${EVAL_OPTS[@]}" --out "$OUT/eval-after"

python - "$OUT" <<'PY'
import sys
from pathlib import Path
import pyarrow.parquet as pq
out = Path(sys.argv[1])
for name in ("eval-before", "eval-after"):
    s = pq.read_table(out / name / "demo" / "agent.summary.parquet").to_pylist()[0]
    print(f"  {name:<12} n {s['n']}  EM {s['em']:.3f}  F1 {s['f1']:.3f}  subEM {s['subem']:.3f}  answered {s['answered']:.2f}")
PY
echo "== done in ${SECONDS} s: curves $OUT/train/curves.png, evals $OUT/eval-before, $OUT/eval-after"
