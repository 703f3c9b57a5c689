"""``zsearch serve``: any ``--search`` backend behind Search-R1's ``/retrieve`` and ``/health``,
in one process or in ``--workers N`` (uvicorn's own worker processes).

What is served (:func:`build_source`):

* ``--index DIR`` (or ``--search bm25|dense|hybrid|auto`` with it): the index, memory-mapped,
  so N workers share one copy of its pages; each worker has its own LRU cache.
* ``--search http://a:8000,http://b:8000``: a caching proxy over replicas (round-robin,
  fail-over, retries within a deadline; ``/health`` says which replicas are up).
* ``--search serpapi[?engine=…&base_url=…]``: SerpAPI with an on-disk cache (``--serpapi-cache``,
  one SQLite file all workers share; its hit rate is in ``/health``).
* ``--search sim:MODEL`` / ``sim+http://host:port/v1``: the ZeroSearch simulator, with the
  noise from ``--noise-*``, per request (``noise`` or ``step``), or ``POST /progress``.

Workers: uvicorn spawns N processes that each import :func:`worker_app` (an app factory)
and accept on the one socket the parent bound; the parent passes them the
:class:`ServePlan` as JSON in ``$ZSEARCH_SERVE_PLAN`` (no secret is ever in it: the SerpAPI
key stays in the environment it came from).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zsearch_cli.config.commands import ServeOptions
from zsearch_cli.config.fields import to_flat
from zsearch_cli.errors import ZsearchError, shown_kind, shown_spec

PLAN_ENV = "ZSEARCH_SERVE_PLAN"

PROXY_TIMEOUT = 30.0
"""Seconds one attempt on a replica may take (a 2560-query batch on a busy dense index)."""
PROXY_DEADLINE = 55.0
"""Seconds a proxied request may take in all, fail-overs and retries included: under
HTTPSearch's 60 s, so the proxy answers (502, naming the replicas) before its caller gives up."""


@dataclass(init=False)
class ServePlan:
    """What ``zsearch serve`` runs: plain values only (it travels to the workers as JSON).

    ``ServePlan(search=…, workers=2)`` sets options by their flat names, as
    ``ServeOptions.from_flat`` takes them; the rest keep ServeOptions' defaults. A
    ``--search`` of None serves ``--index`` with ``--method``; ``serpapi_cache`` None is the
    default cache file, '' or 'off' none."""

    options: dict[str, Any]
    """:class:`~zsearch_cli.config.commands.ServeOptions` by flat name (its
    :func:`~zsearch_cli.config.fields.to_flat`, paths as strings): carried whole, so an option
    added to ServeOptions reaches :attr:`serve_options`, here and in every worker, with no
    edit to this class."""
    sim_options: dict[str, Any]
    """Keyword options for the simulator (the ``--noise-*`` values that were set), checked
    against the spec once, by :func:`plan_from_options`."""

    def __init__(self, options: dict[str, Any] | None = None, sim_options: dict[str, Any] | None = None,
                 **flat: Any):
        self.options = {**(options or {}), **flat}
        self.sim_options = dict(sim_options or {})
        ServeOptions.from_flat(**self.options)  # a name ServeOptions lacks fails here, not in a worker

    @property
    def serve_options(self) -> ServeOptions:
        """The options as ServeOptions, parts nested (``serve_options.retrieval.index``)."""
        return ServeOptions.from_flat(**self.options)


def plan_from_options(o: ServeOptions) -> ServePlan:
    """The plan from ``ServeOptions``; the ``--noise-*`` flags are checked against the spec
    as ``zsearch train`` checks them."""
    from zsearch_cli.search.sim_options import sim_search_options

    spec = o.search.strip() if o.search else None
    sim = sim_search_options(spec or "index", o.sim, seed=0, topk=1)  # topk: each request's, checked per request
    flat = {name: str(value) if isinstance(value, Path) else value for name, value in to_flat(o).items()}
    return ServePlan({**flat, "search": spec}, sim_options=sim)


def _kind(plan: ServePlan) -> str:
    from zsearch_cli.search.factory import INDEX_METHODS, is_simulated

    spec = (plan.serve_options.search or "").strip()
    if not spec or spec in INDEX_METHODS:
        return "index"
    if is_simulated(spec):
        return "sim"
    if spec.startswith(("http://", "https://")):
        return "replicas"
    if spec == "serpapi" or spec.startswith("serpapi?"):
        return "serpapi"
    raise ZsearchError(f"unknown --search {shown_kind(spec)}: use bm25, dense, hybrid, http://host:port[,http://host2:port], "
                       "serpapi, sim:MODEL or sim+http://host:port/v1")


def check_plan(plan: ServePlan) -> None:
    """Combinations refused before anything loads, each with a one-line reason."""
    kind, workers = _kind(plan), plan.serve_options.workers
    if workers < 1:
        raise ZsearchError(f"--workers must be >= 1, got {workers}")
    if kind == "sim" and workers > 1:
        raise ZsearchError("--workers > 1 with the simulator: its curriculum (POST /progress) and its model live in "
                           "one process; serve the model with `vllm serve` and use --search sim+http://… for throughput")


