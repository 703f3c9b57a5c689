"""The collapse guard's runtime half: what the trainer does with the events that
``train/guard.py`` (the detection half) raises. docs/stability.md, section Actions, is the
specification; in short, per ``--on-collapse``:

- every mode: each event is printed as one yellow console line, appended to
  ``OUT/guard.jsonl`` (``GuardEvent.to_dict()`` plus the ``action`` taken; flushed; never
  rewritten, so it keeps every event of the run, rolled back or not) and recorded in the
  metadata of ``metrics.parquet`` (``read_metadata(path)["config"]["collapse_guard"]``:
  ``{"on_collapse", "events", "rollbacks"}``); the row gets ``guard/events`` (this step)
  and ``guard/rollbacks`` (so far); the guard's state goes into every checkpoint and comes
  back on ``--resume``.
- ``warn``: go on. ``nonfinite`` (a NaN/inf loss or gradient) still stops, except under
  ``rollback``, whose restore replaces the corrupted weights.
- ``stop``: write guard.jsonl, metrics.parquet (the rows so far) and ``OUT/guard_report.json``,
  then raise a one-line :class:`ZsearchError` (the event's message). The step's state is not
  checkpointed.
- ``rollback``: restore the newest *healthy* checkpoint (no event in the ``smooth_window``
  steps after it), keep the data cursor where it is (the offending batch and the ones drawn
  since are skipped), multiply the lr by :data:`LR_FACTOR`, resync the generation backend and
  go on from the checkpoint's step + 1 towards the same ``--steps``. At most
  :data:`MAX_ROLLBACKS`; then, or without a healthy checkpoint, as ``stop``.

Every process observes the same (process-averaged) row, so all take the same decision.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.markup import escape

from zsearch_cli.errors import ZsearchError
from zsearch_cli.train.guard import CollapseGuard, GuardConfig, GuardEvent
from zsearch_cli.train.handle import TrainerHandle


MAX_ROLLBACKS = 3
"""Rollbacks per run (over resumes too); the next event after them stops the run."""
KEEP_HEALTHY = 3
"""The newest healthy checkpoints kept out of the ``--keep-checkpoints`` rotation."""
LR_FACTOR = 0.5
"""Each rollback multiplies the lr (policy and critic, the whole remaining schedule) by this."""
EVENTS_FILE = "guard.jsonl"
REPORT_FILE = "guard_report.json"
METADATA_KEY = "collapse_guard"
"""Key of the guard's record in the config metadata of metrics.parquet."""


