"""In-process search over a zsearch index directory (BM25, dense or hybrid)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from zsearch_cli.search.base import SearchBackend, SearchRequest, SearchResult


class IndexSearch(SearchBackend):
    """Wraps :class:`zsearch_cli.retrieval.index.SearchIndex`; one batched call per turn."""

    def __init__(self, index_dir: str | Path, method: str = "auto"):
        from zsearch_cli.retrieval.index import load_index

        self.index = load_index(Path(index_dir))
        self.method = method
        self.name = f"index:{method}:{self.index.name}"

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        if not requests:
            return []
        hits = self.index.search([r.query for r in requests], topk, method=self.method)
        return [SearchResult(passages=h) for h in hits]
