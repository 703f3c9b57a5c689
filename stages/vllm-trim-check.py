"""Does vLLM's zsearch path import any package the stage-2 kit dropped? (docs/gpu.md, "Trimming")

    python stages/vllm-trim-check.py [--drop-list stages/vllm-0.26-gpu-drop.txt]

Imports the vLLM modules zsearch's path loads (vllm.LLM in-process, the engine core, the GPU
worker and model runner, FlashAttention's backend, the sampler, the Qwen2/Llama models, the
structured-output manager, the kernel warmup, sleep mode's allocator) and says, in one line,
whether any dropped package got imported. Exit 0: none did (modules that need a GPU driver,
`libcuda.so.1`, are skipped on a machine without one and named); 1: a dropped package was
imported, or a path module failed for a missing dropped package (put it back in the kit).
With vLLM's CUDA wheel on a CPU-only machine it checks the imports of the CUDA path; on the GPU
machine, everything. It needs no model and no GPU time worth counting (about 10 s).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The import name of each droppable distribution (PEP 503 names): what to look for in sys.modules.
MODULE_OF = {
    "numba": "numba", "mistral-common": "mistral_common", "pynvvideocodec": "PyNvVideoCodec",
    "torchcodec": "torchcodec", "flashinfer-python": "flashinfer", "nvidia-cudnn-frontend": "cudnn",
    "tilelang": "tilelang", "nvidia-cutlass-dsl": "cutlass", "quack-kernels": "quack",
    "tokenspeed-mla": "tokenspeed_mla", "humming-kernels": "humming", "outlines-core": "outlines_core",
    "lm-format-enforcer": "lmformatenforcer", "anthropic": "anthropic", "mcp": "mcp",
    "xgrammar": "xgrammar", "llguidance": "llguidance", "apache-tvm-ffi": "tvm_ffi",
}
# Left out with them (only a dropped package needs them).
ALSO = ["tokenspeed_triton", "z3", "jwt", "cryptography"]
PATH_MODULES = [
    "vllm", "vllm.entrypoints.llm", "vllm.v1.engine.llm_engine", "vllm.v1.engine.core", "vllm.v1.engine.core_client",
    "vllm.v1.executor.uniproc_executor", "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner",
    "vllm.platforms.cuda", "vllm.v1.attention.backends.flash_attn", "vllm.v1.attention.backends.fa_utils",
    "vllm.v1.attention.backends.triton_attn", "vllm.v1.attention.backends.flex_attention",
    "vllm.vllm_flash_attn.flash_attn_interface", "vllm.v1.sample.sampler", "vllm.v1.sample.ops.topk_topp_sampler",
    "vllm.model_executor.models.qwen2", "vllm.model_executor.models.llama", "vllm.model_executor.model_loader",
    "vllm.model_executor.warmup.kernel_warmup", "vllm.model_executor.kernels.linear.cute_dsl.ll_bf16",
    "vllm.v1.structured_output", "vllm.v1.core.sched.scheduler", "vllm.utils.jit_monitor",
    "vllm.compilation.backends", "vllm.device_allocator.cumem", "vllm.reasoning", "vllm.tool_parsers",
    "vllm.tokenizers.hf", "vllm.entrypoints.mcp.tool_server",
]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_drop_list(path: Path) -> list[str]:
    names = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    return [norm(n) for n in names if n]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drop-list", type=Path, default=HERE / "vllm-0.26-gpu-drop.txt")
    args = parser.parse_args()
    dropped = read_drop_list(args.drop_list)
    unknown = [d for d in dropped if d not in MODULE_OF]
    if unknown:
        print(f"vllm-trim-check: no import name known for {', '.join(unknown)}: add it to MODULE_OF", file=sys.stderr)
        return 2
    watch = [MODULE_OF[d] for d in dropped] + ALSO
    installed = [m for m in watch if importlib.util.find_spec(m) is not None]
    failed, no_driver = [], []
    for name in PATH_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as e:
            if "libcuda.so" in str(e) or "_vllm_fa" in str(e):  # no GPU driver on this machine
                no_driver.append(name)
            else:
                failed.append(f"{name}: {type(e).__name__}: {e}")
    loaded = [m for m in watch if m in sys.modules]
    missing_dropped = [f for f in failed if any(f"'{m}" in f for m in watch)]
    import vllm

    fa = sys.modules.get("vllm.vllm_flash_attn.flash_attn_interface")  # Hopper's attention: FA3, in vllm's wheel
    fa3 = "not imported" if fa is None else ("available" if getattr(fa, "FA3_AVAILABLE", False)
                                             else f"unavailable ({str(getattr(fa, 'FA3_UNAVAILABLE_REASON', ''))[:80]})")
    verdict = "ok" if not loaded and not missing_dropped else "FAIL"
    print(f"vllm-trim-check: {verdict}: vLLM {vllm.__version__}, {len(PATH_MODULES) - len(failed) - len(no_driver)}"
          f"/{len(PATH_MODULES)} path modules imported; dropped packages imported: {', '.join(loaded) or 'none'}"
          f"; FlashAttention 3 {fa3}"
          + (f"; installed here anyway: {', '.join(installed)}" if installed else "")
          + (f"; skipped without a GPU driver: {', '.join(no_driver)}" if no_driver else ""))
    for line in failed:
        print(f"  failed: {line}")
    return 0 if verdict == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
