"""``zsearch serve --search SPEC`` for the backends that are not an index, over real HTTP on
127.0.0.1: the ZeroSearch simulator (the real tiny model) asked in Search-R1's request
shape, and SerpAPI (a local fake API server) behind the on-disk cache.

The apps are built by ``commands.serve.build_app`` from a ``ServePlan``, the code
``zsearch serve`` runs after parsing its flags (the CLI and multi-process paths are in
test_serve_scale.py)."""

from __future__ import annotations

import dataclasses
import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlparse

import pytest
import requests

from zsearch_cli.commands.serve import PLAN_ENV, ServePlan, build_app, plan_from_options, worker_app
from zsearch_cli.retrieval.server import serving
from zsearch_cli.search.base import SearchRequest
from zsearch_cli.search.simulated import SimConfig, SimulatedSearch

SIM_OPTIONS = "max_tokens=8&temperature=0&device=cpu&cache_size=0"
"""Greedy (temperature 0): a document depends on its prompt alone, so a served answer can be
compared with the simulator's own; no cache, so every request generates."""


def post(url: str, body: dict[str, Any], path: str = "/retrieve") -> requests.Response:
    return requests.post(url + path, json=body, timeout=60)


# ----------------------------------------------------------------------------- the simulator


@pytest.fixture(scope="module")
def sim_url(tiny_model_dir: Path) -> Iterator[str]:
    # --noise-end 1 (p_s 0): p(t) runs from 0 at step 0 to 1 at the last step.
    plan = ServePlan(search=f"sim:{tiny_model_dir}?{SIM_OPTIONS}", sim_options={"noise_end": 1.0})
    with serving(build_app(plan)) as url:
        yield url


def test_search_r1_request_shape_gets_documents_at_the_current_noise(sim_url: str) -> None:
    # Search-R1's generation.py sends exactly these three keys and reads result[i][j]["document"]["contents"].
    resp = post(sim_url, {"queries": ["danube cities", "capital of peru"], "topk": 3, "return_scores": True})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [len(hits) for hits in body["result"]] == [3, 3]
    for hits in body["result"]:
        for hit in hits:
            assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
            # Search-R1's contents shape: '"Title"\ntext' (a simulated document has no title)
            assert hit["document"]["contents"].startswith('""\n') and hit["document"]["id"].startswith("sim-")
    # Step 0 of the curriculum: p = p_s = 0, so every document is useful.
    assert [d["quality"] for d in body["simulator"]] == ["useful", "useful"] and body["simulator"][0]["p"] == 0.0
    bare = post(sim_url, {"queries": ["danube cities"], "topk": 2}).json()["result"]
    assert [sorted(doc) for doc in bare[0]] == [["contents", "id"]] * 2


def test_documents_follow_the_requested_noise(sim_url: str, tiny_backend: Any) -> None:
    query = "river through vienna"
    served = {}
    for noise, quality in ((1.0, "noisy"), (0.0, "useful")):
        body = post(sim_url, {"queries": [query], "topk": 3, "return_scores": True, "noise": noise}).json()
        assert [d["quality"] for d in body["simulator"]] == [quality]
        served[quality] = [h["document"]["contents"] for h in body["result"][0]]
    # The served documents are the ones the simulator writes when asked for that quality
    # (the same greedy model, the same prompt), and the two qualities' prompts differ.
    own = SimulatedSearch("tiny", SimConfig.from_options(dict(p.split("=") for p in SIM_OPTIONS.split("&"))),
                          generator=tiny_backend)
    request = SearchRequest(query, query, query, ("unknown",))  # what the server builds from a bare query
    for quality in ("noisy", "useful"):
        [result] = own.simulate([request], 3, qualities=[quality])
        assert served[quality] == [p.contents for p in result.passages]
    assert served["noisy"] != served["useful"]


def test_noise_fraction_and_curriculum_step_per_request(sim_url: str) -> None:
    queries = [f"query number {i}" for i in range(120)]
    half = post(sim_url, {"queries": queries, "topk": 1, "noise": 0.5}).json()["simulator"]
    # 120 hashed draws at p = 0.5: sd = sqrt(0.25/120) ~ 0.046; 0.3..0.7 is over 4 sd.
    noisy = sum(d["quality"] == "noisy" for d in half) / len(half)
    assert 0.3 <= noisy <= 0.7
    assert all((d["quality"] == "noisy") == (d["u"] < 0.5) for d in half)
    # eq. 1 with p_s 0, p_e 1: step T -> p = 1 (all noisy); step 0 -> p = 0 (all useful).
    last = post(sim_url, {"queries": queries[:20], "topk": 1, "step": 10, "total_steps": 10}).json()["simulator"]
    first = post(sim_url, {"queries": queries[:20], "topk": 1, "step": 0, "total_steps": 10}).json()["simulator"]
    assert {d["quality"] for d in last} == {"noisy"} and {d["quality"] for d in first} == {"useful"}
    bad = post(sim_url, {"queries": ["q"], "noise": 1.5})
    assert bad.status_code == 400 and "'noise' must be a number in [0, 1]" in bad.json()["error"]


