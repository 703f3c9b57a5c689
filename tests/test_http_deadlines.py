"""Every remote call has a *total* deadline per request, with bounded retries.

The server here is real: a loopback TCP socket that answers every request by trickling
bytes, one every 0.1 s, forever. Each single read then succeeds well inside any per-read
timeout, which is exactly how a client whose ``timeout`` bounds reads (``requests``'
meaning) waits forever. With a 0.5 s deadline and 1 retry a client must give up after
about 2 x 0.5 s (+ backoff); the tests allow 6 s on a loaded machine and run each call in
a thread, so a client without a deadline fails the test instead of hanging it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from zsearch_cli.errors import ZsearchError

DEADLINE = 0.5
LIMIT = 6.0


class TrickleServer:
    """Accepts connections; for each, reads the request head, then sends ``prefix`` one
    byte at a time and keeps trickling spaces until told to stop. ``attempts`` counts the
    connections (one per request attempt: a broken connection is never reused)."""

    def __init__(self, prefix: bytes, interval: float = 0.1):
        self.prefix = prefix
        self.interval = interval
        self.attempts = 0
        self.stop = threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.attempts += 1
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                stream = iter(self.prefix)
                while not self.stop.is_set():
                    byte = next(stream, 32)
                    conn.sendall(bytes([byte]))
                    time.sleep(self.interval)
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


HEADERS_TRICKLE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"  # the head never ends
BODY_TRICKLE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{\"a\": "


@pytest.fixture(params=["head", "body"])
def trickle(request) -> Iterator[TrickleServer]:
    server = TrickleServer(HEADERS_TRICKLE if request.param == "head" else BODY_TRICKLE)
    yield server
    server.close()


def _finishes(call) -> tuple[float, BaseException | None]:
    """Run ``call`` in a thread; (seconds it took, what it raised). Fails after LIMIT s."""
    outcome: dict[str, BaseException | None] = {"error": None}

    def run() -> None:
        try:
            call()
        except BaseException as err:  # noqa: BLE001 - reported to the test
            outcome["error"] = err

    start = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(LIMIT)
    assert not worker.is_alive(), f"still waiting after {LIMIT}s: no total deadline"
    return time.monotonic() - start, outcome["error"]


def _check(trickle: TrickleServer, call) -> str:
    took, error = _finishes(call)
    assert isinstance(error, ZsearchError), repr(error)
    assert trickle.attempts == 2, trickle.attempts  # 1 + retries, no more
    assert took >= 2 * DEADLINE * 0.9  # both attempts waited for their deadline
    assert "0.5s" in str(error), str(error)
    return str(error)


def test_retrieval_client_and_http_search(trickle):
    from zsearch_cli.retrieval.client import RetrievalClient

    client = RetrievalClient(trickle.url, timeout=DEADLINE, retries=1, backoff=0)
    assert trickle.url in _check(trickle, lambda: client.retrieve(["q"], 3))


def test_http_search_backend(trickle):
    from zsearch_cli.search.base import SearchRequest
    from zsearch_cli.search.http import HTTPSearch

    backend = HTTPSearch(trickle.url, timeout=DEADLINE, retries=1, backoff=0)
    _check(trickle, lambda: backend.search([SearchRequest("q", "r0", "q?", ("a",))], 3))


def test_llm_client_judge_and_simulator(trickle):
    from zsearch_cli.llm_client import LLMClient

    client = LLMClient(trickle.url + "/v1", "m", timeout=DEADLINE, retries=1, backoff=0)
    assert "/v1/chat/completions" in _check(trickle, lambda: client.complete_one("hi", 4))


def test_remote_solver_backend(trickle, tiny_model_and_tokenizer):
    from zsearch_cli.models.base import SamplingParams
    from zsearch_cli.models.remote import RemoteBackend

    _, tokenizer = tiny_model_and_tokenizer
    backend = RemoteBackend(trickle.url + "/v1", tokenizer, model="m", timeout=DEADLINE, retries=1,
                            check_tokenizer=False)
    backend.client.backoff = 0
    _check(trickle, lambda: backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4)))


def test_serpapi(trickle):
    from zsearch_cli.search.base import SearchRequest
    from zsearch_cli.search.web import SerpAPISearch

    search = SerpAPISearch(api_key="sk-secret-9f8e7d", base_url=trickle.url + "/search.json", timeout=DEADLINE,
                           retries=1, backoff=0)
    message = _check(trickle, lambda: search.search([SearchRequest("q", "r0", "q?", ("a",))], 3))
    assert "sk-secret-9f8e7d" not in message


def test_a_fast_server_is_unaffected():
    """The deadline does not get in the way of normal answers, and keep-alive still works."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from zsearch_cli.retrieval.client import RetrievalClient

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"result": [[{"document": {"id": "1", "contents": "\\"T\\"\\ntext"}, "score": 1.5}]]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = RetrievalClient(f"http://127.0.0.1:{server.server_port}", timeout=DEADLINE, retries=0)
        for _ in range(20):
            [[hit]] = client.retrieve(["q"], 1)
            assert (hit.id, hit.title, hit.text, hit.score) == ("1", "T", "text", 1.5)
    finally:
        server.shutdown()
