"""The ZeroSearch simulator: parsing, per-row routing through the real rollout engine with
an in-process tiny model, the OpenAI-compatible HTTP path against real loopback servers
(a working one and a hanging one), the cache, and ``zsearch search --search sim:…``."""

from __future__ import annotations

import json
import re
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator, Sequence

import pytest

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import GenerationOutput, SamplingParams
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import QARow, RolloutEngine
from zsearch_cli.rollout.protocols import TagsProtocol
from zsearch_cli.search.base import SearchBackendError, SearchRequest
from zsearch_cli.search.factory import make_search_backend
from zsearch_cli.search.sim_text import PLACEHOLDER_DOC, parse_documents
from zsearch_cli.search.simulated import SimConfig, SimulatedSearch, parse_sim_spec

# ----------------------------------------------------------------------------- parsing (pure)

FIVE = "\n".join(f"Doc {i}: document number {i} text." for i in range(1, 6))


def test_parse_exact_and_extra_docs():
    assert parse_documents(FIVE, 5) == [f"document number {i} text." for i in range(1, 6)]
    # extra documents are dropped, and so is a model that goes on imitating the prompt
    extra = FIVE + "\nDoc 6: six\nDoc 7: seven\n\nQuery: another query\nUseful Output:\nDoc 1: junk"
    assert parse_documents(extra, 5) == parse_documents(FIVE, 5)
    assert parse_documents(FIVE, 3) == ["document number 1 text.", "document number 2 text.", "document number 3 text."]


def test_parse_fewer_docs_and_marker_variants():
    text = "Sure, here are the results:\n\nDoc 1. first doc\n\n\n**Doc 2:** second\ncontinues here\nDoc 3 - third"
    assert parse_documents(text, 5) == ["first doc", "second continues here", "third"]
    assert parse_documents("Doc 1: one Doc 2: two Doc 3: three", 5) == ["one", "two", "three"]


def test_parse_without_doc_prefixes():
    assert parse_documents("1. alpha\n2) beta\n3: gamma", 5) == ["alpha", "beta", "gamma"]
    assert parse_documents("alpha paragraph\nstill alpha\n\nbeta paragraph", 5) == ["alpha paragraph still alpha",
                                                                                  "beta paragraph"]
    assert parse_documents("line one\nline two\n\n", 5) == ["line one", "line two"]


def test_parse_garbage_empty_and_length_cap():
    assert parse_documents("", 5) == []
    assert parse_documents("   \n\n  ", 5) == []
    assert parse_documents("!!! ### ???\n---\n***", 5) == []
    assert parse_documents("Doc 1:\nDoc 2: \nDoc 3: ok", 5) == ["ok"]
    long = parse_documents("Doc 1: " + "word " * 500, 5, max_chars=60)[0]
    assert len(long) <= 60 and long.endswith("word")


# ----------------------------------------------------------------------------- routing through the engine


class ScriptedBackend:
    """Plays fixed turn texts per question found in the prompt (as in test_engine.py)."""

    def __init__(self, tokenizer: Any, scripts: dict[str, list[str]]):
        self.tokenizer = tokenizer
        self.scripts = {q: list(turns) for q, turns in scripts.items()}

    def generate(self, prompts, params: SamplingParams, stop: Sequence[str] = ()):
        outs = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            question = next(q for q in self.scripts if q in text)
            ids = self.tokenizer.encode(self.scripts[question].pop(0), add_special_tokens=False)
            outs.append(GenerationOutput(ids, [-0.1] * len(ids), "stop"))
        return outs


class RecordingGenerator:
    """The real tiny-model backend, recording the decoded prompts the simulator sends it."""

    def __init__(self, inner: Any):
        self.inner, self.tokenizer, self.prompts = inner, inner.tokenizer, []

    def generate(self, prompts, params, stop=()):
        self.prompts += [self.tokenizer.decode(p) for p in prompts]
        return self.inner.generate(prompts, params, stop)


