"""``zsearch collect``: trajectories against a real search engine, and the query-document
pairs in them (ZeroSearch §3.3, the first step of the simulator's fine-tuning data).

An agent model answers a QA set with the multi-turn engine, searching a real backend
(BM25 / dense / hybrid index in process, or a ``zsearch serve`` URL). Each question gets
``samples_per_question`` samples at temperature 1.0 by default, for diverse queries. Two
files come out, both rewritten atomically after every batch so a re-run resumes:

* ``trajectories.parquet``: the TRAJECTORY artifact, as training and eval write it;
* ``queries.parquet``: the COLLECTED_QUERY artifact, one row per executed search, with the
  documents the engine returned and whether the trajectory's final answer was right. It is
  derived from the trajectories alone (the engine's turn log records the passages), so it
  can always be rebuilt from them.

Reproducibility: batch ``k`` always covers QA rows ``[k*B, (k+1)*B)`` and samples with
step ``k``, so with the same ``--batch-size`` a resumed run samples what an uninterrupted
one would have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from zsearch_cli.config.fields import check_options
from zsearch_cli.data.demo import demo_qa
from zsearch_cli.data.qa import load_qa
from zsearch_cli.errors import ZsearchError
from zsearch_cli.progress import progress_bar
from zsearch_cli.config.commands import CollectOptions
from zsearch_cli.rewards import score_answer
from zsearch_cli.rollout.trajectory import Trajectory
from zsearch_cli.artifacts import read_artifact, read_metadata, write_artifact
from zsearch_cli.schemas import COLLECTED_QUERY, TRAJECTORY

console = Console(stderr=True)

TRAJECTORIES_FILE = "trajectories.parquet"
QUERIES_FILE = "queries.parquet"

RESUME_KEYS = ("data", "model", "protocol", "search", "samples_per_question", "temperature", "top_p", "seed",
               "topk", "max_turns")
"""Options that must match the run being resumed: mixing them would make one file
describe two different collections."""


# ----------------------------------------------------------------------------- query rows


def document_text(doc: dict[str, Any]) -> str:
    """COLLECTED_QUERY's document form: ``"title\\ntext"`` (the title line may be empty)."""
    return f"{doc.get('title') or ''}\n{doc.get('text') or ''}"


def query_rows(trajectories: Iterable[Trajectory]) -> list[dict[str, Any]]:
    """One COLLECTED_QUERY row per search the trajectories ran, in trajectory and turn order.

    A turn ran a search exactly when the engine logged its ``doc_ids``; queries of turns
    that ran none (the final turn, an invalid action) returned no documents and are not
    rows. ``correct`` is the EM of the trajectory's final answer against the golds (no
    answer is not correct).
    """
    rows: list[dict[str, Any]] = []
    for t in trajectories:
        correct = score_answer(t.prediction, t.golden_answers)["em"] == 1.0
        for pos, turn in enumerate(t.turns):
            if "doc_ids" not in turn:
                continue
            index = turn.get("turn", pos)
            docs = turn.get("docs")
            if docs is None:
                raise ZsearchError(
                    f"trajectory {t.id!r}: turn {index} logged doc_ids but no docs (it was written before "
                    "zsearch recorded the documents); collect it again"
                )
            queries = list(turn.get("queries") or [])
            if len(docs) != len(queries):
                raise ZsearchError(
                    f"trajectory {t.id!r}: turn {index} has {len(queries)} queries but {len(docs)} result lists"
                )
            for qi, (query, found) in enumerate(zip(queries, docs)):
                rows.append({
                    "id": f"{t.id}/t{index}/q{qi}",
                    "row_id": t.row_id,
                    "trajectory_id": t.id,
                    "sample_index": t.sample_index,
                    "turn": index,
                    "query_index": qi,
                    "question": t.question,
                    "golden_answers": list(t.golden_answers),
                    "query": query,
                    "doc_ids": [d["id"] for d in found],
                    "documents": [document_text(d) for d in found],
                    "prediction": t.prediction,
                    "correct": correct,
                })
    return rows


# ----------------------------------------------------------------------------- the stage


