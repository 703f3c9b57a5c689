"""`zsearch eval` end to end on the tiny random model and the bundled data, resuming,
scoring a predictions file, and options from a YAML config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.artifacts import read_artifact, read_metadata
from zsearch_cli.schemas import EVAL_EXAMPLE, EVAL_SUMMARY

runner = CliRunner()


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "index"
    result = runner.invoke(app, ["index", "--out", str(out)])  # no corpus argument: the bundled one
    assert result.exit_code == 0, result.output
    return out


def _eval(args: list[str]):
    result = runner.invoke(app, ["eval", *args])
    assert result.exit_code == 0, result.output
    return result


def test_eval_agent_and_rag_end_to_end_then_resume(tmp_path, demo_index, tiny_model_dir):
    out = tmp_path / "eval"
    common = ["--model", str(tiny_model_dir), "--index", str(demo_index), "--out", str(out),
              "--max-turn-tokens", "8", "--max-turns", "2", "--batch-size", "3", "--device", "cpu"]
    _eval([*common, "--limit", "4"])
    _eval([*common, "--limit", "4", "--method", "rag"])
    examples = read_artifact(out / "demo" / "agent.examples.parquet", EVAL_EXAMPLE)
    assert examples.num_rows == 4  # batch 3 + a tail of 1: nothing dropped
    assert set(examples.column("finish_reason").to_pylist()) <= {"eos", "length", "max_turns", "context", "answer"}
    summary = read_artifact(out / "demo" / "rag.summary.parquet", EVAL_SUMMARY).to_pylist()[0]
    assert summary["n"] == 4 and summary["method"] == "rag"
    assert read_metadata(out / "demo" / "agent.examples.parquet")["config"]["max_turn_tokens"] == 8
    assert (out / "em.png").stat().st_size > 1000
    # a second run with a larger limit scores only the new examples
    result = _eval([*common, "--limit", "6"])
    assert "4 examples already scored, 2 to go" in result.output
    assert read_artifact(out / "demo" / "agent.examples.parquet", EVAL_EXAMPLE).num_rows == 6


def test_a_finished_eval_run_again_loads_no_model(tmp_path, demo_index, tiny_model_dir, monkeypatch):
    """Every question already scored: the same command reprints the same summary without
    loading the model (a finished recipe stage resumed costs no model load), and a larger
    --limit then loads it for the new questions only."""
    import zsearch_cli.commands.evaluate as evaluate

    out = tmp_path / "eval"
    common = ["--model", str(tiny_model_dir), "--index", str(demo_index), "--out", str(out),
              "--max-turn-tokens", "8", "--max-turns", "2", "--device", "cpu"]
    _eval([*common, "--limit", "2"])
    first = read_artifact(out / "demo" / "agent.summary.parquet", EVAL_SUMMARY).to_pylist()
    build, builds = evaluate._build_engine, []
    monkeypatch.setattr(evaluate, "_build_engine", lambda opts: builds.append(1) or build(opts))
    result = _eval([*common, "--limit", "2"])
    assert "2 examples already scored, 0 to go" in result.output
    assert builds == [] and read_artifact(out / "demo" / "agent.summary.parquet", EVAL_SUMMARY).to_pylist() == first
    result = _eval([*common, "--limit", "3"])
    assert "2 examples already scored, 1 to go" in result.output and builds == [1]
    assert read_artifact(out / "demo" / "agent.examples.parquet", EVAL_EXAMPLE).num_rows == 3


def test_score_predictions_file_joined_with_qa(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the dataset key is the predictions file's path: preds.jsonl
    qa = tmp_path / "qa.jsonl"
    qa.write_text("\n".join(json.dumps(r) for r in [
        {"id": "1", "question": "Capital of France?", "golden_answers": ["Paris"]},
        {"id": "2", "question": "Who wrote Hamlet?", "golden_answers": ["William Shakespeare", "Shakespeare"]},
    ]))
    preds = tmp_path / "preds.jsonl"
    preds.write_text("\n".join(json.dumps(r) for r in [
        {"id": "1", "prediction": "paris."},          # EM after normalization
        {"id": "2", "prediction": "the playwright Shakespeare"},  # subEM only; F1 = 2*1/(3+1)... see below
    ]))
    _eval(["--predictions", str(preds), "--qa", str(qa), "--out", str(tmp_path / "out")])
    s = read_artifact(tmp_path / "out" / "preds.jsonl" / "predictions.summary.parquet", EVAL_SUMMARY).to_pylist()[0]
    # row 2: pred tokens [playwright, shakespeare] ("the" removed); best gold "shakespeare":
    # IN=1, PN=2, RN=1 -> F1 = 2*1/(2+1) = 2/3.  Means: EM (1+0)/2, subEM (1+1)/2, F1 (1+2/3)/2.
    assert s["em"] == pytest.approx(0.5)
    assert s["subem"] == pytest.approx(1.0)
    assert s["f1"] == pytest.approx((1 + 2 / 3) / 2)


def test_predictions_without_golds_is_a_clear_error(tmp_path):
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"id": "1", "prediction": "x"}) + "\n")
    result = runner.invoke(app, ["eval", "--predictions", str(preds), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "preds.jsonl: row 0: id '1' has no golden_answers" in result.output


def test_unknown_dataset_and_missing_benchmark_files(tmp_path):
    result = runner.invoke(app, ["eval", "--datasets", "nosuch", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown dataset 'nosuch'" in result.output
    result = runner.invoke(app, ["eval", "--datasets", "all", "--data-dir", str(tmp_path), "--out", str(tmp_path)])
    assert result.exit_code == 2 and str(tmp_path / "nq" / "test.jsonl") in result.output


def test_yaml_config_sets_options_and_flags_override(tmp_path, demo_index):
    cfg = tmp_path / "search.yaml"
    cfg.write_text(f"index: {demo_index}\ntopk: 1\n")
    result = runner.invoke(app, ["search", "Which river flows through Vienna?", "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    assert result.output.count("geo-") == 1
    result = runner.invoke(app, ["search", "Which river flows through Vienna?", "--config", str(cfg), "--topk", "3"])
    assert result.output.count("geo-") == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("topk: 1\nnot_an_option: 2\n")
    result = runner.invoke(app, ["search", "x", "--config", str(bad)])
    assert result.exit_code == 2 and "unknown option(s) for 'search': not_an_option" in result.output


def test_download_without_network_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # CI has no hub access; this makes it fail fast
    result = runner.invoke(app, ["eval", "--datasets", "bamboogle", "--download", "--data-dir", str(tmp_path),
                                 "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "could not be downloaded from RUC-NLPIR/FlashRAG_datasets" in result.output
    assert str(tmp_path / "bamboogle" / "test.jsonl") in result.output
