"""Pick and build a generation backend for a model: HF transformers or vLLM.

Above ``loading`` (which loads weights and tokenizers) and the backends (``hf``, ``vllm``),
so that neither needs the other: each backend imports ``loading``, and only this module
imports the backends, lazily (vLLM is heavy and optional).
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.loading import is_lora_checkpoint, load_model, loadable_model_path, merged_lora_dir

if TYPE_CHECKING:
    from zsearch_cli.models.base import GenerationBackend


def vllm_available() -> bool:
    """vLLM importable and a CUDA device present (checked without importing vLLM)."""
    import torch

    return importlib.util.find_spec("vllm") is not None and torch.cuda.is_available()


def load_backend(
    name_or_path: str,
    backend: str = "auto",
    device: str = "auto",
    dtype: str = "auto",
    **vllm_kwargs: Any,
) -> "GenerationBackend":
    """A generation backend for a model: ``hf``, ``vllm``, or ``auto`` (vLLM when it is
    installed and CUDA is available, else HF). ``vllm_kwargs`` go to ``vllm.LLM``."""
    if backend == "auto":
        backend = "vllm" if vllm_available() else "hf"
    if backend == "hf":
        from zsearch_cli.models.hf import HFBackend

        model, tokenizer = load_model(name_or_path, device=device, dtype=dtype)
        return HFBackend(model, tokenizer)
    if backend == "vllm":
        from zsearch_cli.models.vllm import VLLMBackend

        path = loadable_model_path(name_or_path)
        if is_lora_checkpoint(path):
            name_or_path = merged_lora_dir(path)
        return VLLMBackend(name_or_path, dtype=dtype, **vllm_kwargs)
    raise ZsearchError(f"unknown backend '{backend}': use hf, vllm or auto")
