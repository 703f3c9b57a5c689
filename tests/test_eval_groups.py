"""Issue 23.1: a QA file that holds several benchmarks (Search-R1's merged test Parquet, with
its ``data_source`` column) is scored per benchmark, never as one silent pooled number; the
pooled score exists only when asked for (``--pooled``), under a key that says so. The same
for a predictions file, and for validation during training."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.data.qa import group_labels, load_qa, split_groups
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import EVAL_EXAMPLE, EVAL_SUMMARY

runner = CliRunner()


def search_r1_test_file(path: Path, rows: list[tuple[str, str, str, list[str]]]) -> Path:
    """A file shaped as Search-R1's merged test Parquet: (id, data_source, question, golds)."""
    table = pa.Table.from_pylist([{
        "id": id_, "data_source": source, "question": question,
        "prompt": [{"role": "user", "content": question}], "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
        "extra_info": {"index": i, "split": "test"},
    } for i, (id_, source, question, golds) in enumerate(rows)])
    pq.write_table(table, path)
    return path


ROWS = [
    ("nq_1", "nq", "Capital of France?", ["Paris"]),
    ("hp_1", "hotpotqa", "Who wrote Hamlet?", ["Shakespeare"]),
    ("nq_2", "nq", "Largest ocean?", ["Pacific"]),
]


def test_group_labels_from_search_r1_metadata_and_from_a_jsonl_column(tmp_path):
    merged = search_r1_test_file(tmp_path / "test.parquet", ROWS)
    qa = load_qa(merged)
    labels = group_labels(merged, qa, "data_source")
    assert labels == ["nq", "hotpotqa", "nq"]
    groups = split_groups(qa, labels)
    # first-appearance order, rows in file order within a group
    assert [(g, t.column("id").to_pylist()) for g, t in groups] == [("nq", ["nq_1", "nq_2"]), ("hotpotqa", ["hp_1"])]
    # FlashRAG-style jsonl with a top-level column the QA artifact does not keep
    flat = tmp_path / "mixed.jsonl"
    flat.write_text("\n".join(json.dumps({"id": i, "question": q, "golden_answers": g, "source": s})
                              for i, s, q, g in ROWS))
    qa = load_qa(flat)
    assert group_labels(flat, qa, "source") == ["nq", "hotpotqa", "nq"]
    assert group_labels(flat, qa, "data_source") == [None] * 3  # no such column: nothing to split
    assert split_groups(qa, [None] * 3) == [] and split_groups(qa, ["nq"] * 3) == []  # one value: stays whole


def _preds(tmp_path: Path) -> Path:
    preds = tmp_path / "preds.jsonl"
    preds.write_text("\n".join(json.dumps(r) for r in [
        {"id": "nq_1", "prediction": "Paris"},      # EM 1
        {"id": "hp_1", "prediction": "Shakespeare"},  # EM 1
        {"id": "nq_2", "prediction": "Atlantic"},   # EM 0
    ]))
    return preds


def test_predictions_joined_with_a_merged_file_are_scored_per_data_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the dataset key is the predictions file's path: preds.jsonl
    merged = search_r1_test_file(tmp_path / "test.parquet", ROWS)
    result = runner.invoke(app, ["eval", "--predictions", str(_preds(tmp_path)), "--qa", str(merged),
                                 "--out", "out"])
    assert result.exit_code == 0, result.output
    # nq: (1 + 0)/2 = 0.5; hotpotqa: 1/1 = 1.0. Today's code wrote one pooled EM (1+1+0)/3 = 0.667.
    nq = read_artifact(tmp_path / "out/preds.jsonl/nq/predictions.summary.parquet", EVAL_SUMMARY).to_pylist()[0]
    hp = read_artifact(tmp_path / "out/preds.jsonl/hotpotqa/predictions.summary.parquet", EVAL_SUMMARY).to_pylist()[0]
    assert (nq["dataset"], nq["n"], nq["em"]) == ("preds.jsonl/nq", 2, pytest.approx(0.5))
    assert (hp["dataset"], hp["n"], hp["em"]) == ("preds.jsonl/hotpotqa", 1, pytest.approx(1.0))
    assert not (tmp_path / "out/preds.jsonl/predictions.summary.parquet").exists()  # no silent pooled number
    assert not (tmp_path / "out/preds.jsonl/pooled").exists()
    assert "2 datasets by data_source" in result.output
    # pooling is an explicit choice, under a key that says so
    result = runner.invoke(app, ["eval", "--predictions", str(_preds(tmp_path)), "--qa", str(merged),
                                 "--out", "out2", "--pooled"])
    assert result.exit_code == 0, result.output
    pooled = read_artifact(tmp_path / "out2/preds.jsonl/pooled/predictions.summary.parquet",
                           EVAL_SUMMARY).to_pylist()[0]
    assert (pooled["dataset"], pooled["n"], pooled["em"]) == ("preds.jsonl/pooled", 3, pytest.approx(2 / 3))
    # --group-by none: the old single number, still labelled by a line
    result = runner.invoke(app, ["eval", "--predictions", str(_preds(tmp_path)), "--qa", str(merged),
                                 "--out", "out3", "--group-by", "none"])
    assert result.exit_code == 0, result.output
    whole = read_artifact(tmp_path / "out3/preds.jsonl/predictions.summary.parquet", EVAL_SUMMARY).to_pylist()[0]
    assert whole["n"] == 3
    # ... and a line says the one number pools several benchmarks (it printed none: issue 36.11)
    assert "preds.jsonl: holds 2 data_source values (nq, hotpotqa), scored as ONE pooled number" in result.output


