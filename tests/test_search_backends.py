"""Search backends over real loopback HTTP: SerpAPI's response shape against a local
server speaking it, and the factory's errors."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator
from urllib.parse import parse_qs, urlparse

import pytest

from zsearch_cli.errors import ZsearchError
from zsearch_cli.search.base import SearchBackendError, SearchRequest
from zsearch_cli.search.factory import make_search_backend
from zsearch_cli.search.web import SerpAPISearch


@contextmanager
def fake_serpapi(fail_first: int = 0, status: int = 500) -> Iterator[tuple[str, list[dict]]]:
    """A loopback server answering like serpapi.com/search.json; the first ``fail_first``
    calls get ``status``."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            params = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
            seen.append(params)
            if len(seen) <= fail_first:
                self.send_response(status)
                self.end_headers()
                return
            body = json.dumps({"organic_results": [
                {"title": f"{params['q']} result {i}", "link": f"https://example.org/{i}", "snippet": f"snippet {i}"}
                for i in range(5)
            ]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/search.json", seen
    finally:
        server.shutdown()
        server.server_close()


def _req(q: str) -> SearchRequest:
    return SearchRequest(q, "r1", "question?", ("gold",))


def test_serpapi_parses_organic_results_and_sends_the_key(monkeypatch):
    monkeypatch.setenv("SERPAPI_API_KEY", "test-key")
    with fake_serpapi() as (url, seen):
        backend = SerpAPISearch(base_url=url, retries=0)
        results = backend.search([_req("danube"), _req("vienna")], topk=3)
    assert [p.title for p in results[0].passages] == ["danube result 0", "danube result 1", "danube result 2"]
    assert results[1].passages[0].id == "https://example.org/0"
    assert {s["api_key"] for s in seen} == {"test-key"} and {s["num"] for s in seen} == {"3"}


def test_serpapi_retries_5xx_then_succeeds(monkeypatch):
    monkeypatch.setenv("SERPAPI_API_KEY", "k")
    with fake_serpapi(fail_first=2) as (url, seen):
        results = SerpAPISearch(base_url=url, retries=3, backoff=0.01).search([_req("q")], topk=1)
    assert len(seen) == 3 and results[0].passages[0].title == "q result 0"


def test_serpapi_gives_up_after_bounded_retries_and_does_not_retry_4xx(monkeypatch):
    monkeypatch.setenv("SERPAPI_API_KEY", "k")
    with fake_serpapi(fail_first=100) as (url, seen):
        with pytest.raises(SearchBackendError, match="failed after 3 attempts"):
            SerpAPISearch(base_url=url, retries=2, backoff=0.01).search([_req("q")], topk=1)
        assert len(seen) == 3
    with fake_serpapi(fail_first=100, status=401) as (url, seen):
        with pytest.raises(SearchBackendError, match="HTTP 401"):
            SerpAPISearch(base_url=url, retries=5, backoff=0.01).search([_req("q")], topk=1)
        assert len(seen) == 1


def test_serpapi_without_key_and_unknown_backends(monkeypatch):
    monkeypatch.delenv("SERPAPI_API_KEY", raising=False)
    with pytest.raises(ZsearchError, match="SERPAPI_API_KEY"):
        make_search_backend("serpapi")
    with pytest.raises(ZsearchError, match="unknown --search 'bing'"):
        make_search_backend("bing")
    with pytest.raises(ZsearchError, match="needs --index"):
        make_search_backend("bm25")
