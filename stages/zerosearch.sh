#!/usr/bin/env bash
# ZeroSearch recipe (Sun et al. 2025): RL without a search engine, on an LLM that simulates one.
#   1. index    a real corpus (BM25)                                   zsearch index
#   2. collect  agent trajectories against that real engine             zsearch collect
#   3. judge    label each query's documents useful / noisy             zsearch judge
#   4. simsft   fine-tune the simulator on the judged query-documents   zsearch simsft
#   5. (GPU, optional) serve the simulator with vLLM, see below
#   6. train    REINFORCE on the simulator, curriculum noise p_s -> p_e  zsearch train --preset zerosearch
#   7. eval     the trained policy against the REAL engine              zsearch eval
#
# Defaults are CPU-sized: the bundled demo corpus and train split, the embedded smollm2,
# LoRA, a few short steps. Every path and size is a variable (override from the
# environment). Two models must be able to do their job for the chain to complete: the
# collecting agent must search (smollm2 was never trained to: expect about one query row
# per 30 trajectories; use a model that writes <search> tags, e.g. a Qwen2.5 instruct model,
# or smollm2 after a format warm-up with `zsearch sft`), and the judge must follow the
# verdict format (below). tests/test_zerosearch_chain.py runs this script on tiny CPU models
# with a warmed-up policy and a format-following judge endpoint.
#
# The judge: the labels are only as good as the judge, and it must answer "Verdict: yes|no"
# (unparseable verdicts are recorded, never guessed, and the simulator skips those rows).
# The default is a local model through --judge-model, smollm2, which is too small: it
# answers in prose, so no row gets a label and the script stops at step 4 with a hint
# (made to give a verdict with `zsearch judge --prefill-verdict`, it says "no" to everything:
# stages/zerosearch-mini.sh). On CPU, JUDGE_MODEL=rule:answer (a gold answer in the documents)
# stands in for a large judge. Use a
# real instruct model, locally (JUDGE_MODEL=Qwen/Qwen2.5-7B-Instruct DEVICE=cuda) or behind
# an OpenAI-compatible endpoint (JUDGE_URL=http://127.0.0.1:8002/v1 JUDGE_MODEL=<served name>,
# key in $OPENAI_API_KEY; e.g. `vllm serve Qwen/Qwen2.5-7B-Instruct --port 8002`).
#
# The paper's setting on a GPU (Qwen-2.5-3B policy, 3B simulator, 0 -> 0.25 noise):
#   MODEL=Qwen/Qwen2.5-3B SIM_MODEL=Qwen/Qwen2.5-3B-Instruct JUDGE_URL=http://127.0.0.1:8002/v1 \
#   JUDGE_MODEL=Qwen/Qwen2.5-7B-Instruct CORPUS=wiki-18.jsonl TRAIN_DATA=nq_hotpotqa_train.parquet \
#   COLLECT_DATA=nq_hotpotqa_train.parquet COLLECT_LIMIT=20000 SAMPLES=5 SIM_STEPS=2000 SIM_LR=1e-6 \
#   STEPS=200 BATCH=64 GROUP=5 TURN_TOKENS=500 LORA_R=0 DEVICE=cuda DATASETS=all EVAL_LIMIT=1000000 \
#   bash stages/zerosearch.sh
# (7B: NOISE_END=0.75; LLaMA-3.2-3B: NOISE_START=0.25 NOISE_END=0.5. Multi-GPU training:
# LAUNCH="accelerate launch --config_file stages/accelerate/ddp.yaml".)
#
# Step 5, serving the simulator (GPU): in-process `sim:` generation shares the GPU with the
# policy and is slow; for throughput serve it and point SIM at the server, e.g.
#   vllm serve "$OUT/simsft/final" --port 8001 &      # (LoRA simsft: "$OUT/simsft/final/merged")
#   SIM=sim+http://127.0.0.1:8001/v1 bash stages/zerosearch.sh
set -euo pipefail