def _build_engine(opts: CollectOptions):
    from zsearch_cli.rollout.build import build_engine

    return build_engine(opts)


def _check_options(opts: CollectOptions) -> None:
    check_options(opts)  # the declared ranges and choices: the same check as the command line's


def _load_previous(path: Path, config: dict[str, Any]) -> list[Trajectory]:
    """The trajectories of an earlier run into the same folder, if its options match."""
    if not path.exists():
        return []
    before = read_metadata(path).get("config", {})
    for key in RESUME_KEYS:
        if key in before and key in config and before[key] != config[key]:
            flag = "--" + key.replace("_", "-")
            raise ZsearchError(
                f"{path}: was collected with {flag} {before[key]!r}, this run has {config[key]!r}; "
                "use another --out, or the same options to resume"
            )
    return [Trajectory.from_row(r) for r in read_artifact(path, TRAJECTORY).to_pylist()]


def _save(trajs: list[Trajectory], out: Path, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Rewrite both files atomically (trajectories first: the queries derive from them)."""
    queries = query_rows(trajs)
    write_artifact([t.to_row() for t in trajs], out / TRAJECTORIES_FILE, TRAJECTORY, config)
    write_artifact(queries, out / QUERIES_FILE, COLLECTED_QUERY, config)
    return queries


def collect(opts: CollectOptions, config: dict[str, Any]) -> dict[str, Any]:
    """Collect (or resume collecting) trajectories and query rows; returns the summary."""
    from zsearch_cli.rollout.engine import QARow

    _check_options(opts)
    qa = load_qa(opts.data if opts.data is not None else demo_qa("train"))  # validate before loading a model
    if opts.limit is not None:
        qa = qa.slice(0, opts.limit)
    rows = [QARow(r["id"], r["question"], r["golden_answers"]) for r in qa.to_pylist()]
    trajs = _load_previous(opts.out / TRAJECTORIES_FILE, config)
    done = {t.row_id for t in trajs}
    todo = sum(r.id not in done for r in rows)
    if done:
        console.print(f"[dim]{len(done)} questions already collected, {todo} to go[/]")
    queries = query_rows(trajs)
    if todo:
        engine = _build_engine(opts)
        with progress_bar(TextColumn("collect"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                          console=console, transient=True) as bar:
            task = bar.add_task("collect", total=todo)
            for step, start in enumerate(range(0, len(rows), opts.batch_size)):
                batch = [r for r in rows[start : start + opts.batch_size] if r.id not in done]
                if not batch:
                    continue
                trajs += engine.rollout(batch, group_size=opts.samples_per_question, step=step,
                                        on_row_done=lambda n: bar.advance(task, n))
                queries = _save(trajs, opts.out, config)  # after every batch: resumable
    elif not (opts.out / QUERIES_FILE).exists() and trajs:
        queries = _save(trajs, opts.out, config)
    summary = summarize(trajs, queries)
    print_summary(summary, opts.out)
    return summary


def summarize(trajs: Sequence[Trajectory], queries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = len(trajs)
    correct = sum(score_answer(t.prediction, t.golden_answers)["em"] == 1.0 for t in trajs)
    return {
        "questions": len({t.row_id for t in trajs}),
        "trajectories": n,
        "answered": sum(t.prediction is not None for t in trajs),
        "correct": correct,
        "searches": sum(t.num_searches for t in trajs),
        "query_rows": len(queries),
        "query_rows_correct": sum(q["correct"] for q in queries),
    }


def print_summary(s: dict[str, Any], out: Path) -> None:
    """The collection at a glance, one metric per line (fits any terminal width)."""
    table = Table(title=f"zsearch collect → {out}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for label, key in (("questions", "questions"), ("trajectories", "trajectories"), ("answered", "answered"),
                       ("EM-correct", "correct"), ("searches", "searches"), ("query rows", "query_rows"),
                       ("query rows from correct trajectories", "query_rows_correct")):
        table.add_row(label, str(s[key]))
    Console().print(table)
    if s["trajectories"] and not s["query_rows"]:
        console.print("[yellow]warning:[/] no trajectory searched, so queries.parquet has no rows")
