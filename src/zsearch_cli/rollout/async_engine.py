"""Async rollouts (``--rollout-mode async``): the engine's loop without the turn barrier.

The sync loop generates one turn of every active sample, then runs every search of that
turn, then the next turn: the generator waits for the slowest search of each turn, and the
search backend waits for the longest generation. Here each sample advances on its own:

* a sample whose turn asks for a search goes to a pool of search threads, while the main
  thread keeps generating for the samples that are ready;
* on a continuous-batching backend (vLLM, :class:`~zsearch_cli.models.base.StreamingBackend`)
  the engine is stepped one step at a time: a sample leaves the running batch the step its
  turn ends and rejoins it, between two steps, as soon as its search returns; no turn waits
  for the longest generation of its batch;
* on other backends (HF) each generate call takes whatever is ready, at most the backend's
  ``max_batch_size`` (a bigger call would run in sequential chunks anyway), so the first
  chunk's searches run while the next chunk generates; a finished search's observation is
  inserted as soon as the main thread is between two generate calls, and the sample
  rejoins the queue.

What a sample contains does not depend on this schedule: the per-sample steps are the sync
engine's own (:meth:`RolloutEngine.record_turns`, :meth:`RolloutEngine.observe`), and
every turn's sampling seed names the sample and turn, not the batch (``sample_seed``).

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
from typing import TYPE_CHECKING, Any, Callable, Sequence

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import streams
from zsearch_cli.search.base import SearchBackend, SearchRequest, SearchResult, search_grouped

if TYPE_CHECKING:
    from zsearch_cli.rollout.engine import RolloutEngine, _Finisher, _Sample


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


def _check_separate_models(engine: "RolloutEngine") -> None:
    """A simulator that writes documents with the policy's own model object cannot search
    while the policy generates (one HF model is not safe on two threads at once)."""
    sim_model = getattr(getattr(engine.search, "generator", None), "model", None)
    if sim_model is not None and sim_model is getattr(engine.backend, "model", None):
        raise ZsearchError("the search simulator shares the policy's model, which cannot run on two threads "
                           "at once: use --rollout-mode sync, or give the simulator its own model")


def rollout_async(engine: "RolloutEngine", samples: Sequence["_Sample"], step: int, done: "_Finisher") -> None:
    """Advance every sample to its end (see the module docstring); fills ``samples`` in place."""
    _check_separate_models(engine)
    if streams(engine.backend):
        _rollout_streaming(engine, samples, step, done)
    else:
        _rollout_batched(engine, samples, step, done)


class _Searches:
    """The samples' side trips to search, shared by every async loop: ``send`` the turns that
    asked for a search (and put the others that go on back in ``ready``), ``collect`` the
    observations that came back (their samples rejoin ``ready``). The pool starts with the
    first search. ``failed(err)`` gives the exception to raise when the backend fails."""

    def __init__(self, engine: "RolloutEngine", done: "_Finisher", ready: deque,
                 failed: Callable[[ZsearchError], Exception]):
        self.engine, self.done, self.ready, self.failed = engine, done, ready, failed
        self.pool: SearchPool | None = None
        self.waiting = 0

    def send(self, batch: Sequence["_Sample"], pending: list[tuple["_Sample", Any]]) -> None:
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


def stream_step(engine: "RolloutEngine", batch: list["_Sample"], running: dict[str, "_Sample"],
                searches: _Searches, done: "_Finisher") -> None:
    """One turn of the streaming loop: submit ``batch`` (samples whose next turn starts now)
    to join ``running``, step the engine once, and record the turns that ended in that step."""
    backend = engine.backend
    if batch:
        ids = backend.submit(engine.contexts(batch), engine.turn_params(batch), stop=engine.protocol.stop_strings)
        running.update(zip(ids, batch))
    finished = backend.step() if running else []
    if finished:
        ended = [running.pop(rid) for rid, _ in finished]
        searches.send(ended, engine.record_turns(ended, [out for _, out in finished], done))


def _rollout_streaming(engine: "RolloutEngine", samples: Sequence["_Sample"], step: int, done: "_Finisher") -> None:
    """On a continuous-batching backend (vLLM): every ready sample is submitted at once and
    the engine is stepped; a sample leaves the running batch the step its turn ends (to its
    search, or done) and rejoins it when its search returns, while the others keep decoding."""
    backend = engine.backend
    ready: deque[_Sample] = deque(samples)
    running: dict[str, _Sample] = {}
    searches = _Searches(engine, done, ready, lambda err: engine.search_failed(err, samples, step))
    try:
        while ready or searches.waiting or running:
            searches.collect(block=not ready and not running)
            batch = list(ready)
            ready.clear()
            stream_step(engine, batch, running, searches, done)
    finally:
        if running:  # a failure left requests in the engine: they must not surface later
            backend.abort(list(running))
        searches.close()


def _rollout_batched(engine: "RolloutEngine", samples: Sequence["_Sample"], step: int, done: "_Finisher") -> None:
    """On a backend without continuous batching (HF): each generate call takes the samples
    that are ready, at most ``max_batch_size``."""
    capacity = getattr(engine.backend, "max_batch_size", None) or len(samples) or 1
    ready: deque[_Sample] = deque(samples)
    searches = _Searches(engine, done, ready, lambda err: engine.search_failed(err, samples, step))
    try:
        while ready or searches.waiting:
            searches.collect(block=not ready)
            if ready:
                batch = [ready.popleft() for _ in range(min(capacity, len(ready)))]
                searches.send(batch, engine.generate_turn(batch, done))
    finally:
        searches.close()
