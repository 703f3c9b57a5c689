"""The shipped format-warmed smollm2 adapter, ``--model smollm2-warm`` (issue 14).

smollm2 (the default model) answers in prose and never writes ``<answer>`` tags, so every
metric of docs/methods.md §1 scores it 0. The papers' models follow the action format
before RL starts (Search-R1, Jin et al. 2025; DSPO); this adapter gives smollm2 that format
warm-up: a 30-step LoRA SFT on ``zsearch warmup-data`` trajectories of the bundled train
split. ``stages/warmup.sh`` regenerates it and calls ``warm_recipe.pack``, which writes the adapter
(fp16, to keep the package small) and ``manifest.json`` beside it: the exact options, seed,
data fingerprints, zsearch version and the adapter's sha256.

Why a cache copy at load time: peft resolves ``base_model_name_or_path`` as a hub id or a
folder, and the base here is the dequantized GGUF that exists only in this user's zsearch
cache (``models/smollm2``), at a path no installed package can know in advance. The shipped
``adapter_config.json`` therefore names the alias ``smollm2`` (portable), and
:func:`warm_adapter_path` writes a copy under ``<cache>/models/smollm2-warm`` whose config
names the absolute base folder, so plain ``peft.AutoPeftModelForCausalLM.from_pretrained``
loads that copy.

The recipe's side (the manifest, packing, ``python -m zsearch_cli.models.warm_recipe``) is
in ``models/warm_recipe.py``.
"""

from __future__ import annotations

import json
import os
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from zsearch_cli.errors import ZsearchError
from zsearch_cli.files import mkdtemp_like_mkdir, sha256_file

WARM_ALIAS = "smollm2-warm"
BASE_ALIAS = "smollm2"
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"
MANIFEST = "manifest.json"
BASE_FILE = "zsearch_base.json"
"""Written beside an adapter whose config names an absolute cache folder: the alias that
folder came from, so zsearch rebuilds it when the cache is gone or on another machine."""
RECIPE_STEPS = ("index", "warmup-data", "sft")


def shipped_dir() -> Path:
    """The adapter inside the installed package: ``zsearch_cli/data/adapters/smollm2-warm``."""
    return Path(str(resources.files("zsearch_cli") / "data" / "adapters" / WARM_ALIAS))


def read_manifest(folder: Path | None = None) -> dict[str, Any]:
    path = (folder or shipped_dir()) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ZsearchError(f"{path}: the {WARM_ALIAS} manifest is missing or unreadable ({err}); reinstall zsearch") from None


def _current(target: Path, sha: str, base: str) -> bool:
    try:
        config = json.loads((target / CONFIG).read_text())
        return config.get("base_model_name_or_path") == base and sha256_file(target / WEIGHTS) == sha
    except (OSError, ValueError):
        return False


def checked_shipped_dir() -> Path:
    """:func:`shipped_dir`, once its weights are checked against the manifest's sha256 (a
    damaged install is one line): what every copy of the warm layer starts from."""
    source = shipped_dir()
    sha = read_manifest(source)["adapter"]["sha256"]
    if not (source / WEIGHTS).is_file() or sha256_file(source / WEIGHTS) != sha:
        raise ZsearchError(f"{source / WEIGHTS}: missing or not the file its manifest names; reinstall zsearch")
    return source


def warm_adapter_path(base: str, cache: Path) -> str:
    """The ``smollm2-warm`` adapter as a folder plain peft can load (built on first use):
    ``<cache>/models/smollm2-warm``, the shipped weights with the base's absolute path.
    ``base`` is the base model's folder (``loading.resolve_model_path('smollm2')``) and
    ``cache`` zsearch's cache root: passed in, so this module needs nothing from ``loading``.
    The shipped weights must match the manifest's sha256 (a damaged install is one line)."""

    source = checked_shipped_dir()
    sha = read_manifest(source)["adapter"]["sha256"]
    base = str(Path(base).resolve())
    target = cache / "models" / WARM_ALIAS
    if _current(target, sha, base):
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = mkdtemp_like_mkdir(prefix=f".{WARM_ALIAS}.tmp-", dir=target.parent)
    try:
        shutil.copyfile(source / WEIGHTS, tmp / WEIGHTS)
        shutil.copyfile(source / MANIFEST, tmp / MANIFEST)
        config = json.loads((source / CONFIG).read_text())
        config["base_model_name_or_path"] = base
        (tmp / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        (tmp / BASE_FILE).write_text(json.dumps({"base": BASE_ALIAS}) + "\n")
        shutil.rmtree(target, ignore_errors=True)  # stale: another base folder or other weights
        try:
            os.rename(tmp, target)
        except OSError:  # a concurrent first use won the rename; its copy is the same
            if not _current(target, sha, base):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
