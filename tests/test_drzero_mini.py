"""stages/drzero-mini.sh (issue 38): the report's goals, the two options real text asked for
(--solver-protocol, --proposer-prompt short), and the recipe end to end on a tiny model with
smollm2's real tokenizer, where a difficulty reward with its sign flipped must fail the band
goal. The measured run on smollm2-warm is the README's (docs/drzero-mini.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zsearch_cli.errors import ZsearchError
from zsearch_cli.artifacts import write_artifact
from zsearch_cli.schemas import METRICS, PROPOSED_QA
from zsearch_cli.train.drzero_mini import main, report, table

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {"corpus_fingerprint": "c0", "retriever": "bm25", "topk": 3, "max_turns": 1, "max_turn_tokens": 128,
            "max_obs_tokens": 500, "prompt": "tags/agent:abc", "decoding": "greedy", "dataset_fingerprint": "d0",
            "limit": None}


# ----------------------------------------------------------------------------- the report


def _summary(folder: Path, em: float, n: int = 72, **changes: Any) -> None:
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([{"dataset": "demo", "method": "agent", "model": "m", "n": n, "em": em,
                                          **SETTINGS, **changes}]), folder / "agent.summary.parquet")


def _run(out: Path, ks: list[list[int]], prompts: list[int], em: list[float], n: int = 5) -> Path:
    """A finished recipe folder: per iteration, the generated questions' solver k (one per
    question), the prompts they came from, two HRPO steps of metrics, and held-out EM
    (``em[0]`` before the loop, ``em[i]`` after iteration i)."""
    its = []
    _summary(out / "eval-heldout-before" / "demo", em[0])
    for i, (k_list, p) in enumerate(zip(ks, prompts), 1):
        d = out / f"iter-{i}"
        (d / "proposer").mkdir(parents=True)
        rows = [{"id": f"q{i}-{j}", "question": f"question {j}?", "golden_answers": ["a"], "metadata": "{}", "hops": 1,
                 "source_id": "doc", "proposer_answer": "a", "solver_answers": ["a"] * k, "k": k, "n": n,
                 "difficulty": (n - k) / (n - 1) if 0 < k < n else 0.0, "fmt_think": 0.0, "fmt_tool": 0.125,
                 "fmt_question": 0.125, "fmt_answer": 0.125, "format_total": 0.375, "reward": 0.0}
                for j, k in enumerate(k_list)]
        write_artifact(rows, d / "questions.parquet", PROPOSED_QA)
        write_artifact([{"step": s, "proposer/difficulty": 0.1 * i + 0.1 * s, "proposer/gate_pass": 6.0}
                        for s in (1, 2)], d / "proposer" / "metrics.parquet", METRICS)
        _summary(d / "eval" / "demo", em[i])
        its.append({"iteration": i, "propose": {"status": "done", "run_dir": str(d / "proposer")},
                    "generate": {"status": "done", "prompts": p, "questions": len(k_list), "data": str(d / "questions.parquet")},
                    "eval": {"status": "done", "out": str(d / "eval"),
                             "results": [{"dataset": "demo", "n": 72, "em": em[i], "f1": em[i], "subem": em[i]}]}})
    (out / "lineage.json").write_text(json.dumps({"options": {"batch_size": 8, "solver_samples": n}, "iterations": its}))
    return out


# Iteration 1: 8 questions of 10 prompts, k = 0 0 0 0 5 5 2 3 (2 of 8 in the band); iteration 2:
# 9 of 10, k = 0 0 1 2 4 5 3 3 0 (5 of 9). Held-out 22/72 -> 22/72 -> 23/72.
K1, K2 = [0, 0, 0, 0, 5, 5, 2, 3], [0, 0, 1, 2, 4, 5, 3, 3, 0]


def test_report_measures_each_iteration_and_checks_each_goal(tmp_path):
    s = report(_run(tmp_path / "ok", [K1, K2], [10, 10], [22 / 72, 22 / 72, 23 / 72]), wall_s=3000)
    first, second = s["iterations"]
    assert (first["parse"], second["parse"]) == (0.8, 0.9)
    assert first["k_hist"] == [4, 0, 1, 1, 0, 2] and second["k_hist"] == [3, 1, 1, 2, 1, 1]
    assert first["band"] == pytest.approx(2 / 8) and second["band"] == pytest.approx(5 / 9)
    assert first["pass_rate"] == pytest.approx(15 / 40)
    assert first["difficulty"] == pytest.approx((0.75 + 0.5) / 8)
    assert first["train_difficulty"] == pytest.approx(0.25) and first["train_parse"] == pytest.approx(0.75)
    assert s["em_change_questions"] == 1 and all(s["goals"].values()), s["goals"]
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["goals"] == s["goals"]
    text = table(s)
    assert "| share in the reward's band 0 < k < n | – | 0.250 | 0.556 |" in text
    assert "| greedy EM, held-out human questions | 0.306 (22/72) | 0.306 (22/72) | 0.319 (23/72) |" in text
    assert "(+1 of 72 questions)" in text and "within the 60-minute budget" in text
    assert (tmp_path / "ok" / "iterations.md").read_text().startswith("| measure | before | iteration 1 | iteration 2 |")

    # each goal missed on its own: the band share falls, iteration 1 parses 0.7, one question lost
    bad = report(_run(tmp_path / "band", [K2, K1], [10, 10], [0.3, 0.3, 0.3]), wall_s=1)["goals"]
    assert list(bad.values()) == [False, True, True]
    bad = report(_run(tmp_path / "parse", [K1[:7], K2], [10, 10], [0.3, 0.3, 0.3]), wall_s=1)["goals"]
    assert list(bad.values()) == [True, False, True]
    bad = report(_run(tmp_path / "em", [K1, K2], [10, 10], [22 / 72, 23 / 72, 21 / 72]), wall_s=1)["goals"]
    assert list(bad.values()) == [True, True, False]
    assert main(["report", str(tmp_path / "em"), "--wall-s", "1", "--strict"]) == 1
    assert main(["report", str(tmp_path / "em"), "--wall-s", "1"]) == 0
    # over the time budget: reported, never failed (issue 36.11)
    assert main(["report", str(tmp_path / "ok"), "--wall-s", "3700", "--strict"]) == 0
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["within_time_budget"] is False


def test_report_refuses_an_unfinished_run_or_evals_that_differ(tmp_path, capsys):
    out = _run(tmp_path / "one", [K1], [10], [0.3, 0.3])
    with pytest.raises(ZsearchError, match="1 of 2 iterations finished with their eval; rerun the recipe to resume"):
        report(out, wall_s=1)
    assert main(["report", str(out), "--wall-s", "1", "--strict"]) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line
    out = _run(tmp_path / "differ", [K1, K2], [10, 10], [0.3, 0.3, 0.3])
    pq.write_table(pa.Table.from_pylist([{"dataset": "demo", "method": "agent", "model": "m", "n": 72, "em": 0.3,
                                          **SETTINGS, "max_obs_tokens": 512}]),
                   out / "iter-2" / "eval" / "demo" / "agent.summary.parquet")
    with pytest.raises(ZsearchError, match="differ in max_obs_tokens 500 vs 512"):
        report(out, wall_s=1)


# ----------------------------------------------------------------------------- the options real text asked for


def test_the_short_prompt_is_one_hop_only_and_refused_otherwise_in_one_line(tmp_path, demo_index):
    from typer.testing import CliRunner

    from zsearch_cli.cli import app
    from zsearch_cli.commands.propose import check_proposer_prompt
    from zsearch_cli.prompts import render_proposer_prompt

    text = render_proposer_prompt(1, '(Title: "Danube")\nThe Danube rises in the Black Forest.\n', "short")
    assert text.endswith('Document: (Title: "Danube")\nThe Danube rises in the Black Forest.\n')
    assert "<question> your question </question>\n<answer> your answer </answer>" in text and len(text) < 1000
    assert render_proposer_prompt(2, "doc") == render_proposer_prompt(2, "doc", "figure5")  # the paper's by default
    check_proposer_prompt("short", "1:0:0:0")
    check_proposer_prompt("figure5", "4:3:2:1")
    with pytest.raises(ZsearchError, match="1-hop questions only; pass --hop-ratio 1:0:0:0, not '4:3:2:1'"):
        check_proposer_prompt("short", "4:3:2:1")
    # refused before any model loads (no such model exists)
    result = CliRunner().invoke(app, ["drzero", "--model", "no/such-model", "--index", str(demo_index), "--out",
                                      str(tmp_path / "dz"), "--proposer-prompt", "short"])
    assert result.exit_code == 2 and "1-hop questions only" in " ".join(result.output.split())


def test_the_solver_protocol_reaches_every_solver_of_the_loop(tmp_path, monkeypatch):
    """Propose's frozen solver, generate's, the solve step and the eval step all speak
    --solver-protocol; the proposer keeps Figure 5's tool calls."""
    import zsearch_cli.commands.evaluate as evaluate
    import zsearch_cli.commands.propose_train as propose_train
    import zsearch_cli.train.trainer as trainer
    from zsearch_cli.commands.drzero import DrZeroOptions, Loop

    seen: dict[str, Any] = {}
    monkeypatch.setattr(trainer, "run_training", lambda cfg, **kw: seen.setdefault("solve", cfg))
    monkeypatch.setattr(propose_train, "train_proposer", lambda cfg, **kw: seen.setdefault("propose", (cfg, kw)))
    monkeypatch.setattr(evaluate, "evaluate", lambda opts, config: seen.setdefault("eval", opts) and [])
    loop = Loop(DrZeroOptions.from_flat(out=tmp_path / "dz", solver_protocol="tags", eval_datasets="demo"), {})
    loop.propose({"checkpoint": str(tmp_path / "p" / "final"), "run_dir": str(tmp_path / "p"), "proposer_init": "P",
                  "solver": "S", "seed": 1})
    loop.solve({"checkpoint": str(tmp_path / "s" / "final"), "run_dir": str(tmp_path / "s"), "solver_init": "S",
                "data": "q.parquet", "batch_size": 2, "seed": 3})
    loop.evaluate({"out": str(tmp_path / "e"), "model": "S", "label": "iter-1/eval"})
    cfg, kw = seen["propose"]
    assert cfg.rollout.protocol == "tool_call" and kw["solver_protocol"] == "tags"
    assert seen["solve"].rollout.protocol == "tags" and seen["eval"].rollout.protocol == "tags"


