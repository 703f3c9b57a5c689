"""``zsearch eval --predictions FILE``: score another system's predictions with zsearch's
metric, per dataset, as ``zsearch eval`` scores a model (split by ``--group-by`` the same way).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from zsearch_cli.averages import average_rows, write_averages
from zsearch_cli.commands.eval_report import console, print_summaries
from zsearch_cli.data.datasets import POOLED
from zsearch_cli.data.qa import NO_GROUPING, dataset_key, group_labels, load_qa, source_keyed_ids, split_groups
from zsearch_cli.errors import ZsearchError
from zsearch_cli.protocol import METRIC_VERSION, Protocol, file_fingerprint
from zsearch_cli.rewards import score_answer
from zsearch_cli.artifacts import file_kind, jsonl_rows, read_parquet, rows_to_table, validate, write_artifact
from zsearch_cli.schemas import EVAL_EXAMPLE, EVAL_SUMMARY, PREDICTIONS
from zsearch_cli.scoring import dataset_dir, summarize


def predictions_protocol(path: Path, key: str, qa_path: Path | None) -> Protocol:
    """What is known about another system's predictions: the metric and the dataset; the
    rest (model, retriever, decoding) is not, and is recorded as unknown (null)."""
    return Protocol(model="-", model_revision=None, adapter=None, corpus_fingerprint=None, corpus_size=None,
                    retriever="unknown", bm25_k1=None, bm25_b=None, bm25_analyzer=None, encoder=None, topk=None,
                    max_turns=None, max_turn_tokens=None, max_obs_tokens=None, prompt="unknown",
                    metric_version=METRIC_VERSION, decoding="unknown", temperature=None, top_p=None, seed=None,
                    dataset=key, dataset_fingerprint=file_fingerprint(path, *([qa_path] if qa_path else [])),
                    split=None, limit=None, full_set=True)


def _read_predictions(path: Path) -> tuple[pa.Table, Callable[[str], list[Any] | None]]:
    """The predictions file, validated; ids keyed by (data_source, id) where the file holds
    several sources whose ids repeat (as Search-R1's merged test file does: data/qa.py). Also
    a reader of any other column of the file as read (``--group-by``'s), in file order, or None
    where the file has no such column: the file is read once."""
    if file_kind(path) == "parquet":
        table = raw = read_parquet(path)

        def column(name: str) -> list[Any] | None:
            return raw.column(name).to_pylist() if name in raw.column_names else None
    else:
        rows = jsonl_rows(path, PREDICTIONS)
        sources = [r.get("data_source") for r in rows]
        table = rows_to_table(rows, PREDICTIONS, path).append_column("data_source", pa.array(
            [None if v in (None, "") else str(v) for v in sources], pa.string()))

        def column(name: str) -> list[Any] | None:
            return [r.get(name) for r in rows]
    if "data_source" in table.column_names and "id" in table.column_names:
        keyed = source_keyed_ids(table.column("id").to_pylist(), table.column("data_source").to_pylist())
        if keyed is not None:
            table = table.set_column(table.column_names.index("id"), "id", pa.array(keyed, pa.string()))
    return validate(table, PREDICTIONS, path), column


def score_predictions(path: Path, qa_path: Path | None, out: Path, config: dict[str, Any],
                      group_by: str = "data_source", pooled: bool = False) -> list[dict[str, Any]]:
    """Score another system's predictions: FILE has id + prediction (+ golden_answers),
    or golds come from a QA file joined by id. With a QA file, every question it holds
    counts: one without a prediction scores 0 and is counted as ``missing``. Split by
    ``group_by`` as :func:`evaluate` splits a file (the QA file's labels when given, else the
    predictions file's own column); returns one summary per dataset."""
    preds, raw_column = _read_predictions(path)
    key = dataset_key(path, None)[0]
    golds: dict[str, list[str]] = {}
    questions: dict[str, str] = {}
    qa = load_qa(qa_path) if qa_path is not None else None
    if qa is not None:
        ids = qa.column("id").to_pylist()
        golds = dict(zip(ids, qa.column("golden_answers").to_pylist()))
        questions = dict(zip(ids, qa.column("question").to_pylist()))

    def labels_by(column: str) -> dict[str, str | None]:
        """id -> the value of ``column``: the QA file's when given, else the predictions file's own."""
        if qa is not None:
            return dict(zip(qa.column("id").to_pylist(), group_labels(qa_path, qa, column)))
        values = raw_column(column)
        if values is None:
            return {}
        # in file order, as the ids (maybe source-keyed)
        return dict(zip(preds.column("id").to_pylist(), [None if v in (None, "") else str(v) for v in values]))

    labels = labels_by(group_by) if group_by != NO_GROUPING else {}

    def row(id_: str, prediction: str | None, gold: list[str]) -> dict[str, Any]:
        s = score_answer(prediction, gold)
        return {"dataset": key, "method": "predictions", "id": id_, "question": questions.get(id_, ""),
                "golden_answers": gold, "prediction": prediction, "em": s["em"], "f1": s["f1"], "subem": s["subem"],
                "searches": 0, "turns": 0, "tokens": 0, "finish_reason": "", "trajectory": "", "turn_log": "[]"}

    rows = []
    for i, r in enumerate(preds.to_pylist()):
        gold = r["golden_answers"] if r["golden_answers"] is not None else golds.get(r["id"])
        if gold is None:
            where = f"not in {qa_path}" if qa_path else "and no --qa file was given to join golds from"
            raise ZsearchError(f"{path}: row {i}: id {r['id']!r} has no golden_answers ({where})")
        rows.append(row(r["id"], r["prediction"], gold))
    predicted = set(preds.column("id").to_pylist())
    rows += [row(id_, None, gold) for id_, gold in golds.items() if id_ not in predicted]
    table = rows_to_table(rows, EVAL_EXAMPLE, path)
    groups = split_groups(table, [labels.get(r["id"]) for r in rows])
    parts = [(f"{key}/{label}", sub) for label, sub in groups] or [(key, table)]
    if groups and pooled:
        parts.append((f"{key}/{POOLED}", table))
    if groups:
        console.print(f"{key}: {len(groups)} datasets by {group_by} ({', '.join(g for g, _ in groups)}), each scored "
                      "on its own", markup=False, highlight=False)
    elif group_by == NO_GROUPING:  # say that one number pools several benchmarks, as `eval --datasets` does
        sources = labels_by("data_source")
        mixed = split_groups(table, [sources.get(r["id"]) for r in rows])
        if mixed:
            console.print(f"{key}: holds {len(mixed)} data_source values ({', '.join(g for g, _ in mixed)}), scored "
                          "as ONE pooled number (--group-by none)", markup=False, highlight=False)
    summaries, protocols = [], []
    for name, examples in parts:
        missing = sum(1 for id_ in examples.column("id").to_pylist() if id_ not in predicted)
        examples = examples.set_column(0, "dataset", pa.array([name] * examples.num_rows, pa.string()))
        protocol = predictions_protocol(path, name, qa_path)
        folder = dataset_dir(out, name)
        write_artifact(examples, folder / "predictions.examples.parquet", EVAL_EXAMPLE, config, protocol.as_dict())
        summary = {**summarize(examples, name, "predictions", "-", missing=missing), **protocol.as_dict()}
        write_artifact([summary], folder / "predictions.summary.parquet", EVAL_SUMMARY, config, protocol.as_dict())
        summaries.append(summary)
        protocols.append(protocol)
    averages = average_rows(summaries, leave_out={f"{key}/{POOLED}"})  # its questions are the others'
    write_averages(out, averages, config)
    print_summaries(summaries, protocols, averages)
    return summaries
