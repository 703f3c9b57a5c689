#!/usr/bin/env bash
# ZeroSearch in miniature (issue 38): the paper's central claim measured with a real language
# model on CPU. ZeroSearch (§3.3-3.4) says a fine-tuned simulator writes useful or noisy
# documents on demand, switched by "adjusting a few words in the prompt", and that a policy
# trained against it, with the noise curriculum, then works on real search. Here, with
# smollm2 on the bundled corpus (docs/zerosearch-mini.md says why each setting):
#
#   1. collect   smollm2-warm searches real BM25 on the bundled train questions
#   2. judge     every collected query by rule:answer (a gold answer in the documents: the
#                stand-in for a large judge), and the first JUDGE_SAMPLE by smollm2 itself;
#                the report compares the two
#   3. eval      smollm2-warm, greedy, on the 72 held-out test questions with real BM25: the
#                "before", and the held-out queries the simulator is measured on
#   4. control   the base smollm2 as the simulator: U and N, the share of its documents
#                holding the gold answer under the useful and under the noisy prompt
#   5. simsft    smollm2 fine-tuned into the simulator on the rule's labels (balanced)
#   6. control   the fine-tuned simulator's U and N on the same held-out queries
#   7. train     GRPO (ALGO=dspo: DSPO) with LoRA from smollm2-warm against the simulator,
#                the curriculum taking the noise probability from NOISE_START to NOISE_END
#   8. eval      the trained policy on the held-out questions with real BM25: the "after"
#   9. report    the README's table and issue 38's goals (OUT/summary.json); exit 1 naming
#                a missed goal (STRICT=0: report only)
#
# Resumable: each stage writes OUT/STAGE/.done (its seconds, then its command) when it
# finishes, and is skipped when started again with the same command; a stage stopped half way
# resumes inside the command (collect, judge, eval and train keep what they wrote). A changed
# setting reruns its stage, not the later ones: to redo a stage and what follows, delete their
# folders. The report's wall time is the sum of the stages' times.
#
#   bash stages/zerosearch-mini.sh                        # the measured run (README, "ZeroSearch in miniature")
#   ALGO=dspo TRAIN_ARGS="--max-gen-batches 2" bash stages/zerosearch-mini.sh
#   STEPS=100 DEVICE=cuda bash stages/zerosearch-mini.sh
set -euo pipefail

OUT=${OUT:-runs/zerosearch-mini}
INDEX=${INDEX:-$OUT/index}
MODEL=${MODEL:-smollm2-warm}          # the policy: collects, is trained and evaluated
COLLECT_MODEL=${COLLECT_MODEL:-$MODEL}
SIM_MODEL=${SIM_MODEL:-smollm2}       # the base the simulator is fine-tuned from
JUDGE_MODEL=${JUDGE_MODEL:-smollm2}   # the small LLM judge compared with the rule
JUDGE_PREFILL=${JUDGE_PREFILL:-1}     # start its reply with "Verdict:" (smollm2 answers in prose otherwise)
JUDGE_SAMPLE=${JUDGE_SAMPLE:-48}      # queries the LLM judge labels (the first ones)
SIM_JUDGE=${SIM_JUDGE:-rule}          # whose labels simsft learns: rule or lm ...
SIM_JUDGMENTS=${SIM_JUDGMENTS:-$OUT/judge-$SIM_JUDGE/judgments.parquet}  # ... or judged rows from elsewhere (a large judge's)
COLLECT_DATA=${COLLECT_DATA:-}        # empty: the bundled train split (108 questions)
COLLECT_LIMIT=${COLLECT_LIMIT:-}      # empty: all of them
SAMPLES=${SAMPLES:-1}                 # trajectories per question: the warmed agent copies the question into its query
COLLECT_TEMPERATURE=${COLLECT_TEMPERATURE:-1.0}
TOPK=${TOPK:-1}                       # documents per search, real or simulated
DOC_WORDS=${DOC_WORDS:-0}             # words per simsft target document (0: whole, as judged)
SIM_STEPS=${SIM_STEPS:-40}            # ~4 epochs of the ~84 balanced examples
SIM_LR=${SIM_LR:-5e-5}
SIM_BATCH=${SIM_BATCH:-8}
SIM_LORA_R=${SIM_LORA_R:-0}           # 0: the whole simulator is fine-tuned
SIM_MAX_TOKENS=${SIM_MAX_TOKENS:-128} # one document (the fine-tuned simulator writes ~60 words, then stops)
SIM_TEMPERATURE=${SIM_TEMPERATURE:-0.7}
HELDOUT=${HELDOUT:-demo}              # the held-out QA set (eval --datasets): the 72 test questions
EVAL_LIMIT=${EVAL_LIMIT:-}
CONTROL_LIMIT=${CONTROL_LIMIT:-}      # held-out queries the simulators are measured on (empty: all)
TRAIN_DATA=${TRAIN_DATA:-}            # RL questions; empty: the bundled train split
ALGO=${ALGO:-grpo}
STEPS=${STEPS:-16}
BATCH=${BATCH:-4}
GROUP=${GROUP:-4}
LR=${LR:-1e-3}                        # LoRA peak lr, as the overfit check's
LORA_R=${LORA_R:-16}
LORA_ALPHA=${LORA_ALPHA:-16}
NOISE_START=${NOISE_START:-0}         # p_s (paper, Qwen-2.5-3B: 0 -> 0.25)
NOISE_END=${NOISE_END:-0.25}          # p_e
TURN_TOKENS=${TURN_TOKENS:-128}
MAX_TURNS=${MAX_TURNS:-1}             # the warmed agent searches once, then answers
SEED=${SEED:-0}
DEVICE=${DEVICE:-cpu}
STRICT=${STRICT:-1}
read -r -a EXTRA <<< "${TRAIN_ARGS:-}"  # more `zsearch train` flags
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
PY=${PYTHON:-python}
START=$SECONDS

