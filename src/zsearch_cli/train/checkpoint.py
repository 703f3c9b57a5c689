"""Checkpoints that resume a run exactly: OUT/checkpoints/step-N (N = steps completed).

A checkpoint is an HF model folder (full weights as safetensors, or a peft adapter) plus:

- ``optimizer.pt``, ``scheduler.pt``; PPO adds ``critic.safetensors`` (its trainable
  weights: everything, or LoRA + value head), ``critic_optimizer.pt``, ``critic_scheduler.pt``;
- ``rng.pt``: torch's CPU (and CUDA) generator states (of process 0); with several
  processes ``ranks.pt`` holds every process's python, numpy and torch states and data
  cursor, and each process restores its own;
- ``trainer_state.json``: step, the data cursor, python and numpy RNG states, the sampling
  seed, the resolved config, how the run was distributed and every metric row so far.

Writes are atomic: everything goes into a hidden temp folder that is renamed to
``step-N`` only when complete, so a process killed mid-save leaves no half checkpoint
(a stale ``.step-N.tmp-*`` folder is ignored and removed by the next save). Only the newest
``keep`` checkpoints are kept, and besides them (``--on-collapse rollback``, train/stability.py)
the newest ``keep_healthy`` ones marked healthy (a file ``healthy`` in the folder, written by
the collapse guard once the steps after it raised no event) and those awaiting that verdict.
``trainer_state.json`` also holds the collapse guard's state (``guard``), so a resume keeps
its baseline.

**Completeness.** The last file written is ``zsearch-manifest.json``: every other file's size, and
the SHA-256 of each pickle (``*.pt``), with an HMAC of the whole made with a per-user key
(``$ZSEARCH_CACHE/checkpoint.key``). A folder is *complete* when its manifest is there and
every file it lists has its recorded size (safetensors files are also checked to be whole
from their own header). ``--resume`` takes the newest complete checkpoint and says which
newer ones it skipped and why; with none complete it stops with one line naming the file.
A checkpoint written before manifests existed counts as complete when its required files
are there and its safetensors are whole.

**Loading.** Everything is read with safetensors or ``torch.load(weights_only=True)``,
except DeepSpeed's ZeRO partitions: they hold DeepSpeed objects (its loss scaler), which
``weights_only`` refuses. Those are unpickled fully only when the file's SHA-256 matches a
manifest whose HMAC verifies with this user's key, i.e. a file a zsearch run of this user
wrote. A checkpoint from elsewhere under DeepSpeed is refused with one line.

Several processes (``accelerate launch``): every process calls :func:`save_checkpoint`,
because under FSDP and DeepSpeed ZeRO-3 each holds only a shard of the weights and of the
optimizer state, and gathering them is a collective; the main process alone writes, and all
wait at a barrier until the folder exists. What a checkpoint holds per distribution:

- one process or DDP: everything above; ``--resume`` continues exactly.
- FSDP (1 or 2): the full weights and the full optimizer state, gathered to the main process
  (``get_optimizer_state_dict(full_state_dict=True)``, keyed by parameter name) and sharded
  again on resume, with any number of processes.
- DeepSpeed: the weights consolidated by ``zero3_save_16bit_model`` (16-bit under bf16), and
  as optimizer state every process's ZeRO partition (fp32 master weights and Adam moments),
  gathered to the main process: ``--resume`` restores each process's own partition, so it
  needs DeepSpeed with the same number of processes (DeepSpeed's own rule for its "rigid"
  checkpoints).

A resume under another distribution than the checkpoint's is refused with one line: the
optimizer layouts differ (parameter index, parameter name, ZeRO partitions).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Collection

import numpy as np
import torch

from zsearch_cli.errors import ZsearchError
from zsearch_cli.train.config import TrainConfig
from zsearch_cli.train.distributed import distribution
from zsearch_cli.train.integrity import (MANIFEST, _first_line, checkpoint_problem, load_pickle,  # noqa: F401
                                         trusted_pickle, write_manifest)

STATE_FILE = "trainer_state.json"
RANKS_FILE = "ranks.pt"
METRICS_FORMAT = 2
"""The metric rows a checkpoint carries: 2 = steps counted from 1 and ``namespace/name``
metric names (schemas.METRIC_COLUMNS). Checkpoints without it (format 1: steps from 0, flat
names) are refused on resume in one line rather than mixing the two in one metrics file."""
_STEP_DIR = re.compile(r"^step-(\d+)$")


def _step_dirs(out: Path) -> list[tuple[int, Path]]:
    """Every ``step-N`` folder under OUT/checkpoints, complete or not, oldest first."""
    root = Path(out) / "checkpoints"
    found = []
    if root.is_dir():
        for p in root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir():
                found.append((int(m.group(1)), p))
    return sorted(found)


def checkpoints(out: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under OUT/checkpoints, oldest first. Pruning to ``keep`` counts
    these only, so a damaged newer folder never pushes the last good one out."""
    return [(n, p) for n, p in _step_dirs(out) if checkpoint_problem(p) is None]