OUT=${OUT:-runs/zerosearch}
CORPUS=${CORPUS:-}                  # empty = the bundled demo corpus
INDEX=${INDEX:-$OUT/index}
MODEL=${MODEL:-smollm2}             # the policy (paper: Qwen2.5-3B/7B, LLaMA-3.2-3B)
COLLECT_MODEL=${COLLECT_MODEL:-$MODEL}  # the agent whose searches become the simulator's data
SIM_MODEL=${SIM_MODEL:-smollm2}     # the simulator to fine-tune (paper: Qwen2.5-3B/7B/14B-Instruct)
JUDGE_MODEL=${JUDGE_MODEL:-smollm2} # a local judge, or the endpoint's model name with JUDGE_URL
JUDGE_URL=${JUDGE_URL:-}            # an OpenAI-compatible API root, e.g. http://127.0.0.1:8002/v1
COLLECT_DATA=${COLLECT_DATA:-}      # empty = the bundled demo train split
TRAIN_DATA=${TRAIN_DATA:-}          # empty = the bundled demo train split
COLLECT_LIMIT=${COLLECT_LIMIT:-16}  # questions to collect trajectories for
SAMPLES=${SAMPLES:-2}               # trajectories per question (diverse queries at temperature 1)
TOPK=${TOPK:-5}                     # documents per search: the simulator writes five
SIM_STEPS=${SIM_STEPS:-20}
SIM_LR=${SIM_LR:-1e-5}              # paper: 1e-6 over its full data set
SIM_MAX_TOKENS=${SIM_MAX_TOKENS:-320}  # simulator tokens per call (five ~30-word documents)
NOISE_START=${NOISE_START:-0}       # p_s (paper: 0 for Qwen-2.5)
NOISE_END=${NOISE_END:-0.25}        # p_e (paper: 3B 0.25, 7B 0.75)
STEPS=${STEPS:-4}
BATCH=${BATCH:-4}
GROUP=${GROUP:-5}                   # G, responses per question
TURN_TOKENS=${TURN_TOKENS:-64}
MAX_TURNS=${MAX_TURNS:-5}
LORA_R=${LORA_R:-16}
LR=${LR:-}                          # empty = the preset's 1e-6
VAL_DATA=${VAL_DATA:-}              # a QA file to validate on during training (real BM25 search)
VAL_LIMIT=${VAL_LIMIT:-16}
VAL_EVERY=${VAL_EVERY:-50}
DEVICE=${DEVICE:-auto}
DATASETS=${DATASETS:-demo}
EVAL_LIMIT=${EVAL_LIMIT:-8}
LAUNCH=${LAUNCH:-}                  # e.g. "accelerate launch --config_file stages/accelerate/ddp.yaml"
# the simulator spec: in-process by default, or SIM=sim+http://HOST:PORT/v1 (step 5)
SIM=${SIM:-"sim:$OUT/simsft/final?max_tokens=$SIM_MAX_TOKENS&device=$DEVICE"}

echo "== 1. index (BM25)"
if [ ! -e "$INDEX/manifest.json" ]; then
  zsearch index ${CORPUS:+"$CORPUS"} --out "$INDEX" --kind bm25
fi

echo "== 2. collect: $COLLECT_MODEL searches the real index ($COLLECT_LIMIT questions x $SAMPLES)"
zsearch collect --model "$COLLECT_MODEL" --search bm25 --index "$INDEX" --out "$OUT/collect" \
  --limit "$COLLECT_LIMIT" --samples-per-question "$SAMPLES" --topk "$TOPK" --max-turns "$MAX_TURNS" \
  --max-turn-tokens "$TURN_TOKENS" --device "$DEVICE" ${COLLECT_DATA:+--data "$COLLECT_DATA"}