# stage DIR CMD...: run CMD unless DIR/.done records this very command (it finished before);
# after CMD succeeds, write DIR/.done atomically: its seconds, then the command.
stage() {
  local dir=$1 cmd t0=$SECONDS
  shift
  cmd=$(printf '%q ' "$@")
  if [ -f "$dir/.done" ] && [ "$(tail -n +2 "$dir/.done")" = "$cmd" ]; then
    echo "   done before: $dir/.done"
    return 0
  fi
  "$@"
  mkdir -p "$dir"
  printf '%s\n%s' "$((SECONDS - t0))" "$cmd" > "$dir/.done.tmp"
  mv "$dir/.done.tmp" "$dir/.done"
}

SIM_OPTS="max_tokens=$SIM_MAX_TOKENS&temperature=$SIM_TEMPERATURE&device=$DEVICE&backend=hf"
RUN_OPTS=(--max-turns "$MAX_TURNS" --max-turn-tokens "$TURN_TOKENS" --topk "$TOPK" --seed "$SEED" --device "$DEVICE")

echo "== 1. BM25 index of the bundled corpus"
if [ ! -e "$INDEX/manifest.json" ]; then
  zsearch index --out "$INDEX" --kind bm25
fi

echo "== 2. collect: $COLLECT_MODEL searches BM25 (top $TOPK), $SAMPLES samples a question"
stage "$OUT/collect" zsearch collect --model "$COLLECT_MODEL" --search bm25 --index "$INDEX" --out "$OUT/collect" \
  -G "$SAMPLES" --temperature "$COLLECT_TEMPERATURE" "${RUN_OPTS[@]}" \
  ${COLLECT_DATA:+--data "$COLLECT_DATA"} ${COLLECT_LIMIT:+--limit "$COLLECT_LIMIT"}
QUERIES=$("$PY" -c 'import sys, pyarrow.parquet as pq; print(pq.ParquetFile(sys.argv[1]).metadata.num_rows)' \
  "$OUT/collect/queries.parquet")
if [ "$QUERIES" = 0 ]; then
  echo "error: $OUT/collect/queries.parquet holds no query: $COLLECT_MODEL never searched; use a warmed agent" >&2
  exit 1
fi

