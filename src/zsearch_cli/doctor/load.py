"""Retrieval under the training's load: many ``POST /retrieve`` requests in flight at once.

:func:`run_load` is the asyncio load generator (keep-alive HTTP/1.1 connections, one per
client, all in this process) that ``bench/serve.py`` also uses. Every query is made unique
(a counter suffix) so no cache answers it. A failure is a non-200 answer, a broken
connection, a wrong number of results, or no answer within ``timeout``, counted at the wire:
the training client's retries would hide them, and a retried request is a stalled rollout.

:func:`check_retrieval_load` runs two shapes against ``--search``:

* ``single``: ``--requests`` requests of one query, ``--concurrency`` in flight (slime's
  ``search_concurrency`` 256, verl's search tool);
* ``batch``: ``--batch-requests`` requests of ``--batch-queries`` queries at once (Search-R1's
  GRPO turn: 512 prompts x 5 samples = 2560 queries in one request).

An in-process backend (bm25, dense, hybrid, the simulator) gets the same shapes through its
``search`` method: single queries from a thread pool (one thread unless it is thread-safe,
as the async rollout mode would), batches one after the other (the sync mode's turn).
"""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from zsearch_cli.doctor.results import CheckResult

FAILURES = (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, KeyError, IndexError, TypeError)


async def post_retrieve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> tuple[int, bytes]:
    """One keep-alive HTTP/1.1 POST /retrieve; (status, body)."""
    writer.write(b"POST /retrieve HTTP/1.1\r\nHost: zsearch\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body) + body)
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    length, chunked = None, False
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "content-length":
            length = int(value)
        elif name.lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
    if not chunked:
        return status, await reader.readexactly(length or 0)
    parts = []
    while (size := int((await reader.readline()).strip(), 16)) > 0:
        parts.append(await reader.readexactly(size))
        await reader.readline()
    await reader.readline()
    return status, b"".join(parts)


def summarize(latencies: list[float], failures: dict[str, int], wall: float, per_request: int) -> dict[str, Any]:
    """requests (answered), qps (queries per second), p50/p99 in ms, failures and their kinds."""
    ms = np.array(latencies) * 1000 if latencies else np.array([float("nan")])
    return {"requests": len(latencies), "qps": len(latencies) * per_request / max(wall, 1e-9),
            "p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)),
            "failures": sum(failures.values()), "failure_kinds": failures}


def run_load(url: str, *, clients: int, queries: list[str], per_request: int = 1, topk: int = 3,
             seconds: float | None = None, requests: int | None = None, timeout: float = 60.0,
             warmup: float = 0.0) -> dict[str, Any]:
    """``clients`` connections sending requests of ``per_request`` queries, until ``seconds``
    (after ``warmup``, whose requests are not counted) or ``requests`` in all have been sent."""
    if seconds is None and requests is None:
        raise ValueError("run_load needs seconds or requests")
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    counter = iter(range(10**12))
    sent = iter(range(10**12))
    latencies: list[float] = []
    failures: dict[str, int] = {}

    def body() -> bytes:
        picked = [f"{queries[(n := next(counter)) % len(queries)]} u{n}" for _ in range(per_request)]
        return json.dumps({"queries": picked, "topk": topk, "return_scores": True}).encode()

    def more(stop_at: float) -> bool:
        if time.monotonic() >= stop_at:
            return False
        return requests is None or next(sent) < requests

    async def client(start_at: float, stop_at: float) -> None:
        conn = None
        while more(stop_at):
            payload, t0 = body(), time.monotonic()
            try:
                if conn is None:
                    conn = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
                status, raw = await asyncio.wait_for(post_retrieve(*conn, payload), timeout)
                ok = status == 200 and len(json.loads(raw)["result"]) == per_request
                why = None if ok else f"HTTP {status}" if status != 200 else "wrong result count"
                if status != 200:
                    conn[1].close()
                    conn = None  # the server may have closed it
            except FAILURES as err:
                why = type(err).__name__
                if conn is not None:
                    conn[1].close()
                conn = None
            if t0 >= start_at:
                if why is None:
                    latencies.append(time.monotonic() - t0)
                else:
                    failures[why] = failures.get(why, 0) + 1
        if conn is not None:
            conn[1].close()

    async def main() -> float:
        start_at = time.monotonic() + warmup
        stop_at = start_at + seconds if seconds is not None else float("inf")
        await asyncio.gather(*(client(start_at, stop_at) for _ in range(clients)))
        return time.monotonic() - start_at

    wall = asyncio.run(main())
    return summarize(latencies, failures, wall, per_request)


def run_inprocess(search: Any, *, clients: int, queries: list[str], per_request: int, topk: int,
                  requests: int) -> dict[str, Any]:
    """The same shapes through an in-process backend's ``search`` (see the module docstring)."""
    from zsearch_cli.search.base import SearchRequest

    counter = iter(range(10**12))
    latencies: list[float] = []
    failures: dict[str, int] = {}

    def one(_: int) -> None:
        batch = [SearchRequest(f"{queries[(n := next(counter)) % len(queries)]} u{n}", "doctor", "", ())
                 for _ in range(per_request)]
        t0 = time.monotonic()
        try:
            got = search.search(batch, topk)
            why = None if len(got) == per_request else "wrong result count"
        except Exception as err:  # noqa: BLE001 - any error of the backend is a failed request
            why = type(err).__name__
        if why is None:
            latencies.append(time.monotonic() - t0)
        else:
            failures[why] = failures.get(why, 0) + 1

    workers = clients if getattr(search, "thread_safe", False) and per_request == 1 else 1
    t0 = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(requests)))
    return summarize(latencies, failures, time.monotonic() - t0, per_request)


