"""What ``zsearch serve`` can put behind Search-R1's ``/retrieve``: a *source* answers a
batch of queries and says how it is doing in ``/health``.

* :class:`IndexSource`: a zsearch index on disk (memory-mapped; ``--index`` or bm25/dense/hybrid).
* :class:`ReplicaSource`: other retrieval servers (``--search http://a,http://b``): a caching
  proxy that spreads the misses round-robin and fails over (:mod:`.replicas`).
* ``BackendSource`` (:mod:`zsearch_cli.search.backend_source`): any other search backend
  (``--search serpapi``, with its on-disk cache).
* ``SimSource`` (:mod:`zsearch_cli.search.sim_source`): the ZeroSearch simulator, with the
  noise level per request.

(The last two live in ``search/``: ``retrieval`` does not import ``search``, which imports it.)

Every source has ``name``, ``memory_cache`` (whether the server's LRU may sit in front of
it: not for the simulator, whose answers are drawn per call, nor for SerpAPI, whose disk
cache is the one whose hit rate matters), ``search(queries, topk, fields)`` (``fields``:
the request's JSON object, for sources that read more than the queries) returning one
passage list per query and, optionally, extra top-level response fields, and ``health()``.
"""

from __future__ import annotations

from typing import Any, Sequence

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage

Results = tuple[list[list[Passage]], dict[str, Any] | None]
"""One passage list per query, and extra top-level fields for the response (or None)."""


class IndexSource:
    """A loaded ``SearchIndex`` (or anything with ``name``, ``methods``, ``__len__`` and
    ``search(queries, topk, method=)``) searched with one method."""

    memory_cache = True

    def __init__(self, index: Any, method: str = "auto"):
        methods = list(getattr(index, "methods", []))
        if hasattr(index, "resolve_method"):  # checks the name; 'auto' becomes what it means here
            method = index.resolve_method(method)
        elif method != "auto" and method not in methods:
            raise ZsearchError(f"index {index.name} has no method '{method}' (it has: {', '.join(methods)}, auto)")
        self.index = index
        self.method = method
        self.name = index.name
        self.cache_tag = (index.name, method)

    def search(self, queries: Sequence[str], topk: int, fields: dict[str, Any]) -> Results:
        return self.index.search(list(queries), topk, method=self.method), None

    def health(self) -> dict[str, Any]:
        from zsearch_cli.retrieval.settings import index_settings

        manifest = getattr(self.index, "manifest", None)
        return {
            "index": self.index.name,
            "n_docs": len(self.index),
            "methods": list(getattr(self.index, "methods", [])),
            "method": self.method,
            # what an eval's protocol records for a remote retriever (protocol._served_corpus)
            "settings": index_settings(manifest, self.method) if isinstance(manifest, dict) else None,
        }


UPSTREAM_FIELDS = ("index", "n_docs", "methods", "method", "settings")
"""What a proxy passes on from its replicas' /health, so that a protocol records the
served corpus through the proxy as it would from a replica."""


class ReplicaSource:
    """Replicas of one retriever behind a :class:`~zsearch_cli.retrieval.client.RetrievalClient`."""

    memory_cache = True

    def __init__(self, client: Any):
        self.client = client
        self.name = f"replicas:{client.url}"
        self.cache_tag = ("replicas", client.url)

    def search(self, queries: Sequence[str], topk: int, fields: dict[str, Any]) -> Results:
        return self.client.retrieve(queries, topk), None

    def health(self) -> dict[str, Any]:
        """Which replicas answer their /health now, and the first answer's index fields."""
        import requests

        replicas = self.client.probe()
        out: dict[str, Any] = {"replicas": replicas, "replicas_up": sum(r["up"] for r in replicas)}
        for r in replicas:
            if r["up"]:
                try:
                    body = requests.get(r["url"] + "/health", timeout=2).json()
                except (requests.RequestException, ValueError):
                    continue
                out.update({k: body.get(k) for k in UPSTREAM_FIELDS if isinstance(body, dict) and k in body})
                break
        if not out["replicas_up"]:
            out["status"] = "degraded"
        return out