class Stability:
    """The guard as the trainer drives it: ``observe`` each step's row (adds the ``guard/``
    columns, logs the events, decides), ``act`` on the decision (stop or roll back),
    ``saved`` after each checkpoint (it then awaits its verdict), and ``state_dict`` /
    ``load_state`` for the checkpoint."""

    def __init__(self, out: Path, mode: str, console: Any, main: bool, record: dict[str, Any],
                 guard_config: GuardConfig | None = None):
        self.out = Path(out)
        self.mode = mode
        self.console = console
        self.main = main
        self.guard = CollapseGuard(guard_config)
        self.lag = self.guard.cfg.smooth_window  # a 5-step-mean check fires up to 4 steps after the damage
        self.events: list[dict[str, Any]] = []  # every event of the run (to_dict + action)
        self.rollbacks: list[dict[str, Any]] = []  # {"step": where the event was, "to": the checkpoint's step}
        self.lr_scale = 1.0  # LR_FACTOR ** rollbacks: what the optimizer's lr carries now
        self.pending: list[int] = []  # checkpoints (steps) awaiting their verdict (rollback mode)
        self.healthy: list[int] = []  # checkpoints found healthy, oldest first (the newest KEEP_HEALTHY)
        self.decision: tuple[str, list[GuardEvent]] | None = None  # the last observed step's
        self.closest: dict[str, float] = {}
        """Per ``check:metric``, the closest any step of this run came to firing (1 = fires): the
        run's margin to each threshold, recorded in the metadata (docs/stability.md)."""
        self.observed = 0
        self.record = record  # the metrics' config dict: its METADATA_KEY entry goes into metrics.parquet
        self._update_record()

    # ------------------------------------------------------------------ each step

    def observe(self, step: int, row: dict[str, Any]) -> None:
        """Check ``row`` (step ``step``), fill its ``guard/`` columns, log its events and
        decide what to do (``self.decision``; :meth:`act` does it)."""
        events = self.guard.observe(step, row)
        self.observed += 1
        for name, value in self.guard.closeness.items():
            if value == value and value > self.closest.get(name, float("-inf")):  # NaN never counts
                self.closest[name] = round(float(value), 4)
        self._update_record()
        row["guard/events"] = float(len(events))
        row["guard/rollbacks"] = float(len(self.rollbacks))
        self.decision = None
        if not events:
            self._verdicts(step)
            return
        self.pending.clear()  # the event is within `lag` steps of every pending checkpoint
        action = self._action(events)
        records = [{**e.to_dict(), "action": action} for e in events]
        self.events.extend(records)
        self._update_record()
        if self.main:
            with open(self.out / EVENTS_FILE, "a", encoding="utf-8") as fh:
                fh.write("".join(json.dumps(r) + "\n" for r in records))
                fh.flush()
            for e in events:
                self.console.print(f"[yellow]guard: {escape(e.message)} -> {action}[/]", soft_wrap=True,
                                   highlight=False)
        self.decision = (action, events)

    def _action(self, events: list[GuardEvent]) -> str:
        if self.mode == "rollback":
            return "rollback" if len(self.rollbacks) < MAX_ROLLBACKS and self._target() is not None else "stop"
        if self.mode == "stop" or any(e.check == "nonfinite" for e in events):
            return "stop"
        return "warn"

    def _target(self) -> int | None:
        """The newest healthy checkpoint still on disk and complete."""
        from zsearch_cli.train.checkpoint import checkpoint_problem

        for s in reversed(self.healthy):
            path = self.out / "checkpoints" / f"step-{s}"
            if path.is_dir() and checkpoint_problem(path) is None:
                return s
        return None

    def _verdicts(self, step: int) -> None:
        """After an event-free step: the pending checkpoints ``lag`` steps old are healthy."""
        from zsearch_cli.train.checkpoint import mark_healthy

        ripe = [s for s in self.pending if step - s >= self.lag]
        for s in ripe:
            self.pending.remove(s)
            self.healthy = [*self.healthy, s][-KEEP_HEALTHY:]
            if self.main:
                mark_healthy(self.out / "checkpoints" / f"step-{s}", step)

    def saved(self, step: int) -> None:
        """Checkpoint ``step`` was written: under rollback it awaits its verdict."""
        if self.mode == "rollback":
            self.pending.append(step)

    def protected(self) -> set[int]:
        """Checkpoints the rotation must keep: the ones awaiting a verdict (a healthy one is
        kept by its marker, see checkpoint.py)."""
        return set(self.pending)

    def act(self, trainer: TrainerHandle, step: int, metrics: Any) -> int | None:
        """Carry out the last step's decision: None to go on (no event, or warn), the step
        the run continues after (a rollback); a stop raises :class:`ZsearchError`."""
        if self.decision is None or self.decision[0] == "warn":
            return None
        action, events = self.decision
        if action == "rollback":
            return self._rollback(trainer, step)
        self._stop(step, events, metrics)
        return None  # not reached

    # ------------------------------------------------------------------ stop

    def _stop(self, step: int, events: list[GuardEvent], metrics: Any) -> None:
        first = events[0]
        more = f" (+{len(events) - 1} more: {', '.join(e.check for e in events[1:])})" if len(events) > 1 else ""
        if self.mode == "rollback" and len(self.rollbacks) >= MAX_ROLLBACKS:
            why = (f"rolled back {len(self.rollbacks)} times, to steps "
                   f"{', '.join(str(r['to']) for r in self.rollbacks)}; stopping")
        elif self.mode == "rollback":
            why = (f"no healthy checkpoint to roll back to yet (one is healthy after {self.lag} event-free "
                   "steps); stopping")
        elif self.mode == "warn":
            why = "non-finite values stop under every --on-collapse"
        else:
            why = "stopping (--on-collapse stop)"
        line = f"collapse guard: {first.message}{more}; {why}; report in {self.out / REPORT_FILE}"
        if self.main:
            report = {"step": step, "message": line, "on_collapse": self.mode, "events": self.events,
                      "rollbacks": self.rollbacks}
            (self.out / REPORT_FILE).write_text(json.dumps(report, indent=1, default=str) + "\n")
            metrics.write_parquet()
        raise ZsearchError(line)

    # ------------------------------------------------------------------ rollback

    def _rollback(self, trainer: TrainerHandle, step: int) -> int:
        from zsearch_cli.train.checkpoint import drop_checkpoints_after, load_training_state

        target = self._target()
        assert target is not None  # _action checked
        path = self.out / "checkpoints" / f"step-{target}"
        acc = trainer.accelerator
        cursor = trainer.data.state()  # kept: the offending batch and those drawn since are skipped
        load_weights(trainer, path)
        state = load_training_state(trainer.training_state(), path,
                                    note=lambda text: self.console.print(f"[yellow]{text}[/]", soft_wrap=True))
        trainer.data.load_state(cursor)
        # metrics.parquet loses the rows after `target`; metrics.jsonl (append-only) keeps them
        trainer.metrics.rows = [dict(r) for r in state["metrics"]]
        saved = state.get("guard") or {}
        if "guard" in saved:
            self.guard.load_state_dict(saved["guard"])  # the baseline as it was: no collapsed step in it
        self.rollbacks.append({"step": step, "to": target})
        scale = LR_FACTOR ** len(self.rollbacks)
        factor = scale / float(saved.get("lr_scale", 1.0))  # the checkpoint's lr may carry earlier rollbacks
        scale_lr(trainer.optimizer, trainer.scheduler, factor)
        if trainer.critic is not None:
            scale_lr(trainer.critic_optimizer, trainer.critic_scheduler, factor)
        self.lr_scale = scale
        self.pending.clear()
        self.healthy = [h for h in self.healthy if h <= target]  # newer ones are deleted below
        self._update_record()
        if self.main:
            drop_checkpoints_after(self.out, target)  # a --resume must not pick the collapsed ones
            trainer.metrics.write_parquet()
            self.console.print(f"[yellow]guard: rolled back to {path.name} ({len(self.rollbacks)}/{MAX_ROLLBACKS}); "
                               f"lr x{scale:g} from now on; steps {target + 1}-{step} run again on new batches[/]",
                               soft_wrap=True, highlight=False)
        acc.wait_for_everyone()
        trainer.sync_generation()
        return target

    # ------------------------------------------------------------------ checkpoint state

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable, saved in every checkpoint's trainer_state.json."""
        return {"version": 1, "guard": self.guard.state_dict(), "rollbacks": list(self.rollbacks),
                "lr_scale": self.lr_scale, "pending": list(self.pending), "healthy": list(self.healthy),
                "events": list(self.events)}

    def load_state(self, state: dict[str, Any] | None, step: int) -> None:
        """On --resume from checkpoint ``step``: continue with its baseline, rollbacks and
        verdicts (a checkpoint without guard state starts a fresh baseline)."""
        if not state:
            if self.main:
                self.console.print("[yellow]guard: the checkpoint has no guard state; its baseline starts afresh[/]",
                                   soft_wrap=True)
            return
        try:
            self.guard.load_state_dict(state["guard"])
        except (KeyError, ValueError) as err:
            raise ZsearchError(f"--resume: the checkpoint's guard state is unreadable ({err})") from None
        self.rollbacks = list(state.get("rollbacks", []))
        self.lr_scale = float(state.get("lr_scale", 1.0))
        self.healthy = [int(s) for s in state.get("healthy", [])]
        self.pending = [int(s) for s in state.get("pending", [])] + ([step] if self.mode == "rollback" else [])
        self.events = list(state.get("events", []))
        self._update_record()

    def _update_record(self) -> None:
        self.record[METADATA_KEY] = {"on_collapse": self.mode, "events": self.events, "rollbacks": self.rollbacks,
                                     "steps_observed": getattr(self, "observed", 0),
                                     "closest": dict(getattr(self, "closest", {}))}


