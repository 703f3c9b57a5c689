"""The retrieval server: an index (or any source of :mod:`.sources`: replicas, SerpAPI,
the ZeroSearch simulator) behind Search-R1's ``POST /retrieve`` API.

Search-R1, ZeroSearch and friends call a local HTTP retriever from their rollout
loops, so speaking their wire format lets their tools point at us unchanged::

    POST /retrieve  {"queries": ["q1", ...], "topk": 3, "return_scores": true}
    -> {"result": [[{"document": {"id": ..., "contents": '"Title"\\ntext'}, "score": 1.5}, ...], ...]}

With ``"return_scores": false`` each hit is the bare document ``{"id", "contents"}``
(Search-R1's own server crashes on that path; ours does not).

Design choices, and why:

* The request body is parsed and checked by hand instead of through a pydantic model:
  the error messages are ours (always ``{"error": "..."}``, never a 422 with a nested
  pydantic report or a 500 with a traceback) and the hot path skips model overhead. Reading
  the body, decoding it and answering in JSON are shared with the agent server
  (:mod:`zsearch_cli.http_json`).
* All queries of a request go to the index in one batched ``search`` call, run in the
  threadpool so a slow search never blocks the event loop (the index is thread-safe); small
  requests that arrive together share one such call, in arrival order (:mod:`.coalesce`).
* An LRU cache (:mod:`.cache`) keyed by ``(query, topk, index name, method)`` sits in front
  of the index; rollouts repeat queries a lot, and only the misses are searched, again in
  one batch. It is per process: ``zsearch serve --workers N`` has N of them.
* Multi-process serving, and choosing the source from a ``--search`` spec, live in
  :mod:`zsearch_cli.commands.serve`.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from zsearch_cli.errors import ZsearchError
from zsearch_cli.http_json import (RequestError, answer_http_errors_in_json, error_response, json_response,
                                   parse_object, read_body)
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.retrieval.cache import DEFAULT_CACHE_BYTES, LRUCache, result_bytes
from zsearch_cli.retrieval.coalesce import COALESCE_MAX_QUERIES, Coalescer

log = logging.getLogger("zsearch.server")

DEFAULT_TOPK = 3
"""Search-R1's ``retrieval_topk`` default, used when a request leaves ``topk`` out."""
DEFAULT_MAX_QUERIES = 8192
"""Search-R1's GRPO sends 512 prompts x 5 samples = 2560 queries in one request."""
DEFAULT_MAX_BODY_BYTES = 16 << 20
"""16 MiB: 8192 queries of 2 KiB each; bounds what one request makes us parse."""
DEFAULT_MAX_RESULTS = 100_000
"""Most passages (queries x topk) one response may carry: ~70 MB of JSON for wiki-18
passages, which bounds the memory one request can make us hold (2560 x 3 is 7680)."""


# ----------------------------------------------------------------------------- service


class RetrievalService:
    """A source (:mod:`.sources`: an index, replicas, SerpAPI, the simulator) and the
    cache in front of it.

    Kept apart from the HTTP layer so its batching and caching can be reasoned about
    (and reused) without a web framework in the way. ``index`` may be a source or a
    loaded index (searched with ``method``).
    """

    def __init__(self, index: Any, method: str = "auto", cache_size: int = 100_000,
                 cache_bytes: int = DEFAULT_CACHE_BYTES):
        from zsearch_cli.retrieval.sources import IndexSource

        self.source = index if hasattr(index, "memory_cache") else IndexSource(index, method)
        self.cache = LRUCache(cache_size if self.source.memory_cache else 0, cache_bytes, result_bytes)
        self.index_calls = 0
        """How many batched source calls were made (one per request with misses)."""
        self.searched = 0
        """How many queries went to the source in those calls."""
        self._stats_lock = threading.Lock()

    def search(self, queries: Sequence[str], topk: int,
               fields: dict[str, Any] | None = None) -> tuple[list[list[Passage]], dict[str, Any] | None]:
        """Top-``topk`` passages per query (cache hits as stored, all misses in one batch),
        and any extra response fields the source adds."""
        fields = fields or {}
        if not self.source.memory_cache:
            results, extra = self.source.search(queries, topk, fields)
            self._count(len(queries))
            return [list(r) for r in results], extra
        tag = self.source.cache_tag
        keys = [(q, topk, *tag) for q in queries]
        found = self.cache.get_many(keys)
        missing = list(dict.fromkeys(q for q, hit in zip(queries, found) if hit is None))
        fresh: dict[str, list[Passage]] = {}
        if missing:
            results, _ = self.source.search(missing, topk, fields)
            if len(results) != len(missing):
                raise RuntimeError(f"source returned {len(results)} result lists for {len(missing)} queries")
            fresh = dict(zip(missing, (list(r) for r in results)))
            self.cache.put_many([((q, topk, *tag), fresh[q]) for q in missing])
            self._count(len(missing))
        return [hit if hit is not None else fresh[q] for q, hit in zip(queries, found)], None

    def _count(self, searched: int) -> None:
        with self._stats_lock:
            self.index_calls += 1
            self.searched += searched

    def health(self) -> dict[str, Any]:
        import os

        # per process: with --workers N, each worker reports its own cache (worker_pid says whose)
        cache = {**self.cache.stats(), "index_calls": self.index_calls, "searched": self.searched}
        return {"status": "ok", **self.source.health(), "cache": cache, "worker_pid": os.getpid()}


