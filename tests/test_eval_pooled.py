"""Issue 36.11: ``zsearch eval --pooled`` builds KEY/pooled from the per-source rows already
rolled out: each question is rolled out once (it was twice: once for its source, once again
for the pool), the pooled means are the means over every question of the file, and a resumed
eval writes the pooled line without rolling anything out again."""

from __future__ import annotations

from collections import Counter

import pytest
from typer.testing import CliRunner

from test_eval_groups import search_r1_merged_as_written
from zsearch_cli.cli import app
from zsearch_cli.commands.evaluate import pooled_rows
from zsearch_cli.data.qa import load_qa
from zsearch_cli.rollout.engine import RolloutEngine
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import EVAL_EXAMPLE, EVAL_SUMMARY

runner = CliRunner()
SOURCES = ("nq", "triviaqa")


@pytest.fixture
def rolled_out(monkeypatch) -> Counter:
    """Counts the questions the real engine rolls out, by id (it still generates them)."""
    seen: Counter = Counter()
    real = RolloutEngine.rollout

    def counting(self, rows, *args, **kwargs):
        seen.update(r.id for r in rows)
        return real(self, rows, *args, **kwargs)

    monkeypatch.setattr(RolloutEngine, "rollout", counting)
    return seen


def _eval(merged, demo_index, tiny_model_dir, out: str, *extra: str):
    result = runner.invoke(app, ["eval", "--datasets", str(merged), "--model", str(tiny_model_dir), "--index",
                                 str(demo_index), "--out", out, "--max-turn-tokens", "4", "--max-turns", "1",
                                 "--device", "cpu", *extra])
    assert result.exit_code == 0, result.output
    return result


def _read(folder, method: str = "agent") -> tuple[list[dict], dict]:
    examples = read_artifact(folder / f"{method}.examples.parquet", EVAL_EXAMPLE).to_pylist()
    return examples, read_artifact(folder / f"{method}.summary.parquet", EVAL_SUMMARY).to_pylist()[0]


def _check_pooled(root, method: str = "agent") -> dict:
    """KEY/pooled holds every per-source row once, relabelled, in file order; its means are theirs."""
    per_source = [row for source in SOURCES for row in _read(root / source, method)[0]]
    examples, summary = _read(root / "pooled", method)
    assert [e["id"] for e in examples] == ["nq/test_0", "nq/test_1", "triviaqa/test_0"]  # the file's order
    assert {e["dataset"] for e in examples} == {"test.parquet/pooled"}
    by_id = {r["id"]: r for r in per_source}
    for e in examples:  # the very rows the sources scored, not a second sample
        assert {k: v for k, v in e.items() if k != "dataset"} == {k: v for k, v in by_id[e["id"]].items()
                                                                  if k != "dataset"}
    assert summary["dataset"] == "test.parquet/pooled" and summary["n"] == len(per_source) == 3
    for metric in ("em", "f1", "subem"):
        assert summary[metric] == pytest.approx(sum(r[metric] for r in per_source) / len(per_source))
    assert summary["avg_tokens"] == pytest.approx(sum(r["tokens"] for r in per_source) / len(per_source))
    return summary


def test_pooled_rolls_each_question_out_once_and_pools_the_per_source_rows(
        tmp_path, monkeypatch, demo_index, tiny_model_dir, rolled_out):
    monkeypatch.chdir(tmp_path)
    merged = search_r1_merged_as_written(tmp_path / "test.parquet")
    result = _eval(merged, demo_index, tiny_model_dir, "out", "--pooled")
    # Before: {"nq/test_0": 2, ...}: the pool rolled the whole file out again.
    assert rolled_out == Counter({"nq/test_0": 1, "nq/test_1": 1, "triviaqa/test_0": 1})
    summary = _check_pooled(tmp_path / "out/test.parquet")
    assert summary["full_set"] and "test.parquet/pooled pools them" in result.output
    assert "test.parquet/pooled" in result.output  # its line in the table, labelled as before


def test_a_resumed_eval_writes_the_pool_without_rolling_out_again(
        tmp_path, monkeypatch, demo_index, tiny_model_dir, rolled_out):
    monkeypatch.chdir(tmp_path)
    merged = search_r1_merged_as_written(tmp_path / "test.parquet")
    _eval(merged, demo_index, tiny_model_dir, "out", "--limit", "1")  # an eval that stopped part-way
    assert rolled_out == Counter({"nq/test_0": 1, "triviaqa/test_0": 1})
    rolled_out.clear()
    result = _eval(merged, demo_index, tiny_model_dir, "out", "--pooled")
    assert rolled_out == Counter({"nq/test_1": 1})  # only the question not scored yet
    assert "test.parquet/nq: 1 examples already scored, 1 to go" in result.output
    _check_pooled(tmp_path / "out/test.parquet")
    rolled_out.clear()
    _eval(merged, demo_index, tiny_model_dir, "out", "--pooled")  # everything scored: the pool alone
    assert rolled_out == Counter()
    _check_pooled(tmp_path / "out/test.parquet")


def test_pooled_with_limit_and_probes_pools_what_each_source_scored(
        tmp_path, monkeypatch, demo_index, tiny_model_dir, rolled_out):
    monkeypatch.chdir(tmp_path)
    merged = search_r1_merged_as_written(tmp_path / "test.parquet")
    result = _eval(merged, demo_index, tiny_model_dir, "out", "--pooled", "--limit", "1", "--probe", "real,empty")
    assert rolled_out == Counter({"nq/test_0": 2, "triviaqa/test_0": 2})  # once per probe
    for method in ("agent", "agent+empty"):
        examples, summary = _read(tmp_path / "out/test.parquet/pooled", method)
        # --limit applies per source (as the README says): the first question of each, pooled
        assert [e["id"] for e in examples] == ["nq/test_0", "triviaqa/test_0"]
        assert (summary["n"], summary["limit"], summary["full_set"]) == (2, 1, False)
        sources = [_read(tmp_path / "out/test.parquet" / s, method)[0][0] for s in SOURCES]
        assert [e["prediction"] for e in examples] == [s["prediction"] for s in sources]
        assert summary["em"] == pytest.approx(sum(s["em"] for s in sources) / 2)
    assert "2 (--limit 1)" in result.output


def test_pooled_rows_are_the_members_rows_in_file_order(tmp_path):
    merged = search_r1_merged_as_written(tmp_path / "test.parquet")
    nq = [{"dataset": "t/nq", "id": "nq/test_0", "em": 1.0}, {"dataset": "t/nq", "id": "nq/test_1", "em": 0.0}]
    tq = [{"dataset": "t/triviaqa", "id": "triviaqa/test_0", "em": 1.0}]
    rows = pooled_rows("t/pooled", load_qa(merged), [tq, nq])
    assert rows == [{"dataset": "t/pooled", "id": "nq/test_0", "em": 1.0},
                    {"dataset": "t/pooled", "id": "nq/test_1", "em": 0.0},
                    {"dataset": "t/pooled", "id": "triviaqa/test_0", "em": 1.0}]
    assert nq[0]["dataset"] == "t/nq"  # the members' rows are not changed