def latest_checkpoint(out: Path, note: Callable[[str], None] | None = None) -> Path | None:
    """The newest *complete* checkpoint under OUT/checkpoints (see the module docstring).

    Newer incomplete ones are skipped, and ``note`` (default: a yellow line on stderr from
    the main process) says which and why. None when there are no checkpoints; a
    :class:`ZsearchError` naming the damaged file when there are some but none is complete."""
    found = _step_dirs(out)
    skipped: list[str] = []
    for _, path in reversed(found):
        problem = checkpoint_problem(path)
        if problem is None:
            if skipped:
                (note or _note)(f"--resume: skipping {'; '.join(skipped)}; using {path.name}, the newest complete "
                                "checkpoint")
            return path
        skipped.append(f"{path.name} ({problem})")
    if found:
        raise ZsearchError(f"{found[-1][1]}: {checkpoint_problem(found[-1][1])}; no complete checkpoint in "
                           f"{Path(out) / 'checkpoints'} to resume from (move the damaged ones away to start over)")
    return None


def _note(text: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        from rich.console import Console

        Console(stderr=True).print(f"[yellow]{text}[/]", soft_wrap=True, highlight=False)


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
    """Call ``write(tmp_dir)``, write its :data:`MANIFEST` last, then rename ``tmp_dir`` to
    ``target`` (replacing it). The folder gets the mode a ``mkdir`` would (the umask's)."""
    from zsearch_cli.files import replace_folder

    def write_all(tmp: Path) -> None:
        write(tmp)
        write_manifest(tmp)

    return replace_folder(target, write_all)  # the folder rule (files.py)


# ---------------------------------------------------------------- distributed state


def full_model_state(acc: Any, model: Any) -> dict[str, torch.Tensor] | None:
    """The whole model's state dict on the main process, None on the others. A collective
    under FSDP and ZeRO-3 (the shards are gathered): call it on every process."""
    state = acc.get_state_dict(model)
    return state if acc.is_main_process else None


def _raw_optimizer(optimizer: Any) -> Any:
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps it


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def _gather_to_main(acc: Any, obj: Any) -> list[Any] | None:
    """Every process's ``obj``, in rank order, on the main process only (None elsewhere)."""
    if acc.num_processes == 1:
        return [obj]
    import torch.distributed as dist

    parts: list[Any] | None = [None] * acc.num_processes if acc.is_main_process else None
    dist.gather_object(_to_cpu(obj), parts, dst=0)
    return parts


def full_optimizer_state(acc: Any, model: Any, optimizer: Any) -> dict[str, Any] | None:
    """The optimizer state to save, on the main process (None elsewhere). A collective under
    FSDP and DeepSpeed: call it on every process."""
    kind = distribution(acc)
    if kind == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # full on rank 0, empty elsewhere
        state = get_optimizer_state_dict(model, _raw_optimizer(optimizer), options=options)
        return state if acc.is_main_process else None
    if kind == "deepspeed":
        # the ZeRO optimizer's state_dict() is this process's partition only
        parts = _gather_to_main(acc, _raw_optimizer(optimizer).state_dict())
        return {"zero_partitions": parts} if parts is not None else None
    return optimizer.state_dict() if acc.is_main_process else None


def load_optimizer_state(acc: Any, model: Any, optimizer: Any, path: Path) -> None:
    """Load what :func:`full_optimizer_state` saved: under FSDP every process reads the full
    state and keeps its own shard; under DeepSpeed each takes its own ZeRO partition."""
    kind = distribution(acc)
    state = load_pickle(path, trusted_objects=kind == "deepspeed")  # ZeRO partitions hold DeepSpeed objects
    if kind == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, _raw_optimizer(optimizer), state,
                                 options=StateDictOptions(full_state_dict=True))
    elif kind == "deepspeed":
        _raw_optimizer(optimizer).load_state_dict(state["zero_partitions"], load_optimizer_states=True,
                                                  load_from_fp32_weights=True)
    else:
        optimizer.load_state_dict(state)


def process_states(acc: Any, data: Any) -> list[dict[str, Any]] | None:
    """Every process's RNG states and data cursor, in rank order, on the main process (None
    elsewhere; a collective with several): each process's RNG streams and, under DSPO, how
    many batches it drew are its own."""
    json_rng, torch_rng = rng_state()
    return _gather_to_main(acc, {"rng": json_rng, "torch_rng": torch_rng, "data": data.state()})


