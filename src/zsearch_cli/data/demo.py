"""Paths of the bundled demo data (written by the zsearch authors; see data/demo/README.md)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from zsearch_cli.errors import ZsearchError

_DEMO = resources.files("zsearch_cli") / "data" / "demo"


def demo_path(name: str) -> Path:
    """``corpus``, ``train`` or ``test`` -> the bundled jsonl file."""
    path = Path(str(_DEMO / f"{name}.jsonl"))
    if not path.is_file():
        raise ZsearchError(f"bundled demo file '{name}' is missing from the install ({path})")
    return path


def demo_corpus() -> Path:
    return demo_path("corpus")


def demo_qa(split: str = "test") -> Path:
    if split not in ("train", "test"):
        raise ZsearchError(f"demo QA split must be 'train' or 'test', got {split!r}")
    return demo_path(split)
