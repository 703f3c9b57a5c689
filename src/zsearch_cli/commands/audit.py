"""``zsearch audit``: per dataset, what a QA set can score on an index's corpus.

Datasets are named and keyed as ``zsearch eval`` names and keys them (``nq/test``, ``demo``,
a file path; a file holding several ``data_source`` values is audited per value), and the
files go to OUT/KEY/audit.examples.parquet (one row per question: AUDIT_EXAMPLE) and
OUT/KEY/audit.summary.parquet (AUDIT_SUMMARY), both stamped with the corpus fingerprint,
the QA file's sha256 and the retriever. OUT defaults to INDEX/audit, where ``zsearch eval``
finds the audit of its own index to print the ceiling beside EM.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from zsearch_cli.audit.ceiling import EXAMPLES_FILE, SUMMARY_FILE, default_audit_dir
from zsearch_cli.audit.corpus import (AUDIT_VERSION, RECALL_AT, AnswerLocator, Question, add_support,
                                      audit_questions, summarize_audit)
from zsearch_cli.scoring import dataset_dir
from zsearch_cli.config.commands import AuditOptions
from zsearch_cli.data.datasets import dataset_files, split_by_group
from zsearch_cli.data.qa import load_qa
from zsearch_cli.progress import ProgressLines, heartbeat, progress_bar
from zsearch_cli.protocol import file_fingerprint
from zsearch_cli.retrieval.settings import index_settings
from zsearch_cli.artifacts import write_artifact
from zsearch_cli.schemas import AUDIT_EXAMPLE, AUDIT_SUMMARY


def run_audit(opts: AuditOptions, config: dict[str, Any]) -> list[dict[str, Any]]:
    """Audit every dataset of ``opts`` against ``opts.retrieval.index``; returns the summaries."""
    from zsearch_cli.retrieval.index import load_index

    index_dir, method = Path(opts.retrieval.index), opts.retrieval.method
    files = dataset_files(opts.data.datasets, opts.data.data_dir, opts.data.download)
    qa_tables, notes = split_by_group([(d, load_qa(d.path)) for d in files], opts.data.group_by, pooled=False)
    for line in notes:
        Console(stderr=True).print(line, markup=False, highlight=False)
    with heartbeat("audit", f"loading the index {index_dir}"):
        index = load_index(index_dir)
        method = index.resolve_method(method)
        locator = AnswerLocator(index)
    settings = index_settings(index.manifest, method)
    out = Path(opts.out) if opts.out is not None else default_audit_dir(index_dir)
    summaries = []
    for d, qa in qa_tables:
        if opts.limit is not None:
            qa = qa.slice(0, opts.limit)
        questions = [Question(r["id"], r["question"], list(r["golden_answers"]), r.get("metadata"))
                     for r in qa.to_pylist()]
        started = time.perf_counter()
        with _progress(f"audit {d.key}", len(questions)) as advance:
            rows = audit_questions(locator, questions, d.key, method, advance)
        add_support(index, rows, questions)
        stamp = {"audit_version": AUDIT_VERSION, "corpus_fingerprint": settings["corpus_fingerprint"],
                 "corpus_size": settings["corpus_size"], "index": index.name, "retriever": method,
                 "bm25_k1": settings.get("bm25_k1"), "bm25_b": settings.get("bm25_b"),
                 "bm25_analyzer": settings.get("bm25_analyzer"), "encoder": settings.get("encoder"),
                 "dataset_fingerprint": file_fingerprint(d.path), "split": d.split, "limit": opts.limit}
        summary = {"dataset": d.key, **summarize_audit(rows), "seconds": time.perf_counter() - started, **stamp}
        folder = dataset_dir(out, d.key)
        write_artifact(rows, folder / EXAMPLES_FILE, AUDIT_EXAMPLE, config, stamp)
        write_artifact([summary], folder / SUMMARY_FILE, AUDIT_SUMMARY, config, stamp)
        summaries.append(summary)
    print_audit(summaries, out)
    return summaries


@contextlib.contextmanager
def _progress(label: str, total: int) -> Iterator[Callable[[int], None]]:
    """A bar on a terminal, plain lines in a log file (progress.py); yields ``advance(n)``."""
    console = Console(stderr=True)
    with progress_bar(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=True) as bar, ProgressLines(label, total, "questions") as lines:
        task = bar.add_task(label, total=total)

        def advance(n: int) -> None:
            bar.advance(task, n)
            lines.advance(n)

        yield advance


def print_audit(summaries: list[dict[str, Any]], out: Path) -> None:
    """The summary table (stdout), then where the files are."""
    table = Table(title="zsearch audit")
    columns = ["dataset", "n", "answerable", *(f"R@{k}" for k in RECALL_AT), "support", "seconds"]
    for col in columns:
        table.add_column(col, justify="left" if col == "dataset" else "right", overflow="fold")
    for s in summaries:
        support = "-" if s["support_coverage"] is None else f"{s['support_coverage']:.3f} of {s['support_n']}"
        table.add_row(s["dataset"], str(s["n"]), f"{s['answerable']:.3f}",
                      *(f"{s[f'recall_at_{k}']:.3f}" for k in RECALL_AT), support, f"{s['seconds']:.1f}")
    stdout = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 140)
    stdout.print(table)
    if summaries:
        s = summaries[0]
        stdout.print(f"corpus {s['corpus_fingerprint'][:12]} ({s['corpus_size']} passages), retriever {s['retriever']}"
                     f"; files under {out}", markup=False, highlight=False)
