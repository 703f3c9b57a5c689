#!/usr/bin/env bash
# Dr. Zero recipe: the self-evolution loop as chained subcommands, per iteration
#   propose (HRPO, current solver frozen) -> propose --generate-only -> solve (GRPO) -> eval.
# `zsearch drzero` runs the same loop in one process and records lineage.json; this script
# shows the pieces, with a shell variable for every path. Defaults run on a CPU (smollm2,
# LoRA, a few short steps); the paper's setting on a GPU, e.g.
#   MODEL=Qwen/Qwen2.5-3B-Instruct CORPUS=wiki-18.jsonl ITERATIONS=3 PROPOSER_STEPS=50 SOLVER_STEPS=50 \
#   BATCH=256 SOLVER_BATCH=256 QUESTIONS=4096 TURN_TOKENS=512 LORA_R=0 DEVICE=cuda DATASETS=all bash stages/drzero.sh
# (multi-GPU training steps: LAUNCH="accelerate launch --config_file stages/accelerate/ddp.yaml").
# Rerunning resumes: finished steps are skipped, an interrupted training run continues (--resume).
# Solver on its own GPU: serve the current solver (`vllm serve SOLVER_CHECKPOINT --port 8001`, a
# full-weight checkpoint, so LORA_R=0) and set SOLVER_URL=http://127.0.0.1:8001/v1; propose and
# generate then ask that server (token ids in and out). Restart it on $SOLVER after each solve.
set -euo pipefail

OUT=${OUT:-runs/drzero-sh}
CORPUS=${CORPUS:-}                  # empty = the bundled demo corpus
INDEX=${INDEX:-$OUT/index}
MODEL=${MODEL:-smollm2}             # the base model both proposer and solver start from
ITERATIONS=${ITERATIONS:-1}
PROPOSER_STEPS=${PROPOSER_STEPS:-2}
SOLVER_STEPS=${SOLVER_STEPS:-2}
BATCH=${BATCH:-4}                   # proposer prompts per HRPO step
SOLVER_BATCH=${SOLVER_BATCH:-4}     # questions per GRPO step (at most the generated set's size)
GROUP=${GROUP:-5}                   # solver responses per question
SOLVER_SAMPLES=${SOLVER_SAMPLES:-5} # n of the difficulty reward
QUESTIONS=${QUESTIONS:-16}          # proposer prompts per generated set
SAMPLES=${SAMPLES:-4}               # proposer samples per prompt at generation (best kept)
HOP_RATIO=${HOP_RATIO:-4:3:2:1}
SEED=${SEED:-0}
TURN_TOKENS=${TURN_TOKENS:-96}
LORA_R=${LORA_R:-16}
DEVICE=${DEVICE:-auto}
DATASETS=${DATASETS:-demo}          # empty = no eval
EVAL_LIMIT=${EVAL_LIMIT:-8}
LAUNCH=${LAUNCH:-}
SOLVER_URL=${SOLVER_URL:-}          # empty = the solver runs in-process

echo "== 0. index (BM25)"
if [ ! -e "$INDEX/manifest.json" ]; then
  zsearch index ${CORPUS:+"$CORPUS"} --out "$INDEX" --kind bm25
fi

ZSEARCH=$(command -v zsearch)
PROPOSER=$MODEL
SOLVER=$MODEL
for ((i = 1; i <= ITERATIONS; i++)); do
  ITER=$OUT/iter-$i
  PROPOSER_RUN=$ITER/proposer
  QA=$ITER/questions.parquet
  SOLVER_RUN=$ITER/solver
  EVAL_OUT=$ITER/eval
  BASE_SEED=$((SEED + 1000 * i))   # the same per-iteration seeds as `zsearch drzero`

  echo "== $i.1 propose: HRPO on $PROPOSER, solver $SOLVER frozen"
  if [ ! -d "$PROPOSER_RUN/final" ]; then
    $LAUNCH "$ZSEARCH" propose --model "$PROPOSER" --solver-model "$SOLVER" --index "$INDEX" --out "$PROPOSER_RUN" \
      --steps "$PROPOSER_STEPS" --batch-size "$BATCH" --solver-samples "$SOLVER_SAMPLES" --hop-ratio "$HOP_RATIO" \
      --max-turn-tokens "$TURN_TOKENS" --lora-r "$LORA_R" --device "$DEVICE" --seed $((BASE_SEED + 1)) --resume \
      ${SOLVER_URL:+--solver-url "$SOLVER_URL"}
  fi
  PROPOSER=$PROPOSER_RUN/final

  echo "== $i.2 generate: $QUESTIONS prompts with $PROPOSER"
  if [ ! -e "$QA" ]; then
    zsearch propose --generate-only --model "$PROPOSER" --solver-model "$SOLVER" --index "$INDEX" --out "$QA" \
      --num-questions "$QUESTIONS" --samples "$SAMPLES" --solver-samples "$SOLVER_SAMPLES" --hop-ratio "$HOP_RATIO" \
      --max-turn-tokens "$TURN_TOKENS" --device "$DEVICE" --seed $((BASE_SEED + 2)) ${SOLVER_URL:+--solver-url "$SOLVER_URL"}
  fi

  echo "== $i.3 solve: GRPO on $QA from $SOLVER"
  if [ ! -d "$SOLVER_RUN/final" ]; then
    $LAUNCH "$ZSEARCH" solve "$QA" --model "$SOLVER" --index "$INDEX" --out "$SOLVER_RUN" --steps "$SOLVER_STEPS" \
      --batch-size "$SOLVER_BATCH" --group-size "$GROUP" --max-turn-tokens "$TURN_TOKENS" --lora-r "$LORA_R" \
      --device "$DEVICE" --seed $((BASE_SEED + 3)) --save-every 10 --resume
  fi
  SOLVER=$SOLVER_RUN/final

  if [ -n "$DATASETS" ]; then
    echo "== $i.4 eval $SOLVER ($DATASETS)"
    zsearch eval --model "$SOLVER" --index "$INDEX" --datasets "$DATASETS" --limit "$EVAL_LIMIT" --protocol tool_call \
      --max-turns 5 --max-turn-tokens "$TURN_TOKENS" --device "$DEVICE" --out "$EVAL_OUT"
  fi
done
echo "== done: proposer $PROPOSER, solver $SOLVER"