# ----------------------------------------------------------------------------- request parsing


def parse_request(body: bytes, max_queries: int, max_topk: int,
                  max_results: int = DEFAULT_MAX_RESULTS) -> tuple[list[str], int, bool, dict[str, Any]]:
    """``(queries, topk, return_scores, fields)`` from a /retrieve body, or a
    :class:`RequestError`; ``fields`` is the whole object (the simulator reads more of it).

    Defaults follow Search-R1's ``QueryRequest``: ``topk`` 3, ``return_scores`` false.
    Unknown keys are ignored so newer clients keep working.
    """
    data = parse_object(body)
    queries = data.get("queries")
    if not isinstance(queries, list) or not queries:
        raise RequestError(400, "'queries' must be a non-empty list of strings")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise RequestError(400, f"'queries'[{i}] must be a string, got {type(q).__name__}")
    if len(queries) > max_queries:
        raise RequestError(413, f"too many queries: {len(queries)} (this server takes at most {max_queries} per request)")
    topk = data.get("topk")
    if topk is None:
        topk = DEFAULT_TOPK
    if not isinstance(topk, int) or isinstance(topk, bool):
        raise RequestError(400, f"'topk' must be an integer, got {type(topk).__name__}")
    if not 1 <= topk <= max_topk:
        raise RequestError(400, f"'topk' must be between 1 and {max_topk}, got {topk}")
    if len(queries) * topk > max_results:
        raise RequestError(413, f"too many results: {len(queries)} queries x topk {topk} = {len(queries) * topk} "
                                f"(this server returns at most {max_results} passages per request)")
    return_scores = data.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise RequestError(400, f"'return_scores' must be true or false, got {type(return_scores).__name__}")
    return queries, topk, return_scores, data