def build_source(plan: ServePlan) -> Any:
    """The source :func:`zsearch_cli.retrieval.server.create_app` serves."""
    from zsearch_cli.retrieval import sources

    o = plan.serve_options
    kind, spec = _kind(plan), (o.search or "").strip()
    if kind == "index":
        from zsearch_cli.retrieval.index import load_index

        if o.retrieval.index is None:
            raise ZsearchError("zsearch serve needs --index DIR (build one with `zsearch index`) or --search SPEC")
        method = o.retrieval.method if spec in ("", "index") else spec
        return sources.IndexSource(load_index(Path(o.retrieval.index)), method)
    if kind == "replicas":
        from zsearch_cli.retrieval.client import RetrievalClient

        return sources.ReplicaSource(RetrievalClient(spec, timeout=PROXY_TIMEOUT, retries=2, backoff=0.2,
                                                     deadline=PROXY_DEADLINE))
    if kind == "serpapi":
        from zsearch_cli.search.backend_source import BackendSource
        from zsearch_cli.search.factory import make_search_backend
        from zsearch_cli.search.serpapi_cache import default_cache_path

        cache = None if o.serpapi_cache is None else str(o.serpapi_cache)
        cache = str(default_cache_path()) if cache is None else (None if cache in ("", "off") else cache)
        return BackendSource(make_search_backend(spec, cache=cache))
    from zsearch_cli.search.sim_source import SimSource
    from zsearch_cli.search.simulated import make_simulated_search

    return SimSource(make_simulated_search(spec, **plan.sim_options))


def build_app(plan: ServePlan, source: Any = None) -> Any:
    """The app of one server process. Everything built so far (the index, its tables, the
    app) lives as long as the process, so it is frozen out of the garbage collector's passes:
    a full collection walking it every few thousand requests was the long tail of the latency
    (bench/serve.py, 64 clients: p99 3.1x p50 before, 1.2x after)."""
    import gc

    from zsearch_cli.retrieval.server import create_app

    o = plan.serve_options
    app = create_app(source if source is not None else build_source(plan), max_queries=o.max_queries,
                     max_topk=o.max_topk, cache_size=o.cache_size, cache_bytes=o.cache_mb << 20)
    gc.freeze()
    return app


def worker_app() -> Any:
    """uvicorn's app factory in each ``--workers`` process: the plan from the environment."""
    raw = os.environ.get(PLAN_ENV)
    if not raw:
        raise ZsearchError(f"{PLAN_ENV} is not set: worker_app is started by `zsearch serve --workers N`")
    return build_app(ServePlan(**json.loads(raw)))


def describe(source: Any) -> str:
    """What the start line says is served."""
    from zsearch_cli.retrieval import sources
    from zsearch_cli.search.backend_source import BackendSource

    if isinstance(source, sources.IndexSource):
        methods = ", ".join(getattr(source.index, "methods", []))
        return f"index {source.name} ({len(source.index)} passages; methods: {methods}; method: {source.method})"
    if isinstance(source, sources.ReplicaSource):
        return f"replicas {', '.join(source.client.urls)} (round-robin, fail-over)"
    if isinstance(source, BackendSource):
        stats = source.health().get("disk_cache")
        return f"{source.name} (disk cache: {stats['path'] if stats else 'off'})"
    return f"simulator {source.name}"


def serve(plan: ServePlan) -> None:
    """Check, build once (the start line, and a bad index or spec fails here, in one line),
    bind, print where we listen, and serve until SIGINT/SIGTERM (exit status 0)."""
    from rich.console import Console

    from zsearch_cli.retrieval.server import bind_socket, is_loopback, serve_until_stopped

    check_plan(plan)
    o = plan.serve_options
    source = build_source(plan)
    if not is_loopback(o.host):
        Console(stderr=True).print(
            f"[bold yellow]warning:[/] listening on {o.host}, not loopback: the server has no authentication, "
            "anyone who can reach this port can query it", highlight=False)
    sock = bind_socket(o.host, o.port)
    port = sock.getsockname()[1]
    shown = f"[{o.host}]" if ":" in o.host else o.host
    workers = f"; {o.workers} workers" if o.workers > 1 else ""
    routes = "POST /retrieve, GET /health" + (", POST /progress" if hasattr(source, "progress") else "")
    print(f"serving {describe(source)} on http://{shown}:{port}  ({routes}{workers}; Ctrl+C stops)", flush=True)
    if o.workers == 1:
        serve_until_stopped(build_app(plan, source), sock)
        return
    del source  # each worker builds its own (an index: the same mapped pages)
    run_workers(plan, sock)


def run_workers(plan: ServePlan, sock: Any) -> None:
    """uvicorn's multi-process supervisor over ``sock``: it restarts a worker that dies and
    stops them all on SIGINT/SIGTERM."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    os.environ[PLAN_ENV] = json.dumps(dataclasses.asdict(plan))
    config = uvicorn.Config(f"{__name__}:worker_app", factory=True, workers=plan.serve_options.workers,
                            log_level="warning",
                            access_log=False, lifespan="off", server_header=False, date_header=False,
                            timeout_graceful_shutdown=5)
    try:
        Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()
    print("server stopped", flush=True)
