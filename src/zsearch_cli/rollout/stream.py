"""Rollouts that overlap training steps (``--rollout-overlap K``): off-policy by up to K
policy versions. docs/architecture.md, "Rollout overlap".

The async mode (:mod:`zsearch_cli.rollout.async_engine`) removes the turn barrier inside one
rollout, but a rollout still ends with its slowest sample, and the generator idles through
that tail and through the update that follows. Here one background thread keeps rolling out
the batches of the coming steps, so step t+1's samples fill the generator while step t's
stragglers finish and while step t trains:

* ``put(rows, step, min_version=v)`` queues a step's rows; its samples start once the policy
  version is at least ``v``. The trainer passes ``v = t − 1 − K`` for step t (trained with
  version t − 1): no token it trains on is more than K versions old, the staleness bound;
* ``get()`` returns the next step's trajectories, in ``put`` order, once all its samples ended;
* ``update(version, push)``: the trainer's new weights. ``push`` runs on the rollout thread
  when no request is being generated: the loop stops starting turns, lets the running ones
  end (the sample goes on to its search as usual), pushes, and goes on. So every turn is
  sampled by one version, recorded per token (``Trajectory.policy_version``); the training
  loss then uses the sampler's logprobs as π_old (the behaviour policy), as the papers'
  off-policy corrections do.

What a sample contains is still the engine's own per-sample steps under its own seeds; only
the weights it sees depend on the schedule, which is why the mode is off by default.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import streams
from zsearch_cli.rollout.engine import RolloutEngine
from zsearch_cli.rollout.state import QARow, SampleState, Searches, check_separate_models, stream_step
from zsearch_cli.rollout.trajectory import Trajectory

POLL_S = 0.005
"""How long the loop waits on a search before it looks at its inbox again (a put, an update)."""


@dataclass
class _StepWork:
    rows: Sequence[QARow]
    step: int
    min_version: int
    samples: list[SampleState] = field(default_factory=list)
    left: int = 0
    """Samples not ended yet."""


class _StepFinisher:
    """Ends samples (a :class:`~zsearch_cli.rollout.state.Finisher`) and counts what is left of each step."""

    def __init__(self) -> None:
        self.works: dict[int, _StepWork] = {}

    def finish(self, s: SampleState, reason: str) -> None:
        s.finish = reason
        self.works[s.step].left -= 1


class RolloutStream:
    """Rollouts of consecutive steps on one background thread (module docstring). Use as a
    context manager, or call :meth:`close`."""

    def __init__(self, engine: RolloutEngine, group_size: int):
        check_separate_models(engine)
        self.engine, self.group_size = engine, group_size
        self._cond = threading.Condition()
        self._inbox: deque[_StepWork] = deque()  # put, not started
        self._open: deque[_StepWork] = deque()  # started, not returned: the order get() follows
        self._out: queue.Queue = queue.Queue()
        self._update: tuple[int, Callable[[], None]] | None = None
        self._error: BaseException | None = None
        self._closed = False
        self.version = engine.policy_version
        self._thread = threading.Thread(target=self._run, name="zsearch-rollout", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the trainer's side

    def put(self, rows: Sequence[QARow], step: int, *, min_version: int = 0) -> None:
        """Queue the rows of rollout step ``step`` (its seeds and group ids, as in
        ``RolloutEngine.rollout``); they start once the version is >= ``min_version``."""
        with self._cond:
            self._check()
            self._inbox.append(_StepWork(rows, step, min_version))
            self._cond.notify_all()

    def get(self) -> list[Trajectory]:
        """The trajectories of the oldest step not returned yet (blocks until it ended)."""
        while True:
            try:
                return self._out.get(timeout=0.05)
            except queue.Empty:
                with self._cond:
                    self._check()

    def update(self, version: int, push: Callable[[], None] | None = None) -> None:
        """Make the backend see policy ``version``: ``push()`` (e.g. a vLLM weight sync; None
        when the backend already sees the new weights) runs on the rollout thread between two
        generated turns. Blocks until it ran."""
        with self._cond:
            self._check()
            self._update = (version, push or (lambda: None))
            self._cond.notify_all()
            while self._update is not None:
                self._cond.wait(0.05)
                self._check()

    def close(self) -> None:
        """Stop the thread; requests still running are aborted, searches abandoned."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)

    def __enter__(self) -> "RolloutStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ZsearchError("the rollout stream is closed")

    # ------------------------------------------------------------------ the rollout thread

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as err:  # handed to the trainer's next call
            with self._cond:
                self._error = err
                self._cond.notify_all()

    def _admit(self, ready: deque, finisher: _StepFinisher) -> None:
        """Start every queued step the current version allows (in put order), at once.
        Measured (bench/rollout.py --modes --overlap 1): holding a step back until the
        generator has less than one step's samples avoids lockstep when every turn is the
        same length (1.45x instead of 1.42x), but with heavy-tailed search latency it loses
        (1.86x instead of 2.28x): samples stuck behind a slow search leave gaps that only
        the next step's samples can fill."""
        while self._inbox and self._inbox[0].min_version <= self.version:
            work = self._inbox.popleft()
            work.samples = self.engine.new_samples(work.rows, self.group_size, work.step)
            work.left = len(work.samples)
            finisher.works[work.step] = work
            self._open.append(work)
            ready.extend(work.samples)

    def _emit(self, finisher: _StepFinisher) -> None:
        """Hand over the ended steps at the head of the queue (later ones wait their turn)."""
        while self._open and self._open[0].left == 0:
            work = self._open.popleft()
            del finisher.works[work.step]
            self._out.put(self.engine.trajectories(work.samples))

    def _search_failed(self, err: ZsearchError) -> Exception:
        work = self._open[0]
        return self.engine.search_failed(err, work.samples, work.step)

    def _loop(self) -> None:
        engine = self.engine
        backend = engine.backend
        streaming = streams(backend)
        capacity = getattr(backend, "max_batch_size", None)
        finisher = _StepFinisher()
        ready: deque[SampleState] = deque()
        running: dict[str, SampleState] = {}
        searches = Searches(engine, finisher, ready, self._search_failed)
        try:
            while True:
                with self._cond:
                    if self._closed:
                        return
                    if self._update is not None and not running:  # drained: push between two turns
                        version, push = self._update
                        push()
                        self.version = engine.policy_version = version
                        self._update = None
                        self._cond.notify_all()
                    self._admit(ready, finisher)
                    holding = self._update is not None  # no new turn until the update is in
                    if not (ready or running or searches.waiting):
                        self._cond.wait(0.05)
                        continue
                can_start = bool(ready) and not holding
                searches.collect(block=not can_start and not running, timeout=POLL_S)
                can_start = bool(ready) and not holding
                if can_start:
                    take = len(ready) if streaming else min(capacity or len(ready), len(ready))
                    batch = [ready.popleft() for _ in range(take)]
                    for s in batch:
                        s.version = self.version
                else:
                    batch = []
                if streaming:
                    stream_step(engine, batch, running, searches, finisher)
                elif batch:
                    searches.send(batch, engine.generate_turn(batch, finisher))
                self._emit(finisher)
        finally:
            if running:
                backend.abort(list(running))
            searches.close()
