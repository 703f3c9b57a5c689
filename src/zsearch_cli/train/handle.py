"""What the trainer's helpers may touch of a running :class:`~zsearch_cli.train.trainer.Trainer`.

The SIGTERM stop (``signals.py``) and the collapse guard's rollback (``stability.py``) act on
the trainer, which drives them; typing them against this protocol, not the ``Trainer``
class, keeps the import graph one-way (``trainer`` imports them, never the reverse) and
says in one place which members they rely on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class TrainerHandle(Protocol):
    cfg: Any
    """The resolved ``TrainConfig``."""
    accelerator: Any
    stop: Any
    """The SIGTERM / SIGINT seen between steps (``progress.StopSignals``), or None."""
    start_step: int
    data: Any
    metrics: Any
    policy: Any
    optimizer: Any
    scheduler: Any
    critic: Any
    critic_optimizer: Any
    critic_scheduler: Any

    def checkpoint(self, step: int) -> Path: ...

    def training_state(self) -> Any: ...

    def sync_generation(self) -> None: ...

    def worst_over_processes(self, value: float) -> float: ...
