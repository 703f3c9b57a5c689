"""A search backend that needs nothing but the query (SerpAPI) as a source of
``zsearch serve`` (:mod:`zsearch_cli.retrieval.sources` says what a source is)."""

from __future__ import annotations

from typing import Any, Sequence

from zsearch_cli.retrieval.client import RetrievalUnavailable
from zsearch_cli.retrieval.sources import Results
from zsearch_cli.search.base import SearchBackendError, SearchRequest


class BackendSource:
    """A search backend that needs nothing but the query (SerpAPI): each query becomes a
    ``SearchRequest`` whose question is the query itself."""

    memory_cache = False

    def __init__(self, backend: Any):
        self.backend = backend
        self.name = backend.name
        self.cache_tag = ("backend", backend.name)

    def search(self, queries: Sequence[str], topk: int, fields: dict[str, Any]) -> Results:
        requests = [SearchRequest(query=q, row_id=f"serve-{i}", question=q, golden_answers=())
                    for i, q in enumerate(queries)]
        try:
            results = self.backend.search(requests, topk)
        except SearchBackendError as err:  # the API is down or refusing: the server answers 502
            raise RetrievalUnavailable(str(err)) from None
        return [r.passages for r in results], None

    def health(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend.name}
        stats = getattr(self.backend, "cache_stats", None)
        if callable(stats):
            out["disk_cache"] = stats()
        return out
