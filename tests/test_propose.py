"""Dr. Zero proposer side: seeded hop draws, seed passages, and the difficulty reward
measured by real (scripted-policy) solver rollouts through the engine."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import RolloutEngine
from zsearch_cli.rollout.protocols import ToolCallProtocol
from zsearch_cli.commands.propose import (
    ProposerPrompt,
    best_of,
    draw_hops,
    parse_hop_ratio,
    qa_rows,
    sample_seed_rows,
    score_proposals,
)

from helpers import RecordingSearch, ScriptedBackend, make_trajectory


def test_hop_draw_is_seeded_and_follows_the_ratio():
    assert draw_hops(50, "4:3:2:1", seed=3) == draw_hops(50, "4:3:2:1", seed=3)
    assert draw_hops(50, "4:3:2:1", seed=3) != draw_hops(50, "4:3:2:1", seed=4)
    counts = Counter(draw_hops(20_000, "4:3:2:1", seed=0))
    # expected shares 0.4, 0.3, 0.2, 0.1; the binomial sd at n=20000 is <= 0.0035
    for hop, share in zip((1, 2, 3, 4), (0.4, 0.3, 0.2, 0.1)):
        assert counts[hop] / 20_000 == pytest.approx(share, abs=0.015)
    assert set(draw_hops(100, "0:1:0:0", seed=1)) == {2}
    with pytest.raises(ZsearchError, match="expected four"):
        parse_hop_ratio("4:3:2")


def test_seed_rows_are_seeded_per_step_and_distinct():
    a, b = sample_seed_rows(500, 16, seed=1, step=0), sample_seed_rows(500, 16, seed=1, step=1)
    assert a == sample_seed_rows(500, 16, seed=1, step=0) and a != b
    assert len(set(a)) == 16


PROPOSAL = ('<think>The Danube passes Vienna.</think>\n<tool_call> {"name": "search", "arguments": '
            '{"query_list": ["Danube capitals"]}} </tool_call>')
FINAL = "<think>Two hops.</think>\n<question>Which river flows through the capital of Austria?</question>\n<answer> Danube </answer>"
LEAKY = "<think>x</think>\n<question>Is the Danube long?</question>\n<answer> Danube </answer>"


def test_difficulty_reward_from_solver_rollouts(tiny_backend):
    tok = tiny_backend.tokenizer
    src = Passage("geo-0001", "Danube", "The Danube flows through Vienna.")
    prompts = [ProposerPrompt("p0", 2, src), ProposerPrompt("p1", 1, Passage("geo-0002", "Volga", "A long river."))]
    question = "Which river flows through the capital of Austria?"
    proposer = RolloutEngine(
        ScriptedBackend(tok, {'Title: "Danube"': [PROPOSAL, FINAL], 'Title: "Volga"': [LEAKY]}),
        ToolCallProtocol(), RecordingSearch(), RolloutOptions(max_turns=3))
    trajs = proposer.rollout([p.row(tok) for p in prompts])
    # the solver answers 5 times: 2 correct -> k = 2 -> difficulty (5-2)/(5-1) = 0.75
    answers = ["<answer> Danube </answer>", "<answer> Rhine </answer>", "<answer> the Danube </answer>",
               "<answer> Elbe </answer>", "no tag at all"]
    solver = RolloutEngine(ScriptedBackend(tok, {question: answers}), ToolCallProtocol(), RecordingSearch(),
                           RolloutOptions(max_turns=0))
    scored = score_proposals(trajs, prompts, solver, n_solver=5)
    good, leaky = scored
    assert good["k"] == 2 and good["solver_answers"][4] == ""
    fmt = good["fmt"]
    # think 0.125 (both turns open with <think>), tool 0.125 (1 valid search for 2 hops),
    # question 0.125, answer 0.125 -> r_f = 0.5; r = 0.75 + 0.5
    assert fmt["total"] == pytest.approx(0.5) and good["reward"] == pytest.approx(1.25)
    # the answer appears in the question: the integrity gate zeroes it, and no solver ran for it
    assert leaky["reward"] == 0.0 and leaky["solver_answers"] == []
    rows = qa_rows(scored, prompts, 5)
    assert [r["id"] for r in rows] == ["p0"]
    assert rows[0]["golden_answers"] == ["Danube"] and rows[0]["difficulty"] == pytest.approx(0.75)
    assert json.loads(rows[0]["metadata"]) == {"hops": 2, "source_id": "geo-0001"}


def test_best_of_prefers_the_gate_then_the_format_score(tiny_backend):
    src = Passage("d", "T", "text")
    prompt = ProposerPrompt("p", 1, src)
    # One-turn trajectories as the engine records them: the model's own text in the turns log.
    trajs = [make_trajectory(f"p#{i}", response_text=r, turns=[{"text": r}]) for i, r in enumerate((LEAKY, FINAL, "nothing"))]
    assert best_of(trajs, [prompt], 3)[0].response_text == FINAL


def test_generate_only_cli_reports_when_nothing_passes_the_gate(tmp_path, tiny_model_dir):
    # The random tiny model never writes <question>/<answer>: a one-line error, exit 2.
    from typer.testing import CliRunner

    from zsearch_cli.cli import app

    runner = CliRunner()
    assert runner.invoke(app, ["index", "--out", str(tmp_path / "idx")]).exit_code == 0
    result = runner.invoke(app, ["propose", "--generate-only", "--model", str(tiny_model_dir), "--index",
                                 str(tmp_path / "idx"), "--num-questions", "2", "--samples", "1",
                                 "--max-turn-tokens", "6", "--max-turns", "1", "--device", "cpu",
                                 "--out", str(tmp_path / "q.parquet")])
    assert result.exit_code == 2 and "none of the 2 proposals passed the format gate" in result.output
    assert not (tmp_path / "q.parquet").exists()
