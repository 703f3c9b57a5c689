"""`zsearch warmup-data`: gold teacher trajectories played through the real engine, in both
action formats, and the CLI over the bundled demo data."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import QARow
from zsearch_cli.rollout.protocols import TagsProtocol, ToolCallProtocol
from zsearch_cli.artifacts import read_artifact, read_metadata
from zsearch_cli.schemas import TRAJECTORY
from zsearch_cli.commands.warmup import teacher_trajectories

from helpers import RecordingSearch


@pytest.mark.parametrize("protocol", [TagsProtocol(), ToolCallProtocol()], ids=["tags", "tool_call"])
def test_teacher_searches_the_question_then_answers_the_gold(tiny_backend, protocol):
    tok = tiny_backend.tokenizer
    question = "Which river flows through Vienna?"
    search = RecordingSearch({question: [Passage("d1", "Danube", "The Danube flows through Vienna.")]})
    rows = [QARow("q0", question, ["Danube", "the Danube"]), QARow("q1", "Who wrote Emma?", ["Jane Austen"])]
    trajs = teacher_trajectories(rows, tok, protocol, search, RolloutOptions())
    assert [t.prediction for t in trajs] == ["Danube", "Jane Austen"]
    assert [t.num_searches for t in trajs] == [1, 1] and [t.num_invalid for t in trajs] == [0, 0]
    assert [r.query for r in search.requests[0]] == [question, "Who wrote Emma?"]  # one search per row, its question
    text = trajs[0].response_text
    assert "The Danube flows through Vienna." in text and text.rstrip().endswith("<answer> Danube </answer>")
    # the loss mask covers exactly the teacher's two turns: the observation is masked out
    ids, mask = trajs[0].response_ids, trajs[0].loss_mask
    taught = tok.decode([i for i, m in zip(ids, mask) if m])
    assert "Danube flows" not in taught and taught.count("<think>") == 2 and "<answer> Danube </answer>" in taught
    if isinstance(protocol, ToolCallProtocol):
        assert json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0]) == {
            "name": "search", "arguments": {"query_list": [question]}}


def test_a_row_without_gold_is_refused(tiny_backend):
    from zsearch_cli.errors import ZsearchError

    with pytest.raises(ZsearchError, match="row 'q0': no golden answer"):
        teacher_trajectories([QARow("q0", "Q?", [])], tiny_backend.tokenizer, TagsProtocol(), RecordingSearch(),
                             RolloutOptions())


def test_warmup_data_cli_on_the_demo_split(tmp_path, tiny_model_dir):
    runner = CliRunner()
    assert runner.invoke(app, ["index", "--out", str(tmp_path / "idx"), "--kind", "bm25"]).exit_code == 0
    from zsearch_cli.data.demo import demo_qa

    out = tmp_path / "warm.parquet"
    result = runner.invoke(app, ["warmup-data", str(demo_qa("train")), "--model", str(tiny_model_dir), "--index",
                                 str(tmp_path / "idx"), "--limit", "5", "--topk", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 5 teacher trajectories (5 end in an answer)" in " ".join(result.output.split())
    trajs = read_artifact(out, TRAJECTORY).to_pylist()
    from zsearch_cli.rewards import em

    assert len(trajs) == 5 and all(em(t["prediction"], t["golden_answers"]) == 1.0 for t in trajs)
    assert read_metadata(out)["config"]["topk"] == 2
