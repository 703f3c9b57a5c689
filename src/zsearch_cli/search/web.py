"""Web search through SerpAPI (Google results), for evaluation and real-search collection.

The key comes from the ``SERPAPI_API_KEY`` environment variable. Each result becomes a
Passage with the page title and snippet; the id is the result's link.

SerpAPI takes the key as a query parameter, so it is in every request URL, and ``requests``
puts that URL into its exception messages. Every message that leaves this module goes
through :func:`zsearch_cli.errors.redact` with the key itself as an extra secret. Each
request has a total deadline (``timeout``) and bounded retries.

With ``cache`` (a file path), answers are kept on disk keyed by (query, k, engine)
(:mod:`zsearch_cli.search.serpapi_cache`): an identical request is answered from the file
and makes no network call. ``base_url`` points at another SerpAPI-compatible endpoint
(a proxy, or a local fake in tests).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from zsearch_cli import net
from zsearch_cli.errors import ZsearchError, redact
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.retry import PermanentError, with_retries
from zsearch_cli.search.base import SearchBackend, SearchBackendError, SearchRequest, SearchResult

SERPAPI_URL = "https://serpapi.com/search.json"


class SerpAPISearch(SearchBackend):
    def __init__(
        self,
        api_key: str | None = None,
        base_url: str = SERPAPI_URL,
        timeout: float = 15.0,
        retries: int = 3,
        backoff: float = 1.0,
        concurrency: int = 8,
        engine: str = "google",
        cache: str | Path | None = None,
    ):
        self.api_key = api_key or os.environ.get("SERPAPI_API_KEY")
        if not self.api_key:
            raise ZsearchError("serpapi search needs an API key: set the SERPAPI_API_KEY environment variable")
        self.base_url, self.timeout, self.retries, self.backoff = base_url, timeout, retries, backoff
        self.concurrency, self.engine = concurrency, engine
        self.session = net.session()
        self.name = f"serpapi:{engine}"
        self.cache = None
        if cache:
            from zsearch_cli.search.serpapi_cache import SerpAPICache

            self.cache = SerpAPICache(cache)

    def cache_stats(self) -> dict[str, object] | None:
        """The disk cache's entries, hits, misses and hit rate (None without a cache)."""
        return None if self.cache is None else self.cache.stats()

    def _redact(self, text: str) -> str:
        return redact(str(text).replace(self.api_key, "***"))

    def _one(self, query: str, topk: int) -> list[Passage]:
        if self.cache is not None:
            hit = self.cache.get(query, topk, self.engine)
            if hit is not None:
                return hit
        passages = self._fetch(query, topk)
        if self.cache is not None:
            self.cache.put(query, topk, self.engine, passages)
        return passages

    def _fetch(self, query: str, topk: int) -> list[Passage]:
        def call() -> list[Passage]:
            try:
                resp = net.request(self.session, "GET", self.base_url, deadline=self.timeout,
                                   params={"engine": self.engine, "q": query, "num": topk, "api_key": self.api_key})
            except Exception as err:  # noqa: BLE001 - its message holds the URL, so the key: retried, redacted
                raise RuntimeError(self._redact(f"{type(err).__name__}: {err}")) from None
            if 400 <= resp.status_code < 500 and resp.status_code != 429:
                raise PermanentError(self._redact(f"HTTP {resp.status_code}: {resp.text[:200]}"))
            if resp.status_code >= 400:
                raise RuntimeError(self._redact(f"HTTP {resp.status_code}: {resp.text[:200]}"))
            try:
                results = resp.json().get("organic_results") or []
            except (ValueError, AttributeError):
                raise PermanentError(self._redact(f"not a SerpAPI JSON answer: {resp.text[:200]!r}")) from None
            return [
                Passage(id=str(r.get("link", "")), title=str(r.get("title", "")), text=str(r.get("snippet", "")))
                for r in results[:topk]
            ]

        return with_retries(call, what=f"serpapi query {query[:60]!r}", retries=self.retries, backoff=self.backoff)

    def search(self, requests_: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        if not requests_:
            return []
        try:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                hits = list(pool.map(lambda r: self._one(r.query, topk), requests_))
        except ZsearchError as err:
            raise SearchBackendError(str(err)) from None
        return [SearchResult(passages=h) for h in hits]