def test_the_grounded_answer_part_pays_only_an_answer_the_proposer_saw():
    """--answer-reward grounded (Dr. Zero's code's rule): real smollm2 proposals copied the short
    prompt's example ("Which Danish architect designed the Sydney Opera House?" / "Jorn Utzon"),
    which the paper's "extractable" pays in full; grounded pays it nothing, an answer from the
    passage or a tool response in full, one of 6-10 words half."""
    from helpers import make_trajectory

    from zsearch_cli.commands.propose import ProposerPrompt, evidence, format_reward
    from zsearch_cli.retrieval.base import Passage
    from zsearch_cli.rewards import answer_grounding

    passage = "The telephone was patented by Alexander Graham Bell in 1876 in Boston."
    assert answer_grounding("Alexander Graham Bell", passage) == 1.0
    assert answer_grounding("the 1876", passage) == 1.0  # normalised: articles and case go
    assert answer_grounding("Jorn Utzon", passage) == 0.0 and answer_grounding("", passage) == 0.0
    assert answer_grounding("Bell", "Bellini painted it.") == 0.0  # whole words, as the gate
    assert answer_grounding("patented by Alexander Graham Bell in 1876", passage) == 0.5
    assert answer_grounding(passage, passage + " " + passage) == 0.0  # 12 words: not concise

    copy = ("<question> Which Danish architect designed the Sydney Opera House? </question>\n"
            "<answer> Jorn Utzon </answer>")
    own = "<question> Who patented the telephone in 1876? </question>\n<answer> Alexander Graham Bell </answer>"
    prompt = ProposerPrompt("p0", 1, Passage("sci-0001", "Telephone", passage), "short")
    for text, grounded in ((copy, 0.0), (own, 0.125)):
        traj = make_trajectory("p0#0", turns=[{"text": text}], response_text=text)
        assert format_reward(traj, prompt)["answer"] == 0.125  # the paper's rule pays both
        fmt = format_reward(traj, prompt, "grounded")
        assert fmt["answer"] == grounded and fmt["integrity"]  # the gate is the same
    # the proposer's own <answer> is no evidence; an inserted tool response is
    searched = ('<tool_call> {"name": "search", "arguments": {"query_list": ["opera"]}} </tool_call>', copy)
    response = searched[0] + '\n<tool_response>\n{"result": "Jorn Utzon designed it."}\n</tool_response>\n' + copy
    traj = make_trajectory("p0#0", turns=[{"text": t} for t in searched], response_text=response)
    assert "Jorn Utzon designed it" in evidence(traj, prompt) and "Sydney" not in evidence(traj, prompt)
    assert format_reward(traj, prompt, "grounded")["answer"] == 0.125
    with pytest.raises(ZsearchError, match="unknown --answer-reward 'x'"):
        format_reward(traj, prompt, "x")


