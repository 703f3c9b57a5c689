"""The ZeroSearch simulator behind Search-R1's ``/retrieve``, for trainers other than ours.

Search-R1, verl's search tool, slime and SkyRL send ``{"queries", "topk", "return_scores"}``
and nothing else; that request works as it is. A trainer that knows more may add, per request:

* ``noise``: the probability of noisy documents for this request (0..1), or
* ``step`` (and ``total_steps``): the curriculum's p(t) at that training step (eq. 1);
  without either, p(t) is the server's current one, which ``POST /progress`` advances;
* ``questions`` and ``golden_answers``: one per query, the row that issued it. ZeroSearch's
  prompt names the question and its answer; without them the query stands for the question
  and the answer is given as ``unknown`` (:data:`NO_ANSWER`).

Why the draws are made here and not in :class:`~zsearch_cli.search.simulated.SimulatedSearch`:
its curriculum has one p(t) per process, while requests here carry their own. Each query's
quality is the same pure hash the trainer uses (``unit_draw(seed, step, row, sample, query,
call)``; noisy when u < p), and the simulator is asked for that quality
(``simulate(..., qualities=...)``), so its prompts, parsing, re-asks and cache are untouched.

Concurrent requests are coalesced: one thread drains everything waiting into one batched
``simulate`` call per topk (an in-process model generates a batch about as fast as one
prompt), since the simulator itself is not thread-safe.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import Future
from typing import Any, Sequence

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.sources import Results
from zsearch_cli.search.base import SearchBackendError

NO_ANSWER = "unknown"
"""The gold answer a request without ``golden_answers`` is simulated with."""


class FieldError(ZsearchError):
    """A per-request simulator field is malformed (the server answers 400)."""


def _optional_list(fields: dict[str, Any], name: str, n: int) -> list[Any] | None:
    value = fields.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != n:
        raise FieldError(f"'{name}' must be a list with one entry per query ({n}), got {str(value)[:80]}")
    return value


def read_sim_fields(fields: dict[str, Any], n: int) -> tuple[list[str] | None, list[tuple[str, ...]] | None,
                                                         float | None, int | None, int | None]:
    """``(questions, golden_answers, noise, step, total_steps)`` of a request, checked."""
    questions = _optional_list(fields, "questions", n)
    if questions is not None and not all(isinstance(q, str) for q in questions):
        raise FieldError("'questions' must be strings")
    raw_answers = _optional_list(fields, "golden_answers", n)
    answers = None
    if raw_answers is not None:
        answers = []
        for i, a in enumerate(raw_answers):
            items = [a] if isinstance(a, str) else a
            if not isinstance(items, list) or not items or not all(isinstance(x, str) for x in items):
                raise FieldError(f"'golden_answers'[{i}] must be a string or a non-empty list of strings")
            answers.append(tuple(items))
    noise, step, total = fields.get("noise"), fields.get("step"), fields.get("total_steps")
    if noise is not None and step is not None:
        raise FieldError("give 'noise' or 'step', not both")
    if noise is not None and (isinstance(noise, bool) or not isinstance(noise, (int, float)) or not 0 <= noise <= 1):
        raise FieldError(f"'noise' must be a number in [0, 1], got {noise!r}")
    for name, value in (("step", step), ("total_steps", total)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise FieldError(f"'{name}' must be an integer >= 0, got {value!r}")
    return questions, answers, None if noise is None else float(noise), step, total


class _Job:
    def __init__(self, requests: list[Any], topk: int, qualities: list[str]):
        self.requests, self.topk, self.qualities = requests, topk, qualities
        self.future: Future = Future()


class SimSource:
    """A :class:`~zsearch_cli.search.simulated.SimulatedSearch` served per request."""

    memory_cache = False

    def __init__(self, sim: Any):
        self.sim = sim
        self.name = sim.name
        self.cache_tag = ("sim", sim.name)
        self._calls: Counter = Counter()
        """Per (step, row, query): draws made, so a repeated query gets a fresh draw."""
        self._lock = threading.Lock()
        self._pending: list[_Job] = []
        self._wake = threading.Condition(self._lock)
        self.served = {"useful": 0, "noisy": 0}
        self._worker = threading.Thread(target=self._run, name="sim-batcher", daemon=True)
        self._worker.start()

    # ------------------------------------------------------------------ the curriculum

    def progress(self, step: int, total_steps: int) -> dict[str, Any]:
        """The trainer's ``POST /progress``: p(t) for requests that give no noise of their own."""
        with self._lock:
            self.sim.progress(step, total_steps)
            self._calls.clear()
            return self._curriculum_state()

    def _curriculum_state(self) -> dict[str, Any]:
        cur = self.sim.curriculum
        return {"step": cur.step, "total_steps": cur.total_steps, "noise_p": float(cur.p)}

    def _noise_p(self, noise: float | None, step: int | None, total: int | None) -> tuple[float, int]:
        """``(p, step)`` for one request: its own noise, p(t) at its step, or the current p(t)."""
        from zsearch_cli.search.curriculum import noise_probability

        cur = self.sim.curriculum
        if noise is not None:
            return noise, cur.step
        if step is not None:
            total = cur.total_steps if total is None else total
            return noise_probability(step, total, cur.p_start, cur.p_end, cur.base, cur.schedule), step
        return cur.p, cur.step

    # ------------------------------------------------------------------ search

    def search(self, queries: Sequence[str], topk: int, fields: dict[str, Any]) -> Results:
        from zsearch_cli.search.base import SearchRequest
        from zsearch_cli.search.curriculum import unit_draw

        questions, answers, noise, step, total = read_sim_fields(fields, len(queries))
        requests, qualities, draws = [], [], []
        with self._lock:
            p, t = self._noise_p(noise, step, total)
            for i, query in enumerate(queries):
                question = questions[i] if questions else query
                requests.append(SearchRequest(query=query, row_id=question, question=question,
                                              golden_answers=answers[i] if answers else (NO_ANSWER,)))
                key = (t, question, query)
                call = self._calls[key]
                self._calls[key] += 1
                u = unit_draw(self.sim.config.seed, t, question, 0, query, call)
                qualities.append("noisy" if u < p else "useful")
                draws.append({"quality": qualities[-1], "p": p, "u": u, "t": t})
            job = _Job(requests, topk, qualities)
            self._pending.append(job)
            self._wake.notify()
        try:
            results = job.future.result()
        except SearchBackendError as err:  # a sim+http server that is down: the server answers 502
            from zsearch_cli.retrieval.client import RetrievalUnavailable

            raise RetrievalUnavailable(str(err)) from None
        return [r.passages for r in results], {"simulator": draws}

    def _run(self) -> None:
        """The batcher: take every waiting job, one ``simulate`` call per topk."""
        while True:
            with self._lock:
                while not self._pending:
                    self._wake.wait()
                jobs, self._pending = self._pending, []
            by_topk: dict[int, list[_Job]] = {}
            for job in jobs:
                by_topk.setdefault(job.topk, []).append(job)
            for topk, group in by_topk.items():
                self._simulate(topk, group)

    def _simulate(self, topk: int, jobs: list[_Job]) -> None:
        try:
            results = self.sim.simulate([r for j in jobs for r in j.requests], topk,
                                        qualities=[q for j in jobs for q in j.qualities])
        except BaseException as err:  # noqa: BLE001 - each waiting request gets the error
            for job in jobs:
                job.future.set_exception(err)
            return
        at = 0
        for job in jobs:
            job.future.set_result(results[at: at + len(job.requests)])
            at += len(job.requests)
            for q in job.qualities:
                self.served[q] += 1

    def health(self) -> dict[str, Any]:
        with self._lock:
            return {"simulator": self.sim.name, "curriculum": self._curriculum_state(), "served": dict(self.served)}
