#!/usr/bin/env bash
# Dr. Zero in miniature (issue 38): does the difficulty reward move a real proposer towards
# questions its solver answers only sometimes, and does the solver, trained on them with no
# human data, stay as good on human questions? smollm2-warm is proposer and solver, on the
# bundled corpus, for two `zsearch drzero` iterations (propose: HRPO against the frozen
# solver; generate; solve: GRPO; eval), each with LoRA on CPU.
#
# Per iteration the recipe measures the share of proposals that parse, the solver's pass rate
# k/5 on them (and the share in the reward's band 0 < k < 5), the proposer's mean difficulty
# reward, and the new solver's greedy EM on the 72 held-out test questions (also measured for
# smollm2-warm before the loop, with the loop's eval settings). OUT/iterations.md is rewritten
# after every iteration; the last step prints the README's table and checks the goals
# (OUT/summary.json; python -m zsearch_cli.train.drzero_mini says how each is measured).
#
# What real text forced on the defaults (docs/drzero-mini.md): smollm2-warm answers only in the
# Search-R1 tags it was warmed on (--solver-protocol tags; under Dr. Zero's tool calls it writes
# <search> and never answers, so every question would score k = 0 and the reward never vary);
# it follows a one-example prompt, not Figure 5's 2,600 tokens (--proposer-prompt short, 1-hop);
# and it copies that example, whose answer no passage holds, which the paper's format reward
# pays in full (--answer-reward grounded: Dr. Zero's code's rule, the answer must be in the passage).
#
# Resumable: OUT/lineage.json records every sub-step, a checkpoint is written every step and the
# evals keep what they scored, so the same command goes on where a killed run stopped. The
# wall time reported is the sum of every part's (OUT/wall_s).
#
#   bash stages/drzero-mini.sh                       # the measured run (2 idle cores)
#   DEVICE=cuda PROPOSER_STEPS=20 bash stages/drzero-mini.sh
#   LOOP_ARGS="--rollout-mode async" bash stages/drzero-mini.sh   # any other `zsearch drzero` flag
set -euo pipefail

OUT=${OUT:-runs/drzero-mini}
INDEX=${INDEX:-$OUT/index}
MODEL=${MODEL:-smollm2-warm}
ITERATIONS=${ITERATIONS:-2}
PROPOSER_STEPS=${PROPOSER_STEPS:-4}   # HRPO steps per iteration
BATCH=${BATCH:-8}                     # proposer prompts per HRPO step (one hop group: 1-hop only)
PROPOSER_LR=${PROPOSER_LR:-1e-3}      # LoRA; the overfit recipe's: 2e-4 left its reward flat for 7 steps
QUESTIONS=${QUESTIONS:-16}            # proposer prompts per generated set
SAMPLES=${SAMPLES:-2}                 # proposer samples per prompt at generation, the best by format kept
SOLVER_SAMPLES=${SOLVER_SAMPLES:-5}   # n of the difficulty reward
SOLVER_STEPS=${SOLVER_STEPS:-4}       # GRPO steps per iteration
SOLVER_BATCH=${SOLVER_BATCH:-4}       # questions per GRPO step
GROUP=${GROUP:-4}                     # G solver samples per question
SOLVER_LR=${SOLVER_LR:-2e-4}          # LoRA; gentler than the proposer's: the solver must not lose held-out EM
LORA_R=${LORA_R:-16}
HOP_RATIO=${HOP_RATIO:-1:0:0:0}       # 1-hop: the short prompt's, and the warmed agent's single search
PROPOSER_PROMPT=${PROPOSER_PROMPT:-short}
SOLVER_PROTOCOL=${SOLVER_PROTOCOL:-tags}
ANSWER_REWARD=${ANSWER_REWARD:-grounded}  # pay the answer part only for an answer found in the source passage
TURN_TOKENS=${TURN_TOKENS:-128}       # both sides; the overfit recipe's eval setting
MAX_TURNS=${MAX_TURNS:-1}             # the warmed agent searches once, then answers
OBS_TOKENS=${OBS_TOKENS:-500}
TOPK=${TOPK:-3}
SEED=${SEED:-0}
DEVICE=${DEVICE:-cpu}
HELDOUT=${HELDOUT:-demo}              # the held-out QA set (eval --datasets): the bundled test split
EVAL_LIMIT=${EVAL_LIMIT:-}            # only the first N held-out questions (empty: all)
STRICT=${STRICT:-1}                   # exit 1 when a goal is missed
read -r -a EXTRA <<< "${LOOP_ARGS:-}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
PY=${PYTHON:-python}