def test_the_generate_step_scores_with_the_solver_protocol(tiny_model_dir, demo_index):
    from zsearch_cli.commands.propose import make_engines
    from zsearch_cli.config.commands import GenerateOptions

    opts = GenerateOptions.from_flat(model=str(tiny_model_dir), device="cpu", index=demo_index, solver_protocol="tags")
    proposer, solver, _ = make_engines(opts)
    assert (proposer.protocol.name, solver.protocol.name) == ("tool_call", "tags")
    assert solver.backend is proposer.backend  # the same model: one copy of the weights


# ----------------------------------------------------------------------------- the recipe, end to end

TOY_QUESTION = "What colour is it?"
PROPOSER_ANSWERS = ("red", "green", "red", "green")
"""The warmed toy proposer asks for red in half of its proposals, else for green: room to move
either way, so a flipped reward shows as a fall, not as noise near 0."""
SOLVER_ANSWERS = ("red", "blue")
"""The warmed toy solver answers red half the time, else blue."""


def warm_toy_model(root: Path, index: Path, steps: int = 30, seed: int = 0) -> Path:
    """A random tiny Llama with smollm2's real tokenizer and chat template, taught the toy by
    a short SFT of its own on the proposer prompts of ``index`` (the toy corpus, whose
    passages differ in a few tokens, so 6 prompts teach the format for every other); returns
    its folder.

    As proposer (the short prompt, the tool-call protocol) it writes ``<question> What colour
    is it? </question>`` then ``<answer> red </answer>`` half of the time, else green; as
    solver (the tags protocol) ``<answer> red </answer>`` or ``<answer> blue </answer>``, half
    and half. So a question whose answer is red is answered right k ~ Binomial(5, 1/2) times,
    in the reward's band with probability 30/32, and one whose answer is green never (k = 0,
    out of the band): the difficulty reward's only lever is the proposer's answer word, and
    HRPO must move it towards red, the band share rising with it. With the reward's sign
    flipped HRPO moves it towards green and the share falls.

    The SFT runs in-process with the LM head at the response positions only: ``zsearch sft``
    runs the 49k-wide head over all ~400 prompt positions, about 20 s a step here. Its loss
    ends at the floor the two coin flips leave (~0.036 a token); sampled at temperature 1 the
    warmed model wrote 16 of 16 clean proposals (5 red) and 16 clean answers (7 red)."""
    import torch
    from transformers import AutoModelForCausalLM

    from zsearch_cli.commands.propose import proposer_prompts
    from zsearch_cli.config.parts import RolloutOptions
    from zsearch_cli.models.base import GenerationOutput
    from zsearch_cli.models.tiny import make_tiny_model_with_tokenizer, smollm2_tokenizer
    from zsearch_cli.retrieval.index import load_index
    from zsearch_cli.rollout.engine import QARow, RolloutEngine
    from zsearch_cli.rollout.protocols import TagsProtocol, ToolCallProtocol

    class Played:
        """Plays the given texts in order, so the prompts are exactly the engine's."""

        def __init__(self, tokenizer: Any, texts: list[str]):
            self.tokenizer, self.texts = tokenizer, texts

        def generate(self, prompts, params, stop=()):
            ids = [self.tokenizer.encode(self.texts.pop(0), add_special_tokens=False) for _ in prompts]
            return [GenerationOutput(i, [0.0] * len(i), "stop", stop_string="</answer>") for i in ids]

    tok = smollm2_tokenizer()
    path = make_tiny_model_with_tokenizer(root / "tiny", tok, seed=seed)
    options = RolloutOptions(max_turns=1, max_turn_tokens=32)
    prompts = [p.row(tok) for p in proposer_prompts(load_index(index), 6, "1:0:0:0", seed + 99, style="short")]
    rows = [p for p in prompts for _ in PROPOSER_ANSWERS]
    texts = [f"<question> {TOY_QUESTION} </question>\n<answer> {a} </answer>" for _ in prompts for a in PROPOSER_ANSWERS]
    trajs = RolloutEngine(Played(tok, texts), ToolCallProtocol(), None, options).rollout(rows)
    answers = [a for a in SOLVER_ANSWERS for _ in range(2)]
    trajs += RolloutEngine(Played(tok, [f"<answer> {a} </answer>" for a in answers]), TagsProtocol(), None, options
                           ).rollout([QARow(f"s{i}", TOY_QUESTION, ["red"]) for i in range(len(answers))])

    seqs = [list(t.prompt_ids) + list(t.response_ids) for t in trajs]
    ids = torch.full((len(seqs), max(map(len, seqs))), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    at: list[tuple[int, int, int]] = []  # (row, position predicting, target id) of every response token
    for i, (t, s) in enumerate(zip(trajs, seqs)):
        ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
        at += [(i, j - 1, s[j]) for j in range(len(t.prompt_ids), len(s))]
    row, pos, target = (torch.tensor(c) for c in zip(*at))
    model = AutoModelForCausalLM.from_pretrained(path)
    opt = torch.optim.Adam(model.parameters(), lr=2e-2)
    for _ in range(steps):
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[row, pos]), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(root / "warm")
    tok.save_pretrained(root / "warm")
    return root / "warm"