def load_queries() -> list[str]:
    """The bundled demo questions (train and test): real query text to make unique."""
    from zsearch_cli.data.demo import demo_qa
    from zsearch_cli.data.qa import load_qa

    return [q for split in ("train", "test") for q in load_qa(demo_qa(split)).column("question").to_pylist()]


def check_retrieval_load(opts: Any, make_search: Callable[[], Any] | None = None) -> CheckResult:
    """``opts.retrieval.search`` under both shapes (``opts.concurrency``, ``opts.requests``,
    ``opts.batch_requests``, ``opts.batch_queries``, ``opts.load_timeout``, ``opts.rollout.topk``);
    any failure fails the check. ``make_search`` builds an in-process backend (default
    :func:`~zsearch_cli.rollout.build.make_search`)."""
    t0 = time.perf_counter()
    res = CheckResult("retrieval", "")
    spec = opts.retrieval.search.strip()
    queries = load_queries()
    topk = opts.rollout.topk
    shapes = {"single": (opts.concurrency, 1, opts.requests),
              "batch": (opts.batch_requests, opts.batch_queries, opts.batch_requests)}
    rows: dict[str, dict[str, Any]] = {}
    if spec.startswith(("http://", "https://")):
        for url in [u.strip() for u in spec.split(",") if u.strip()]:
            for shape, (clients, per, n) in shapes.items():
                rows[f"{shape} {url}"] = run_load(url, clients=clients, queries=queries, per_request=per, topk=topk,
                                                  requests=n, timeout=opts.load_timeout)
    else:
        if make_search is None:
            from zsearch_cli.rollout.build import make_search as build_search

            search = build_search(opts)
        else:
            search = make_search()
        for shape, (clients, per, n) in shapes.items():
            rows[shape] = run_inprocess(search, clients=clients, queries=queries, per_request=per, topk=topk, requests=n)
    res.details = {"search": spec, "topk": topk, "shapes": {k: {"in_flight": v[0], "queries_per_request": v[1],
                                                                "requests": v[2]} for k, v in shapes.items()},
                   "results": rows}
    for name, r in rows.items():
        if r["failures"]:
            kinds = ", ".join(f"{k} x{v}" for k, v in r["failure_kinds"].items())
            res.fail(f"{name}: {r['failures']} of {r['failures'] + r['requests']} requests failed ({kinds}) with "
                     f"{shapes[name.split()[0]][0]} in flight; a training run needs 0")
    res.summary = "; ".join(f"{name}: {r['qps']:.0f} q/s, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
                            f"{r['failures']} failed" for name, r in rows.items())
    res.seconds = time.perf_counter() - t0
    return res
