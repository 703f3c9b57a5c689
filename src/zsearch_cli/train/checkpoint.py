"""Checkpoints that resume a run exactly: OUT/checkpoints/step-N (N = steps completed).

A checkpoint is an HF model folder (full weights as safetensors, or a peft adapter) plus:

- ``optimizer.pt``, ``scheduler.pt``; PPO adds ``critic.safetensors`` (its trainable
  weights: everything, or LoRA + value head), ``critic_optimizer.pt``, ``critic_scheduler.pt``;
- ``rng.pt``: torch's CPU (and CUDA) generator states;
- ``trainer_state.json``: step, the data cursor, python and numpy RNG states, the sampling
  seed, the resolved config and every metric row so far.

Writes are atomic: everything goes into a hidden temp folder that is renamed to
``step-N`` only when complete, so a process killed mid-save leaves no half checkpoint
(a stale ``.step-N.tmp-*`` folder is ignored and removed by the next save). Only the newest
``keep`` checkpoints are kept.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "trainer_state.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def checkpoints(out: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under OUT/checkpoints, oldest first."""
    root = Path(out) / "checkpoints"
    found = []
    if root.is_dir():
        for p in root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and (p / STATE_FILE).is_file():
                found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(out: Path) -> Path | None:
    found = checkpoints(out)
    return found[-1][1] if found else None


def rng_state() -> tuple[dict[str, Any], dict[str, Any]]:
    """(JSON-able python/numpy states, torch states) of every global generator."""
    py = random.getstate()
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    json_part = {"python": [py[0], list(py[1]), py[2]],
                 "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(gauss)]}
    torch_part: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        torch_part["cuda"] = torch.cuda.get_rng_state_all()
    return json_part, torch_part


def set_rng_state(json_part: dict[str, Any], torch_part: dict[str, Any]) -> None:
    py = json_part["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, keys, pos, has_gauss, gauss = json_part["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(torch_part["cpu"])
    if "cuda" in torch_part and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(torch_part["cuda"])


def atomic_dir(target: Path, write: Any) -> Path:
    """Call ``write(tmp_dir)`` then rename ``tmp_dir`` to ``target`` (replacing it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        tmp.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def save_checkpoint(trainer: Any, completed: int) -> Path:
    """Write OUT/checkpoints/step-``completed`` for ``trainer`` and prune old ones."""
    from safetensors.torch import save_file

    from zsearch_cli.train.models import save_policy, trainable_state

    out = Path(trainer.cfg.out)
    acc = trainer.accelerator

    def write(tmp: Path) -> None:
        save_policy(acc.unwrap_model(trainer.policy), trainer.tokenizer, tmp, trainer.cfg.model)
        torch.save(trainer.optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(trainer.scheduler.state_dict(), tmp / "scheduler.pt")
        if trainer.critic is not None:
            save_file(trainable_state(acc.unwrap_model(trainer.critic)), str(tmp / "critic.safetensors"))
            torch.save(trainer.critic_optimizer.state_dict(), tmp / "critic_optimizer.pt")
            torch.save(trainer.critic_scheduler.state_dict(), tmp / "critic_scheduler.pt")
        json_rng, torch_rng = rng_state()
        torch.save(torch_rng, tmp / "rng.pt")
        state = {
            "step": completed,
            "data": trainer.data.state(),
            "rng": json_rng,
            "sampling": {"seed": trainer.cfg.seed, "next_step": completed},
            "config": trainer.cfg.to_dict(),
            "metrics": trainer.metrics.rows,
        }
        (tmp / STATE_FILE).write_text(json.dumps(state, default=str) + "\n")

    root = out / "checkpoints"
    for stale in root.glob(".step-*.tmp-*") if root.is_dir() else []:
        shutil.rmtree(stale, ignore_errors=True)  # left by a process killed mid-save
    path = atomic_dir(root / f"step-{completed}", write)
    for _, old in checkpoints(out)[: -trainer.cfg.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def read_state(path: Path) -> dict[str, Any]:
    return json.loads((path / STATE_FILE).read_text())


def load_training_state(trainer: Any, path: Path) -> dict[str, Any]:
    """Restore optimizer(s), scheduler(s), critic, RNGs and the data cursor from ``path``
    (the policy weights were already loaded from it); returns the trainer state dict."""
    from safetensors.torch import load_file

    state = read_state(path)
    acc = trainer.accelerator
    trainer.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    trainer.scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    if trainer.critic is not None:
        missing = acc.unwrap_model(trainer.critic).load_state_dict(load_file(str(path / "critic.safetensors")), strict=False)
        if missing.unexpected_keys:
            raise RuntimeError(f"{path}: critic checkpoint has unknown weights {missing.unexpected_keys[:3]}")
        trainer.critic_optimizer.load_state_dict(torch.load(path / "critic_optimizer.pt", weights_only=True))
        trainer.critic_scheduler.load_state_dict(torch.load(path / "critic_scheduler.pt", weights_only=True))
    set_rng_state(state["rng"], torch.load(path / "rng.pt", weights_only=True))
    trainer.data.load_state(state["data"])
    return state
