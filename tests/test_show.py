"""`zsearch show`: trajectories from eval and rollout Parquet files, rendered turn by turn,
with --id, --where and --limit; bad files are one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.artifacts import write_artifact
from zsearch_cli.schemas import EVAL_EXAMPLE

runner = CliRunner()


def _example(i: int, prediction: str | None, gold: str) -> dict:
    turns = [{"turn": 0, "text": f"<think> need the capital {i} </think><search> capital {i} </search>",
              "action": "search", "queries": [f"capital {i}"],
              "docs": [[{"id": f"d{i}", "title": f"Title {i}", "text": "..."}]]},
             {"turn": 1, "text": f"<think> it is {prediction} </think><answer> {prediction} </answer>",
              "action": "answer", "queries": []}]
    em = float(prediction == gold)
    return {"dataset": "demo", "method": "agent", "id": f"q{i}", "question": f"Capital of place {i}?",
            "golden_answers": [gold], "prediction": prediction, "em": em, "f1": em, "subem": em, "searches": 1,
            "turns": 2, "tokens": 40, "finish_reason": "answer", "trajectory": "…", "turn_log": json.dumps(turns)}


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "agent.examples.parquet"
    write_artifact([_example(0, "Paris", "Paris"), _example(1, "Lyon", "Rome"), _example(2, "Oslo", "Oslo")],
                   path, EVAL_EXAMPLE)
    return path


def _out(args: list[str]) -> str:
    result = runner.invoke(app, ["show", *args], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def test_show_renders_each_turn_and_filters(tmp_path):
    path = _file(tmp_path)
    text = _out([str(path), "--limit", "5"])
    for piece in ("Capital of place 0?", "need the capital 0", "search: capital 0", "retrieved: Title 0",
                  "gold: Paris", "answer: Paris", "correct", "3 trajectories, 2 correct; showing 3"):
        assert piece in text, piece
    wrong = _out([str(path), "--where", "wrong"])
    assert "Capital of place 1?" in wrong and "Capital of place 0?" not in wrong and "showing 1" in wrong
    assert "answer: Lyon" in wrong and "gold: Rome" in wrong
    one = _out([str(path), "--id", "q2"])
    assert "Capital of place 2?" in one and "showing 1" in one
    assert "showing 1" in _out([str(path), "--where", "correct", "--limit", "1"])


def test_show_reads_a_real_rollout_file(tmp_path, tiny_model_dir):
    # A real `zsearch train --save-rollouts` file from the tiny model.
    index = tmp_path / "index"
    assert runner.invoke(app, ["index", "--out", str(index), "--kind", "bm25"]).exit_code == 0
    result = runner.invoke(app, ["train", "--algo", "grpo", "-G", "2", "--batch-size", "1", "--model",
                                 str(tiny_model_dir), "--index", str(index), "--steps", "1", "--max-turns", "1",
                                 "--max-turn-tokens", "8", "--device", "cpu", "--out", str(tmp_path / "run"),
                                 "--save-rollouts"])
    assert result.exit_code == 0, result.output
    text = _out([str(tmp_path / "run" / "rollouts" / "step-000001.parquet")])  # the first step is step 1
    assert "turn 1" in text and "reward 0.000" in text and "2 trajectories" in text


def test_show_refuses_a_file_without_trajectories(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"id": ["a"], "question": ["q"]}), path)
    result = runner.invoke(app, ["show", str(path)])
    assert result.exit_code == 2
    assert "missing column 'golden_answers', 'prediction'" in " ".join(result.output.split())
    result = runner.invoke(app, ["show", str(_file(tmp_path)), "--id", "nope"])
    assert result.exit_code == 2 and "no trajectory with id nope" in result.output