def test_progress_advances_the_curriculum(sim_url: str) -> None:
    try:
        # t/T = 0.5 with base 4: (4^0.5 - 1)/(4 - 1) = 1/3, times (p_e - p_s) = 1.
        state = post(sim_url, {"step": 5, "total_steps": 10}, "/progress").json()
        assert state == {"step": 5, "total_steps": 10, "noise_p": pytest.approx(1 / 3)}
        draws = post(sim_url, {"queries": ["a", "b"], "topk": 1}).json()["simulator"]
        assert [d["p"] for d in draws] == [pytest.approx(1 / 3)] * 2 and {d["t"] for d in draws} == {5}
        health = requests.get(sim_url + "/health", timeout=10).json()
        assert health["curriculum"]["noise_p"] == pytest.approx(1 / 3)
        assert post(sim_url, {"step": -1}, "/progress").status_code == 400
    finally:
        post(sim_url, {"step": 0, "total_steps": 10}, "/progress")


# ----------------------------------------------------------------------------- SerpAPI


@contextmanager
def fake_serpapi() -> Iterator[tuple[str, list[dict]]]:
    """A loopback server answering like serpapi.com/search.json, recording each call."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            params = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
            seen.append(params)
            body = json.dumps({"organic_results": [
                {"title": f"{params['q']} {params['engine']} {i}", "link": f"https://example.org/{i}",
                 "snippet": f"snippet {i}"} for i in range(int(params["num"]))]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/search.json", seen
    finally:
        server.shutdown()
        server.server_close()


SECRET = "sk-serp-7f3a9c"


def test_serpapi_cache_second_identical_request_makes_no_network_call(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SERPAPI_API_KEY", SECRET)
    cache = tmp_path / "serpapi.sqlite"
    with fake_serpapi() as (api, seen):
        plan = ServePlan(search=f"serpapi?base_url={api}", serpapi_cache=str(cache))
        with serving(build_app(plan)) as url:
            first = post(url, {"queries": ["danube"], "topk": 3, "return_scores": True})
            assert len(seen) == 1 and seen[0]["api_key"] == SECRET and seen[0]["q"] == "danube"
            second = post(url, {"queries": ["danube"], "topk": 3, "return_scores": True})
            assert len(seen) == 1  # answered from the disk cache: no call
            assert second.content == first.content
            post(url, {"queries": ["danube"], "topk": 2})  # another k: another key, one call
            assert len(seen) == 2
            health = requests.get(url + "/health", timeout=10).json()
        # 3 lookups: miss, hit, miss -> hit rate 1/3
        assert health["disk_cache"] | {"path": None} == {"path": None, "entries": 2, "hits": 1, "misses": 2,
                                                         "hit_rate": pytest.approx(1 / 3, abs=1e-4), "scope": "counts per worker"}
        # A rerun (a new server on the same file) does not pay again; another engine does.
        with serving(build_app(plan)) as url:
            assert post(url, {"queries": ["danube"], "topk": 3, "return_scores": True}).content == first.content
            assert len(seen) == 2
        with serving(build_app(ServePlan(search=f"serpapi?base_url={api}&engine=bing", serpapi_cache=str(cache)))) as url:
            post(url, {"queries": ["danube"], "topk": 3})
            assert len(seen) == 3 and seen[-1]["engine"] == "bing"
    # The key is in neither the cache file nor what /health shows.
    assert SECRET.encode() not in cache.read_bytes() and SECRET not in json.dumps(health)


# ----------------------------------------------------------------------------- the plan


def test_the_plan_carries_every_serve_option_to_a_worker(monkeypatch) -> None:
    from zsearch_cli.config.commands import ServeOptions
    from zsearch_cli.config.fields import leaves, to_flat

    opts = ServeOptions.from_flat(search=" http://127.0.0.1:9,http://127.0.0.1:10 ", index=Path("idx"), workers=3,
                                  port=0, max_topk=7, cache_size=11, cache_mb=2, serpapi_cache=Path("c.sqlite"))
    plan = plan_from_options(opts)
    # every option by its flat name, none listed by hand: a new ServeOptions field travels too
    assert set(plan.options) == set(leaves(ServeOptions))
    # what `--workers N` hands each worker: JSON in the environment, back to the same plan
    monkeypatch.setenv(PLAN_ENV, json.dumps(dataclasses.asdict(plan)))
    back = ServePlan(**json.loads(json.dumps(dataclasses.asdict(plan))))
    assert back == plan
    expected = {**to_flat(opts), "search": "http://127.0.0.1:9,http://127.0.0.1:10", "index": "idx",
                "serpapi_cache": "c.sqlite"}
    assert to_flat(back.serve_options) == expected
    app = worker_app()  # builds the proxy; nothing is asked of the replicas until a request comes
    assert app.state.service.source.client.urls == ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    assert app.state.service.cache.stats()["capacity"] == 11 and app.state.service.cache.max_bytes == 2 << 20
    with pytest.raises(TypeError, match="no option"):
        ServePlan(cache_bytes=1 << 20)  # not an option (cache_mb is): refused at once, not in a worker
