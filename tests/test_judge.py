"""`zsearch judge`: strict verdict parsing, the prompt, an end-to-end run against a real
loopback OpenAI-compatible server (canned verdicts, one unparseable, one flaky), balancing,
resuming, the local-model path with the tiny model, and bad input."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.errors import ZsearchError
from zsearch_cli.llm_client import LLMClient
from zsearch_cli.prompts.judge import build_judge_prompt, parse_verdict
from zsearch_cli.artifacts import read_artifact, read_metadata, write_artifact
from zsearch_cli.schemas import COLLECTED_QUERY, JUDGMENT
from zsearch_cli.commands.judge import balance, label_counts

runner = CliRunner()


@pytest.mark.parametrize("text, expected", [
    ("Verdict: yes", ("yes", None)),
    ("Verdict: NO.", ("no", None)),
    ("yes", ("yes", None)),
    ("  No.\n", ("no", None)),
    ("verdict:yes", ("yes", None)),
    ("The documents name the river.\nVerdict: yes", ("yes", None)),  # a preamble line is fine
    ("Verdict: no\nVerdict: no", ("no", None)),                       # repeated, consistent
    ("I think yes but no", (None, "no 'Verdict: yes|no' line")),
    ("", (None, "empty output")),
    ("   \n ", (None, "empty output")),
    (None, (None, "empty output")),
    ("#$%@ lorem", (None, "no 'Verdict: yes|no' line")),
    ("yes no", (None, "no 'Verdict: yes|no' line")),
    ("Verdict: yes or no", (None, "no 'Verdict: yes|no' line")),
    ("Verdict: yes, mostly", (None, "no 'Verdict: yes|no' line")),
    ("Verdict: yes\nVerdict: no", (None, "conflicting verdicts")),
    ("yes.\nno.", (None, "no 'Verdict: yes|no' line")),
])
def test_parse_verdict_is_strict(text, expected):
    assert parse_verdict(text) == expected


def test_prompt_shows_question_answer_query_and_documents():
    prompt = build_judge_prompt(" Who wrote Hamlet? ", ["William Shakespeare", "Shakespeare"], "hamlet author",
                                ["Hamlet\nHamlet is a tragedy by  William Shakespeare.", "\nuntitled passage"])
    assert 'the question: "Who wrote Hamlet?"' in prompt
    assert "The correct answer is: William Shakespeare (also accepted: Shakespeare)" in prompt
    assert 'searched for: "hamlet author"' in prompt
    assert "Doc 1 (Title: Hamlet) Hamlet is a tragedy by William Shakespeare.\nDoc 2 untitled passage" in prompt
    assert prompt.endswith("Verdict: yes\nif the documents contain enough information to answer the query, or\n"
                           "Verdict: no\nif they do not.")
    assert "(no documents)" in build_judge_prompt("Q?", ["a"], "q", [])


def _query_row(i: int, query: str) -> dict:
    return {"id": f"r{i}#0/t0/q0", "row_id": f"r{i}", "trajectory_id": f"r{i}#0", "sample_index": 0, "turn": 0,
            "query_index": 0, "question": f"Question {i}?", "golden_answers": [f"answer {i}"], "query": query,
            "doc_ids": [f"d{i}"], "documents": [f"Title {i}\ntext {i}"], "prediction": None, "correct": False}


CANNED = {"q-use-1": "Verdict: yes", "q-use-2": "Verdict: YES.", "q-noise": "Verdict: no",
          "q-garbage": "Hmm, hard to say.", "q-use-3": "yes", "q-flaky": "Verdict: no"}


def _fake_openai(seen: list) -> FastAPI:
    """A real OpenAI-compatible server: canned verdicts keyed by the query in the prompt;
    'q-flaky' fails with 503 the first time; an unknown model is a 404. (FastAPI resolves
    the ``Request`` annotation by name, so it is imported at module level.)"""
    app_ = FastAPI()
    failed: set[str] = set()

    @app_.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app_.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        seen.append({"body": body, "auth": request.headers.get("authorization")})
        if body["model"] != "fake-judge":
            return JSONResponse({"error": {"message": "model not found"}}, status_code=404)
        prompt = body["messages"][0]["content"]
        query = next(q for q in CANNED if f'searched for: "{q}"' in prompt)
        if query == "q-flaky" and query not in failed:
            failed.add(query)
            return JSONResponse({"error": "overloaded"}, status_code=503)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": CANNED[query]},
                             "finish_reason": "stop"}]}

    @app_.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        return {"choices": [{"index": 0, "text": f"echo:{body['prompt']}", "finish_reason": "stop"}]}

    return app_


@pytest.fixture()
def queries_file(tmp_path) -> Path:
    path = tmp_path / "queries.parquet"
    write_artifact([_query_row(i, q) for i, q in enumerate(CANNED)], path, COLLECTED_QUERY)
    return path


def test_judge_against_an_openai_compatible_endpoint(tmp_path, queries_file, monkeypatch):
    from zsearch_cli.retrieval.server import serving

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    seen: list = []
    out = tmp_path / "judged"
    with serving(_fake_openai(seen)) as url:
        args = ["judge", str(queries_file), "--judge-url", f"{url}/v1", "--judge-model", "fake-judge",
                "--out", str(out), "--batch-size", "4", "--concurrency", "2", "--balance", "--seed", "3"]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        rows = {r["id"]: r for r in read_artifact(out / "judgments.parquet", JUDGMENT).to_pylist()}
        labels = {r["query"]: r["label"] for r in rows.values()}
        assert labels == {"q-use-1": "useful", "q-use-2": "useful", "q-noise": "noisy", "q-garbage": None,
                          "q-use-3": "useful", "q-flaky": "noisy"}  # the 503 was retried
        bad = next(r for r in rows.values() if r["query"] == "q-garbage")
        assert (bad["parse_ok"], bad["parse_error"], bad["judge_output"]) == (
            False, "no 'Verdict: yes|no' line", "Hmm, hard to say.")
        assert all(r["parse_ok"] and r["parse_error"] is None for r in rows.values() if r["label"])
        assert {r["judge_model"] for r in rows.values()} == {"fake-judge"}
        assert rows["r0#0/t0/q0"]["documents"] == ["Title 0\ntext 0"]  # query columns carried over
        assert len(seen) == 7 and all(s["auth"] == "Bearer sk-test" for s in seen)
        assert all(s["body"]["temperature"] == 0 and s["body"]["max_tokens"] == 32 for s in seen)
        assert "Question 3?" in next(s["body"]["messages"][0]["content"] for s in seen
                                     if '"q-garbage"' in s["body"]["messages"][0]["content"])
        assert "1 judge outputs did not parse" in result.output
        assert label_counts(list(rows.values())) == {"useful": 3, "noisy": 2, "unparseable": 1}
        balanced = read_artifact(out / "judgments.balanced.parquet", JUDGMENT).to_pylist()
        assert label_counts(balanced) == {"useful": 2, "noisy": 2, "unparseable": 0}
        assert read_metadata(out / "judgments.parquet")["config"]["judge_prompt_version"] == "zsearch-judge-v1"

        # a re-run resumes: nothing is sent again
        result = runner.invoke(app, args)
        assert result.exit_code == 0 and "6 query rows already judged, 0 to go" in result.output
        assert len(seen) == 7
        # a 4xx is not retried and names the endpoint; rows not yet started are not sent
        # (with one worker: the failing request and at most the one already picked up)
        result = runner.invoke(app, ["judge", str(queries_file), "--judge-url", f"{url}/v1", "--judge-model", "nope",
                                     "--concurrency", "1", "--out", str(tmp_path / "other")])
        assert result.exit_code == 2 and "HTTP 404" in result.output and 1 <= len(seen) - 7 <= 2
        # the raw completions API of the same client
        client = LLMClient(f"{url}/v1/completions", "fake-judge", api="completions")
        assert client.complete(["a", "b"], max_tokens=4) == ["echo:a", "echo:b"]


def test_endpoint_down_fails_after_bounded_retries():
    waits: list[float] = []
    client = LLMClient("http://127.0.0.1:9/v1", "m", retries=2, backoff=0.01, timeout=1, sleep=waits.append)
    with pytest.raises(ZsearchError, match=r"LLM endpoint http://127.0.0.1:9/v1/chat/completions: failed after 3"):
        client.complete(["x"], max_tokens=2)
    assert waits == [0.01, 0.02]


def test_balance_downsamples_the_majority_with_a_seed():
    rows = [{"id": str(i), "label": lab} for i, lab in enumerate(["useful"] * 6 + ["noisy"] * 2 + [None] * 3)]
    a, b = balance(rows, seed=1), balance(rows, seed=1)
    assert a == b and label_counts(a) == {"useful": 2, "noisy": 2, "unparseable": 0}
    assert [r["id"] for r in a] == sorted((r["id"] for r in a), key=int)  # original order kept
    assert {r["id"] for r in a if r["label"] == "noisy"} == {"6", "7"}
    assert balance([{"id": "0", "label": "useful"}], seed=0) == []


def test_local_judge_with_tiny_model_records_without_guessing(tmp_path, queries_file, tiny_model_dir):
    out = tmp_path / "local"
    result = runner.invoke(app, ["judge", str(queries_file), "--judge-model", str(tiny_model_dir), "--device", "cpu",
                                 "--backend", "hf", "--max-new-tokens", "4", "--limit", "4", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = read_artifact(out / "judgments.parquet", JUDGMENT).to_pylist()
    assert len(rows) == 4 and {r["judge_model"] for r in rows} == {str(tiny_model_dir)}
    for r in rows:  # every label is exactly what the strict parser reads from the raw text
        verdict, error = parse_verdict(r["judge_output"])
        assert r["label"] == {"yes": "useful", "no": "noisy", None: None}[verdict]
        assert (r["parse_ok"], r["parse_error"]) == (verdict is not None, error)
    assert "unparseable" in result.output


def test_missing_column_is_a_one_line_error(tmp_path):
    bad = tmp_path / "queries.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["Q?"]}), bad)
    result = runner.invoke(app, ["judge", str(bad), "--judge-model", "whatever", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line
    assert f"{bad}: missing column 'row_id'" in line and "collected_query" in line


def test_every_completion_says_its_whole_sampling_distribution(caplog):
    # A `vllm serve` fills any sampling field a request leaves out from the model's generation
    # config (Qwen2.5: top_p 0.8, top_k 20, repetition_penalty 1.05), so the simulator and the
    # judge would sample from a distribution they never asked for. Every request names all of
    # them. A server that, like OpenAI's own API, refuses the fields OpenAI lacks gets them
    # dropped once, with one log line, and the request still goes through.
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    from zsearch_cli.llm_client import NEUTRAL_SAMPLING, OPENAI_SAMPLING, SERVER_SAMPLING
    from zsearch_cli.retrieval.server import serving

    seen: list[dict] = []
    strict = FastAPI()
    strict.get("/health")(lambda: {"ok": True})

    @strict.post("/{kind}/completions")
    async def completions(kind: str, request: Request):
        body = await request.json()
        seen.append({"kind": kind, **body})
        if kind == "strict" and set(body) & set(SERVER_SAMPLING):
            return JSONResponse({"error": {"message": "Unrecognized request argument supplied: top_k"}},
                                status_code=400)
        return {"choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]}

    with serving(strict) as url:
        lenient = LLMClient(f"{url}/vllm/completions", "m", api="completions")
        assert lenient.complete(["a"], max_tokens=2, temperature=0.7) == ["ok"]
        assert {k: seen[0][k] for k in NEUTRAL_SAMPLING} == NEUTRAL_SAMPLING and seen[0]["temperature"] == 0.7
        assert lenient.complete_one("b", max_tokens=2, top_p=0.9)  # the caller's own value wins
        assert seen[1]["top_p"] == 0.9 and seen[1]["top_k"] == -1
        seen.clear()
        client = LLMClient(f"{url}/strict/completions", "m", api="completions", concurrency=1)
        with caplog.at_level("WARNING", logger="zsearch_cli.llm_client"):
            assert client.complete(["a", "b"], max_tokens=2, temperature=0.0) == ["ok", "ok"]
        assert len(seen) == 3  # one refusal, then each prompt once without the extra fields
        assert all({k: s[k] for k in OPENAI_SAMPLING} == OPENAI_SAMPLING for s in seen)
        assert not set(seen[1]) & set(SERVER_SAMPLING) and not set(seen[2]) & set(SERVER_SAMPLING)
        assert sum("rejects top_k/min_p/repetition_penalty" in r.message for r in caplog.records) == 1