def restore_process_state(acc: Any, path: Path, state: dict[str, Any], data: Any) -> str | None:
    """Set this process's generators and data cursor to the ones it saved; returns a note
    when the number of processes changed (then every process takes process 0's)."""
    ranks_file = path / RANKS_FILE
    if ranks_file.is_file():
        ranks = load_pickle(ranks_file)  # python/numpy states were made plain lists
        if len(ranks) == acc.num_processes:
            mine = ranks[acc.process_index]
            set_rng_state(mine["rng"], mine["torch_rng"])
            data.load_state(mine["data"])
            return None
    set_rng_state(state["rng"], load_pickle(path / "rng.pt"))
    data.load_state(state["data"])
    saved = state.get("num_processes", 1)
    if state.get("processes_saved", saved) < saved:
        return (f"{path.name} was written by the main process alone when a signal stopped the run: every "
                "process takes its generators, so the resume continues the run but is not bit-identical")
    if saved != acc.num_processes:
        return (f"{path.name} was written by {saved} process(es), this run has {acc.num_processes}: "
                "the resume continues the run but is not bit-identical")
    return None


# ---------------------------------------------------------------- save / load


@dataclass
class TrainingState:
    """What a checkpoint saves and restores of a run: the models and their optimizers and
    schedulers (critic ones only for PPO), the data cursor, the config and the metrics so
    far. The trainer hands over this, not itself: the checkpoint code sees no rollout,
    search or loss."""

    accelerator: Any
    cfg: TrainConfig
    policy: Any
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    data: Any  # the prompt cursor (train/sampler.py: PromptSampler)
    metrics: list[dict[str, Any]]
    critic: Any = None
    critic_optimizer: Any = None
    critic_scheduler: Any = None
    guard: dict[str, Any] | None = None  # the collapse guard's state (train/stability.py), JSON
    snapshot: dict[str, Any] | None = None
    """Set when a signal abandoned a step (train/signals.py): this process's generators and data
    cursor as that step began, written instead of the live ones; with several processes (DDP)
    the main process then writes alone, without a collective."""

    @property
    def alone(self) -> bool:
        return self.snapshot is not None and self.accelerator.num_processes > 1


def _gather(ts: TrainingState) -> dict[str, Any]:
    """Everything a checkpoint holds that lives in (possibly sharded) models: on every
    process, in the same order (the gathers are collectives); None on non-main processes."""
    from zsearch_cli.train.policy import trainable_state

    acc = ts.accelerator
    parts: dict[str, Any] = {
        "policy": full_model_state(acc, ts.policy),
        "optimizer": full_optimizer_state(acc, ts.policy, ts.optimizer),
        "ranks": [ts.snapshot] if ts.snapshot is not None else process_states(acc, ts.data),
    }
    if ts.critic is not None:
        critic = full_model_state(acc, ts.critic)
        parts["critic"] = trainable_state(acc.unwrap_model(ts.critic), critic) if critic is not None else None
        parts["critic_optimizer"] = full_optimizer_state(acc, ts.critic, ts.critic_optimizer)
    return parts


def _write(ts: TrainingState, parts: dict[str, Any], completed: int, tmp: Path) -> None:
    """The main process's half of :func:`save_checkpoint`: files into ``tmp``."""
    from safetensors.torch import save_file

    from zsearch_cli.train.policy import save_policy

    acc = ts.accelerator
    save_policy(acc.unwrap_model(ts.policy), ts.tokenizer, tmp, ts.cfg.policy.model, parts["policy"])
    torch.save(parts["optimizer"], tmp / "optimizer.pt")
    torch.save(ts.scheduler.state_dict(), tmp / "scheduler.pt")
    if ts.critic is not None:
        save_file(parts["critic"], str(tmp / "critic.safetensors"))
        torch.save(parts["critic_optimizer"], tmp / "critic_optimizer.pt")
        torch.save(ts.critic_scheduler.state_dict(), tmp / "critic_scheduler.pt")
    main = parts["ranks"][0]
    torch.save(main["torch_rng"], tmp / "rng.pt")
    if len(parts["ranks"]) > 1:
        torch.save(parts["ranks"], tmp / RANKS_FILE)
    state = {
        "step": completed,
        "data": main["data"],
        "rng": main["rng"],
        "sampling": {"seed": ts.cfg.seed, "next_step": completed},
        "config": ts.cfg.to_dict(),
        "distribution": distribution(acc),
        "num_processes": acc.num_processes,
        "metrics_format": METRICS_FORMAT,
        "metrics": ts.metrics,
    }
    if ts.guard is not None:
        state["guard"] = ts.guard
    if ts.alone:
        state["processes_saved"] = 1  # the others' generators were not gathered (train/signals.py)
    (tmp / STATE_FILE).write_text(json.dumps(state, default=str) + "\n")