echo "== 3. judge the $QUERIES queries: rule:answer on all, $JUDGE_MODEL on the first $JUDGE_SAMPLE"
stage "$OUT/judge-rule" zsearch judge "$OUT/collect/queries.parquet" --judge-model rule:answer --out "$OUT/judge-rule"
LM_PREFILL=()
if [ "$JUDGE_PREFILL" = 1 ]; then LM_PREFILL=(--prefill-verdict); fi
stage "$OUT/judge-lm" zsearch judge "$OUT/collect/queries.parquet" --judge-model "$JUDGE_MODEL" --limit "$JUDGE_SAMPLE" \
  --max-new-tokens 8 --device "$DEVICE" --out "$OUT/judge-lm" ${LM_PREFILL[@]+"${LM_PREFILL[@]}"}

EVAL_OPTS=(--method agent --search bm25 --index "$INDEX" --datasets "$HELDOUT" "${RUN_OPTS[@]}")
if [ -n "$EVAL_LIMIT" ]; then EVAL_OPTS+=(--limit "$EVAL_LIMIT"); fi
echo "== 4. before: $MODEL, greedy, on the held-out questions ($HELDOUT) with real BM25"
stage "$OUT/eval-heldout-before" zsearch eval --model "$MODEL" "${EVAL_OPTS[@]}" --out "$OUT/eval-heldout-before"

CONTROL_OPTS=(--eval "$OUT/eval-heldout-before" --topk "$TOPK")
if [ -n "$CONTROL_LIMIT" ]; then CONTROL_OPTS+=(--limit "$CONTROL_LIMIT"); fi
echo "== 5. controllability of the base $SIM_MODEL as the simulator (the Table 2 prompt)"
stage "$OUT/control-base" "$PY" -m zsearch_cli.train.zerosearch_mini control --sim "sim:$SIM_MODEL?$SIM_OPTS&seed=$SEED" \
  "${CONTROL_OPTS[@]}" --out "$OUT/control-base"

echo "== 6. simsft: $SIM_MODEL becomes the simulator ($SIM_STEPS steps on $SIM_JUDGMENTS)"
stage "$OUT/simsft" zsearch simsft "$SIM_JUDGMENTS" --model "$SIM_MODEL" --out "$OUT/simsft" \
  --balance --titles --doc-words "$DOC_WORDS" --max-steps "$SIM_STEPS" --lr "$SIM_LR" --batch-size "$SIM_BATCH" \
  --lora-r "$SIM_LORA_R" --eval-fraction 0 --save-every 0 --seed "$SEED" --device "$DEVICE"
SIM="sim:$OUT/simsft/final?$SIM_OPTS"

echo "== 7. controllability of the fine-tuned simulator"
stage "$OUT/control-sim" "$PY" -m zsearch_cli.train.zerosearch_mini control --sim "$SIM&seed=$SEED" \
  "${CONTROL_OPTS[@]}" --out "$OUT/control-sim"

echo "== 8. $ALGO from $MODEL against the simulator: $STEPS steps x $BATCH x G $GROUP, noise $NOISE_START -> $NOISE_END"
stage "$OUT/train" zsearch train --algo "$ALGO" --model "$MODEL" --search "$SIM" --index "$INDEX" --out "$OUT/train" \
  ${TRAIN_DATA:+--train-data "$TRAIN_DATA"} --noise-start "$NOISE_START" --noise-end "$NOISE_END" \
  --steps "$STEPS" --batch-size "$BATCH" --group-size "$GROUP" --lr "$LR" --lr-schedule cosine --warmup-ratio 0.1 \
  --min-lr-ratio 0.1 --lora-r "$LORA_R" --lora-alpha "$LORA_ALPHA" "${RUN_OPTS[@]}" \
  --save-every 1 --keep-checkpoints 2 --resume --guard ${EXTRA[@]+"${EXTRA[@]}"}

echo "== 9. after: the trained policy on the held-out questions with real BM25"
stage "$OUT/eval-heldout-after" zsearch eval --model "$OUT/train/final" "${EVAL_OPTS[@]}" --out "$OUT/eval-heldout-after"

echo "== 10. measured ($OUT/summary.json)"
REPORT_OPTS=()
if [ "$STRICT" = 1 ]; then REPORT_OPTS+=(--strict); fi
status=0
"$PY" -m zsearch_cli.train.zerosearch_mini report "$OUT" ${REPORT_OPTS[@]+"${REPORT_OPTS[@]}"} || status=$?
echo "== done: this invocation took $((SECONDS - START)) s"
exit "$status"