FLIP = """# planted by tests/test_drzero_mini.py: Dr. Zero's difficulty reward with its sign flipped
import zsearch_cli.rewards as rewards

_eq4 = rewards.difficulty_reward


def difficulty_reward(k, n):
    return -_eq4(k, n)


rewards.difficulty_reward = difficulty_reward
"""
"""Loaded by every Python process of the recipe (``sitecustomize`` on PYTHONPATH): the proposer
reward, its metrics and the generated set's difficulty all go through the flipped function."""

TINY = {"PROPOSER_STEPS": "2", "BATCH": "16", "PROPOSER_LR": "2e-3", "QUESTIONS": "48", "SAMPLES": "1",
        "SOLVER_STEPS": "1", "SOLVER_BATCH": "2", "GROUP": "2", "SOLVER_LR": "1e-6", "LORA_R": "8",
        "TURN_TOKENS": "24", "OBS_TOKENS": "64", "TOPK": "1", "DEVICE": "cpu", "OMP_NUM_THREADS": "1"}
"""The recipe at CI size. The solver barely moves (lr 1e-6): the toy measures the proposer. Sized so
neither run saturates by iteration 1 (at lr 1e-2 the shipped proposer asked for red only by then,
and the flipped one's share, near 0, went up or down by chance), with 48 questions a set."""


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from types import SimpleNamespace

    from typer.testing import CliRunner

    from zsearch_cli.cli import app

    root = tmp_path_factory.mktemp("drzero_mini")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"toy-{i:02d}", "title": f"Toy {i}", "text": f"Toy {i} is a small thing."})
                              + "\n" for i in range(24)))
    result = CliRunner().invoke(app, ["index", str(corpus), "--out", str(root / "index"), "--kind", "bm25"])
    assert result.exit_code == 0, result.output
    heldout = root / "heldout.jsonl"  # two human questions of the bundled test split
    heldout.write_text("".join((REPO / "src/zsearch_cli/data/demo/test.jsonl").read_text().splitlines(keepends=True)[:2]))
    return SimpleNamespace(index=root / "index", heldout=heldout, model=warm_toy_model(root, root / "index"))


