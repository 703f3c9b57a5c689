"""Dr. Zero end to end on tiny models, CPU, offline: HRPO's hop grouping inside the one
trainer, `zsearch train --algo hrpo` refused, `zsearch solve`, `zsearch propose` training,
and one full `zsearch drzero` iteration with its lineage, no-op rerun and mid-training resume.

The random tiny model never writes ``<question>``/``<answer>``, so every proposal would fail
the integrity gate and the generated set would be empty. The module's proposer is therefore
format-warmed first with `zsearch sft` on hand-made proposer completions (a search call,
then a question and an answer not contained in it), played through the real engine so
prompts, the real tool response and the loss mask are exactly what a rollout sees.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.errors import ZsearchError
from zsearch_cli.rollout.engine import QARow
from zsearch_cli.artifacts import read_artifact, read_metadata, write_artifact
from zsearch_cli.schemas import METRICS, PROPOSED_QA, ROLLOUT, TRAJECTORY
from zsearch_cli.commands.drzero import iteration_seeds
from zsearch_cli.train.step_samples import BatchRewards

from helpers import PlayedProposer, RecordingSearch, make_trajectory

runner = CliRunner()

LOOP = ["--iterations", "1", "--proposer-steps", "2", "--solver-steps", "2", "--questions-per-iteration", "4",
        "--samples", "4", "--batch-size", "2", "--solver-batch-size", "2", "-G", "2", "--max-turns", "2",
        "--max-turn-tokens", "48", "--proposer-lr", "1e-4", "--solver-lr", "1e-4", "--save-every", "1",
        "--device", "cpu"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One intra-op thread: on a shared 2-core box a second OpenMP thread mostly spins."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _ok(args: list[str]):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def dz(tmp_path_factory) -> SimpleNamespace:
    """A BM25 index of the demo corpus and a tiny model whose BPE also learned the Dr. Zero
    prompts (proposer prompts of ~1400 tokens instead of ~2850: twice as fast)."""
    from zsearch_cli.data.demo import demo_corpus
    from zsearch_cli.models.tiny import make_tiny_model
    from zsearch_cli.prompts import DRZERO_PROPOSER_TEMPLATE, DRZERO_SOLVER_TEMPLATE, DRZERO_SYSTEM_PROMPT

    root = tmp_path_factory.mktemp("drzero")
    _ok(["index", "--out", str(root / "index"), "--kind", "bm25"])
    corpus = "\n".join(json.loads(line)["text"] for line in demo_corpus().read_text().splitlines())
    prompts = "\n".join([DRZERO_PROPOSER_TEMPLATE, DRZERO_SOLVER_TEMPLATE, DRZERO_SYSTEM_PROMPT] * 30)
    model = make_tiny_model(root / "tiny", seed=0, vocab_size=2000, corpus_text=prompts + "\n" + corpus)
    return SimpleNamespace(root=root, index=root / "index", model=model)


@pytest.fixture(scope="module")
def warm(dz) -> Path:
    """The tiny model after a short `zsearch sft` format warm-up on proposer trajectories over
    the prompts the loop below draws (iteration 1's proposer steps and generation, seed 0)."""
    from zsearch_cli.models.loading import load_tokenizer
    from zsearch_cli.retrieval.index import load_index
    from zsearch_cli.config.parts import RolloutOptions
    from zsearch_cli.rollout.engine import RolloutEngine
    from zsearch_cli.rollout.protocols import ToolCallProtocol
    from zsearch_cli.search.factory import make_search_backend
    from zsearch_cli.commands.propose import proposer_prompts

    tok = load_tokenizer(str(dz.model))
    index = load_index(dz.index)
    seeds = iteration_seeds(0, 1)
    prompts = (proposer_prompts(index, 4, "4:3:2:1", seeds["generate"])
               + [p for step in (0, 1) for p in proposer_prompts(index, 2, "4:3:2:1", seeds["propose"], step)])
    engine = RolloutEngine(PlayedProposer(tok), ToolCallProtocol(), make_search_backend("bm25", index_dir=dz.index),
                           RolloutOptions(max_turns=2, max_turn_tokens=48))
    trajs = engine.rollout([p.row(tok) for p in prompts])
    assert all(t.num_searches == 1 and "</answer>" in t.response_text for t in trajs)
    data = write_artifact([t.to_row() for t in trajs], dz.root / "warmup.parquet", TRAJECTORY)
    _ok(["sft", str(data), "--model", str(dz.model), "--out", str(dz.root / "warm"), "--device", "cpu",
         "--max-steps", "40", "--lr", "5e-3", "--batch-size", "2", "--max-length", "4096", "--eval-fraction", "0",
         "--save-every", "0", "--warmup-ratio", "0"])
    return dz.root / "warm" / "final"


# ----------------------------------------------------------------------------- HRPO in the trainer


def test_advantages_group_by_the_batch_rewards_keys_not_the_prompt():
    from zsearch_cli.algos import ALGOS, HRPOConfig
    from zsearch_cli.train.step_samples import Sample
    from zsearch_cli.train.update import advantages, step_batch

    def samples(keys: list[Any]) -> list[Sample]:
        return [Sample(make_trajectory(f"p{i}#0", response_ids=[5, 6], group_id="same-prompt"), step=1, gen_batch=0,
                       group_key=k, reward=r) for i, (k, r) in enumerate(zip(keys, [1.0, 0.0, 5.0]))]

    spec = ALGOS["hrpo"]
    adv = advantages(spec, HRPOConfig(), step_batch(samples([1, 1, 2]), pad_id=0)).advantages
    # hop 1: mean 0.5, unbiased std sqrt(0.5); hop 2 is a singleton: A = 0 (whatever its reward)
    assert [round(float(a), 4) for a in adv] == [0.7071, -0.7071, 0.0]
    # grouped by the prompt instead, all three would share one baseline: the keys decide
    same = advantages(spec, HRPOConfig(), step_batch(samples(["same-prompt"] * 3), pad_id=0)).advantages
    assert [round(float(a), 4) for a in same] != [0.7071, -0.7071, 0.0]


class _Rows:
    """A stage data source: fixed rows, a step counter as its state."""

    batch_size = 3

    def __init__(self):
        self.step = 0

    def next_batch(self) -> list[QARow]:
        self.step += 1
        return [QARow(f"r{i}", f"q{i}", [], prompt=f"Write question {i}.") for i in range(3)]

    def state(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def test_trainer_hrpo_uses_the_batch_rewards_hop_counts(tmp_path, tiny_model_dir):
    from zsearch_cli.train.config import TrainConfig
    from zsearch_cli.train.trainer import Trainer

    seen: list[dict[str, Any]] = []

    def batch_reward(trajs: list[Any], step: int) -> BatchRewards:
        seen.extend(trajs)
        return BatchRewards(rewards=[1.0, 0.0, 5.0], group_keys=[1, 1, 2],
                            metrics={"proposer/hops_1": 2.0, "proposer/hops_2": 1.0, "proposer/gate_pass": 3.0},
                            columns=[{"hops": h, "solver_k": 0} for h in (1, 1, 2)])

    cfg = TrainConfig.from_flat(algo="hrpo", model=str(tiny_model_dir), out=tmp_path / "run", steps=1, batch_size=3,
                      protocol="tool_call", max_turns=0, max_turn_tokens=4, lr=1e-3, device="cpu", save_every=0,
                      save_rollouts=True)
    with pytest.raises(ZsearchError, match="use `zsearch propose`"):
        Trainer(cfg, search=RecordingSearch(), data=_Rows())  # no stage reward: refused
    trainer = Trainer(cfg, search=RecordingSearch(), data=_Rows(), batch_reward_fn=batch_reward)
    row = trainer.train_step(1)
    (path,) = (tmp_path / "run" / "rollouts").iterdir()
    saved = read_artifact(path, ROLLOUT).to_pylist()
    assert [r["id"] for r in saved] == [t.id for t in seen]
    assert [round(r["advantage"], 4) for r in saved] == [0.7071, -0.7071, 0.0]
    assert [(r["hops"], r["solver_k"]) for r in saved] == [(1, 0), (1, 0), (2, 0)]  # the batch reward's columns
    assert row["actor/grad_norm"] > 0 and row["actor/seq_logp_mean"] is not None  # HRPO's own loss statistic
    assert (row["proposer/hops_1"], row["proposer/hops_2"], row["proposer/gate_pass"]) == (2.0, 1.0, 3.0)
    assert trainer.data.state() == {"step": 1}


def test_train_refuses_hrpo_with_one_line(tmp_path):
    result = runner.invoke(app, ["train", "--algo", "hrpo", "--out", str(tmp_path)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and text.count("error:") == 1
    assert "--algo hrpo: hrpo trains the Dr. Zero proposer" in text and "use `zsearch propose`" in text


# ----------------------------------------------------------------------------- solve / propose


def test_solve_trains_grpo_with_the_solver_preset_on_proposed_qa(tmp_path, dz):
    rows = [{"id": f"p{i}", "question": q, "golden_answers": [a], "metadata": json.dumps({"hops": 1}), "hops": 1,
             "source_id": "geo-0001", "proposer_answer": a, "solver_answers": [""] * 5, "k": 0, "n": 5,
             "difficulty": 0.0, "fmt_think": 0.125, "fmt_tool": 0.125, "fmt_question": 0.125, "fmt_answer": 0.125,
             "format_total": 0.5, "reward": 0.5}
            for i, (q, a) in enumerate([("Which river flows through Vienna?", "Danube"),
                                        ("Which sea does the Danube reach?", "Black Sea"),
                                        ("Where does the Danube rise?", "Black Forest")])]
    qa = write_artifact(rows, tmp_path / "questions.parquet", PROPOSED_QA)
    out = tmp_path / "solve"
    _ok(["solve", str(qa), "--model", str(dz.model), "--index", str(dz.index), "--steps", "2", "--batch-size", "2",
         "-G", "2", "--max-turns", "1", "--max-turn-tokens", "8", "--device", "cpu", "--out", str(out),
         "--save-rollouts"])
    config = read_metadata(out / "metrics.parquet")["config"]
    assert (config["preset"], config["algo"], config["protocol"], config["reward"], config["group_size"],
            config["lr"], config["train_data"]) == ("drzero-solver", "grpo", "tool_call", "em", 2, 1e-6, str(qa))
    assert [m["step"] for m in read_artifact(out / "metrics.parquet", METRICS).to_pylist()] == [1, 2]
    rollouts = read_artifact(out / "rollouts" / "step-000001.parquet", ROLLOUT).to_pylist()
    from zsearch_cli.models.loading import load_tokenizer

    prompt = load_tokenizer(str(dz.model)).decode(rollouts[0]["prompt_ids"])
    assert "call a search engine by <tool_call> query </tool_call>" in prompt  # Figure 6
    assert {r["golden_answers"][0] for r in rollouts} <= {"Danube", "Black Sea", "Black Forest"}
    assert (out / "final" / "model.safetensors").is_file()


def test_propose_trains_the_proposer_against_a_frozen_solver(tmp_path, dz, warm):
    out = tmp_path / "proposer"
    result = _ok(["propose", "--model", str(warm), "--solver-model", str(dz.model), "--index", str(dz.index),
                  "--steps", "2", "--batch-size", "2", "--max-turns", "2", "--max-turn-tokens", "48", "--lr", "1e-4",
                  "--seed", "1007", "--device", "cpu", "--out", str(out)])
    # Seed 1007: a draw in which the tiny warm proposer writes a question that passes the
    # format gate in step 1 (most seeds do not; 1001 did before per-sample seeds).
    line = " ".join(result.output.split())
    assert "difficulty " in line and "gate_pass " in line and "hops_1 " in line  # the batch reward's metrics
    metrics = read_artifact(out / "metrics.parquet", METRICS).to_pylist()
    assert len(metrics) == 2 and read_metadata(out / "metrics.parquet")["config"]["algo"] == "hrpo"
    assert all(sum(m[f"proposer/hops_{h}"] for h in (1, 2, 3, 4)) == 2 for m in metrics)
    assert all(m["proposer/gate_pass"] is not None and m["proposer/difficulty"] is not None for m in metrics)
    assert sum(m["proposer/gate_pass"] for m in metrics) >= 1  # the warm-up works: the solver measured some question
    assert json.loads((out / "proposer.json").read_text())["solver_model"] == str(dz.model)
    assert (out / "final" / "model.safetensors").is_file()


# ----------------------------------------------------------------------------- the loop


def test_drzero_one_iteration_lineage_and_resume(tmp_path, dz, warm):
    out = tmp_path / "loop"
    # --rollout-mode async reaches every sub-step (Dr. Zero gets the async engine like the others).
    args = ["drzero", "--model", str(warm), "--index", str(dz.index), "--out", str(out), *LOOP,
            "--eval-datasets", "demo", "--eval-limit", "2", "--rollout-mode", "async"]
    _ok(args)
    lineage = json.loads((out / "lineage.json").read_text())
    it = lineage["iterations"][0]
    assert it["seeds"] == iteration_seeds(0, 1) == {"propose": 1001, "generate": 1002, "solve": 1003}
    propose, generate, solve = it["propose"], it["generate"], it["solve"]
    assert {propose["status"], generate["status"], solve["status"], it["eval"]["status"]} == {"done"}
    # which checkpoint produced which data, which data trained which checkpoint
    assert propose["proposer_init"] == propose["solver"] == str(warm)
    assert generate["proposer"] == propose["checkpoint"] == str(out / "iter-1" / "proposer" / "final")
    assert generate["solver"] == str(warm) and solve["solver_init"] == str(warm)
    assert solve["data"] == generate["data"] == str(out / "iter-1" / "questions.parquet")
    assert lineage["current"] == {"proposer": propose["checkpoint"], "solver": solve["checkpoint"]}
    assert it["eval"]["model"] == solve["checkpoint"] and it["eval"]["results"][0]["n"] == 2
    questions = read_artifact(generate["data"], PROPOSED_QA).to_pylist()
    assert generate["questions"] == len(questions) >= 1 and sum(generate["hops"].values()) == len(questions)
    assert all(q["golden_answers"] == [q["proposer_answer"]] and q["n"] == 5 for q in questions)
    metrics = read_artifact(out / "iter-1" / "solver" / "metrics.parquet", METRICS).to_pylist()
    assert [m["step"] for m in metrics] == [1, 2]
    assert read_metadata(out / "iter-1" / "solver" / "metrics.parquet")["config"]["preset"] == "drzero-solver"
    assert len(read_artifact(out / "iter-1" / "proposer" / "metrics.parquet", METRICS)) == 2
    for run in ("solver", "proposer"):
        assert read_metadata(out / "iter-1" / run / "metrics.parquet")["config"]["rollout_mode"] == "async"
    assert read_metadata(generate["data"])["config"]["rollout_mode"] == "async"

    # The same command again: every sub-step is recorded done, so nothing runs or changes.
    before = (out / "lineage.json").read_bytes()
    result = _ok(args)
    assert "nothing to run" in result.output and (out / "lineage.json").read_bytes() == before

    # Interrupted mid-solve (after its step-1 checkpoint): the rerun resumes that training run.
    lineage["iterations"][0]["solve"]["status"] = "running"
    (out / "lineage.json").write_text(json.dumps(lineage))
    shutil.rmtree(out / "iter-1" / "solver" / "final")
    shutil.rmtree(out / "iter-1" / "solver" / "checkpoints" / "step-2")
    result = _ok(args)
    text = " ".join(result.output.split())
    assert "drzero iteration 1/1: solve" in text and "resuming from" in text and "(step 1/2)" in text
    assert "iteration 1/1: propose" not in text and "iteration 1/1: generate" not in text
    assert json.loads((out / "lineage.json").read_text())["iterations"][0]["solve"]["status"] == "done"
    assert (out / "iter-1" / "solver" / "final" / "model.safetensors").is_file()


def test_drzero_stops_with_one_line_when_no_question_passes_the_gate(tmp_path, dz):
    out = tmp_path / "loop"
    result = runner.invoke(app, ["drzero", "--model", str(dz.model), "--index", str(dz.index), "--out", str(out),
                                 *LOOP, "--proposer-steps", "1", "--samples", "1", "--questions-per-iteration", "2",
                                 "--max-turn-tokens", "8"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and text.count("error:") == 1
    assert "drzero iteration 1 generate: none of the 2 proposals passed the format gate" in text
    generate = json.loads((out / "lineage.json").read_text())["iterations"][0]["generate"]
    assert generate["status"] == "failed" and "format gate" in generate["error"]


def test_propose_with_the_solver_behind_an_openai_compatible_server(tmp_path, dz, warm):
    # The solver answers from a real loopback server that speaks like `vllm serve` (token
    # ids in and out) over the same weights. Greedy decoding makes the two paths comparable:
    # the generated set must be identical to the in-process solver's, answer for answer.
    from zsearch_cli.models.factory import load_backend
    from zsearch_cli.retrieval.server import serving

    from helpers import vllm_style_app

    server_app = vllm_style_app(load_backend(str(warm), backend="hf", device="cpu"))
    common = ["propose", "--model", str(warm), "--index", str(dz.index), "--max-turns", "2",
              "--max-turn-tokens", "48", "--device", "cpu"]
    generate = [*common, "--generate-only", "--num-questions", "4", "--samples", "1", "--seed", "1002",
                "--temperature", "0"]
    _ok([*generate, "--out", str(tmp_path / "local.parquet")])
    with serving(server_app) as url:
        _ok([*generate, "--solver-url", f"{url}/v1", "--out", str(tmp_path / "remote.parquet")])
        n_generate = len(server_app.state.seen)
        _ok([*common, "--solver-url", url, "--steps", "1", "--batch-size", "2", "--lr", "1e-4", "--seed", "1007",
             "--out", str(tmp_path / "proposer")])
    local = read_artifact(tmp_path / "local.parquet", PROPOSED_QA).to_pylist()
    remote = read_artifact(tmp_path / "remote.parquet", PROPOSED_QA).to_pylist()
    assert len(local) >= 1
    assert [(r["question"], r["solver_answers"], r["k"]) for r in remote] == [
        (r["question"], r["solver_answers"], r["k"]) for r in local]
    assert n_generate >= 5 * len(remote)  # n = 5 answers per question, at least one turn each
    assert all(isinstance(b["prompt"], list) for b in server_app.state.seen)
    assert all(b["temperature"] == 0.0 for b in server_app.state.seen[:n_generate])
    stage = json.loads((tmp_path / "proposer" / "proposer.json").read_text())
    assert stage["solver_url"] == url and stage["solver_model"] == str(warm)
    metrics = read_artifact(tmp_path / "proposer" / "metrics.parquet", METRICS).to_pylist()
    assert len(metrics) == 1 and metrics[0]["proposer/gate_pass"] is not None
    assert len(server_app.state.seen) > n_generate  # training asked the server too