# ---------------------------------------------------------------------- helpers


def scale_lr(optimizer: Any, scheduler: Any, factor: float) -> None:
    """Multiply a LambdaLR schedule by ``factor`` from now on: its ``base_lrs`` (every later
    step's lr), its last lr and the optimizer's current ``lr`` / ``initial_lr``."""
    if math.isclose(factor, 1.0):
        return
    scheduler.base_lrs = [b * factor for b in scheduler.base_lrs]
    if getattr(scheduler, "_last_lr", None) is not None:
        scheduler._last_lr = [x * factor for x in scheduler._last_lr]
    for group in getattr(optimizer, "optimizer", optimizer).param_groups:
        group["lr"] *= factor
        if "initial_lr" in group:
            group["initial_lr"] *= factor


def load_weights(trainer: TrainerHandle, path: Path) -> None:
    """Load checkpoint ``path``'s policy (and critic) weights into the live models. Every
    process holds the whole model (one process or DDP), so each loads the same files."""
    from safetensors.torch import load_file

    from zsearch_cli.train.distributed import distribution
    from zsearch_cli.train.policy import is_peft

    acc = trainer.accelerator
    if distribution(acc) != "replicated":
        raise ZsearchError(f"--on-collapse rollback under {distribution(acc)}: the sharded weights cannot be "
                           "restored in place; use stop and --resume")
    import torch

    policy = acc.unwrap_model(trainer.policy)
    with torch.no_grad():
        if is_peft(policy):
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(policy, load_file(str(path / "adapter_model.safetensors")))
            missing = [k for k in getattr(result, "unexpected_keys", [])]
            if missing:
                raise ZsearchError(f"{path}: adapter weights the policy lacks: {missing[:3]}")
        else:
            state: dict[str, Any] = {}
            for f in sorted(path.glob("model*.safetensors")):
                state.update(load_file(str(f)))
            result = policy.load_state_dict(state, strict=False)
            params = {n for n, _ in policy.named_parameters()}  # tied copies appear once
            lacking = [k for k in result.missing_keys if k in params]
            if lacking or result.unexpected_keys:
                raise ZsearchError(f"{path}: its weights do not match the policy (missing {lacking[:3]}, "
                                   f"unexpected {result.unexpected_keys[:3]})")
        if trainer.critic is not None:
            found = acc.unwrap_model(trainer.critic).load_state_dict(load_file(str(path / "critic.safetensors")),
                                                                     strict=False)
            if found.unexpected_keys:
                raise ZsearchError(f"{path}: critic checkpoint has unknown weights {found.unexpected_keys[:3]}")
