"""The whole ZeroSearch chain through the CLI on tiny models, offline:

format warm-up (`zsearch sft`) → `zsearch index` → `zsearch collect` (real BM25) →
`zsearch judge` (a real loopback OpenAI-compatible judge) → `zsearch simsft` →
`zsearch train --search sim:… --noise-*` (REINFORCE on the simulator, validated on BM25) →
`zsearch eval` (real BM25); then stages/zerosearch.sh itself with the same tiny settings.

The tiny random model never writes tags, so it first memorises a handful of hand-made
(prompt, completion) pairs in the tags format whose completion searches, then answers. The
chain then runs on exactly those questions (a 2-layer model learns the pairs, not the
skill), so the policy really searches in collect and in train: queries reach BM25 and the
simulator, and the turn logs carry the simulator's draws.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from fastapi import FastAPI, Request
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.retrieval.server import serving
from zsearch_cli.rollout.protocols import PROTOCOLS
from zsearch_cli.artifacts import read_artifact, read_metadata, write_artifact
from zsearch_cli.schemas import COLLECTED_QUERY, EVAL_EXAMPLE, EVAL_SUMMARY, JUDGMENT, METRICS, ROLLOUT, SFT_EXAMPLE
from zsearch_cli.search.curriculum import noise_probability

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]

# (id, question, golden answers, the query the warm-up teaches): questions of the bundled
# train split, so BM25 over the bundled corpus finds real passages for them.
QUESTIONS = [
    ("art-q010", "At which railway station did Leo Tolstoy die in November 1910?", ["Astapovo"], "tolstoy death"),
    ("art-q011", "Who is generally identified as the woman portrayed in the Mona Lisa?", ["Lisa Gherardini"],
     "mona lisa sitter"),
    ("art-q013", "In what year was Real Madrid founded as Madrid Football Club?", ["1902"], "real madrid founded"),
    ("art-q019", "How many stab wounds did Julius Caesar suffer when he was assassinated?", ["23"],
     "caesar stab wounds"),
]
TURN_TOKENS = "40"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread (see test_sft.py): tiny models, shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _ok(args: list[str]):
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def chain_inputs(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """The QA file, a BM25 index of the bundled corpus and the format-warmed policy."""
    root = tmp_path_factory.mktemp("zerosearch")
    qa = root / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": g}) + "\n"
                          for i, q, g, _ in QUESTIONS))
    protocol = PROTOCOLS["tags"]()
    pairs = [{"id": f"warm-{i}", "prompt": protocol.build_prompt(q),
              "completion": f"<think> I need to search. </think>\n<search> {query} </search>\n\n"
                            f"<information>Doc 1(Title: {g[0]}) {g[0]} is the answer.</information>\n\n"
                            f"<answer> {g[0]} </answer>"}
             for i, q, g, query in QUESTIONS]
    write_artifact(pairs, root / "warmup.parquet", SFT_EXAMPLE)
    _ok(["sft", str(root / "warmup.parquet"), "--model", str(tiny_model_dir), "--out", str(root / "warm"),
         "--device", "cpu", "--max-steps", "60", "--lr", "3e-3", "--batch-size", "4", "--eval-fraction", "0",
         "--lr-schedule", "constant", "--warmup-ratio", "0", "--save-every", "0"])
    _ok(["index", "--out", str(root / "index"), "--kind", "bm25"])
    return {"root": root, "qa": qa, "warm": root / "warm" / "final", "index": root / "index"}


def _fake_judge() -> FastAPI:
    """An OpenAI-compatible chat endpoint whose verdicts alternate yes, no, yes, ..."""
    app_ = FastAPI()
    verdicts = itertools.cycle(["Verdict: yes", "Verdict: no"])
    lock = threading.Lock()

    @app_.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app_.post("/v1/chat/completions")
    async def chat(request: Request):
        await request.json()
        with lock:
            text = next(verdicts)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}

    return app_


def test_zerosearch_chain_through_the_cli(chain_inputs, tiny_model_dir, tmp_path, monkeypatch):
    qa, warm, index = chain_inputs["qa"], chain_inputs["warm"], chain_inputs["index"]

    # collect: the warmed policy searches the real BM25 index
    _ok(["collect", "--data", str(qa), "--model", str(warm), "--index", str(index), "--out", str(tmp_path / "collect"),
         "--limit", "4", "-G", "2", "--max-turns", "2", "--max-turn-tokens", TURN_TOKENS, "--device", "cpu",
         "--backend", "hf"])
    queries = read_artifact(tmp_path / "collect" / "queries.parquet", COLLECTED_QUERY).to_pylist()
    taught = {query for *_, query in QUESTIONS}
    searched = [q for q in queries if q["query"] in taught]  # the warm-up's queries, really searched
    assert len(searched) >= 4 and all(len(q["documents"]) == 5 for q in searched)

    # judge: a real loopback OpenAI-compatible server
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    with serving(_fake_judge()) as url:
        _ok(["judge", str(tmp_path / "collect" / "queries.parquet"), "--judge-url", f"{url}/v1", "--judge-model",
             "fake-judge", "--concurrency", "1", "--out", str(tmp_path / "judge")])
    judged = read_artifact(tmp_path / "judge" / "judgments.parquet", JUDGMENT).to_pylist()
    assert {r["label"] for r in judged} == {"useful", "noisy"} and len(judged) == len(queries)

    # simsft: the tiny simulator learns the Table 2 format from the judged rows
    sim = tmp_path / "sim"
    _ok(["simsft", str(tmp_path / "judge" / "judgments.parquet"), "--model", str(tiny_model_dir), "--out", str(sim),
         "--device", "cpu", "--max-steps", "2", "--batch-size", "4", "--eval-fraction", "0", "--lr", "1e-4",
         "--save-every", "0"])
    assert (sim / "final" / "model.safetensors").is_file()

    # train: REINFORCE on the simulator with curriculum noise 0 -> 0.5, validated on real BM25
    run = tmp_path / "train"
    result = _ok(["train", "--algo", "reinforce", "--model", str(warm), "--train-data", str(qa),
                  "--search", f"sim:{sim / 'final'}?max_tokens=16&device=cpu", "--noise-start", "0",
                  "--noise-end", "0.5", "--steps", "2", "--batch-size", "2", "-G", "2", "--topk", "5",
                  "--max-turns", "2", "--max-turn-tokens", TURN_TOKENS, "--reward", "f1", "--device", "cpu",
                  "--index", str(index), "--out", str(run), "--save-rollouts", "--save-every", "0",
                  "--val-data", str(qa), "--val-limit", "2", "--val-every", "1"])
    metrics = read_artifact(run / "metrics.parquet", METRICS).to_pylist()
    assert [m["search/noise_p"] for m in metrics] == pytest.approx([noise_probability(t, 2, 0.0, 0.5) for t in (0, 1)])
    assert metrics[1]["search/noise_p"] == pytest.approx(0.5 / 3)  # (4^{1/2} - 1)/(4 - 1) * 0.5
    assert all(m["val/em"] is not None and 0 <= m["val/f1"] <= 1 for m in metrics)
    assert "noise_p 0.167" in " ".join(result.output.split())
    config = read_metadata(run / "metrics.parquet")["config"]
    assert (config["noise_start"], config["noise_end"], config["noise_base"]) == (0.0, 0.5, None)
    calls = []
    for step in (1, 2):  # 1-based, as the console and the checkpoints; eq. 1's t is the steps done before
        for t in read_artifact(run / "rollouts" / f"step-{step:06d}.parquet", ROLLOUT).to_pylist():
            for turn in json.loads(t["turns"]):
                calls += [(step, c) for c in turn.get("search_log", [])]
    assert any(not c["cache_hit"] for _, c in calls), "the warmed policy should search the simulator"
    for step, c in calls:
        assert c["p"] == pytest.approx(noise_probability(step - 1, 2, 0.0, 0.5)) and c["t"] == step - 1
        assert c["quality"] in ("useful", "noisy") and (c["cache_hit"] or isinstance(c["raw"], str))
        assert (c["quality"] == "noisy") == (c["u"] < c["p"])
    val = read_artifact(run / "val" / "step-000002.examples.parquet", EVAL_EXAMPLE).to_pylist()
    assert [v["id"] for v in val] == ["art-q010", "art-q011"]
    assert metrics[1]["val/f1"] == pytest.approx(sum(v["f1"] for v in val) / 2)
    val_docs = [d for v in val for turn in json.loads(v["turn_log"]) for docs in turn.get("docs", []) for d in docs]
    assert val_docs and not any(d["id"].startswith("sim-") for d in val_docs)  # validation searched BM25

    # eval: the trained policy against the real engine
    _ok(["eval", "--model", str(run / "final"), "--search", "bm25", "--index", str(index), "--datasets", str(qa),
         "--limit", "2", "--max-turns", "2", "--max-turn-tokens", TURN_TOKENS, "--device", "cpu",
         "--out", str(tmp_path / "eval")])
    (found,) = (tmp_path / "eval").rglob("agent.summary.parquet")  # OUT/<dataset key: the QA file's path>/
    summary = read_artifact(found, EVAL_SUMMARY).to_pylist()[0]
    assert summary["n"] == 2 and summary["avg_searches"] > 0


def test_zerosearch_recipe_script_runs(chain_inputs, tiny_model_dir, tmp_path):
    """stages/zerosearch.sh with tiny settings: every step is a fresh `zsearch` process."""
    out = tmp_path / "recipe"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OUT": str(out), "INDEX": str(chain_inputs["index"]), "MODEL": str(chain_inputs["warm"]),
           "SIM_MODEL": str(tiny_model_dir), "JUDGE_MODEL": "fake-judge", "OPENAI_API_KEY": "sk-test",
           "COLLECT_DATA": str(chain_inputs["qa"]), "TRAIN_DATA": str(chain_inputs["qa"]),
           "DATASETS": str(chain_inputs["qa"]), "COLLECT_LIMIT": "4", "SAMPLES": "2", "SIM_STEPS": "1",
           "SIM_MAX_TOKENS": "16", "STEPS": "1", "BATCH": "2", "GROUP": "2", "MAX_TURNS": "1",
           "TURN_TOKENS": TURN_TOKENS, "LORA_R": "0", "DEVICE": "cpu", "EVAL_LIMIT": "1", "OMP_NUM_THREADS": "1",
           "VAL_DATA": str(chain_inputs["qa"]), "VAL_LIMIT": "1"}
    with serving(_fake_judge()) as url:
        env["JUDGE_URL"] = f"{url}/v1"
        proc = subprocess.run(["bash", str(REPO / "stages" / "zerosearch.sh")], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "== done" in proc.stdout
    metrics = read_artifact(out / "train" / "metrics.parquet", METRICS).to_pylist()
    assert metrics[0]["search/noise_p"] == 0.0 and metrics[0]["val/em"] is not None
    assert read_metadata(out / "train" / "metrics.parquet")["config"]["preset"] == "zerosearch"
    (found,) = (out / "eval").rglob("agent.summary.parquet")  # OUT/<dataset key: the QA file's path>/
    assert read_artifact(found, EVAL_SUMMARY).to_pylist()[0]["n"] == 1
    assert (out / "train" / "curves.png").is_file()


def test_zerosearch_recipe_stops_when_collect_found_no_query(chain_inputs, tiny_model_dir, tmp_path):
    """Issue 23.7: a policy that never searches leaves queries.parquet empty; the recipe stops
    there with one line saying why, instead of judging nothing."""
    out = tmp_path / "recipe"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OUT": str(out), "INDEX": str(chain_inputs["index"]), "MODEL": str(tiny_model_dir),
           "SIM_MODEL": str(tiny_model_dir), "COLLECT_DATA": str(chain_inputs["qa"]), "COLLECT_LIMIT": "2",
           "SAMPLES": "1", "MAX_TURNS": "1", "TURN_TOKENS": "4", "DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(REPO / "stages" / "zerosearch.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "queries.parquet holds no query" in proc.stderr and "== 3." not in proc.stdout