def render(results: list[list[Passage]], return_scores: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Search-R1's response body for ``results`` (plus a source's ``extra`` top-level fields,
    which Search-R1's clients ignore: they read ``result`` only)."""
    extra = extra or {}
    if return_scores:
        return {**extra, "result": [
            [{"document": {"id": p.id, "contents": p.contents}, "score": None if p.score is None else float(p.score)}
             for p in hits]
            for hits in results
        ]}
    return {**extra, "result": [[{"id": p.id, "contents": p.contents} for p in hits] for hits in results]}


# ----------------------------------------------------------------------------- app


def is_upstream_failure(err: ZsearchError) -> bool:
    """Sources raise RetrievalUnavailable when what they ask (replicas, SerpAPI, a simulator
    server) failed after its retries."""
    from zsearch_cli.retrieval.client import RetrievalUnavailable

    return isinstance(err, RetrievalUnavailable)



def create_app(
    index: Any,
    method: str = "auto",
    max_queries: int = DEFAULT_MAX_QUERIES,
    max_topk: int = 100,
    cache_size: int = 100_000,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    max_results: int = DEFAULT_MAX_RESULTS,
) -> FastAPI:
    """A FastAPI app serving ``index`` (a loaded ``SearchIndex``, or a source from
    :mod:`.sources`) at /retrieve and /health, and at /progress when the source has a
    curriculum (the simulator).

    The service is reachable as ``app.state.service`` (its cache stats are in /health too).
    """
    if min(max_queries, max_topk, max_body_bytes, max_results) < 1:
        raise ZsearchError("max_queries, max_topk, max_body_bytes and max_results must all be >= 1")
    service = RetrievalService(index, method=method, cache_size=cache_size, cache_bytes=cache_bytes)
    app = FastAPI(title="zsearch retrieval server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    # small requests to an index or a replica set (sources that read no request field beyond
    # the queries and topk) ride shared batches (coalesce.py); the simulator merges its own,
    # and SerpAPI has no batch to share
    coalescer = Coalescer(service.search) if service.source.memory_cache else None
    app.state.coalescer = coalescer

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        try:
            body = await read_body(request, max_body_bytes)
            queries, topk, return_scores, fields = parse_request(body, max_queries, max_topk, max_results)
            if coalescer is not None and len(queries) <= COALESCE_MAX_QUERIES:
                results, extra = await coalescer.search(queries, topk), None
            else:
                results, extra = await run_in_threadpool(service.search, queries, topk, fields)
            return json_response(render(results, return_scores, extra))
        except RequestError as err:
            return error_response(err)
        except ZsearchError as err:
            # the source's upstream (replicas, SerpAPI, a simulator server) failed: 502, which
            # clients retry; anything else is about this request: 400
            return json_response({"error": str(err)}, 502 if is_upstream_failure(err) else 400)
        except Exception as err:  # the client gets one line; the traceback goes to our log
            log.exception("search failed")
            return json_response({"error": f"internal error: {type(err).__name__}: {err}"}, 500)

    @app.get("/health")
    async def health() -> Response:
        # in the threadpool: a proxy's health asks its replicas over the network
        return json_response(await run_in_threadpool(service.health))

    @app.post("/progress")
    async def progress(request: Request) -> Response:
        """An outside trainer advances the simulator's curriculum: ``{"step": t, "total_steps": T}``."""
        try:
            if not hasattr(service.source, "progress"):
                raise RequestError(404, f"{service.source.name} has no noise curriculum (only --search sim:… has)")
            data = parse_object(await read_body(request, max_body_bytes))
            step, total = data.get("step"), data.get("total_steps", 0)
            for name, value in (("step", step), ("total_steps", total)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise RequestError(400, f"'{name}' must be an integer >= 0, got {value!r}")
            return json_response(service.source.progress(step, total))
        except RequestError as err:
            return error_response(err)

    answer_http_errors_in_json(app)
    return app


# ----------------------------------------------------------------------------- running


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1: addresses other machines cannot reach."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0 picks a free one), or a clear ZsearchError.

    Binding ourselves, instead of letting uvicorn do it, turns "address in use" into one
    readable line and tells us the real port when 0 was asked for.
    """
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, IndexError) as err:
        raise ZsearchError(f"cannot resolve host {host!r} ({err})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise ZsearchError(f"cannot listen on {host}:{port} ({err.strerror or err})") from None
    sock.setblocking(False)
    return sock


def serve_until_stopped(app: Any, sock: Any) -> None:
    """Run ``app`` with uvicorn on the bound ``sock`` until Ctrl+C or SIGTERM, then return
    normally (exit status 0); shared by ``zsearch serve`` and ``zsearch agent serve``."""
    import signal

    import uvicorn

    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            server_header=False, date_header=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    # uvicorn re-raises the signal that stopped it once it has shut down; a no-op SIGTERM
    # handler and catching KeyboardInterrupt make that a normal return (exit status 0).
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: None) if in_main else None
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
        sock.close()
    print("server stopped", flush=True)


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free loopback port in a background thread and yield its
    base URL once /health answers (tests, benchmarks and notebooks use this)."""
    import requests
    import uvicorn

    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while True:
        try:
            if requests.get(url + "/health", timeout=1).ok:
                break
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            raise ZsearchError(f"{url}: server did not come up within 10 s")
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