def test_each_simulator_prompt_carries_its_own_rows_question_and_answer(tiny_backend):
    # The first row never searches and the others search on different turns: a backend
    # that paired queries with batch positions (the bug in ZeroSearch's code) would mix the rows up.
    rows = [
        QARow("hamlet", "Who wrote Hamlet?", ["William Shakespeare"]),
        QARow("vienna", "Which river flows through Vienna?", ["Danube", "Donau"]),
        QARow("peru", "What is the capital of Peru?", ["Lima"]),
    ]
    scripts = {
        rows[0].question: ["<answer> Shakespeare </answer>"],
        rows[1].question: ["<search> river vienna </search>", "<answer> Danube </answer>"],
        rows[2].question: ["<search> peru capital </search>", "<search> lima peru </search>", "<answer> Lima </answer>"],
    }
    sim_gen = RecordingGenerator(tiny_backend)
    sim = SimulatedSearch("tiny", SimConfig(noise_start=0.0, noise_end=1.0, max_tokens=8, seed=1), generator=sim_gen)
    sim.progress(5, 10)
    assert sim.noise_p == pytest.approx(1 / 3)  # (4^0.5 − 1)/3
    engine = RolloutEngine(ScriptedBackend(tiny_backend.tokenizer, scripts), TagsProtocol(), sim,
                           RolloutOptions(max_turns=4, topk=3, max_obs_tokens=400))
    trajs = {t.row_id: t for t in engine.rollout(rows)}
    logged: set[str] = set()
    for row in rows:
        logs = [e for turn in trajs[row.id].turns for e in turn.get("search_log", [])]
        assert len(logs) == {"vienna": 1, "hamlet": 0, "peru": 2}[row.id]
        for log in logs:
            prompt = log["prompt"]
            assert f'the question: "{row.question}" whose answer is {row.golden_answers[0]}.' in prompt
            assert f"generate five {log['quality']} documents" in prompt
            assert log["p"] == pytest.approx(1 / 3) and 0.0 <= log["u"] < 1.0
            assert (log["quality"] == "noisy") == (log["u"] < log["p"])
            assert prompt in sim_gen.prompts  # exactly what the model was given (raw, no chat template)
            assert not prompt.startswith("<|im_start|>")
            logged.add(prompt)
    assert logged == set(sim_gen.prompts)  # the model saw nothing else (re-asks repeat a prompt)
    assert trajs["hamlet"].num_searches == 0 and trajs["peru"].num_searches == 2


def test_quality_draw_does_not_depend_on_the_batch(tiny_backend):
    cfg = SimConfig(noise_start=0.5, noise_end=0.5, max_tokens=4, reask=False, cache_size=0)
    req = SearchRequest("q target", "row-7", "Q?", ("A",), 2)
    others = [SearchRequest(f"q{i}", f"r{i}", "Q?", ("A",), 0) for i in range(3)]
    alone = SimulatedSearch("tiny", cfg, generator=tiny_backend).search([req], 2)[0].log
    mixed = SimulatedSearch("tiny", cfg, generator=tiny_backend).search([*others, req], 2)[3].log
    assert (alone["u"], alone["quality"]) == (mixed["u"], mixed["quality"])


# ----------------------------------------------------------------------------- HTTP


