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

The search side trips (:class:`~zsearch_cli.rollout.state.Searches`: batched calls on
worker threads) and the streaming turn are shared with ``stream.py``, in ``state.py``.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence, cast

from zsearch_cli.models.base import StreamingBackend, streams
from zsearch_cli.rollout.state import (
    Finisher,
    SampleState,
    Searches,
    TurnSteps,
    check_separate_models,
    stream_step,
)


def rollout_async(engine: TurnSteps, samples: Sequence[SampleState], step: int, done: Finisher) -> None:
    """Advance every sample to its end (see the module docstring); fills ``samples`` in place."""
    check_separate_models(engine)
    if streams(engine.backend):
        _rollout_streaming(engine, samples, step, done)
    else:
        _rollout_batched(engine, samples, step, done)


def _rollout_streaming(engine: TurnSteps, samples: Sequence[SampleState], step: int, done: Finisher) -> None:
    """On a continuous-batching backend (vLLM): every ready sample is submitted at once and
    the engine is stepped; a sample leaves the running batch the step its turn ends (to its
    search, or done) and rejoins it when its search returns, while the others keep decoding."""
    backend = cast(StreamingBackend, engine.backend)
    ready: deque[SampleState] = deque(samples)
    running: dict[str, SampleState] = {}
    searches = Searches(engine, done, ready, lambda err: engine.search_failed(err, samples, step))
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


def _rollout_batched(engine: TurnSteps, samples: Sequence[SampleState], step: int, done: Finisher) -> None:
    """On a backend without continuous batching (HF): each generate call takes the samples
    that are ready, at most ``max_batch_size``."""
    capacity = getattr(engine.backend, "max_batch_size", None) or len(samples) or 1
    ready: deque[SampleState] = deque(samples)
    searches = Searches(engine, done, ready, lambda err: engine.search_failed(err, samples, step))
    try:
        while ready or searches.waiting:
            searches.collect(block=not ready)
            if ready:
                batch = [ready.popleft() for _ in range(min(capacity, len(ready)))]
                searches.send(batch, engine.generate_turn(batch, done))
    finally:
        searches.close()
