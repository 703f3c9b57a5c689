"""The search interface the rollout engine talks to.

Every query carries the context of the row that issued it (row id, question, gold
answers), because the ZeroSearch simulator writes documents *for that question*; ZeroSearch's
code sent another row's question when some rows of a batch did not search.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage


@dataclass(frozen=True)
class SearchRequest:
    """One query and the row that issued it."""

    query: str
    row_id: str
    question: str
    golden_answers: tuple[str, ...]
    sample_index: int = 0


@dataclass
class SearchResult:
    """The passages for one request, plus anything the backend wants logged in the
    trajectory (the simulator records p(t), its draw and its raw output here)."""

    passages: list[Passage]
    log: dict[str, Any] = field(default_factory=dict)


class SearchBackendError(ZsearchError):
    """The backend failed after its retries. ``completed`` holds the trajectories the
    engine had already finished, so a caller can save them before exiting."""

    def __init__(self, message: str, completed: list[Any] | None = None):
        super().__init__(message)
        self.completed = completed or []


class SearchBackend:
    """What every search backend is: :meth:`search`, plus two training hooks with no-op
    defaults, so the trainer calls them on any backend without probing for them."""

    name: str = "search"
    thread_safe: bool = False
    """True when :meth:`search` may run on several threads at once: the async rollout mode then
    keeps up to ``--search-concurrency`` calls in flight (otherwise one at a time)."""

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        """All of a turn's queries in one batched call; one result per request, in order."""
        raise NotImplementedError

    def progress(self, step: int, total: int) -> None:
        """Training progress before step ``step`` of ``total`` (0-based: the steps already
        done). The simulator's noise curriculum reads it (ZeroSearch eq. 1); others ignore it."""

    def metrics(self) -> dict[str, float]:
        """Numbers to log for the current step, without a namespace (the trainer logs them as
        ``search/<name>``); e.g. the simulator's noise probability ``noise_p``."""
        return {}


def search_grouped(search: SearchBackend, groups: Sequence[list[SearchRequest]], topk: int) -> list[list[SearchResult]]:
    """All ``groups`` of requests in one backend call (a retriever or a simulator is faster
    on a batch); the results split back per group. Both rollout schedulers search this way."""
    results = search.search([r for reqs in groups for r in reqs], topk)
    out, at = [], 0
    for reqs in groups:
        out.append(list(results[at : at + len(reqs)]))
        at += len(reqs)
    return out
