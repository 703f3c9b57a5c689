"""Counterfactual retrievers for ``zsearch eval --probe``: wrappers around the real backend
that change what a search returns, so the EM they give says what the agent does with search.

- ``real``: the backend itself;
- ``empty``: no passages (how far the agent gets from memory alone);
- ``random``: ``topk`` passages drawn uniformly from the corpus, seeded per request by the
  run's seed, the row, the sample and the query (the same whichever batch a query is in);
- ``shuffled``: ranks k+1..2k of the real backend in place of 1..k (plausible but worse);
- ``gold``: the real top-k with a passage holding a gold answer put first, where the audit
  (``zsearch audit``) found one; unchanged elsewhere.

Each keeps the inner backend's thread safety and forwards its training hooks.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import mix_seed
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.search.base import SearchBackend, SearchRequest, SearchResult

PROBES = ("real", "empty", "random", "shuffled", "gold")


def parse_probes(spec: str | None) -> list[str]:
    """``"real,empty"`` -> ``["real", "empty"]`` (order kept, duplicates dropped); None -> []."""
    if spec is None:
        return []
    probes = list(dict.fromkeys(p.strip().lower() for p in spec.split(",") if p.strip()))
    unknown = [p for p in probes if p not in PROBES]
    if unknown or not probes:
        raise ZsearchError(f"--probe: unknown probe {', '.join(map(repr, unknown)) or 'list'} "
                           f"(choose from: {', '.join(PROBES)})")
    return probes


class ProbeSearch(SearchBackend):
    """A backend wrapped by a probe; subclasses change :meth:`search`."""

    probe = "real"

    def __init__(self, inner: SearchBackend):
        self.inner = inner
        self.thread_safe = getattr(inner, "thread_safe", False)
        self.name = f"probe:{self.probe}({getattr(inner, 'name', 'search')})"

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        return self.inner.search(requests, topk)

    def progress(self, step: int, total: int) -> None:
        self.inner.progress(step, total)

    def metrics(self) -> dict[str, float]:
        return self.inner.metrics()


class EmptySearch(ProbeSearch):
    probe = "empty"

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        return [SearchResult(passages=[]) for _ in requests]


class RandomSearch(ProbeSearch):
    """``corpus`` is anything with ``len()`` and ``get(row) -> Passage`` (a SearchIndex)."""

    probe = "random"

    def __init__(self, inner: SearchBackend, corpus: Any, seed: int):
        super().__init__(inner)
        self.thread_safe = True  # reads the memory-mapped corpus only
        self.corpus, self.seed = corpus, seed

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        n = len(self.corpus)
        out = []
        for r in requests:
            rng = np.random.default_rng(mix_seed(self.seed, "probe-random", r.row_id, r.sample_index, r.query))
            rows = rng.choice(n, size=min(topk, n), replace=False)
            out.append(SearchResult(passages=[self.corpus.get(int(row)) for row in rows]))
        return out


class ShuffledSearch(ProbeSearch):
    probe = "shuffled"

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        deeper = self.inner.search(requests, 2 * topk)
        return [SearchResult(passages=list(res.passages[topk : 2 * topk]), log=res.log) for res in deeper]


class GoldSearch(ProbeSearch):
    """``gold``: row id -> the passage to put first (from the audit; rows without one are
    searched as usual). The passage is not repeated further down, and the list keeps ``topk``."""

    probe = "gold"

    def __init__(self, inner: SearchBackend, gold: Mapping[str, Passage]):
        super().__init__(inner)
        self.gold = dict(gold)

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        out = []
        for r, res in zip(requests, self.inner.search(requests, topk)):
            first = self.gold.get(r.row_id)
            if first is None:
                out.append(res)
                continue
            rest = [p for p in res.passages if p.id != first.id]
            out.append(SearchResult(passages=[first, *rest][:topk], log=res.log))
        return out


def probe_backend(probe: str, inner: SearchBackend, *, corpus: Any = None, seed: int = 0,
                  gold: Mapping[str, Passage] | None = None) -> SearchBackend:
    """The backend ``probe`` runs with: ``inner`` itself for ``real``."""
    if probe == "real":
        return inner
    if probe == "empty":
        return EmptySearch(inner)
    if probe == "shuffled":
        return ShuffledSearch(inner)
    if probe == "random":
        if corpus is None:
            raise ZsearchError("--probe random draws passages from an index: give --index DIR")
        return RandomSearch(inner, corpus, seed)
    if probe == "gold":
        return GoldSearch(inner, gold or {})
    raise ZsearchError(f"--probe: unknown probe {probe!r} (choose from: {', '.join(PROBES)})")