@contextmanager
def fake_openai(texts: list[str] | None = None, hang: bool = False) -> Iterator[tuple[str, list[dict]]]:
    """A loopback OpenAI-compatible server: /v1/models, /v1/completions, /v1/chat/completions.
    Completions answer ``texts`` in turn (the last one repeats), or hang when ``hang``."""
    seen: list[dict] = []
    release = threading.Event()
    texts = texts or ["Doc 1: {q} one.\nDoc 2: {q} two.\nDoc 3: {q} three.\nDoc 4: {q} four.\nDoc 5: {q} five."]

    class Handler(BaseHTTPRequestHandler):
        def _send(self, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802
            seen.append({"path": self.path})
            self._send({"object": "list", "data": [{"id": "sim-model-1"}, {"id": "other"}]})

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
            if hang:
                release.wait(10)
                return
            prompt = body.get("prompt") or body["messages"][-1]["content"]
            query = re.findall(r"Query: (.*)", prompt)[-1]
            text = texts[min(len(seen) - 1, len(texts) - 1)].format(q=query)
            if self.path.endswith("/chat/completions"):
                self._send({"choices": [{"message": {"role": "assistant", "content": text}}]})
            else:
                self._send({"choices": [{"text": text}]})

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_http_simulator_routes_rows_and_caches(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with fake_openai() as (url, seen):
        sim = make_search_backend(f"sim+{url}?noise_start=0&noise_end=0&seed=3", concurrency=4)
        reqs = [SearchRequest("danube cities", "r1", "Which river flows through Vienna?", ("Danube",)),
                SearchRequest("peru capital", "r2", "What is the capital of Peru?", ("Lima", "Lima, Peru"))]
        first = sim.search(reqs, 5)
        assert seen[0]["path"] == "/v1/models"  # model name from the server's first id
        posts = [s for s in seen if s["path"] == "/v1/completions"]
        assert len(posts) == 2
        for p in posts:
            assert p["model"] == "sim-model-1" and p["auth"] == "Bearer test-key"
            assert set(p) >= {"prompt", "max_tokens", "temperature", "top_p", "seed"}
            assert p["temperature"] == pytest.approx(0.7)
        by_query = {re.findall(r"Query: (.*)", p["prompt"])[0]: p["prompt"] for p in posts}
        assert 'question: "What is the capital of Peru?" whose answer is Lima.' in by_query["peru capital"]
        assert "Vienna" in by_query["danube cities"] and "Peru" not in by_query["danube cities"]
        assert [p.text for p in first[1].passages] == [f"peru capital {w}." for w in ("one", "two", "three", "four", "five")]
        assert all(p.title == "" and p.id.startswith("sim-") for p in first[1].passages)
        assert first[0].log["quality"] == "useful" and not first[0].log["cache_hit"] and not first[0].log["padded"]

        again = sim.search(reqs[:1], 3)  # same (query, quality, question): no HTTP request
        assert len([s for s in seen if s["path"] == "/v1/completions"]) == 2
        assert again[0].log["cache_hit"] and again[0].log["raw"] is None
        assert [p.text for p in again[0].passages] == [p.text for p in first[0].passages][:3]


def test_short_output_is_reasked_once_then_padded():
    with fake_openai(texts=["Doc 1: only one.", "Doc 1: a.\nDoc 2: b."]) as (url, seen):
        sim = make_search_backend(f"sim+{url}", model="named", noise_end=0.0)
        res = sim.search([SearchRequest("q", "r", "Q?", ("A",))], 3)[0]
        posts = [s for s in seen if s["path"].endswith("/completions")]
        assert len(posts) == 2 and posts[0]["seed"] != posts[1]["seed"]  # one re-ask, with a new seed
        assert not any(s["path"] == "/v1/models" for s in seen)  # --sim-model given
        assert [p.text for p in res.passages] == ["a.", "b.", PLACEHOLDER_DOC]
        assert res.log["reasked"] and res.log["padded"] and res.log["n_docs"] == 2
        sim.search([SearchRequest("q", "r", "Q?", ("A",))], 3)  # a padded answer is not cached
        assert len([s for s in seen if s["path"].endswith("/completions")]) == 4


def test_prompt_mode_uses_chat_and_hides_the_answer_from_noisy_requests():
    with fake_openai() as (url, seen):
        sim = make_search_backend(f"sim+{url}?mode=prompt", model="m")
        reqs = [SearchRequest("q1", "r1", "Who wrote Hamlet?", ("Shakespeare",))] * 2
        sim.simulate(reqs[:1], 3, qualities=["useful"])
        sim.simulate(reqs[1:], 3, qualities=["noisy"])
        useful, noisy = [s for s in seen if s["path"] == "/v1/chat/completions"]
        assert useful["messages"][0]["role"] == "system"
        assert "Who wrote Hamlet?" in useful["messages"][-1]["content"] and "Shakespeare" in useful["messages"][-1]["content"]
        assert "Hamlet" not in noisy["messages"][-1]["content"] and "Shakespeare" not in noisy["messages"][-1]["content"]


def test_hanging_server_fails_after_bounded_attempts():
    with fake_openai(hang=True) as (url, seen):
        sim = make_search_backend(f"sim+{url}?timeout=0.3&retries=1&backoff=0.01", model="m")
        with pytest.raises(SearchBackendError, match=re.escape(f"{url}/completions")) as err:
            sim.search([SearchRequest("q", "r", "Q?", ("A",))], 3)
        assert isinstance(err.value, ZsearchError)
        assert "failed after 2 attempts" in str(err.value)
        assert len([s for s in seen if s["path"] == "/v1/completions"]) == 2


# ----------------------------------------------------------------------------- spec and CLI


def test_spec_options_and_errors():
    assert parse_sim_spec("sim:smollm2?noise_end=0.75&mode=prompt") == ("smollm2", {"noise_end": "0.75", "mode": "prompt"})
    assert SimConfig.from_options({"noise-end": "0.75", "reask": "false", "sim_model": "x"}) == SimConfig(
        noise_end=0.75, reask=False, model="x")
    with pytest.raises(ZsearchError, match="unknown simulator option 'noise'"):
        SimConfig.from_options({"noise": "1"})
    with pytest.raises(ZsearchError, match="not a float"):
        SimConfig.from_options({"temperature": "hot"})
    with pytest.raises(ZsearchError, match="sim\\+http"):
        make_search_backend("sim+ftp://x")
    with fake_openai() as (url, _):
        with pytest.raises(ZsearchError, match="topk <= 5"):
            make_search_backend(f"sim+{url}", model="m").search([SearchRequest("q", "r", "Q?", ("A",))], 6)
        with pytest.raises(ZsearchError, match="row 'r'.*gold answer"):
            make_search_backend(f"sim+{url}", model="m").search([SearchRequest("q", "r", "Q?", ())], 3)


def test_cli_search_with_the_simulator(tiny_model_dir):
    from typer.testing import CliRunner

    from zsearch_cli.cli import app

    result = CliRunner().invoke(app, [
        "search", "--search", f"sim:{tiny_model_dir}?max_tokens=16&device=cpu", "danube cities",
        "--question", "Which river flows through Vienna?", "--answer", "Danube", "--quality", "noisy", "-k", "3",
    ], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    # the table's title may wrap (a long tmp path names the simulator): compare words, not lines
    assert "noisy top-3 for 'danube cities'" in " ".join(result.output.split())
    assert "rank" in result.output and "sim-" in result.output
