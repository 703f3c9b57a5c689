"""Issue 37.3: averages over benchmarks as papers print them. Both the plain mean and the mean
weighted by n (the questions scored from each file) are printed and recorded, under one
label each, "avg (plain)" / "avg (weighted by n)"; never an unlabelled average."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from zsearch_cli.averages import (PLAIN, PLAIN_LABEL, STANDARD_SIZES, WEIGHTED, WEIGHTED_LABEL, average_rows,
                                  benchmark_of)
from zsearch_cli.cli import app
from zsearch_cli.artifacts import read_artifact, write_artifact
from zsearch_cli.schemas import EVAL_SUMMARY

runner = CliRunner()

SEVEN = ["nq/test", "triviaqa/test", "popqa/test", "hotpotqa/dev", "2wikimultihopqa/dev", "musique/dev",
         "bamboogle/test"]


def _summary(dataset: str, n: int, em: float, method: str = "agent") -> dict:
    return {"dataset": dataset, "method": method, "model": "m", "n": n, "missing": 0, "em": em, "f1": em,
            "subem": em, "answered": 1.0, "avg_searches": 1.0, "avg_turns": 2.0, "avg_tokens": 30.0}


def test_seven_ems_and_the_seven_standard_sizes_give_the_two_means():
    sizes = [3610, 11313, 14267, 7405, 12576, 2417, 125]
    ems = [0.5, 0.6, 0.4, 0.3, 0.2, 0.1, 0.8]
    assert [STANDARD_SIZES[benchmark_of(k)] for k in SEVEN] == sizes
    # plain:    (0.5 + 0.6 + 0.4 + 0.3 + 0.2 + 0.1 + 0.8) / 7 = 2.9 / 7 = 0.414286
    # weighted: Σ n = 3610 + 11313 + 14267 + 7405 + 12576 + 2417 + 125 = 51713
    #           Σ n·EM = 1805 + 6787.8 + 5706.8 + 2221.5 + 2515.2 + 241.7 + 100 = 19378
    #           19378 / 51713 = 0.374722
    plain, weighted = average_rows([_summary(k, n, em) for k, n, em in zip(SEVEN, sizes, ems)])
    assert (plain["dataset"], plain["average"]) == (PLAIN_LABEL, PLAIN) == ("avg (plain)", "plain")
    assert (weighted["dataset"], weighted["average"]) == (WEIGHTED_LABEL, WEIGHTED) == ("avg (weighted by n)",
                                                                                         "weighted by n")
    assert plain["em"] == pytest.approx(2.9 / 7) and round(plain["em"], 6) == 0.414286
    assert weighted["em"] == pytest.approx(19378 / 51713) and round(weighted["em"], 6) == 0.374722
    for row in (plain, weighted):  # what was averaged: each set's n beside its EM
        assert row["datasets"] == SEVEN and row["sizes"] == sizes and row["dataset_em"] == ems
        assert row["n"] == row["standard_n"] == 51713


def test_a_size_read_from_the_files_wins_over_the_table(tmp_path):
    # The files hold 4 NQ and 2 HotpotQA questions: the weights are 4 and 2, not 3610 and 7405.
    # weighted: (4·0.25 + 2·1.0) / 6 = 3/6 = 0.5   (by the table: (902.5 + 7405) / 11015 = 0.754)
    # plain:    (0.25 + 1.0) / 2 = 0.625
    rows = [_summary("nq/test", 4, 0.25), _summary("hotpotqa/dev", 2, 1.0), _summary("x/pooled", 6, 0.5)]
    plain, weighted = average_rows(rows, leave_out={"x/pooled"})  # a pooled row would count twice
    assert weighted["em"] == pytest.approx(0.5) and plain["em"] == pytest.approx(0.625)
    assert weighted["sizes"] == [4, 2] and weighted["n"] == 6 and weighted["standard_n"] == 3610 + 7405
    assert average_rows(rows[:1]) == []  # one dataset: nothing to average
    # old summaries (no average columns) still read, as dataset rows
    write_artifact([_summary("demo", 3, 0.5)], tmp_path / "old.summary.parquet", EVAL_SUMMARY)
    assert read_artifact(tmp_path / "old.summary.parquet", EVAL_SUMMARY).to_pylist()[0]["average"] is None


def _table_row(output: str, dataset: str) -> list[str]:
    """The cells of the printed table row whose first cell is ``dataset``."""
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 2 and cells[1] == dataset:
            return cells
    raise AssertionError(f"no table row {dataset!r} in:\n{output}")


def test_a_predictions_eval_prints_and_records_both_labelled_averages(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # dataset keys: preds.jsonl/nq, ...
    qa, preds = [], []
    for source, right, wrong in (("nq", 1, 3), ("hotpotqa", 2, 0), ("bamboogle", 1, 0)):
        for i in range(right + wrong):
            qa.append({"id": f"{source}{i}", "question": f"{source} {i}?", "golden_answers": ["yes sir"],
                       "data_source": source})
            preds.append({"id": f"{source}{i}", "prediction": "yes sir" if i < right else "no"})
    (tmp_path / "qa.jsonl").write_text("\n".join(map(json.dumps, qa)))
    (tmp_path / "preds.jsonl").write_text("\n".join(map(json.dumps, preds)))
    result = runner.invoke(app, ["eval", "--predictions", "preds.jsonl", "--qa", "qa.jsonl", "--out", "out",
                                 "--pooled"])
    assert result.exit_code == 0, result.output
    # EM: nq 1/4 = 0.25 (n 4), hotpotqa 2/2 = 1 (n 2), bamboogle 1/1 = 1 (n 1)
    # plain:    (0.25 + 1 + 1) / 3 = 0.75
    # weighted: (4·0.25 + 2·1 + 1·1) / 7 = 4/7 = 0.571, the pooled row's 4/7 too
    #           (by the standard sizes it would be (902.5 + 7405 + 125) / 11140 = 0.757)
    head = next(ln for ln in result.output.splitlines() if "┃" in ln and "missing" in ln)
    header = [c.strip() for c in head.split("┃")]
    assert header.index("EM") == header.index("n") + 1  # each set's size beside its EM
    assert _table_row(result.output, "preds.jsonl/nq")[2:5] == ["predictions", "4 (standard 3610)", "0.250"]
    assert _table_row(result.output, PLAIN_LABEL)[3:5] == ["3 sets", "0.750"]
    assert _table_row(result.output, WEIGHTED_LABEL)[3:5] == ["7 in 3 sets", "0.571"]
    assert _table_row(result.output, "preds.jsonl/pooled")[4] == "0.571"
    assert ("EM (n): preds.jsonl/nq 0.250 (4), preds.jsonl/hotpotqa 1.000 (2), preds.jsonl/bamboogle 1.000 (1)"
            in result.output)
    rows = read_artifact(tmp_path / "out/predictions.averages.summary.parquet", EVAL_SUMMARY).to_pylist()
    assert [(r["dataset"], r["average"]) for r in rows] == [(PLAIN_LABEL, PLAIN), (WEIGHTED_LABEL, WEIGHTED)]
    assert [r["em"] for r in rows] == [pytest.approx(0.75), pytest.approx(4 / 7)]
    assert rows[1]["sizes"] == [4, 2, 1] and rows[1]["dataset_em"] == [0.25, 1.0, 1.0]
    assert rows[1]["standard_n"] == 3610 + 7405 + 125 and rows[1]["full_set"] is True
    nq = read_artifact(tmp_path / "out/preds.jsonl/nq/predictions.summary.parquet", EVAL_SUMMARY).to_pylist()[0]
    assert (nq["n"], nq["standard_n"], nq["average"]) == (4, 3610, None)


def test_a_partial_agent_eval_is_marked_and_weighted_by_the_scored_counts(tmp_path, monkeypatch, demo_index,
                                                                          tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    qa = [{"id": f"{s}{i}", "question": f"What is {s} {i}?", "golden_answers": ["x"], "data_source": s}
          for s, k in (("nq", 2), ("hotpotqa", 3)) for i in range(k)]
    (tmp_path / "test.jsonl").write_text("\n".join(map(json.dumps, qa)))
    result = runner.invoke(app, [
        "eval", "--datasets", "test.jsonl", "--model", str(tiny_model_dir), "--index", str(demo_index),
        "--out", "out", "--max-turn-tokens", "4", "--max-turns", "1", "--device", "cpu", "--limit", "1"])
    assert result.exit_code == 0, result.output
    assert _table_row(result.output, "test.jsonl/nq")[3] == "1 of 3610 (--limit 1)"
    assert _table_row(result.output, PLAIN_LABEL)[3] == "2 sets (partial)"
    assert _table_row(result.output, WEIGHTED_LABEL)[3] == "2 in 2 sets (partial)"
    assert ("agent: PARTIAL run (--limit): the weights are the questions scored (test.jsonl/nq 1 of 3610, "
            "test.jsonl/hotpotqa 1 of 7405)") in result.output
    rows = read_artifact(tmp_path / "out/agent.averages.summary.parquet", EVAL_SUMMARY).to_pylist()
    assert [r["average"] for r in rows] == [PLAIN, WEIGHTED]
    assert all(r["full_set"] is False and r["sizes"] == [1, 1] and r["model"] == str(tiny_model_dir) for r in rows)
    ems = rows[0]["dataset_em"]
    assert rows[0]["em"] == pytest.approx(sum(ems) / 2) and rows[1]["em"] == pytest.approx(sum(ems) / 2)
    assert (tmp_path / "out/em.png").is_file()


def test_validation_over_sources_logs_both_averages(tmp_path, tiny_model_dir, demo_index, monkeypatch):
    from zsearch_cli.rollout.engine import QARow
    from zsearch_cli.train import validation
    from zsearch_cli.train.config import TrainConfig

    cfg = TrainConfig.from_flat(algo="reinforce", model=str(tiny_model_dir), index=demo_index, out=tmp_path / "run",
                                steps=1, batch_size=1, group_size=1, device="cpu", max_turn_tokens=4, max_turns=1)
    ems = {"n1": 1.0, "n2": 0.0, "n3": 0.0, "h1": 1.0}
    rows = [QARow(i, f"{i}?", ["x"]) for i in ems]
    v = validation.Validator(cfg, rows, {"n1": "nq", "n2": "nq", "n3": "nq", "h1": "hotpotqa"})

    def scored(engine, rows, dataset, model, batch_size):
        examples = [{"dataset": dataset, "method": "agent", "id": r.id, "question": r.question,
                     "golden_answers": ["x"], "prediction": "x", "em": ems[r.id], "f1": ems[r.id],
                     "subem": ems[r.id], "searches": 0, "turns": 1, "tokens": 1, "finish_reason": "answer",
                     "trajectory": "", "turn_log": "[]"} for r in rows]
        return examples, {"n": len(rows), **{k: sum(ems[r.id] for r in rows) / len(rows) for k in validation.SCORES}}

    monkeypatch.setattr(validation, "evaluate_engine", scored)
    v.search = type("Search", (), {"progress": lambda self, *a: None})()
    metrics = v.run(1)
    # val/em, pooled = avg (weighted by n): (1 + 0 + 0 + 1) / 4 = 0.5
    # val/em_plain = avg (plain): (nq 1/3 + hotpotqa 1/1) / 2 = 2/3
    assert metrics["val/em"] == pytest.approx(0.5) and metrics["val/em_plain"] == pytest.approx(2 / 3)
    rows = read_artifact(tmp_path / "run/val/step-000001.summary.parquet", EVAL_SUMMARY).to_pylist()
    by_label = {r["dataset"]: r for r in rows}
    assert by_label[PLAIN_LABEL]["em"] == pytest.approx(2 / 3) and by_label[WEIGHTED_LABEL]["em"] == pytest.approx(0.5)
    assert by_label[WEIGHTED_LABEL]["sizes"] == [3, 1]


def test_plots_and_the_model_card_use_the_same_labels(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from zsearch_cli.commands.eval_report import plot_em
    from zsearch_cli.commands.export_card import model_card
    from zsearch_cli.train.metrics import plot_metrics

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "val/em": 0.5, "val/em_plain": 0.6}) + "\n"
                                               for s in (1, 2)))
    figures: list = []
    savefig = plt.Figure.savefig
    plt.Figure.savefig = lambda self, *a, **k: (figures.append(self), savefig(self, *a, **k))[1]
    try:
        plot_metrics(run)
        rows = [_summary("nq/test", 4, 0.25), _summary("hotpotqa/dev", 2, 1.0)]
        for r in rows:
            write_artifact([r], tmp_path / "ev" / r["dataset"] / "agent.summary.parquet", EVAL_SUMMARY)
        averages = average_rows(rows)
        write_artifact(averages, tmp_path / "ev/agent.averages.summary.parquet", EVAL_SUMMARY)
        plot_em(tmp_path / "ev")
    finally:
        plt.Figure.savefig = savefig
    curves, bars = figures
    titles = [ax.get_title() for ax in curves.axes]
    assert "val/em: avg (weighted by n)" in titles and "val/em_plain: avg (plain)" in titles
    (ax,) = bars.axes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["hotpotqa/dev", "nq/test", PLAIN_LABEL, WEIGHTED_LABEL]
    assert sorted(t.get_text() for t in ax.texts) == ["0.250", "0.500", "0.625", "1.000"]  # each bar its value
    info = {"config": {}, "base": {"name": "org/base", "fingerprint": None}, "weights": "full weights",
            "algo": "grpo", "zsearch_version": "0", "dtype": "bfloat16", "source_step": 1}
    card = model_card(info, averages + rows, "card")
    table = [ln for ln in card.splitlines() if ln.startswith("| ") and "agent" in ln]
    assert [ln.split(" | ")[0] for ln in table] == ["| nq/test", "| hotpotqa/dev", f"| {PLAIN_LABEL}",
                                                    f"| {WEIGHTED_LABEL}"]
    assert "| 2 sets | 0.625 |" in table[2] and "| 6 in 2 sets | 0.500 |" in table[3]
