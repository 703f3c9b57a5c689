#!/usr/bin/env bash
# Overfit sanity check: RL must visibly move a real language model (smollm2-warm, the shipped
# format warm-up) on CPU within an hour. Practitioners run this before spending GPU hours on
# a new trainer: a loss mask shifted by one token, a template boundary that retokenizes or a
# flipped advantage sign keeps the reward flat here (docs/overfit.md).
#
# GRPO (or ALGO=dspo: the sequence ratio and its filter of mixed groups) with LoRA on the 8
# bundled train questions in stages/overfit-questions.jsonl, which smollm2-warm answers right
# sometimes but not always (so the groups are mixed). Greedy EM on those questions and on the
# 72 held-out test questions is measured before and after, and the last step prints the
# README's table and checks the goals (OUT/summary.json; curves in OUT/train/curves.png).
# A checkpoint is written every step and the evals keep what they scored: a stopped run goes
# on where it was when started again (the wall time printed is then that of the last part).
#
#   bash stages/overfit.sh                    # GRPO, CPU-sized defaults (48.5 min measured on 2 idle cores)
#   ALGO=dspo bash stages/overfit.sh          # DSPO
#   SELECT=1 bash stages/overfit.sh           # re-pick the questions first (zsearch collect, below)
#   STEPS=100 DEVICE=cuda bash stages/overfit.sh
#   TRAIN_ARGS="--max-gen-batches 3" ALGO=dspo bash stages/overfit.sh   # any other train flag
set -euo pipefail

OUT=${OUT:-runs/overfit}
INDEX=${INDEX:-$OUT/index}
MODEL=${MODEL:-smollm2-warm}
ALGO=${ALGO:-grpo}
QUESTIONS=${QUESTIONS:-stages/overfit-questions.jsonl}
STEPS=${STEPS:-40}
BATCH=${BATCH:-4}           # prompts per step: the 8 questions are one epoch every 2 steps
GROUP=${GROUP:-4}           # G samples per prompt
LR=${LR:-1e-3}              # LoRA peak lr: 2e-4 left the reward flat for 7 steps, 1e-3 moved it in 2
LR_SCHEDULE=${LR_SCHEDULE:-cosine}  # after a 10% warm-up, down to 10% of LR by the last step
WARMUP_RATIO=${WARMUP_RATIO:-0.1}
MIN_LR_RATIO=${MIN_LR_RATIO:-0.1}
LORA_R=${LORA_R:-16}
LORA_ALPHA=${LORA_ALPHA:-16}
TURN_TOKENS=${TURN_TOKENS:-128}
MAX_TURNS=${MAX_TURNS:-1}   # the warmed agent searches once, then answers
SEED=${SEED:-0}
DEVICE=${DEVICE:-cpu}
HELDOUT=${HELDOUT:-demo}      # the held-out QA set (eval --datasets): the bundled test split
EVAL_LIMIT=${EVAL_LIMIT:-}    # only the first N held-out questions (empty: all)
SELECT=${SELECT:-0}
SELECT_FROM=${SELECT_FROM:-32} # SELECT=1: sample the first N train questions ...
SELECT_SAMPLES=${SELECT_SAMPLES:-8} # ... this many times each
STRICT=${STRICT:-1}           # exit 1 when a goal is missed
read -r -a EXTRA <<< "${TRAIN_ARGS:-}"  # more `zsearch train` flags, e.g. TRAIN_ARGS="--max-gen-batches 3"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
PY=${PYTHON:-python}
START=$SECONDS

echo "== 1. BM25 index of the bundled corpus"
if [ ! -e "$INDEX/manifest.json" ]; then
  zsearch index --out "$INDEX" --kind bm25
fi

if [ "$SELECT" = 1 ]; then
  # How the shipped question file was made (the defaults): 8 samples (temperature 1) of each
  # of the first 32 train questions, then the 8 questions right in some samples but not all,
  # closest to a quarter right first (zsearch_cli/train/overfit.py says why).
  TRAIN=$("$PY" -c 'from zsearch_cli.data.demo import demo_path; print(demo_path("train"))')
  echo "== 1b. choose the questions: $MODEL sampled $SELECT_SAMPLES times on the first $SELECT_FROM train questions"
  zsearch collect --data "$TRAIN" --limit "$SELECT_FROM" --model "$MODEL" --index "$INDEX" -G "$SELECT_SAMPLES" --temperature 1.0 \
    --max-turns "$MAX_TURNS" --max-turn-tokens "$TURN_TOKENS" --seed "$SEED" --device "$DEVICE" --out "$OUT/collect"
  QUESTIONS=$OUT/questions.jsonl
  "$PY" -m zsearch_cli.train.overfit select "$OUT/collect/trajectories.parquet" --qa "$TRAIN" --n 8 --out "$QUESTIONS"
fi

EVAL_OPTS=(--model "$MODEL" --method agent --index "$INDEX" --max-turns "$MAX_TURNS"
           --max-turn-tokens "$TURN_TOKENS" --device "$DEVICE" --seed "$SEED")
HELDOUT_OPTS=(--datasets "$HELDOUT")
if [ -n "$EVAL_LIMIT" ]; then HELDOUT_OPTS+=(--limit "$EVAL_LIMIT"); fi
echo "== 2. before: $MODEL, greedy, on the trained questions and the held-out test split"
zsearch eval "${EVAL_OPTS[@]}" --datasets "$QUESTIONS" --out "$OUT/eval-trained-before"
zsearch eval "${EVAL_OPTS[@]}" "${HELDOUT_OPTS[@]}" --out "$OUT/eval-heldout-before"

echo "== 3. $ALGO from $MODEL on $QUESTIONS: $STEPS steps x $BATCH prompts x G $GROUP, LoRA r $LORA_R, lr $LR"
zsearch train --algo "$ALGO" --model "$MODEL" --index "$INDEX" --train-data "$QUESTIONS" --out "$OUT/train" \
  --steps "$STEPS" --batch-size "$BATCH" --group-size "$GROUP" --lr "$LR" --lr-schedule "$LR_SCHEDULE" \
  --warmup-ratio "$WARMUP_RATIO" --min-lr-ratio "$MIN_LR_RATIO" --lora-r "$LORA_R" \
  --lora-alpha "$LORA_ALPHA" --max-turns "$MAX_TURNS" --max-turn-tokens "$TURN_TOKENS" --seed "$SEED" \
  --device "$DEVICE" --save-every 1 --keep-checkpoints 2 --resume --guard ${EXTRA[@]+"${EXTRA[@]}"}
zsearch plot "$OUT/train" --title "$ALGO from $MODEL, $(wc -l < "$QUESTIONS" | tr -d ' ') train questions ($STEPS steps)"

echo "== 4. after: the trained model, greedy, on the same questions"
EVAL_OPTS[1]="$OUT/train/final"
zsearch eval "${EVAL_OPTS[@]}" --datasets "$QUESTIONS" --out "$OUT/eval-trained-after"
zsearch eval "${EVAL_OPTS[@]}" "${HELDOUT_OPTS[@]}" --out "$OUT/eval-heldout-after"

echo "== 5. measured ($OUT/summary.json)"
WALL=$((SECONDS - START))
REPORT_OPTS=(--wall-s "$WALL")
if [ "$STRICT" = 1 ]; then REPORT_OPTS+=(--strict); fi
status=0
"$PY" -m zsearch_cli.train.overfit report "$OUT" "${REPORT_OPTS[@]}" || status=$?
echo "== done in $WALL s: curves $OUT/train/curves.png"
exit "$status"
