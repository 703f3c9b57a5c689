"""The real vLLM engine (CPU build, ``.venv-vllm``): fixtures for ``tests/vllm``.

``make test`` runs this folder in its own pytest process with the ``.venv-vllm`` python
(``make test-vllm``): the in-process engine changes process-wide state (thread count, RNG
seeds, ``torch.distributed``), so it must not share a process with the main suite. Outside
that venv (no vLLM) the folder is skipped with a reason; ``make test`` never lands there.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]  # the main venv has no vLLM: make test-vllm runs these

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; unset, the KV cache takes half of RAM
os.environ.setdefault("VLLM_CPU_CI_ENV", "1")  # start-up in seconds
MAX_MODEL_LEN = 1024


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.vllm)


@pytest.fixture(scope="session")
def vllm_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen2 vLLM's CPU attention accepts (head_dim 32; the main suite's has 16)."""
    from zsearch_cli.models.tiny import VLLM_CPU_HEADS, make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("vllm_tiny"), seed=0, **VLLM_CPU_HEADS)


@pytest.fixture(scope="session")
def hf_tiny(vllm_tiny_dir: Path) -> Any:
    """The HF backend over the same folder: the reference every engine output is held to."""
    from zsearch_cli.models.factory import load_backend

    return load_backend(str(vllm_tiny_dir), backend="hf", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def engine(vllm_tiny_dir: Path) -> Iterator[Any]:
    """One in-process vLLM engine per test module (closed after it: modules that train or run
    the CLI start their own)."""
    from zsearch_cli.models.vllm import VLLMBackend

    backend = VLLMBackend(str(vllm_tiny_dir), seed=0, max_model_len=MAX_MODEL_LEN)
    yield backend
    backend.close()
