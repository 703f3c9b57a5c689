#!/usr/bin/env bash
# DSPO recipe: index -> RL train (GSPO loss + dynamic filtering, subEM) -> evaluate the result.
# Defaults run on a CPU in minutes: bundled demo corpus and train split, the embedded smollm2,
# LoRA, a few short steps. For the paper's setting on a GPU change the variables, e.g.
#   MODEL=Qwen/Qwen2.5-3B CORPUS=wiki-18.jsonl TRAIN_DATA=nq_hotpotqa_train.parquet \
#   STEPS=500 BATCH=512 TURN_TOKENS=500 LORA_R=0 DEVICE=cuda DATASETS=all bash stages/dspo.sh
# (multi-GPU: LAUNCH="accelerate launch --config_file stages/accelerate/ddp.yaml").
set -euo pipefail

OUT=${OUT:-runs/dspo}
CORPUS=${CORPUS:-}                  # empty = the bundled demo corpus
INDEX=${INDEX:-$OUT/index}
MODEL=${MODEL:-smollm2}
TRAIN_DATA=${TRAIN_DATA:-}          # empty = the bundled demo train split
ALGO=${ALGO:-dspo}                  # dspo, or the ablations dspo-nofilter / dspo-token
MAX_GEN_BATCHES=${MAX_GEN_BATCHES:-3}  # generation batches per step to find BATCH mixed groups
STEPS=${STEPS:-4}
BATCH=${BATCH:-4}
GROUP=${GROUP:-5}                   # G responses per question
MAX_TURNS=${MAX_TURNS:-4}
TURN_TOKENS=${TURN_TOKENS:-64}
LORA_R=${LORA_R:-16}
LR=${LR:-}                          # empty = the algorithm's 1e-6
DEVICE=${DEVICE:-auto}
DATASETS=${DATASETS:-demo}
EVAL_LIMIT=${EVAL_LIMIT:-8}
LAUNCH=${LAUNCH:-}                  # e.g. "accelerate launch --config_file stages/accelerate/ddp.yaml"

echo "== 1. index (BM25)"
if [ ! -e "$INDEX/manifest.json" ]; then
  zsearch index ${CORPUS:+"$CORPUS"} --out "$INDEX" --kind bm25
fi

echo "== 2. train $MODEL with --preset dspo --algo $ALGO for $STEPS steps"
ZSEARCH=$(command -v zsearch)
$LAUNCH "$ZSEARCH" train --preset dspo --algo "$ALGO" --max-gen-batches "$MAX_GEN_BATCHES" --model "$MODEL" --index "$INDEX" --out "$OUT/train" \
  --steps "$STEPS" --batch-size "$BATCH" --group-size "$GROUP" --max-turns "$MAX_TURNS" \
  --max-turn-tokens "$TURN_TOKENS" --lora-r "$LORA_R" --device "$DEVICE" \
  ${TRAIN_DATA:+--train-data "$TRAIN_DATA"} ${LR:+--lr "$LR"} --save-every "$STEPS" --resume

echo "== 3. evaluate the trained model ($DATASETS)"
zsearch eval --model "$OUT/train/final" --index "$INDEX" --datasets "$DATASETS" --limit "$EVAL_LIMIT" \
  --max-turns "$MAX_TURNS" --max-turn-tokens "$TURN_TOKENS" --device "$DEVICE" --out "$OUT/eval"
zsearch plot "$OUT/train"
echo "== done: model $OUT/train/final, metrics $OUT/train/metrics.parquet, eval $OUT/eval"
