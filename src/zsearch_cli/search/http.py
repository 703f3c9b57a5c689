"""Search through a running ``zsearch serve`` (or Search-R1's retriever) at ``http://host:port``,
or through several replicas of one: ``http://a:8000,http://b:8000`` (round-robin, failing
over to the next replica on an error or a timeout; :mod:`zsearch_cli.retrieval.replicas`).

``timeout`` is the total deadline of one ``/retrieve`` attempt (connect, head and body),
which carries a whole rollout turn's queries: 60 s leaves room for a large batch on a busy
dense index, and a server that stalls or trickles bytes fails the call after at most
``(1 + retries)`` rounds of deadlines plus backoff (or ``deadline`` s, when set), never hangs it.
"""

from __future__ import annotations

from typing import Sequence

from zsearch_cli.search.base import SearchBackend, SearchBackendError, SearchRequest, SearchResult
from zsearch_cli.errors import ZsearchError


class HTTPSearch(SearchBackend):
    thread_safe = True  # RetrievalClient keeps one session per thread
    def __init__(self, url: str | Sequence[str], timeout: float = 60.0, retries: int = 3, backoff: float = 0.5,
                 deadline: float | None = None):
        from zsearch_cli.retrieval.client import RetrievalClient

        self.client = RetrievalClient(url, timeout=timeout, retries=retries, backoff=backoff, deadline=deadline)
        self.name = f"http:{url if isinstance(url, str) else self.client.url}"

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        if not requests:
            return []
        try:
            hits = self.client.retrieve([r.query for r in requests], topk)
        except ZsearchError as err:
            raise SearchBackendError(str(err)) from None
        return [SearchResult(passages=h) for h in hits]
