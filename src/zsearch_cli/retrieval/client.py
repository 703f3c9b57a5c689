"""A client for any Search-R1-style ``/retrieve`` server: ours, theirs, or a remote one.

Rollouts call the retriever thousands of times from many threads, and a retriever
restarting or briefly overloaded should not kill a training run; so connection errors,
timeouts and 5xx answers are retried a bounded number of times with exponential backoff,
each attempt held to a total deadline (``timeout``: connect, head and body together, so a
server that trickles bytes cannot stall the caller; :mod:`zsearch_cli.net`),
while a 4xx (our request is wrong; retrying cannot help) fails at once. Either way the
caller gets one :class:`ZsearchError` naming the URL and what went wrong. Several URLs
are replicas of one retriever: calls go round-robin and fail over (:mod:`.replicas`).
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
from zsearch_cli.retrieval.replicas import DEFAULT_COOLDOWN, ReplicaSet, parse_urls


class _Retryable(Exception):
    """A failure worth another try (5xx, connection refused, timeout)."""


class RetrievalUnavailable(ZsearchError):
    """Every attempt on every replica failed (down, timing out or answering 5xx)."""


class RetrievalClient:
    """Talks to ``url`` (e.g. ``http://127.0.0.1:8000``; a trailing ``/retrieve`` is fine), or
    to several replicas of one retriever: ``"http://a:8000,http://b:8000"`` or a list.

    ``timeout`` is the total deadline of one attempt, in seconds; ``deadline`` (optional) the
    total of one call, attempts and backoff together. A call tries the replicas round-robin
    (:mod:`~zsearch_cli.retrieval.replicas`): a failed attempt goes on to the next replica at
    once; only when every replica of a round has failed does the call back off, for at most
    ``1 + retries`` rounds. With one URL a round is one attempt, as before.

    Safe to share between threads: each thread gets its own ``requests.Session`` (and so
    its own keep-alive connections), since a Session's pool is not guaranteed thread-safe.
    """

    def __init__(self, url: str | Sequence[str], timeout: float = 10.0, retries: int = 3, backoff: float = 0.5,
                 deadline: float | None = None, cooldown: float = DEFAULT_COOLDOWN):
        urls = parse_urls(url)
        if retries < 0 or timeout <= 0 or backoff < 0 or (deadline is not None and deadline <= 0):
            raise ZsearchError("retrieval client needs retries >= 0, timeout > 0, backoff >= 0 and deadline > 0")
        self.replicas = ReplicaSet(urls, cooldown)
        self.url = ",".join(urls)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.deadline = deadline
        self._local = threading.local()

    @property
    def urls(self) -> list[str]:
        return self.replicas.urls

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = net.session()
        return session

    def _call(self, verb: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        """One JSON request over the replicas with retries; the decoded body of a 2xx answer."""
        end = None if self.deadline is None else time.monotonic() + self.deadline
        errors: dict[str, str] = {}
        attempts = rounds = 0
        for round_ in range(self.retries + 1):
            if round_:
                pause = self.backoff * 2 ** (round_ - 1)
                if end is not None and time.monotonic() + pause >= end:
                    break
                time.sleep(pause)
            rounds += 1
            for base in self.replicas.order():
                left = self.timeout if end is None else min(self.timeout, end - time.monotonic())
                if left <= 0:
                    break
                attempts += 1
                try:
                    body = self._once(verb, base + path, payload, left)
                except _Retryable as err:
                    errors[base] = str(err)
                    self.replicas.failed(base, str(err))
                    continue
                self.replicas.succeeded(base)
                return body
        raise RetrievalUnavailable(self._failure(path, attempts, rounds, errors))

    def _failure(self, path: str, attempts: int, rounds: int, errors: dict[str, str]) -> str:
        """One line naming every replica and what went wrong with it last."""
        within = "" if self.deadline is None else f" within the {self.deadline:g}s deadline"
        if len(self.urls) == 1:
            last = errors.get(self.urls[0], "no attempt made")
            return f"retrieval server {self.urls[0]}{path} failed after {attempts} attempt(s){within}: {last}"
        named = "; ".join(f"{u}: {errors.get(u, 'not tried')}" for u in self.urls)
        return (f"retrieval servers {', '.join(self.urls)} ({path}) all failed, {attempts} attempt(s) in "
                f"{rounds} round(s){within}: {named}")

    def _once(self, verb: str, url: str, payload: dict[str, Any] | None, deadline: float) -> Any:
        try:
            resp = net.request(self._session(), verb, url, json=payload, deadline=deadline)
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
        """The /health body (index name, size, methods, cache stats) of the first replica that
        answers; with several replicas, ``replicas`` adds which are up (:meth:`probe`)."""
        body = self._call("GET", "/health")
        if len(self.urls) > 1 and isinstance(body, dict):
            body = {**body, "replicas": self.probe()}
        return body

    def probe(self, timeout: float = 2.0) -> list[dict[str, Any]]:
        """Ask every replica's /health now (in parallel, ``timeout`` s each), mark each up or
        down by its answer, and return :meth:`ReplicaSet.status`."""
        from concurrent.futures import ThreadPoolExecutor

        def ask(base: str) -> None:
            try:
                self._once("GET", base + "/health", None, min(timeout, self.timeout))
            except (_Retryable, ZsearchError) as err:
                self.replicas.failed(base, str(err))
            else:
                self.replicas.succeeded(base)

        with ThreadPoolExecutor(len(self.urls)) as pool:
            list(pool.map(ask, self.urls))
        return self.replicas.status()


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