def test_agent_eval_of_a_merged_file_scores_each_benchmark(tmp_path, monkeypatch, demo_index, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    merged = search_r1_test_file(tmp_path / "test.parquet", ROWS)
    result = runner.invoke(app, [
        "eval", "--datasets", str(merged), "--model", str(tiny_model_dir), "--index", str(demo_index),
        "--out", "out", "--max-turn-tokens", "6", "--max-turns", "1", "--device", "cpu", "--limit", "1"])
    assert result.exit_code == 0, result.output
    assert "test.parquet: 2 datasets by data_source (nq 2, hotpotqa 1)" in result.output
    for source, ids in (("nq", ["nq_1"]), ("hotpotqa", ["hp_1"])):  # --limit 1 applies per benchmark
        folder = tmp_path / "out" / "test.parquet" / source
        examples = read_artifact(folder / "agent.examples.parquet", EVAL_EXAMPLE).to_pylist()
        assert [e["id"] for e in examples] == ids and {e["dataset"] for e in examples} == {f"test.parquet/{source}"}
        summary = read_artifact(folder / "agent.summary.parquet", EVAL_SUMMARY).to_pylist()[0]
        assert summary["dataset"] == f"test.parquet/{source}" and summary["n"] == 1
        assert summary["em"] == pytest.approx(examples[0]["em"])
    assert not (tmp_path / "out" / "test.parquet" / "agent.summary.parquet").exists()


def test_validation_on_a_merged_file_writes_per_source_summaries(tmp_path, tiny_model_dir, demo_index):
    from zsearch_cli.train.config import TrainConfig
    from zsearch_cli.train.trainer import Trainer

    merged = search_r1_test_file(tmp_path / "test.parquet", ROWS)
    cfg = TrainConfig.from_flat(algo="reinforce", model=str(tiny_model_dir), index=demo_index, out=tmp_path / "run", steps=1,
                      batch_size=1, group_size=1, device="cpu", val_data=str(merged), max_turn_tokens=4, max_turns=1)
    validator = Trainer(cfg).validator
    assert validator.sources == {"nq_1": "nq", "hp_1": "hotpotqa", "nq_2": "nq"}
    metrics = validator.run(1)
    examples = read_artifact(tmp_path / "run/val/step-000001.examples.parquet", EVAL_EXAMPLE).to_pylist()
    assert {e["id"]: e["dataset"] for e in examples} == {"nq_1": "test/nq", "hp_1": "test/hotpotqa",
                                                         "nq_2": "test/nq"}
    summaries = {s["dataset"]: s for s in read_artifact(tmp_path / "run/val/step-000001.summary.parquet",
                                                        EVAL_SUMMARY).to_pylist()}
    # one row per source, then both labelled averages over them (tests/test_averages.py)
    assert {k: s["n"] for k, s in summaries.items()} == {"test/nq": 2, "test/hotpotqa": 1, "avg (plain)": 3,
                                                         "avg (weighted by n)": 3}
    for key, ids in (("test/nq", ("nq_1", "nq_2")), ("test/hotpotqa", ("hp_1",))):
        assert summaries[key]["em"] == pytest.approx(sum(e["em"] for e in examples if e["id"] in ids) / len(ids))
    assert metrics["val/em"] == pytest.approx(sum(e["em"] for e in examples) / 3)  # pooled, as the line says


# ------------------------------------------------------------------ Search-R1's merged file as its script writes it


def search_r1_merged_as_written(path: Path) -> Path:
    """As Search-R1's ``qa_search_test_merge.py`` writes it: each FlashRAG file mapped (its own
    ``id``, ``question`` and ``golden_answers`` kept, ``data_source``, ``prompt``, ``ability``,
    ``reward_model`` and ``extra_info`` added), then concatenated, so FlashRAG's per-source ids
    repeat: ``test_0`` is a row of nq and of triviaqa."""
    rows = []
    for source, items in (("nq", [("test_0", "capital of france", ["Paris"]), ("test_1", "largest ocean", ["Pacific"])]),
                          ("triviaqa", [("test_0", "who wrote hamlet", ["Shakespeare"])])):
        for idx, (id_, question, golds) in enumerate(items):
            question = question.strip() + "?"
            rows.append({"id": id_, "question": question, "golden_answers": golds, "data_source": source,
                         "prompt": [{"role": "user", "content": f"Answer the given question. Question: {question}"}],
                         "ability": "fact-reasoning",
                         "reward_model": {"style": "rule", "ground_truth": {"target": golds}},
                         "extra_info": {"split": "test", "index": idx}})
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_search_r1s_merged_file_with_repeated_flashrag_ids_is_keyed_by_source(tmp_path):
    # Before: "column 'id' has duplicate value 'test_0'", the whole file refused.
    merged = search_r1_merged_as_written(tmp_path / "test.parquet")
    qa = load_qa(merged)
    assert qa.column("id").to_pylist() == ["nq/test_0", "nq/test_1", "triviaqa/test_0"]
    meta = [json.loads(m) for m in qa.column("metadata").to_pylist()]
    assert [(m["data_source"], m["source_id"]) for m in meta] == [("nq", "test_0"), ("nq", "test_1"),
                                                                  ("triviaqa", "test_0")]
    labels = group_labels(merged, qa, "data_source")
    assert [(g, t.column("id").to_pylist()) for g, t in split_groups(qa, labels)] == [
        ("nq", ["nq/test_0", "nq/test_1"]), ("triviaqa", ["triviaqa/test_0"])]
    # a repeat within one source is still refused, naming it
    twice = pa.concat_tables([pq.read_table(merged), pq.read_table(merged).slice(0, 1)])
    pq.write_table(twice, tmp_path / "twice.parquet")
    from zsearch_cli.errors import ZsearchError

    with pytest.raises(ZsearchError, match=r"twice.parquet: column 'id' has duplicate value 'nq/test_0' \(rows 0 and 3\)"):
        load_qa(tmp_path / "twice.parquet")
    # a file of one source keeps its ids
    pq.write_table(pq.read_table(merged).slice(0, 2), tmp_path / "nq.parquet")
    assert load_qa(tmp_path / "nq.parquet").column("id").to_pylist() == ["test_0", "test_1"]


def test_predictions_with_repeated_ids_are_joined_by_source_and_scored_per_source(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    merged = search_r1_merged_as_written(tmp_path / "test.parquet")
    preds = tmp_path / "preds.jsonl"
    preds.write_text("\n".join(json.dumps(r) for r in [
        {"id": "test_0", "data_source": "nq", "prediction": "Paris"},            # EM 1
        {"id": "test_1", "data_source": "nq", "prediction": "Atlantic"},         # EM 0
        {"id": "test_0", "data_source": "triviaqa", "prediction": "Marlowe"},    # EM 0
    ]))
    result = runner.invoke(app, ["eval", "--predictions", str(preds), "--qa", str(merged), "--out", "out"])
    assert result.exit_code == 0, result.output
    nq = read_artifact(tmp_path / "out/preds.jsonl/nq/predictions.summary.parquet", EVAL_SUMMARY).to_pylist()[0]
    tq = read_artifact(tmp_path / "out/preds.jsonl/triviaqa/predictions.summary.parquet", EVAL_SUMMARY).to_pylist()[0]
    # nq: (1 + 0)/2; triviaqa: 0/1 -- a join by the bare id would have given triviaqa nq's Paris
    assert (nq["n"], nq["em"], tq["n"], tq["em"]) == (2, pytest.approx(0.5), 1, pytest.approx(0.0))
    assert nq.get("missing", 0) == 0 and tq.get("missing", 0) == 0  # every prediction found its question


def test_agent_eval_of_search_r1s_merged_file_as_written(tmp_path, monkeypatch, demo_index, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    merged = search_r1_merged_as_written(tmp_path / "test.parquet")
    result = runner.invoke(app, [
        "eval", "--datasets", str(merged), "--model", str(tiny_model_dir), "--index", str(demo_index),
        "--out", "out", "--max-turn-tokens", "4", "--max-turns", "1", "--device", "cpu", "--limit", "1"])
    assert result.exit_code == 0, result.output
    assert "test.parquet: 2 datasets by data_source (nq 2, triviaqa 1)" in result.output
    for source in ("nq", "triviaqa"):
        examples = read_artifact(tmp_path / "out/test.parquet" / source / "agent.examples.parquet",
                                 EVAL_EXAMPLE).to_pylist()
        assert [e["id"] for e in examples] == [f"{source}/test_0"]
