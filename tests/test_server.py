"""The retrieval server and client over real HTTP on 127.0.0.1, with a real BM25 index."""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests
import uvicorn

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.client import RetrievalClient
from zsearch_cli.retrieval.index import build_index, load_index
from zsearch_cli.retrieval.server import bind_socket, create_app, is_loopback, serving

WORDS = ("river castle engine violin comet forest harbor glacier orbit piano desert lantern "
         "falcon copper meadow volcano library canyon thunder marble saddle crystal beacon "
         "tundra pepper anchor quartz meteor willow ember cobalt summit prairie").split()


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 300-passage BM25 index built from a seeded synthetic corpus."""
    root = tmp_path_factory.mktemp("serve")
    rng = random.Random(7)
    corpus = root / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as fh:
        for i in range(300):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 30)))
            fh.write(json.dumps({"id": f"doc{i}", "title": f"{rng.choice(WORDS).title()} {i}", "text": text}) + "\n")
    return build_index(corpus, root / "index", {"kind": "bm25"})


@pytest.fixture(scope="module")
def index(index_dir: Path) -> Any:
    return load_index(index_dir)


@pytest.fixture(scope="module")
def url(index: Any) -> Iterator[str]:
    with serving(create_app(index, max_queries=64, max_topk=20, max_body_bytes=64 << 10)) as base:
        yield base


def queries_for(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.sample(WORDS, rng.randint(1, 3))) for _ in range(n)]


# ----------------------------------------------------------------------------- the happy path


def test_health(url: str, index: Any) -> None:
    body = requests.get(url + "/health", timeout=5).json()
    assert body["status"] == "ok"
    assert body["index"] == index.name
    assert body["n_docs"] == len(index) == 300
    assert "bm25" in body["methods"]
    assert set(body["cache"]) >= {"hits", "misses", "size", "capacity"}


def test_search_r1_response_format(url: str, index: Any) -> None:
    qs = ["river castle", "comet orbit"]
    resp = requests.post(url + "/retrieve", json={"queries": qs, "topk": 3, "return_scores": True}, timeout=5)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("application/json")
    result = resp.json()["result"]
    expected = index.search(qs, 3)
    assert len(result) == 2
    for hits, want in zip(result, expected):
        assert [h["document"]["id"] for h in hits] == [p.id for p in want]
        assert [h["document"]["contents"] for h in hits] == [f'"{p.title}"\n{p.text}' for p in want]
        assert [h["score"] for h in hits] == [float(p.score) for p in want]


def test_return_scores_false_gives_bare_documents(url: str, index: Any) -> None:
    for body in ({"queries": ["violin piano"], "topk": 2, "return_scores": False}, {"queries": ["violin piano"], "topk": 2}):
        result = requests.post(url + "/retrieve", json=body, timeout=5).json()["result"]
        assert [sorted(doc) for doc in result[0]] == [["contents", "id"]] * 2
        assert [doc["id"] for doc in result[0]] == [p.id for p in index.search(["violin piano"], 2)[0]]


def test_sixteen_concurrent_clients_match_in_process_search(url: str, index: Any) -> None:
    client = RetrievalClient(url, timeout=20)

    def worker(seed: int) -> list[tuple[list[str], int, Any]]:
        out = []
        for j in range(6):
            qs = queries_for(seed * 100 + j, 1 + (seed + j) % 8)
            topk = 1 + (seed + j) % 5
            out.append((qs, topk, client.retrieve(qs, topk)))
        return out

    with ThreadPoolExecutor(16) as pool:
        done = list(pool.map(worker, range(16)))
    calls = [call for per_worker in done for call in per_worker]
    assert len(calls) == 96  # every call returned, none raised
    for qs, topk, got in calls:
        want = index.search(qs, topk)
        assert [[(p.id, p.title, p.text, p.score) for p in hits] for hits in got] == \
               [[(p.id, p.title, p.text, float(p.score)) for p in hits] for hits in want]


# ----------------------------------------------------------------------------- bad requests


@pytest.mark.parametrize("body, status, words", [
    (b"{not json", 400, "not valid JSON"),
    (b"\xff\xfe\x00", 400, "not valid JSON"),
    (b"[1, 2]", 400, "JSON object"),
    (b'{"topk": 3}', 400, "'queries'"),
    (b'{"queries": []}', 400, "non-empty"),
    (b'{"queries": "one string"}', 400, "'queries'"),
    (b'{"queries": ["ok", 7]}', 400, "'queries'[1]"),
    (b'{"queries": ["q"], "topk": "3"}', 400, "'topk'"),
    (b'{"queries": ["q"], "topk": 2.5}', 400, "'topk'"),
    (b'{"queries": ["q"], "topk": true}', 400, "'topk'"),
    (b'{"queries": ["q"], "topk": 0}', 400, "between 1 and 20"),
    (b'{"queries": ["q"], "topk": 21}', 400, "between 1 and 20"),
    (b'{"queries": ["q"], "return_scores": "yes"}', 400, "'return_scores'"),
    (json.dumps({"queries": ["q"] * 65}).encode(), 413, "too many queries"),
    (json.dumps({"queries": ["x" * 70_000]}).encode(), 413, "body too large"),
])
def test_malformed_requests_get_4xx_json(url: str, body: bytes, status: int, words: str) -> None:
    resp = requests.post(url + "/retrieve", data=body, headers={"content-type": "application/json"}, timeout=5)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert words in error and "Traceback" not in error


def test_streamed_body_over_limit_is_refused(url: str) -> None:
    chunks = (b'{"queries": ["' + b"y" * 20_000 if i == 0 else b"y" * 20_000 for i in range(5))
    resp = requests.post(url + "/retrieve", data=chunks, timeout=5)  # chunked: no Content-Length
    assert resp.status_code == 413 and "body too large" in resp.json()["error"]


def test_unknown_path_and_verb_are_json_errors(url: str) -> None:
    assert requests.get(url + "/nope", timeout=5).json() == {"error": "GET /nope: Not Found"}
    resp = requests.get(url + "/retrieve", timeout=5)
    assert resp.status_code == 405 and "error" in resp.json()


def test_index_failure_is_a_json_500_without_traceback(index: Any) -> None:
    class Broken:  # the real index with a search that fails, to reach the 500 path
        name, methods = index.name, index.methods

        def __len__(self) -> int:
            return len(index)

        def search(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("disk on fire")

    with serving(create_app(Broken())) as base:
        resp = requests.post(base + "/retrieve", json={"queries": ["q"]}, timeout=5)
    assert resp.status_code == 500
    assert resp.json() == {"error": "internal error: RuntimeError: disk on fire"}


def test_unknown_method_is_refused_at_startup(index: Any) -> None:
    with pytest.raises(ZsearchError, match="dense"):
        create_app(index, method="dense")
    with pytest.raises(ZsearchError, match="unknown search method"):
        create_app(index, method="sparse")


# ----------------------------------------------------------------------------- cache


def test_cache_hits_are_counted_and_only_misses_are_searched(index: Any) -> None:
    with serving(create_app(index, cache_size=1000)) as base:
        post = lambda qs: requests.post(base + "/retrieve", json={"queries": qs, "topk": 3, "return_scores": True},
                                        timeout=5).json()["result"]
        stats = lambda: {k: v for k, v in requests.get(base + "/health", timeout=5).json()["cache"].items()
                         if k not in ("bytes", "max_bytes")}  # byte counts: test_cache_is_bounded_in_bytes...
        first = post(["river", "comet orbit"])
        assert stats() == {"hits": 0, "misses": 2, "size": 2, "capacity": 1000, "index_calls": 1, "searched": 2}
        second = post(["comet orbit", "river", "glacier", "glacier"])  # two hits, one new query sent once
        assert stats() == {"hits": 2, "misses": 4, "size": 3, "capacity": 1000, "index_calls": 2, "searched": 3}
        assert second[:2] == first[::-1] and second[2] == second[3]
        post(["river"])
        post(["river"])  # other topk: a different key
        requests.post(base + "/retrieve", json={"queries": ["river"], "topk": 2}, timeout=5)
        assert stats()["hits"] == 4 and stats()["index_calls"] == 3


def test_cache_is_bounded(index: Any) -> None:
    with serving(create_app(index, cache_size=2)) as base:
        for q in ("river", "comet", "orbit", "river"):
            requests.post(base + "/retrieve", json={"queries": [q]}, timeout=5)
        cache = requests.get(base + "/health", timeout=5).json()["cache"]
    assert cache["size"] == 2 and cache["hits"] == 0 and cache["index_calls"] == 4


# ----------------------------------------------------------------------------- client


@contextmanager
def scripted_server(statuses: list[int]) -> Iterator[tuple[str, list[int]]]:
    """A plain HTTP server answering the given statuses in turn (the last one repeats)."""
    seen: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            self.rfile.read(int(self.headers.get("content-length", 0)))
            status = statuses[min(len(seen), len(statuses) - 1)]
            seen.append(status)
            if status == 0:  # 0 means: answer too late (after the client's timeout)
                time.sleep(0.4)
                status = 200
            body = json.dumps({"result": [[{"document": {"id": "d1", "contents": '"T"\nbody'}, "score": 1.0}]]}
                              if status == 200 else {"error": f"scripted {status}"}).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_client_retries_5xx_then_succeeds() -> None:
    with scripted_server([503, 502, 200]) as (base, seen):
        hits = RetrievalClient(base, retries=3, backoff=0.01).retrieve(["q"], 1)
    assert seen == [503, 502, 200]
    assert [(p.id, p.title, p.text, p.score) for p in hits[0]] == [("d1", "T", "body", 1.0)]


def test_client_retries_timeouts() -> None:
    with scripted_server([0, 0, 200]) as (base, seen):
        with pytest.raises(ZsearchError, match=r"failed after 2 attempt\(s\): timed out after 0.1s"):
            RetrievalClient(base, timeout=0.1, retries=1, backoff=0.01).retrieve(["q"], 1)
        assert len(RetrievalClient(base, timeout=0.1, retries=1, backoff=0.01).retrieve(["q"], 1)) == 1
    assert len(seen) == 3


def test_client_gives_up_after_bounded_retries() -> None:
    with scripted_server([500]) as (base, seen):
        with pytest.raises(ZsearchError, match=r"/retrieve failed after 3 attempt\(s\): HTTP 500: scripted 500"):
            RetrievalClient(base, retries=2, backoff=0.01).retrieve(["q"], 1)
    assert len(seen) == 3


def test_client_does_not_retry_4xx(url: str) -> None:
    with pytest.raises(ZsearchError, match="rejected the request: HTTP 400: 'topk' must be between 1 and 20"):
        RetrievalClient(url, retries=3, backoff=0.01).retrieve(["q"], 50)
    with scripted_server([404]) as (base, seen):
        with pytest.raises(ZsearchError, match="HTTP 404"):
            RetrievalClient(base, retries=3, backoff=0.01).retrieve(["q"], 1)
    assert seen == [404]


def test_client_raises_naming_url_when_server_is_stopped(index: Any) -> None:
    with serving(create_app(index)) as base:
        client = RetrievalClient(base + "/retrieve", retries=2, backoff=0.05)
        assert client.health()["n_docs"] == 300
        assert len(client.retrieve(["river"], 2)[0]) == 2
    start = time.monotonic()
    with pytest.raises(ZsearchError) as err:
        client.retrieve(["river"], 2)
    assert time.monotonic() - start >= 0.05 + 0.1  # backed off between the three attempts
    assert f"{base}/retrieve failed after 3 attempt(s): cannot connect" in str(err.value)
    assert client.retrieve([], 2) == []  # nothing to ask: no request at all


def test_is_loopback() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "192.168.1.4", "::", "example.org"]))


# ----------------------------------------------------------------------------- CLI


def test_cli_serve_subprocess(index_dir: Path, index: Any) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "zsearch_cli.cli", "serve", "--index", str(index_dir), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = proc.stdout.readline()  # printed once the socket is bound
        assert f"http://127.0.0.1:{port}" in line, line + proc.stderr.read() if proc.poll() is not None else line
        client = RetrievalClient(f"http://127.0.0.1:{port}", retries=5, backoff=0.1)
        assert client.health()["index"] == index.name
        got = client.retrieve(["castle river"], 3)
        assert [p.id for p in got[0]] == [p.id for p in index.search(["castle river"], 3)[0]]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "server stopped" in out and "Traceback" not in err


def test_cli_serve_port_in_use_is_one_line_error(index_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "zsearch_cli.cli", "serve", "--index", str(index_dir), "--port", str(port)],
            capture_output=True, text=True, timeout=30,
        )
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_serve_non_loopback_host_warns(index_dir: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is not ours to bind: we see the warning, then a one-line error.
    proc = subprocess.run(
        [sys.executable, "-m", "zsearch_cli.cli", "serve", "--index", str(index_dir), "--host", "192.0.2.1", "--port", "0"],
        capture_output=True, text=True, timeout=30,
    )
    assert "warning: listening on 192.0.2.1, not loopback" in " ".join(proc.stderr.split())
    assert proc.returncode == 2 and "cannot listen on 192.0.2.1:0" in proc.stderr


# ----------------------------------------------------------------------------- request and memory bounds


def test_json_nested_2000_deep_is_a_400_not_a_500(url: str) -> None:
    # The stdlib parser recurses once per level and raises RecursionError, which used to
    # fall through to the 500 handler (and log a traceback per request).
    body = b'{"queries": ' + b"[" * 2000 + b"]" * 2000 + b"}"
    resp = requests.post(url + "/retrieve", data=body, headers={"content-type": "application/json"}, timeout=5)
    assert resp.status_code == 400 and "nested too deeply" in resp.json()["error"]


def test_search_r1_grpo_request_of_2560_queries_is_served_by_default(index: Any) -> None:
    # Search-R1's GRPO: 512 prompts x 5 samples in one /retrieve; a 413 crashes its client.
    qs = queries_for(11, 2560)
    with serving(create_app(index)) as base:
        resp = requests.post(base + "/retrieve", json={"queries": qs, "topk": 3}, timeout=60)
    assert resp.status_code == 200
    result = resp.json()["result"]
    assert len(result) == 2560 and [d["id"] for d in result[5]] == [p.id for p in index.search([qs[5]], 3)[0]]


def test_queries_times_topk_is_bounded(index: Any) -> None:
    with serving(create_app(index, max_results=100)) as base:
        ok = requests.post(base + "/retrieve", json={"queries": ["river"] * 20, "topk": 5}, timeout=5)
        big = requests.post(base + "/retrieve", json={"queries": ["river"] * 20, "topk": 6}, timeout=5)
    assert ok.status_code == 200
    assert big.status_code == 413 and "120" in big.json()["error"]


def test_cache_is_bounded_in_bytes_and_reports_them(index: Any) -> None:
    # Each entry holds 3 passages of ~100-250 chars plus ~860 bytes of overhead: ~1.5 KB.
    # A 6 KB budget therefore keeps a handful of the 40 distinct queries, never all.
    with serving(create_app(index, cache_size=10_000, cache_bytes=6000)) as base:
        for q in queries_for(3, 40):
            requests.post(base + "/retrieve", json={"queries": [q], "topk": 3}, timeout=5)
        cache = requests.get(base + "/health", timeout=5).json()["cache"]
    assert cache["max_bytes"] == 6000
    assert 0 < cache["bytes"] <= 6000
    assert 1 <= cache["size"] < 10


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_wiki18_passages_are_served_byte_identical(tmp_path: Path, fmt: str) -> None:
    # Search-R1's server returns the corpus's `contents` string untouched; rebuilding it from
    # (title, text) dropped a title's own leading quote and the trailing whitespace.
    contents = ['""Weird Al" Yankovic"\n"Weird Al" Yankovic is an American singer known for parody.  \n',
                '"Tab\ttitle"\nA passage with  double  spaces\tand a tab, then a trailing space ',
                'no title line, only a passage about parody singers']
    rows = [{"id": str(i), "contents": c} for i, c in enumerate(contents)]
    corpus = tmp_path / f"wiki.{fmt}"
    if fmt == "jsonl":
        corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), corpus)
    index = load_index(build_index(corpus, tmp_path / "idx", {"kind": "bm25"}))
    assert index.get(0).title == '"Weird Al" Yankovic'  # one pair of quotes removed, not the title's own
    with serving(create_app(index)) as base:
        scored = requests.post(base + "/retrieve", json={"queries": ["parody singer", "double tab passage"],
                                                         "topk": 3, "return_scores": True}, timeout=5).json()
        bare = requests.post(base + "/retrieve", json={"queries": ["parody singer"], "topk": 3}, timeout=5).json()
    served = {d["document"]["id"]: d["document"]["contents"] for hits in scored["result"] for d in hits}
    served.update({d["id"]: d["contents"] for d in bare["result"][0]})
    assert served == {str(i): c for i, c in enumerate(contents)}


# ----------------------------------------------------------------------------- micro-batching


def test_concurrent_small_requests_share_batched_searches_in_arrival_order(index: Any) -> None:
    # 24 one-query requests arrive while a slow search runs: they queue and ride a few batched
    # searches (not 24), each answer is exactly what it would be alone, topk never mixes, and a
    # big request (over COALESCE_MAX_QUERIES) is searched on its own.
    from zsearch_cli.retrieval.coalesce import COALESCE_MAX_QUERIES
    from zsearch_cli.retrieval.sources import IndexSource

    calls: list[int] = []

    class SlowIndex(IndexSource):  # the real index, 0.2 s per call: a queue forms behind it
        def search(self, queries, topk, fields):
            calls.append(len(queries))
            time.sleep(0.2)
            return super().search(queries, topk, fields)

    app = create_app(SlowIndex(index), cache_size=0)
    qs = queries_for(11, 24)
    with serving(app) as base, ThreadPoolExecutor(24) as pool:
        def ask(i: int) -> Any:
            body = {"queries": [qs[i]], "topk": 2 + i % 2, "return_scores": True}
            return requests.post(base + "/retrieve", json=body, timeout=30).json()["result"][0]
        answers = list(pool.map(ask, range(24)))
        many = queries_for(3, COALESCE_MAX_QUERIES + 1)
        big = requests.post(base + "/retrieve", json={"queries": many, "topk": 2}, timeout=30).json()["result"]
    for i, hits in enumerate(answers):
        alone = index.search([qs[i]], 2 + i % 2)[0]
        assert [h["document"]["id"] for h in hits] == [p.id for p in alone]
    coalescer = app.state.coalescer
    assert coalescer.requests == 24 and coalescer.calls < 12, (coalescer.calls, calls)
    # the big request's call holds its own (distinct) queries only, none of the queue's
    assert max(calls[:-1]) > 1 and calls[-1] == len(set(many)) and len(big) == COALESCE_MAX_QUERIES + 1
