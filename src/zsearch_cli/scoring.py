"""Scoring answered questions as ``zsearch eval`` does: per-example EM / F1 / subEM rows
(EVAL_EXAMPLE), their summary (EVAL_SUMMARY), and :func:`evaluate_engine` for a model
already in memory. Beside ``rewards.py`` (the answer metrics themselves) so that both
``commands/evaluate.py`` and the trainer's validation (``train/validation.py``) use it
without the trainer importing a command."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa

from zsearch_cli.averages import standard_size
from zsearch_cli.errors import ZsearchError
from zsearch_cli.rewards import score_answer
from zsearch_cli.rollout.trajectory import Trajectory
from zsearch_cli.artifacts import rows_to_table
from zsearch_cli.schemas import EVAL_EXAMPLE


def example_rows(dataset: str, method: str, trajs: Sequence[Trajectory]) -> list[dict[str, Any]]:
    """EVAL_EXAMPLE rows: the answer the engine parsed, scored (the same field training rewards)."""
    rows = []
    for t in trajs:
        scores = score_answer(t.prediction, t.golden_answers)
        rows.append({
            "dataset": dataset, "method": method, "id": t.row_id, "question": t.question,
            "golden_answers": t.golden_answers, "prediction": t.prediction,
            "em": scores["em"], "f1": scores["f1"], "subem": scores["subem"],
            "searches": t.num_searches, "turns": t.num_turns, "tokens": t.response_tokens,
            "finish_reason": t.finish_reason, "trajectory": t.response_text, "turn_log": t.to_row()["turns"],
        })
    return rows


def summarize(examples: pa.Table, dataset: str, method: str, model: str, missing: int = 0) -> dict[str, Any]:
    d = examples.to_pydict()
    n = len(d["id"])
    mean = lambda xs: float(sum(xs) / n) if n else 0.0  # noqa: E731
    return {
        "dataset": dataset, "method": method, "model": model, "n": n, "missing": missing,
        "em": mean(d["em"]), "f1": mean(d["f1"]), "subem": mean(d["subem"]),
        "answered": mean([p is not None for p in d["prediction"]]),
        "avg_searches": mean(d["searches"]), "avg_turns": mean(d["turns"]), "avg_tokens": mean(d["tokens"]),
        "standard_n": standard_size(dataset),  # beside n, which the averages weight by (averages.py)
    }


def evaluate_engine(engine: Any, rows: Sequence[Any], dataset: str, model: str, batch_size: int,
                    method: str = "agent") -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Score ``rows`` (QARows) with a ready engine, one sample each, as ``zsearch eval`` does:
    the EVAL_EXAMPLE rows and their EVAL_SUMMARY row (None without rows). For a model that is
    already in memory: validation during ``zsearch train`` runs the policy being trained."""
    examples: list[dict[str, Any]] = []
    for start in range(0, len(rows), batch_size):
        examples += example_rows(dataset, method, engine.rollout(rows[start : start + batch_size], group_size=1))
    if not examples:
        return examples, None
    return examples, summarize(rows_to_table(examples, EVAL_EXAMPLE, Path(dataset)), dataset, method, model)


def dataset_dir(out: Path, key: str) -> Path:
    """OUT/KEY as nested folders, never outside ``out``: each part of the key is escaped
    (``%`` -> ``%25``, a leading ``.`` -> ``%2E``, the empty root of an absolute path ->
    ``%2F``), which is one-to-one, so distinct keys get distinct folders."""
    parts = []
    for part in key.split("/"):
        part = part.replace("%", "%25")
        if part == "":
            part = "%2F"
        elif part.startswith("."):
            part = "%2E" + part[1:]
        parts.append(part)
    path = Path(out).joinpath(*parts)
    if not Path(os.path.abspath(path)).is_relative_to(Path(os.path.abspath(out))):  # defensive: cannot happen
        raise ZsearchError(f"dataset key {key!r} would be written outside --out {out}")
    return path