# A policy that never searched leaves no query to judge: stop here, saying why, rather than
# fail in the judge (or fine-tune the simulator on nothing).
PY=$(command -v python || command -v python3)
QUERIES=$("$PY" -c 'import sys, pyarrow.parquet as pq; print(pq.ParquetFile(sys.argv[1]).metadata.num_rows)' \
  "$OUT/collect/queries.parquet" 2>/dev/null || echo unknown)
if [ "$QUERIES" = 0 ]; then
  echo "error: $OUT/collect/queries.parquet holds no query: $COLLECT_MODEL never searched in" \
       "$COLLECT_LIMIT questions x $SAMPLES samples; use a warmed-up policy (COLLECT_MODEL=smollm2-warm)" \
       "or more questions (COLLECT_LIMIT)" >&2
  exit 1
fi

echo "== 3. judge the $QUERIES collected queries with $JUDGE_MODEL ${JUDGE_URL:+at $JUDGE_URL}"
zsearch judge "$OUT/collect/queries.parquet" --judge-model "$JUDGE_MODEL" ${JUDGE_URL:+--judge-url "$JUDGE_URL"} \
  --out "$OUT/judge" --device "$DEVICE"

echo "== 4. simsft: fine-tune the simulator $SIM_MODEL ($SIM_STEPS steps)"
if [ ! -e "$OUT/simsft/final" ]; then
  if ! zsearch simsft "$OUT/judge/judgments.parquet" --model "$SIM_MODEL" --out "$OUT/simsft" \
      --max-steps "$SIM_STEPS" --lr "$SIM_LR" --device "$DEVICE" --save-every 0; then
    echo "simsft failed. 'no usable rows' means: either the judge ($JUDGE_MODEL) did not answer" \
         "'Verdict: yes|no' (use JUDGE_MODEL=Qwen/Qwen2.5-7B-Instruct DEVICE=cuda, or JUDGE_URL=http://HOST:PORT/v1" \
         "JUDGE_MODEL=NAME), or $COLLECT_MODEL hardly searched in step 2 (use COLLECT_MODEL=a model that writes" \
         "<search> tags, e.g. a Qwen2.5 instruct model or one warmed up with \`zsearch sft\`); then re-run." >&2
    exit 1
  fi
fi

# == 5. (GPU) serve the simulator for throughput, then re-run with SIM=sim+http://127.0.0.1:8001/v1:
# vllm serve "$OUT/simsft/final" --port 8001 &

echo "== 6. train $MODEL with --preset zerosearch on $SIM (noise $NOISE_START -> $NOISE_END)"
ZSEARCH=$(command -v zsearch)
$LAUNCH "$ZSEARCH" train --preset zerosearch --model "$MODEL" --search "$SIM" --index "$INDEX" --out "$OUT/train" \
  --noise-start "$NOISE_START" --noise-end "$NOISE_END" --steps "$STEPS" --batch-size "$BATCH" -G "$GROUP" \
  --topk "$TOPK" --max-turns "$MAX_TURNS" --max-turn-tokens "$TURN_TOKENS" --lora-r "$LORA_R" --device "$DEVICE" \
  ${TRAIN_DATA:+--train-data "$TRAIN_DATA"} ${LR:+--lr "$LR"} \
  ${VAL_DATA:+--val-data "$VAL_DATA" --val-limit "$VAL_LIMIT" --val-every "$VAL_EVERY"} --save-every "$STEPS" --resume

echo "== 7. evaluate the trained model with the real engine ($DATASETS)"
zsearch eval --model "$OUT/train/final" --search bm25 --index "$INDEX" --datasets "$DATASETS" --limit "$EVAL_LIMIT" \
  --topk "$TOPK" --max-turns "$MAX_TURNS" --max-turn-tokens "$TURN_TOKENS" --device "$DEVICE" --out "$OUT/eval"
zsearch plot "$OUT/train"
echo "== done: simulator $OUT/simsft/final, model $OUT/train/final, metrics $OUT/train/metrics.parquet, eval $OUT/eval"