def test_the_recipe_meets_its_goals_on_the_toy_and_misses_the_band_with_the_reward_flipped(toy, tmp_path):
    """stages/drzero-mini.sh twice, every step a fresh process: as shipped, and with
    the difficulty reward's sign flipped in every process. As shipped HRPO moves the proposer
    towards red (in the band) and every goal is met; flipped, towards green (k = 0), and the
    strict report exits 1 naming the band goal alone. Measured (seed 0): the band share 0.625 ->
    0.729 as shipped, 0.479 -> 0.333 flipped (of 48 questions each); ~35 s each on the idle
    2-core box."""
    flip = tmp_path / "flip"
    flip.mkdir()
    (flip / "sitecustomize.py").write_text(FLIP)
    env = {**os.environ, **TINY, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "INDEX": str(toy.index), "MODEL": str(toy.model), "HELDOUT": str(toy.heldout), "PYTHON": sys.executable}
    env.pop("PYTHONPATH", None)
    # one after the other: under make test both cores are busy anyway, and two more processes
    # at once only made each slower (more CPU for the same work)
    runs = {}
    for name, more in (("shipped", {}), ("flipped", {"PYTHONPATH": str(flip)})):
        if name == "flipped":  # the model and eval settings are the shipped run's: its before-eval is reused
            shutil.copytree(tmp_path / "shipped" / "eval-heldout-before", tmp_path / name / "eval-heldout-before")
        runs[name] = subprocess.run(["bash", str(REPO / "stages" / "drzero-mini.sh")], cwd=tmp_path, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600,
                                    env={**env, "OUT": str(tmp_path / name), **more})
    out = {name: proc.stdout for name, proc in runs.items()}
    code = {name: proc.returncode for name, proc in runs.items()}

    assert code["shipped"] == 0, out["shipped"][-3000:]
    assert "drzero-mini check: every goal met" in out["shipped"]
    s = json.loads((tmp_path / "shipped" / "summary.json").read_text())
    assert s["band_last"] > s["band_first"] and all(r["parse"] >= 0.8 for r in s["iterations"])
    lineage = json.loads((tmp_path / "shipped" / "lineage.json").read_text())
    assert [it["eval"]["status"] for it in lineage["iterations"]] == ["done", "done"]
    assert lineage["options"]["solver_protocol"] == "tags" and lineage["options"]["proposer_prompt"] == "short"
    assert (tmp_path / "shipped" / "iterations.md").is_file() and float((tmp_path / "shipped" / "wall_s").read_text()) > 0
    assert "== 3.2 Dr. Zero iteration 2 of 2" in (tmp_path / "shipped" / "recipe.log").read_text()

    assert code["flipped"] == 1, out["flipped"][-3000:]
    assert ("drzero-mini check: MISSED: the share of proposed questions in the reward's band rises from "
            "iteration 1 to 2\n") in out["flipped"]
    assert "2 examples already scored, 0 to go" in out["flipped"]  # the copied before-eval was reused
    flipped = json.loads((tmp_path / "flipped" / "summary.json").read_text())
    assert flipped["iterations"][0]["train_difficulty"] < 0  # the plant took: the reward itself was negative

    # The same command again resumes: every sub-step is done, nothing trains, the report is the same.
    again = subprocess.run(["bash", str(REPO / "stages" / "drzero-mini.sh")], cwd=tmp_path, text=True,
                           capture_output=True, env={**env, "OUT": str(tmp_path / "shipped")}, timeout=300)
    assert again.returncode == 0 and again.stdout.count("already done") == 2, again.stdout[-3000:]
    assert json.loads((tmp_path / "shipped" / "summary.json").read_text())["iterations"] == s["iterations"]
