"""``zsearch train``'s answer to SIGTERM / SIGINT: one line at once, the running step
abandoned, the state of the last completed step written, and an exit within seconds
(issues 23 and 36.8; the signal handler itself is :class:`zsearch_cli.progress.StopSignals`,
installed by the CLI command only).

A scheduler's kill grace is short (Slurm's ``KillWait`` defaults to 30 s) and a step can
take minutes, so the trainer does not wait for the step to end:

- **Before the step's first optimizer step** (its rollout, its reward, the reference and old
  log-prob passes, the forward and backward passes of the first mini-batch) the weights are
  still those of the last completed step. The step is abandoned where it is, and when a
  checkpoint is due (``--save-every`` > 0 and a step completed since the last one) that state
  is written: the weights and optimizer as they are, the generators and data cursor as they
  were when the step began (:func:`process_snapshot`). ``--resume`` then replays the
  abandoned step exactly.
- **After it** (a later mini-batch or epoch, the weight sync, validation) the weights are
  part of the way through the step, a state no run ever had. The step is abandoned and
  nothing is written; the newest checkpoint on disk is the resume point.
- **While the step's results are recorded** (metrics, rollouts, the collapse guard, a due
  checkpoint) a signal waits: the step is then complete, and the check between two steps
  (:func:`stop_between_steps`) writes its checkpoint when one is due.

Several processes: one process or DDP abandons as above, the main process writing alone
(DDP's weights and optimizer state are whole on every process; the others' generators are
not saved, so a resume is exact in the weights and continues the run, but is not
bit-identical). The other processes keep working until the launcher ends them, because
a process that left mid-step would leave the main process waiting in a collective. FSDP and
ZeRO-3 need every process to gather a checkpoint: they stop between two steps, as before.
"""

from __future__ import annotations

import signal
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from zsearch_cli.progress import Stopped
from zsearch_cli.train.distributed import distribution
from zsearch_cli.train.handle import TrainerHandle


def process_snapshot(data: Any) -> dict[str, Any]:
    """This process's generators and data cursor, as :func:`~zsearch_cli.train.checkpoint.process_states`
    records them: taken when a step begins, so an abandoned step can be written as not begun."""
    from zsearch_cli.train.checkpoint import rng_state

    json_rng, torch_rng = rng_state()
    return {"rng": json_rng, "torch_rng": torch_rng, "data": data.state()}


def _saved(trainer: TrainerHandle, completed: int) -> int:
    """The newest checkpoint this run holds, at most ``completed`` (a rollback went back to one)."""
    return min(getattr(trainer, "saved_step", trainer.start_step), completed)


def _checkpoint_path(trainer: TrainerHandle, step: int) -> Path:
    return Path(trainer.cfg.run.out) / "checkpoints" / f"step-{step}"


def stop_between_steps(trainer: TrainerHandle, step: int) -> None:
    """Between two steps (``step`` done): after a SIGTERM / SIGINT (on any process), write a
    checkpoint when one is due (--save-every > 0 and a step done since the last one) and
    raise :class:`Stopped` with the one line to print."""
    if trainer.stop is None:
        return
    signum = trainer.stop.signum or 0
    if trainer.accelerator.num_processes > 1:
        signum = int(trainer.worst_over_processes(float(signum)))  # every process stops at the same step
    if not signum:
        return
    name, cfg = signal.Signals(signum).name, trainer.cfg
    saved = _saved(trainer, step)
    if cfg.run.save_every and step > saved:
        path, saved = trainer.checkpoint(step), step
    else:
        path = _checkpoint_path(trainer, saved)
    if saved:
        line = f"train: {name}: checkpoint written to {path}; resume with --resume"
        if saved < step:
            line = f"train: {name} after step {step}: latest checkpoint {path} (step {saved}); resume with --resume"
    elif not cfg.run.save_every:
        line = f"train: {name}: no checkpoint (--save-every 0); the run cannot be resumed"
    else:
        line = f"train: {name} before the first step: no checkpoint; rerun the same command"
    raise Stopped(signum, line)


def announce(stop: Any, step: int, steps: int) -> Any:
    """The line printed the moment a signal arrives while step ``step`` runs or is recorded."""
    def line(signum: int) -> str:
        name = signal.Signals(signum).name
        if stop.abandoning:
            return f"train: {name} during step {step}/{steps}: abandoning it; the last completed step's state follows"
        return f"train: {name} after step {step}/{steps}: stopping once it is recorded"
    return line


def abandon_step(trainer: TrainerHandle, step: int, signum: int, snapshot: dict[str, Any], committed: bool) -> Stopped:
    """Step ``step`` was abandoned by ``signum``; ``committed``: an optimizer step of it had
    run. Writes the state of step ``step - 1`` when it is unchanged and a checkpoint is due,
    and returns the :class:`Stopped` to raise, with its one line."""
    name, cfg, done = signal.Signals(signum).name, trainer.cfg, step - 1
    saved = _saved(trainer, done)
    head = f"train: {name}: step {step} abandoned"
    if not committed and cfg.run.save_every and done > saved:
        path = trainer.checkpoint(done, snapshot=snapshot)
        line = f"{head}; checkpoint of step {done} written to {path}; resume with --resume"
    elif saved:
        why = " after its first optimizer step" if committed and done > saved else ""
        line = (f"{head}{why}; latest checkpoint {_checkpoint_path(trainer, saved)} (step {saved}); "
                "resume with --resume")
    elif not cfg.run.save_every:
        line = f"{head}; no checkpoint (--save-every 0): the run cannot be resumed"
    else:
        line = f"{head}; no checkpoint yet: rerun the same command"
    trainer.metrics_written()
    return Stopped(signum, line, hard_exit=True)



def watch_steps(trainer: Any) -> None:
    """Let a signal abandon the running step where that is safe: on one process, or on DDP's
    main process, which can write a checkpoint alone. An optimizer step (policy or critic)
    marks the step committed: from then on its weights are not the last completed step's."""
    if trainer.stop is None:
        return
    acc = trainer.accelerator
    trainer.abandons_steps = acc.num_processes == 1 or (distribution(acc) == "replicated" and acc.is_main_process)

    def mark(*_: Any) -> None:
        trainer.committed = True

    for optimizer in (trainer.optimizer, trainer.critic_optimizer):
        if optimizer is not None:
            getattr(optimizer, "optimizer", optimizer).register_step_pre_hook(mark)


def abandonable(trainer: Any, step: int) -> Any:
    """The part of step ``step`` a signal abandons at once (a no-op where steps are not abandoned)."""
    if not trainer.abandons_steps:
        return nullcontext()
    trainer.stop.announce = announce(trainer.stop, step, trainer.cfg.steps)
    return trainer.stop.abandonable()
