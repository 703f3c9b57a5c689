#!/usr/bin/env bash
# The first thing to run on a GPU machine: does the vLLM path work here, and what does a step cost?
#   1. index the bundled demo corpus (BM25);
#   2. zsearch eval --backend vllm on Qwen2.5-0.5B-Instruct (greedy, a few demo questions);
#   3. 2 GRPO steps with --backend vllm (rollouts in vLLM, the weight sync after each update);
#   4. the step-time breakdown (rollout, reward, update, weight sync), the probe check of each
#      sync, and peak GPU memory.
# Needs the CUDA build: pip install torch==2.13.0 (CUDA wheel) and pip install -e '.[gpu]' (see
# README, "GPU"). MODEL may be an HF id or a local folder (offline machines):
#   MODEL=/models/Qwen2.5-0.5B-Instruct bash stages/gpu-smoke.sh
# NOT run in CI (no GPU there): the same code paths run on vLLM's CPU build in make test.
set -euo pipefail

OUT=${OUT:-runs/gpu-smoke}
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
INDEX=${INDEX:-$OUT/index}
EVAL_LIMIT=${EVAL_LIMIT:-8}
STEPS=${STEPS:-2}
BATCH=${BATCH:-4}
GROUP=${GROUP:-5}
TURN_TOKENS=${TURN_TOKENS:-256}
PY=${PY:-python}

$PY - <<'PYEOF'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu-smoke: no CUDA GPU visible to torch (torch.cuda.is_available() is False); "
             "on a CPU-only machine run make test, which covers the vLLM path on vLLM's CPU build")
from vllm.platforms import current_platform
print(f"torch {torch.__version__}, GPU {torch.cuda.get_device_name(0)}, vLLM platform {current_platform.device_type}")
PYEOF

echo "== 1. index (BM25, bundled demo corpus)"
if [ ! -e "$INDEX/manifest.json" ]; then
  zsearch index --out "$INDEX" --kind bm25
fi

echo "== 2. eval --backend vllm ($MODEL, $EVAL_LIMIT questions, greedy)"
zsearch eval --model "$MODEL" --backend vllm --index "$INDEX" --limit "$EVAL_LIMIT" \
  --max-turn-tokens "$TURN_TOKENS" --out "$OUT/eval"

echo "== 3. $STEPS GRPO steps --backend vllm"
rm -rf "$OUT/train"
# In this shell's python, not a subprocess, so torch's peak-memory counters see the trainer and
# the in-process vLLM engine together (vLLM allocates through torch's CUDA allocator).
$PY - "$MODEL" "$INDEX" "$STEPS" "$BATCH" "$GROUP" "$TURN_TOKENS" "$OUT/train" <<'PYEOF'
import sys, torch
from zsearch_cli.cli import app
model, index, steps, batch, group, turn_tokens, out = sys.argv[1:]
try:
    app(["train", "--algo", "grpo", "--model", model, "--backend", "vllm", "--index", index, "--steps", steps,
         "--batch-size", batch, "-G", group, "--max-turn-tokens", turn_tokens, "--save-every", "0", "--out", out,
         "--device", "cuda"], standalone_mode=False)
finally:
    gib = 2**30
    print(f"peak GPU memory (trainer + vLLM engine, one process): allocated "
          f"{torch.cuda.max_memory_allocated() / gib:.2f} GiB, reserved {torch.cuda.max_memory_reserved() / gib:.2f} GiB "
          f"of {torch.cuda.get_device_properties(0).total_memory / gib:.1f} GiB")
PYEOF

echo "== 4. step-time breakdown"
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
echo "gpu-smoke: done ($OUT)"