def save_checkpoint(ts: TrainingState, completed: int, protect: Collection[int] = (), keep_healthy: int = 0) -> Path:
    """Write OUT/checkpoints/step-``completed`` of the run ``ts`` and prune old ones (all but
    the newest ``keep``, the newest ``keep_healthy`` marked healthy and the steps in
    ``protect``). Call it on every process: all gather, the main process writes, all return
    once it exists."""
    acc = ts.accelerator
    out = Path(ts.cfg.run.out)
    root = out / "checkpoints"
    path = root / f"step-{completed}"
    parts = _gather(ts)
    if acc.is_main_process:
        for stale in root.glob(".step-*.tmp-*") if root.is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)  # left by a process killed mid-save
        atomic_dir(path, lambda tmp: _write(ts, parts, completed, tmp))
        healthy = healthy_checkpoints(out)
        spared = set(protect) | ({n for n, _ in healthy[-keep_healthy:]} if keep_healthy > 0 else set())
        for n, old in checkpoints(out)[: -ts.cfg.run.keep_checkpoints]:
            if n not in spared:
                shutil.rmtree(old, ignore_errors=True)
    if not ts.alone:
        acc.wait_for_everyone()  # no process goes on (or reads the folder) before it is complete
    return path


HEALTHY_MARK = "healthy"
"""A checkpoint folder holding this file was found healthy by the collapse guard (no event in
the steps after it; train/stability.py); it records the step of that verdict."""


def mark_healthy(path: Path, verdict_step: int) -> None:
    """Mark checkpoint ``path`` healthy (a no-op when the folder is gone)."""
    if path.is_dir():
        (path / HEALTHY_MARK).write_text(json.dumps({"verdict_step": verdict_step}) + "\n")


def healthy_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints marked healthy, oldest first."""
    return [(n, p) for n, p in checkpoints(out) if (p / HEALTHY_MARK).is_file()]


def drop_checkpoints_after(out: Path, step: int) -> None:
    """Remove every checkpoint of a step after ``step`` (a rollback to ``step`` abandons
    them: a later --resume must not continue the collapsed run)."""
    for n, path in _step_dirs(out):
        if n > step:
            shutil.rmtree(path, ignore_errors=True)


def read_state(path: Path) -> dict[str, Any]:
    try:
        return json.loads((path / STATE_FILE).read_text())
    except (OSError, ValueError) as err:
        raise ZsearchError(f"{path / STATE_FILE}: unreadable ({_first_line(err)}); the checkpoint is damaged") from None


def check_resumable(path: Path, acc: Any) -> None:
    """One-line refusal of a resume this launch cannot continue (see the module docstring)."""
    state = read_state(path)
    if state.get("metrics_format", 1) != METRICS_FORMAT:
        raise ZsearchError(f"--resume: {path} was written by an older zsearch (its metrics count steps from 0 "
                           "under other names): finish that run with the zsearch that started it, or start a new "
                           f"--out from its weights (--model {path})")
    saved, now = state.get("distribution", "replicated"), distribution(acc)
    if saved != now:
        raise ZsearchError(f"--resume: {path} was written under {saved}, this launch is {now}: their optimizer "
                           "states differ; launch it as it was written (or start a new run from its weights)")
    processes = state.get("num_processes", 1)
    if now == "deepspeed" and processes != acc.num_processes:
        raise ZsearchError(f"--resume: {path} holds DeepSpeed ZeRO partitions of {processes} processes, this launch "
                           f"has {acc.num_processes}: launch it with {processes}")


def load_training_state(ts: TrainingState, path: Path, note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Restore optimizer(s), scheduler(s), RNGs and the data cursor(s) from ``path`` on every
    process (the policy and critic weights were loaded from it before ``prepare``); returns
    the saved state dict. ``note`` (main process) hears what could not be restored exactly."""
    state = read_state(path)
    acc = ts.accelerator
    load_optimizer_state(acc, ts.policy, ts.optimizer, path / "optimizer.pt")
    ts.scheduler.load_state_dict(load_pickle(path / "scheduler.pt"))
    if ts.critic is not None:
        load_optimizer_state(acc, ts.critic, ts.critic_optimizer, path / "critic_optimizer.pt")
        ts.critic_scheduler.load_state_dict(load_pickle(path / "critic_scheduler.pt"))
    message = restore_process_state(acc, path, state, ts.data)
    if message and note is not None and acc.is_main_process:
        note(message)
    return state
