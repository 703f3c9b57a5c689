"""``zsearch train``'s answer to SIGTERM / SIGINT between two steps: a checkpoint when one is
due, then one line and a resumable stop (issue 23; the signal handler itself is
:class:`zsearch_cli.progress.StopSignals`, installed by the CLI command only)."""

from __future__ import annotations

import signal
from pathlib import Path

from zsearch_cli.progress import Stopped
from zsearch_cli.train.handle import TrainerHandle



def stop_between_steps(trainer: TrainerHandle, step: int) -> None:
    """Between two steps (``step`` done): after a SIGTERM / SIGINT (on any process), write a
    checkpoint when one is due (--save-every > 0 and a step done since the last one) and
    raise :class:`Stopped` with the one line to print."""
    if trainer.stop is None:
        return
    signum = trainer.stop.signum or 0
    if trainer.accelerator.num_processes > 1:  # every process stops at the same step
        signum = int(trainer.worst_over_processes(float(signum)))
    if not signum:
        return
    name, cfg = signal.Signals(signum).name, trainer.cfg
    saved = min(getattr(trainer, "saved_step", trainer.start_step), step)  # (a rollback goes back to one)
    if cfg.run.save_every and step > saved:
        path, saved = trainer.checkpoint(step), step
    else:
        path = Path(cfg.run.out) / "checkpoints" / f"step-{saved}"
    if saved:
        line = f"train: {name}: checkpoint written to {path}; resume with --resume"
        if saved < step:
            line = f"train: {name} after step {step}: latest checkpoint {path} (step {saved}); resume with --resume"
    elif not cfg.run.save_every:
        line = f"train: {name}: no checkpoint (--save-every 0); the run cannot be resumed"
    else:
        line = f"train: {name} before the first step: no checkpoint; rerun the same command"
    raise Stopped(signum, line)
