"""A client for any Search-R1-style ``/retrieve`` server: ours, theirs, or a remote one.

Rollouts call the retriever thousands of times from many threads, and a retriever
restarting or briefly overloaded should not kill a training run; so connection errors,
timeouts and 5xx answers are retried a bounded number of times with exponential backoff,
each attempt held to a total deadline (``timeout``: connect, head and body together, so a
server that trickles bytes cannot stall the caller; :mod:`zsearch_cli.net`),
while a 4xx (our request is wrong; retrying cannot help) fails at once. Either way the
caller gets one :class:`ZsearchError` naming the URL and what went wrong.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

import requests

from zsearch_cli import net
from zsearch_cli.data.corpus import split_contents
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage


class _Retryable(Exception):
    """A failure worth another try (5xx, connection refused, timeout)."""


class RetrievalClient:
    """Talks to ``url`` (e.g. ``http://127.0.0.1:8000``; a trailing ``/retrieve`` is fine).
    ``timeout`` is the total deadline of one attempt, in seconds.

    Safe to share between threads: each thread gets its own ``requests.Session`` (and so
    its own keep-alive connection), since a Session's pool is not guaranteed thread-safe.
    """

    def __init__(self, url: str, timeout: float = 10.0, retries: int = 3, backoff: float = 0.5):
        base = url.rstrip("/")
        for suffix in ("/retrieve", "/health"):
            if base.endswith(suffix):
                base = base[: -len(suffix)]
        if not base.startswith(("http://", "https://")):
            raise ZsearchError(f"retrieval url must start with http:// or https://, got {url!r}")
        if retries < 0 or timeout <= 0 or backoff < 0:
            raise ZsearchError("retrieval client needs retries >= 0, timeout > 0 and backoff >= 0")
        self.url = base
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = net.session()
        return session

    def _call(self, verb: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        """One JSON request with retries; returns the decoded body of a 2xx answer."""
        url = self.url + path
        last = "no attempt made"
        attempts = self.retries + 1
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                return self._once(verb, url, payload)
            except _Retryable as err:
                last = str(err)
        raise ZsearchError(f"retrieval server {url} failed after {attempts} attempt(s): {last}")

    def _once(self, verb: str, url: str, payload: dict[str, Any] | None) -> Any:
        try:
            resp = net.request(self._session(), verb, url, json=payload, deadline=self.timeout)
        except net.DeadlineExceeded as err:
            raise _Retryable(str(err)) from None
        except requests.ConnectionError as err:
            raise _Retryable(f"cannot connect ({_root_cause(err)})") from None
        except requests.RequestException as err:  # a broken answer (cut body, bad chunking)
            raise _Retryable(f"{type(err).__name__}: {_root_cause(err)}") from None
        if resp.status_code >= 500:
            raise _Retryable(f"HTTP {resp.status_code}: {_error_text(resp)}")
        if resp.status_code >= 400:
            raise ZsearchError(f"retrieval server {url} rejected the request: HTTP {resp.status_code}: {_error_text(resp)}")
        try:
            return resp.json()
        except ValueError:
            raise ZsearchError(f"retrieval server {url} answered with non-JSON: {resp.text[:200]!r}") from None

    def retrieve(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """Top-``topk`` passages per query, best first, with scores where the server gives them."""
        queries = list(queries)
        if not queries:
            return []
        body = self._call("POST", "/retrieve", {"queries": queries, "topk": topk, "return_scores": True})
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise ZsearchError(f"retrieval server {self.url}/retrieve: expected 'result' with {len(queries)} lists, "
                               f"got {str(body)[:200]}")
        return [[_passage(hit) for hit in hits] for hits in result]

    def search(self, queries: Sequence[str], topk: int) -> list[list[Passage]]:
        """The :class:`~zsearch_cli.retrieval.base.Retriever` protocol: same as :meth:`retrieve`."""
        return self.retrieve(queries, topk)

    def health(self) -> dict[str, Any]:
        """The server's /health body (index name, size, methods, cache stats)."""
        return self._call("GET", "/health")


def _passage(hit: Any) -> Passage:
    """A Passage from either hit shape: ``{"document": {...}, "score": s}`` or a bare document."""
    if not isinstance(hit, dict):
        raise ZsearchError(f"retrieval server returned a hit that is not an object: {hit!r:.200}")
    doc, score = (hit["document"], hit.get("score")) if "document" in hit else (hit, None)
    if "contents" in doc:
        title, text = split_contents(doc["contents"] or "")
    else:
        title, text = doc.get("title") or "", doc.get("text") or ""
    return Passage(id=str(doc.get("id", "")), title=title, text=text,
                   score=None if score is None else float(score))


def _error_text(resp: requests.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text[:200] or resp.reason
    if isinstance(body, dict):
        return str(body.get("error") or body.get("detail") or body)[:500]
    return str(body)[:200]


def _root_cause(err: BaseException) -> str:
    """The innermost reason of a requests ConnectionError (e.g. 'Connection refused')."""
    while err.__context__ is not None or err.__cause__ is not None:
        err = err.__cause__ or err.__context__  # type: ignore[assignment]
    for arg in getattr(err, "args", ()):
        if isinstance(arg, BaseException):
            err = arg
    return str(err) or type(err).__name__