mkdir -p "$OUT"
exec > >(tee -a "$OUT/recipe.log") 2>&1   # the progress lines stay in a log file too
# Every part adds its seconds to OUT/wall_s when it ends, killed or not (SIGKILL aside).
START=$SECONDS
record_wall() { "$PY" -c 'import sys, pathlib; p = pathlib.Path(sys.argv[1]); p.write_text(str(float(p.read_text()) + float(sys.argv[2])) if p.is_file() else sys.argv[2])' "$OUT/wall_s" $((SECONDS - START)); START=$SECONDS; }
trap record_wall EXIT

echo "== 1. BM25 index of the bundled corpus"
if [ ! -e "$INDEX/manifest.json" ]; then
  zsearch index --out "$INDEX" --kind bm25
fi

# The loop's eval step and the before-eval share these (the report checks they did).
SHARED=(--index "$INDEX" --topk "$TOPK" --max-turns "$MAX_TURNS" --max-turn-tokens "$TURN_TOKENS"
        --max-obs-tokens "$OBS_TOKENS" --device "$DEVICE")
LIMIT=()
if [ -n "$EVAL_LIMIT" ]; then LIMIT=(--limit "$EVAL_LIMIT"); fi
echo "== 2. before: $MODEL, greedy, on the held-out questions ($HELDOUT)"
zsearch eval --model "$MODEL" --method agent --protocol "$SOLVER_PROTOCOL" --datasets "$HELDOUT" "${LIMIT[@]}" \
  --max-context-tokens 3072 --seed "$SEED" "${SHARED[@]}" --out "$OUT/eval-heldout-before"

LOOP=(--model "$MODEL" --out "$OUT" "${SHARED[@]}" --proposer-steps "$PROPOSER_STEPS" --batch-size "$BATCH"
      --proposer-lr "$PROPOSER_LR" --questions-per-iteration "$QUESTIONS" --samples "$SAMPLES"
      --solver-samples "$SOLVER_SAMPLES" --solver-steps "$SOLVER_STEPS" --solver-batch-size "$SOLVER_BATCH"
      -G "$GROUP" --solver-lr "$SOLVER_LR" --lora-r "$LORA_R" --hop-ratio "$HOP_RATIO"
      --proposer-prompt "$PROPOSER_PROMPT" --solver-protocol "$SOLVER_PROTOCOL" --answer-reward "$ANSWER_REWARD"
      --solver-context-tokens 3072
      --eval-datasets "$HELDOUT" --seed "$SEED" --save-every 1 --keep-checkpoints 1)
if [ -n "$EVAL_LIMIT" ]; then LOOP+=(--eval-limit "$EVAL_LIMIT"); fi
for ((i = 1; i <= ITERATIONS; i++)); do
  echo "== 3.$i Dr. Zero iteration $i of $ITERATIONS: propose ($PROPOSER_STEPS HRPO steps), generate ($QUESTIONS), solve ($SOLVER_STEPS GRPO steps), eval"
  zsearch drzero "${LOOP[@]}" --iterations "$i" ${EXTRA[@]+"${EXTRA[@]}"}
  "$PY" -m zsearch_cli.train.drzero_mini progress "$OUT"
done

echo "== 4. measured ($OUT/summary.json)"
record_wall
WALL=$(cat "$OUT/wall_s")
REPORT_OPTS=(--wall-s "$WALL" --iterations "$ITERATIONS")
if [ "$STRICT" = 1 ]; then REPORT_OPTS+=(--strict); fi
status=0
"$PY" -m zsearch_cli.train.drzero_mini report "$OUT" "${REPORT_OPTS[@]}" || status=$?
echo "== done: $WALL s in all parts, lineage $OUT/lineage.json"
exit "$status"
