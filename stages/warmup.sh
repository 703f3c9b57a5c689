#!/usr/bin/env bash
# Regenerate the shipped format-warmed smollm2 LoRA adapter (`--model smollm2-warm`) from
# scratch with zsearch's own stages: BM25 index of the bundled corpus, `warmup-data` (one gold
# trajectory per bundled train question: think, search, read the real results, answer), then
# a seeded 30-step LoRA `sft`. The last step packs the adapter (fp16, no tokenizer: the base's
# is the same) and writes manifest.json beside it: these exact options, the seed, the
# fingerprints of the train split and the corpus, the zsearch version and the wall time.
#
#   bash stages/warmup.sh                       # -> runs/warmup/adapter
#   DEST=src/zsearch_cli/data/adapters/smollm2-warm bash stages/warmup.sh   # refresh the shipped one
#   bash stages/warmup.sh --print-options       # the options below as JSON, nothing run
#
# The three option arrays are the recipe's one source: tests/test_warm_adapter.py compares
# the shipped manifest with `--print-options`, so editing either alone fails the test.
set -euo pipefail

INDEX_OPTS=(--kind bm25 --bm25-preset zsearch)
WARMUP_OPTS=(--model smollm2 --protocol tags --search bm25 --topk 3 --max-obs-tokens 500 --max-context-tokens 4096)
SFT_OPTS=(--model smollm2 --lora-r 16 --lora-alpha 16 --lora-targets q_proj,k_proj,v_proj,o_proj
          --lr 1e-3 --lr-schedule cosine --warmup-ratio 0.03 --max-steps 30 --batch-size 4
          --max-length 1024 --eval-fraction 0 --seed 0 --device cpu --dtype float32 --save-every 0)

PY=${PYTHON:-python}
if [[ "${1:-}" == "--print-options" ]]; then
  "$PY" -m zsearch_cli.models.warm_recipe options --index "${INDEX_OPTS[*]}" --warmup-data "${WARMUP_OPTS[*]}" --sft "${SFT_OPTS[*]}"
  exit 0
fi

OUT=${OUT:-runs/warmup}
DEST=${DEST:-$OUT/adapter}
TRAIN=$("$PY" -c 'from zsearch_cli.data.demo import demo_path; print(demo_path("train"))')
# fp32 CPU training is deterministic for a fixed thread count; the manifest records it.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

START=$(date +%s)
echo "== 1. BM25 index of the bundled corpus -> $OUT/index"
zsearch index --out "$OUT/index" "${INDEX_OPTS[@]}"
echo "== 2. gold trajectories for the bundled train split -> $OUT/trajectories.parquet"
zsearch warmup-data "$TRAIN" --index "$OUT/index" --out "$OUT/trajectories.parquet" "${WARMUP_OPTS[@]}"
echo "== 3. LoRA SFT (seeded) -> $OUT/sft"
zsearch sft "$OUT/trajectories.parquet" --out "$OUT/sft" "${SFT_OPTS[@]}"
END=$(date +%s)
echo "== 4. pack the adapter and its manifest -> $DEST"
"$PY" -m zsearch_cli.models.warm_recipe pack --adapter "$OUT/sft/final" --dest "$DEST" \
  --index-dir "$OUT/index" --train "$TRAIN" --trajectories "$OUT/trajectories.parquet" \
  --wall-s $((END - START)) --threads "$OMP_NUM_THREADS" \
  --index "${INDEX_OPTS[*]}" --warmup-data "${WARMUP_OPTS[*]}" --sft "${SFT_OPTS[*]}"
