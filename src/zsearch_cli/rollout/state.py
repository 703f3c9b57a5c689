"""What the three rollout schedulers share: the per-sample state and the steps around it.

Internal to the rollout package. The schedulers (the sync loop in ``engine.py``,
``async_engine.py`` and ``stream.py``) import from here and from nowhere else in the package
for their shared parts, so none reaches into another's privates, and none needs
``engine.py`` for a type: :class:`TurnSteps` is the engine as a scheduler sees it. Only
:class:`QARow` is public, through :mod:`zsearch_cli.rollout.engine`.

* :class:`SampleState`: one sample in flight (its ids, mask, logprobs, turns, how it ended);
  every turn's sampling seed is :func:`sample_seed` of the sample and turn, never its batch;
* :class:`Finisher`: ends a sample and counts what ended (:class:`RowFinisher` per row for one
  rollout; ``stream.py`` per step);
* :class:`Searches` and :class:`SearchPool`: the samples' side trips to search on worker
  threads, shared by the async and overlapped loops;
* :func:`stream_step` and :func:`check_separate_models`: the streaming turn and the check
  that the search simulator does not share the policy's model, also shared by both.

Search calls run on worker threads, and each call carries every search waiting when it
starts (batching, as the sync engine's one call per turn does: a retriever or the
simulator's model is faster on a batch). A backend with ``thread_safe = True`` (a class
attribute: the HTTP retriever) gets up to ``search_concurrency`` calls in flight at once, so
one chunk's slow call does not hold up the next chunk's; any other backend (the simulator's
model, an in-process index, SerpAPI's shared session) gets one call at a time. Measured
(``bench/rollout.py --modes``): splitting the waiting searches into one call per sample
instead loses when latency is constant (16 workers cannot keep up with the generator) and
gains little on a heavy tail, so calls stay batched.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, cast

from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import GenerationBackend, SamplingParams, StreamingBackend, mix_seed
from zsearch_cli.search.base import SearchBackend, SearchBackendError, SearchRequest, SearchResult, search_grouped


@dataclass
class QARow:
    id: str
    question: str
    golden_answers: list[str]
    prompt: str | None = None
    """A ready user message (eval's direct/cot/rag baselines); None uses the protocol's template."""


@dataclass
class SampleState:
    """One sample while it is rolled out; the engine turns it into a ``Trajectory`` at the end."""

    row: QARow
    sample_index: int
    group_id: str
    prompt_ids: list[int]
    seed_key: str = ""
    """The row's part of the sample's identity in its sampling seeds (see :func:`sample_seed`)."""
    step: int = 0
    """The rollout step its seeds and group id name."""
    version: int = 0
    """The policy version generating its next turn (see ``RolloutEngine.policy_version``)."""
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[dict[str, Any]] = field(default_factory=list)
    searches: int = 0
    invalid: int = 0
    prediction: str | None = None
    finish: str | None = None

    def extend(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.response_ids.extend(ids)
        if logprobs is None:  # template/observation tokens: not sampled, not trained on
            self.loss_mask.extend([0] * len(ids))
            self.logprobs.extend([0.0] * len(ids))
            self.versions.extend([-1] * len(ids))
        else:
            self.loss_mask.extend([1] * len(ids))
            self.logprobs.extend(logprobs)
            self.versions.extend([self.version] * len(ids))

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


def sample_seed(seed: int, step: int, row_key: str, sample_index: int, turn: int) -> int:
    """The sampling seed of one turn of one sample: it names the sample (run seed, step, row,
    sample index) and the turn, so it is the same whichever batch the turn is generated in."""
    return mix_seed(seed, step, row_key, sample_index, turn)


class Finisher(Protocol):
    """Ends samples (sets ``finish``) and counts, for its scheduler, what has ended."""

    def finish(self, s: SampleState, reason: str) -> None: ...


class RowFinisher:
    """Ends samples and reports each row once all of its ``group_size`` samples have ended."""

    def __init__(self, rows: Sequence[QARow], group_size: int, on_row_done: Callable[[int], None] | None):
        self.rows_left = {row.id: group_size for row in rows}
        self.on_row_done = on_row_done

    def finish(self, s: SampleState, reason: str) -> None:
        s.finish = reason
        self.rows_left[s.row.id] -= 1
        if self.rows_left[s.row.id] == 0 and self.on_row_done is not None:
            self.on_row_done(1)


class TurnSteps(Protocol):
    """The engine (``RolloutEngine``) as the schedulers drive it: the per-sample steps, which
    do not depend on the schedule. A protocol, so that the schedulers, which the engine
    imports, need not import the engine."""

    @property
    def backend(self) -> GenerationBackend: ...
    @property
    def search(self) -> SearchBackend | None: ...
    @property
    def protocol(self) -> Any: ...
    @property
    def config(self) -> RolloutOptions: ...

    def contexts(self, batch: Sequence[SampleState]) -> list[list[int]]: ...
    def turn_params(self, batch: Sequence[SampleState]) -> SamplingParams: ...
    def generate_turn(self, batch: Sequence[SampleState], done: Finisher) -> list[tuple[SampleState, Any]]: ...
    def record_turns(self, batch: Sequence[SampleState], outs: Sequence[Any],
                     done: Finisher) -> list[tuple[SampleState, Any]]: ...
    def search_requests(self, s: SampleState, action: Any) -> list[SearchRequest]: ...
    def observe(self, found: Sequence[tuple[SampleState, list[SearchResult]]], done: Finisher) -> None: ...
    def search_failed(self, err: ZsearchError, samples: Sequence[SampleState], step: int) -> SearchBackendError: ...


def check_separate_models(engine: TurnSteps) -> None:
    """A simulator that writes documents with the policy's own model object cannot search
    while the policy generates (one HF model is not safe on two threads at once)."""
    sim_model = getattr(getattr(engine.search, "generator", None), "model", None)
    if sim_model is not None and sim_model is getattr(engine.backend, "model", None):
        raise ZsearchError("the search simulator shares the policy's model, which cannot run on two threads "
                           "at once: use --rollout-mode sync, or give the simulator its own model")


class SearchPool:
    """Worker threads that run search calls; results come back through :meth:`finished`.
    Every call takes all the jobs waiting; ``thread_safe`` backends get ``workers`` threads
    (calls in flight at once), others one."""

    def __init__(self, search: SearchBackend, topk: int, workers: int):
        self.search, self.topk = search, topk
        self._waiting: deque[tuple[Any, list[SearchRequest]]] = deque()
        self._cond = threading.Condition()
        self._done: queue.Queue = queue.Queue()
        self._closed = False
        # Daemon threads: after a failure, calls still in flight are abandoned, not awaited.
        n = max(1, workers) if getattr(search, "thread_safe", False) else 1
        self._threads = [threading.Thread(target=self._work, name=f"zsearch-search-{i}", daemon=True)
                         for i in range(n)]
        for t in self._threads:
            t.start()

    def submit(self, jobs: list[tuple[Any, list[SearchRequest]]]) -> None:
        """Queue ``(job, requests)`` pairs, all at once, so that one call takes them together."""
        with self._cond:
            self._waiting.extend(jobs)
            self._cond.notify()

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                jobs = list(self._waiting)
                self._waiting.clear()
            try:
                results = search_grouped(self.search, [reqs for _, reqs in jobs], self.topk)
            except BaseException as err:  # handed to the main thread, which raises it
                self._done.put(err)
                continue
            for (job, _), found in zip(jobs, results):
                self._done.put((job, found))

    def finished(self, block: bool, timeout: float | None = None) -> list[tuple[Any, list[SearchResult]]]:
        """The jobs done since the last call (waiting for one when ``block``, at most
        ``timeout`` seconds), in the order they finished; a failed call's exception is raised here."""
        out = []
        try:
            item = self._done.get(block=block, timeout=timeout if block else None)
            while True:
                if isinstance(item, BaseException):
                    raise item
                out.append(item)
                item = self._done.get_nowait()
        except queue.Empty:
            return out

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Searches:
    """The samples' side trips to search, shared by every async loop: ``send`` the turns that
    asked for a search (and put the others that go on back in ``ready``), ``collect`` the
    observations that came back (their samples rejoin ``ready``). The pool starts with the
    first search. ``failed(err)`` gives the exception to raise when the backend fails."""

    def __init__(self, engine: TurnSteps, done: Finisher, ready: deque[SampleState],
                 failed: Callable[[ZsearchError], Exception]):
        self.engine, self.done, self.ready, self.failed = engine, done, ready, failed
        self.pool: SearchPool | None = None
        self.waiting = 0

    def send(self, batch: Sequence[SampleState], pending: list[tuple[SampleState, Any]]) -> None:
        engine = self.engine
        if pending:
            if self.pool is None:
                self.pool = SearchPool(engine.search, engine.config.topk, engine.config.search_concurrency)
            self.pool.submit([(s, engine.search_requests(s, action)) for s, action in pending])
            self.waiting += len(pending)
        # A turn that needs no search (an invalid action, answered with a message) goes on at once.
        searched = {id(s) for s, _ in pending}
        self.ready.extend(s for s in batch if s.finish is None and id(s) not in searched)

    def collect(self, block: bool, timeout: float | None = None) -> None:
        if not self.waiting:
            return
        try:
            found = self.pool.finished(block=block, timeout=timeout)
        except ZsearchError as err:
            raise self.failed(err) from None
        self.waiting -= len(found)
        if found:
            self.engine.observe(found, self.done)
            self.ready.extend(s for s, _ in found if s.finish is None)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def stream_step(engine: TurnSteps, batch: list[SampleState], running: dict[str, SampleState],
                searches: Searches, done: Finisher) -> None:
    """One turn of a streaming loop: submit ``batch`` (samples whose next turn starts now)
    to join ``running``, step the engine once, and record the turns that ended in that step."""
    backend = cast(StreamingBackend, engine.backend)  # the caller checked models.base.streams
    if batch:
        ids = backend.submit(engine.contexts(batch), engine.turn_params(batch), stop=engine.protocol.stop_strings)
        running.update(zip(ids, batch))
    finished = backend.step() if running else []
    if finished:
        ended = [running.pop(rid) for rid, _ in finished]
        searches.send(ended, engine.record_turns(ended, [out for _, out in finished], done))
