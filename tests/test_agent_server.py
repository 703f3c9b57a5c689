"""``zsearch agent serve``: the search agent behind an OpenAI-compatible chat API, over real
HTTP on 127.0.0.1, queried with the real ``openai`` client. Its answers are what ``zsearch
eval --method agent``'s engine predicts for the same question and settings."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

openai = pytest.importorskip("openai")

from zsearch_cli.agent.server import create_app  # noqa: E402
from zsearch_cli.errors import ZsearchError  # noqa: E402
from zsearch_cli.models.base import GenerationOutput  # noqa: E402
from zsearch_cli.config.commands import AgentServeOptions, EvalOptions  # noqa: E402
from zsearch_cli.retrieval.server import serving  # noqa: E402
from zsearch_cli.rollout.build import MAKE, build_engine  # noqa: E402
from zsearch_cli.rollout.engine import QARow  # noqa: E402
from zsearch_cli.search.base import SearchBackend  # noqa: E402

QUESTIONS = ["Who stole the Mona Lisa from the Louvre in August 1911?",
             "Which Roman emperor opened the Colosseum with inaugural games lasting 100 days?"]
LIMITS = dict(max_turns=2, max_turn_tokens=24, max_obs_tokens=200)


def client(url: str) -> Any:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)


def agent_opts(model: str, index: Path, **kw: Any) -> AgentServeOptions:
    return AgentServeOptions.from_flat(model=model, backend="hf", device="cpu", search="bm25", index=index, **{**LIMITS, **kw})


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path, demo_index: Path) -> Iterator[tuple[str, Any]]:
    """The tiny random model as an agent over the demo index, built as the CLI builds it."""
    engine = build_engine(agent_opts(str(tiny_model_dir), demo_index))
    with serving(create_app(engine, "tiny-agent", aliases=(str(tiny_model_dir),))) as url:
        yield url, engine


class Searcher:
    """A policy that follows the format: it searches its question, then answers from what it read.
    It records how many generate calls ran at once (the server must run one at a time)."""

    def __init__(self, tokenizer: Any, gate: threading.Event | None = None):
        self.tokenizer, self.gate = tokenizer, gate
        self.running = self.most = 0
        self.lock = threading.Lock()

    def generate(self, prompts, params, stop=()):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if self.gate is not None:
                assert self.gate.wait(30)
            time.sleep(0.01)
            outs = []
            for p in prompts:
                text = self.tokenizer.decode(p)
                if text.rstrip().endswith("</information>"):
                    title = (re.findall(r'Doc 1\(Title: "([^"]*)"\)', text) or ["unknown"])[-1]
                    turn = f"<think> it says {title} </think>\n<answer> {title} </answer>"
                else:
                    question = text.split("Question:")[-1].split("<|")[0].strip()
                    turn = f"<think> look it up </think>\n<search> {question} </search>"
                ids = self.tokenizer.encode(turn, add_special_tokens=False)
                outs.append(GenerationOutput(ids, [-0.5] * len(ids), "stop"))
            return outs
        finally:
            with self.lock:
                self.running -= 1


@pytest.fixture(scope="module")
def searcher(tiny_model_and_tokenizer: Any, demo_index: Path) -> Iterator[tuple[str, Searcher]]:
    policy = Searcher(tiny_model_and_tokenizer[1])
    engine = build_engine(agent_opts("searcher", demo_index), backend=policy)
    with serving(create_app(engine, "searcher")) as url:
        yield url, policy


# ----------------------------------------------------------------------------- answers


def test_answer_is_what_eval_predicts(tiny, tiny_model_dir, demo_index):
    url, _ = tiny
    opts = EvalOptions.from_flat(model=str(tiny_model_dir), backend="hf", device="cpu", search="bm25", index=demo_index,
                       **LIMITS)
    from zsearch_cli.commands.evaluate import _build_engine

    eval_engine, _ = _build_engine(opts)
    expected = eval_engine.rollout([QARow(f"q{i}", q, []) for i, q in enumerate(QUESTIONS)])
    api = client(url)
    for question, t in zip(QUESTIONS, expected):
        r = api.chat.completions.create(model="tiny-agent", messages=[
            {"role": "system", "content": "ignored: the agent's protocol prompt is used"},
            {"role": "user", "content": question}])
        z = r.model_extra["zsearch"]
        assert [turn["text"] for turn in z["turns"]] == t.policy_texts
        assert r.choices[0].message.content == (t.prediction if t.prediction is not None else t.policy_texts[-1])
        assert z["prediction"] == t.prediction and z["finish_reason"] == t.finish_reason
        assert r.choices[0].finish_reason == ("length" if t.truncated else "stop")
        assert r.usage.prompt_tokens == t.prompt_tokens and r.usage.completion_tokens == t.policy_tokens
        assert r.model == "tiny-agent" and r.object == "chat.completion"


def test_trajectory_holds_turns_queries_and_results(searcher):
    url, _ = searcher
    r = client(url).chat.completions.create(model="searcher", messages=[{"role": "user", "content": QUESTIONS[0]}])
    z = r.model_extra["zsearch"]
    assert z["num_searches"] == 1 and z["num_turns"] == 2 and z["finish_reason"] == "answer"
    assert z["queries"] == [QUESTIONS[0]]
    first = z["turns"][0]
    assert first["action"] == "search" and first["queries"] == [QUESTIONS[0]]
    titles = [d["title"] for d in first["results"][0]]
    assert len(titles) == 3 and all(d["id"] for d in first["results"][0])
    assert z["turns"][1]["action"] == "answer"
    assert r.choices[0].message.content == titles[0] == z["prediction"]
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == z["policy_tokens"] and r.usage.total_tokens > r.usage.completion_tokens


def test_sampling_options_from_the_request(tiny):
    url, _ = tiny
    api = client(url)
    ask = dict(model="tiny-agent", messages=[{"role": "user", "content": QUESTIONS[1]}])
    a = api.chat.completions.create(**ask, temperature=1.0, top_p=0.9, seed=7)
    b = api.chat.completions.create(**ask, temperature=1.0, top_p=0.9, seed=7)
    c = api.chat.completions.create(**ask, temperature=1.0, seed=8)
    turns = lambda r: [t["text"] for t in r.model_extra["zsearch"]["turns"]]  # noqa: E731
    assert turns(a) == turns(b) != turns(c)  # a seed reproduces a request
    short = api.chat.completions.create(**ask, max_tokens=3)
    assert short.usage.completion_tokens <= 3 * short.model_extra["zsearch"]["num_turns"]
    capped = api.chat.completions.create(**ask, max_tokens=10_000)  # bounded by --max-turn-tokens 24
    assert capped.usage.completion_tokens <= 24 * capped.model_extra["zsearch"]["num_turns"]


# ----------------------------------------------------------------------------- streaming


def test_streaming_per_turn_chunks_end_with_done(searcher):
    url, _ = searcher
    chunks = list(client(url).chat.completions.create(
        model="searcher", messages=[{"role": "user", "content": QUESTIONS[1]}], stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    turns = [c.model_extra["zsearch"]["turn"] for c in chunks
             if c.choices and "turn" in (c.model_extra.get("zsearch") or {})]
    assert [t["action"] for t in turns] == ["search", "answer"] and turns[0]["results"][0]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason][-1]
    assert final.choices[0].finish_reason == "stop" and "queries" in final.model_extra["zsearch"]
    assert content == final.model_extra["zsearch"]["prediction"] == turns[0]["results"][0][0]["title"]
    assert chunks[-1].usage.completion_tokens > 0
    # on the wire: SSE data lines, the last one [DONE]
    raw = requests.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                             "stream": True}, stream=True, timeout=30)
    assert raw.headers["content-type"].startswith("text/event-stream")
    lines = [ln for ln in raw.iter_lines() if ln]
    assert all(ln.startswith(b"data: ") for ln in lines) and lines[-1] == b"data: [DONE]"
    assert json.loads(lines[-2][6:])["object"] == "chat.completion.chunk"


# ----------------------------------------------------------------------------- errors, models, concurrency


def test_bad_requests_get_openai_errors(searcher):
    url, _ = searcher
    api = client(url)
    user = [{"role": "user", "content": "q"}]
    for kwargs, where in [(dict(messages=user, temperature=5), "temperature"),
                          (dict(messages=user, top_p=0), "top_p"),
                          (dict(messages=user, max_tokens=0), "max_tokens"),
                          (dict(messages=user, n=2), "n"),
                          (dict(messages=user, tools=[{"type": "function", "function": {"name": "f"}}]), "tools"),
                          (dict(messages=[{"role": "system", "content": "no question"}]), "messages"),
                          (dict(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages")]:
        with pytest.raises(openai.BadRequestError) as err:
            api.chat.completions.create(model="searcher", **kwargs)
        assert err.value.status_code == 400 and err.value.body["param"] == where and err.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="gpt-4", messages=user)
    for body, status in [(b"{not json", 400), (b"[1, 2]", 400), (b"{}", 400), (b"[" * 100_000, 400),
                         (b'{"messages": [{"role": "user", "content": "' + b"x" * (2 << 20) + b'"}]}', 413)]:
        r = requests.post(f"{url}/v1/chat/completions", data=body, timeout=30)
        assert r.status_code == status and r.json()["error"]["message"], (body[:20], r.text[:200])
    r = requests.get(f"{url}/v1/nope", timeout=5)
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    assert requests.get(f"{url}/health", timeout=5).json()["status"] == "ok"  # still serving


def test_text_the_tokenizer_cannot_take_is_a_400_naming_the_field(searcher):
    # A lone UTF-16 surrogate (JSON's \ud800) reached the tokenizer: 500 and a traceback in the
    # log (issue 36.4). Now 400 naming the message, and the server stays up. A NUL too.
    url, _ = searcher
    for raw, what in [(b"capital \\ud800 of France", "lone surrogate (U+D800)"),
                      (b"capital \\u0000 of France", "NUL character")]:
        body = b'{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "' + raw + b'"}]}'
        r = requests.post(f"{url}/v1/chat/completions", data=body, timeout=30)
        assert r.status_code == 400, r.text[:300]
        error = r.json()["error"]
        assert error["param"] == "messages" and "'messages'[1].content holds a" in error["message"]
        assert what in error["message"]
    assert requests.get(f"{url}/health", timeout=5).json()["status"] == "ok"  # still serving


def test_engine_refusals_are_json_errors(searcher, tiny_model_and_tokenizer, demo_index):
    url, _ = searcher
    long = " ".join(["polonium"] * 3000)  # under the character cap, over --max-context-tokens
    for question in (long, "x" * 40_000):
        with pytest.raises(openai.BadRequestError) as err:
            client(url).chat.completions.create(model="searcher", messages=[{"role": "user", "content": question}])
        assert "tokens" in err.value.body["message"] or "characters" in err.value.body["message"]

    class Down(SearchBackend):
        def search(self, requests, topk):
            raise ZsearchError("retriever unreachable")

    engine = build_engine(agent_opts("down", demo_index), backend=Searcher(tiny_model_and_tokenizer[1]), search=Down())
    with serving(create_app(engine, "down")) as down:
        ask = dict(model="down", messages=[{"role": "user", "content": QUESTIONS[0]}])
        with pytest.raises(openai.APIStatusError) as err:
            client(down).chat.completions.create(**ask)
        assert err.value.status_code == 502 and "retriever unreachable" in err.value.body["message"]
        with pytest.raises(openai.APIError, match="retriever unreachable"):
            list(client(down).chat.completions.create(**ask, stream=True))
        assert requests.get(f"{down}/health", timeout=5).json()["status"] == "ok"


def test_models_lists_the_model(tiny, tiny_model_dir):
    url, _ = tiny
    assert [m.id for m in client(url).models.list()] == ["tiny-agent"]
    health = requests.get(f"{url}/health", timeout=5).json()
    assert health["model"] == "tiny-agent" and health["max_turns"] == 2
    # the --model value is accepted as the model's name too
    r = client(url).chat.completions.create(model=str(tiny_model_dir), messages=[{"role": "user", "content": "q"}],
                                            max_tokens=2)
    assert r.model == "tiny-agent"


def test_concurrent_requests_run_one_rollout_at_a_time(searcher):
    url, policy = searcher
    results: list[Any] = []

    def ask(q: str) -> None:
        results.append(client(url).chat.completions.create(model="searcher", messages=[{"role": "user", "content": q}]))

    threads = [threading.Thread(target=ask, args=(QUESTIONS[i % 2],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 6 and policy.most == 1
    assert {r.model_extra["zsearch"]["queries"][0] for r in results} == set(QUESTIONS)


def test_over_max_concurrent_gets_429(tiny_model_and_tokenizer, demo_index):
    gate = threading.Event()
    engine = build_engine(agent_opts("gated", demo_index), backend=Searcher(tiny_model_and_tokenizer[1], gate))
    with serving(create_app(engine, "gated", max_concurrent=1)) as url:
        first = threading.Thread(target=lambda: client(url).chat.completions.create(
            model="gated", messages=[{"role": "user", "content": QUESTIONS[0]}]))
        first.start()
        deadline = time.monotonic() + 10
        while requests.get(f"{url}/health", timeout=5).json()["requests"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        with pytest.raises(openai.RateLimitError):
            client(url).chat.completions.create(model="gated", messages=[{"role": "user", "content": "q"}])
        gate.set()
        first.join(30)
        r = client(url).chat.completions.create(model="gated", messages=[{"role": "user", "content": QUESTIONS[0]}])
        assert r.model_extra["zsearch"]["num_searches"] == 1  # the slot came back


def test_a_client_that_leaves_stops_its_rollout(tiny_model_and_tokenizer, demo_index):
    gate = threading.Event()
    policy = Searcher(tiny_model_and_tokenizer[1], gate)
    calls = []
    generate = policy.generate
    policy.generate = lambda *a, **kw: calls.append(1) or generate(*a, **kw)  # type: ignore[method-assign]
    engine = build_engine(agent_opts("gated", demo_index), backend=policy)
    with serving(create_app(engine, "gated", max_concurrent=1)) as url:
        r = requests.post(f"{url}/v1/chat/completions", stream=True, timeout=30,
                          json={"messages": [{"role": "user", "content": QUESTIONS[0]}], "stream": True})
        assert next(r.iter_lines()).startswith(b"data: ")
        r.close()  # gone before its first turn ended (the gate holds generation)
        time.sleep(0.5)
        gate.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the slot comes back once the rollout has stopped
            try:
                done = client(url).chat.completions.create(model="gated",
                                                           messages=[{"role": "user", "content": QUESTIONS[1]}])
                break
            except openai.RateLimitError:
                time.sleep(0.05)
        # the left request ran at most its first turn (whether its rollout had started when the
        # client left depends on thread timing), never its second: its slot came back
        assert len(calls) - done.model_extra["zsearch"]["num_turns"] in (0, 1)


# ----------------------------------------------------------------------------- the command


def test_agent_serve_options_are_declared_fields():
    import typer

    from zsearch_cli.cli import agent_serve, app
    from zsearch_cli.config.ranges import range_for

    cmd = typer.main.get_command(app).commands["agent"].commands["serve"]
    options = {o.param: o for o in agent_serve.options.values()}
    params = {p.name: p for p in cmd.params if p.name not in ("config", "print_config", "help")}
    assert {"model", "search", "index_dir", "backend", "port", "host", "max_concurrent", "seed",
            "max_turn_tokens", "temperature", "top_p"} <= set(params)
    for name, p in params.items():
        assert p.help, name
        if options[name].annotation in (int, float):
            assert range_for("agent serve", name) is not None, name
    assert AgentServeOptions().host == "127.0.0.1" and AgentServeOptions().rollout.temperature == 0.0
    assert set(options) == set(params)  # one dataclass field per option


def test_cli_serves_and_stops(tiny_model_dir, demo_index, tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "zsearch_cli", "agent", "serve", "--model", str(tiny_model_dir),
                             "--backend", "hf", "--device", "cpu", "--index", str(demo_index), "--port", "0",
                             "--max-turns", "1", "--max-turn-tokens", "8", "--served-model-name", "cli-agent"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        line = ""
        deadline = time.monotonic() + 120
        while "serving agent" not in line and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        assert m, line
        api = client(f"http://127.0.0.1:{m.group(1)}")
        assert [x.id for x in api.models.list()] == ["cli-agent"]
        r = api.chat.completions.create(model="cli-agent", messages=[{"role": "user", "content": QUESTIONS[0]}])
        assert r.model_extra["zsearch"]["num_turns"] >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "server stopped" in out


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("ZSEARCH_TEST_WARM_AGENT") != "1",
                    reason="the warmed smollm2 agent takes 45-75 s per question on a shared 2-core CPU; "
                           "ZSEARCH_TEST_WARM_AGENT=1 runs it")
def test_warm_agent_answers_as_eval_does(zsearch_cache, demo_index):
    """The bundled warmed agent (smollm2-warm) searches, reads and answers; the server's answer
    and trajectory are eval's, token for token (one backend shared, greedy)."""
    from zsearch_cli.models.factory import load_backend

    limits = dict(max_turns=1, max_turn_tokens=48, max_obs_tokens=256)
    backend = load_backend("smollm2-warm", backend="hf", device="cpu")
    opts = AgentServeOptions.from_flat(model="smollm2-warm", search="bm25", index=demo_index, **limits)
    eval_opts = EvalOptions.from_flat(model="smollm2-warm", search="bm25", index=demo_index, **limits)
    expected = build_engine(eval_opts, backend=backend, search=MAKE, max_turns=eval_opts.max_turns).rollout(
        [QARow("art-q002", QUESTIONS[0], [])])[0]
    with serving(create_app(build_engine(opts, backend=backend), "smollm2-warm")) as url:
        r = client(url).chat.completions.create(model="smollm2-warm",
                                                messages=[{"role": "user", "content": QUESTIONS[0]}])
    z = r.model_extra["zsearch"]
    assert expected.prediction and r.choices[0].message.content == expected.prediction
    assert [t["text"] for t in z["turns"]] == expected.policy_texts and z["num_searches"] == expected.num_searches == 1
    assert z["queries"] == [q for t in expected.turns if "docs" in t for q in t["queries"]]
