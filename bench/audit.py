"""Audit benchmark: ``zsearch audit`` of a question set against synthetic corpora of growing size.

    .venv/bin/python bench/audit.py --docs 100000,1000000,3000000 --questions 3610 --cores 2

A printed table, never a timed test. The goal (issue 27): 3,610 questions (NQ test's size)
against 3M passages in 5 minutes or less on 2 cores. Corpora are bench/bm25.py's seeded
``questions`` corpora (a realistic Zipf vocabulary with English function words at the head,
80-120 words per passage); the question set mixes what the audit meets in practice:

* 70% answerable: a 1-3 word span of a drawn passage (a name or a phrase) with a question
  shaped like bench/bm25.py's, made from the same passage's content words;
* 20% unanswerable: two or three frequent words that do occur in the corpus, in an order that
  may not (many candidates to read: the audit's worst case);
* 10% a single frequent word (found in the first passages read).

The index is built once per size (its time is printed apart, not counted); the audit runs in a
fresh subprocess pinned to ``--cores`` cores. With several sizes, a least-squares line in the
passage count extrapolates the audit's seconds to 21,015,324 passages (wiki-18).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bm25 import FUNCTION, WIKI18, _query, make_data  # bench/bm25.py: bench/ is sys.path[0] here

GOAL_S, GOAL_DOCS, GOAL_QUESTIONS = 300.0, 3_000_000, 3610


def make_questions(root: Path, n_docs: int, n_questions: int, seed: int = 1) -> None:
    """``root/qa.jsonl`` from ``root/corpus.jsonl`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    n_span, n_frequent = int(n_questions * 0.7), int(n_questions * 0.1)
    picked = set(rng.choice(n_docs, size=n_span, replace=False).tolist())
    rows, head = [], []
    with open(root / "corpus.jsonl", encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i < 2000:
                head += json.loads(line)["text"].split()
            if i in picked:
                words = np.array(json.loads(line)["text"].split())
                size = int(rng.integers(1, 4))
                at = int(rng.integers(0, max(1, len(words) - size)))
                rows.append((_query(rng, words, "questions"), " ".join(words[at : at + size])))
    common = [w for w, _ in Counter(w for w in head if w not in FUNCTION).most_common(200)]
    while len(rows) < n_span + (n_questions - n_span - n_frequent):
        words = rng.choice(common, size=int(rng.integers(2, 4)), replace=False)
        rows.append((f"what is {' '.join(words)}?", " ".join(words)))
    while len(rows) < n_questions:
        word = str(rng.choice(common[:20]))
        rows.append((f"which {word} came first?", word))
    with open(root / "qa.jsonl", "w", encoding="utf-8") as fh:
        for i, (question, answer) in enumerate(rows):
            fh.write(json.dumps({"id": f"q{i}", "question": question, "golden_answers": [answer]}) + "\n")


def worker(root: Path, cores: int) -> dict:
    """The audit alone, in this process, on ``cores`` cores; its seconds and numbers."""
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:cores]))
    from zsearch_cli.commands.audit import run_audit
    from zsearch_cli.config.commands import AuditOptions
    from zsearch_cli.config.fields import build

    t = time.perf_counter()
    (summary,) = run_audit(build(AuditOptions, {"index": root / "index", "datasets": str(root / "qa.jsonl"),
                                                "out": root / "audit"}), {})
    return {"seconds": time.perf_counter() - t, **{k: summary[k] for k in ("n", "answerable", "recall_at_10")}}


def run_size(args, n_docs: int, console) -> dict:
    with tempfile.TemporaryDirectory(prefix="zsearch-audit-bench-", dir=args.tmp) as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        make_data(root, n_docs, 1, "questions")
        make_questions(root, n_docs, args.questions)
        console.print(f"data: {n_docs:,} passages, {args.questions:,} questions ({time.perf_counter() - t:.0f}s)")
        from zsearch_cli.retrieval.index import build_index

        t = time.perf_counter()
        build_index(root / "corpus.jsonl", root / "index", {"kind": "bm25"})
        index_s = time.perf_counter() - t
        proc = subprocess.run([sys.executable, __file__, "--worker", str(root), "--cores", str(args.cores)],
                              capture_output=True, text=True, check=True)
        result = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"docs": n_docs, "index_s": index_s, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", default="100000", help="comma-separated corpus sizes")
    parser.add_argument("--questions", type=int, default=GOAL_QUESTIONS)
    parser.add_argument("--cores", type=int, default=2, help="cores the audit may use (CPU affinity)")
    parser.add_argument("--tmp", default=None, help="where corpora and indexes go (default: system temp)")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.cores)))
        return

    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 140)
    rows = [run_size(args, int(d), console) for d in args.docs.split(",")]
    table = Table(title=f"zsearch audit, {args.questions:,} questions, {args.cores} cores")
    for col in ("passages", "index build s", "audit s", "questions/s", "answerable", "R@10"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(f"{r['docs']:,}", f"{r['index_s']:.0f}", f"{r['seconds']:.1f}", f"{r['n'] / r['seconds']:,.0f}",
                      f"{r['answerable']:.3f}", f"{r['recall_at_10']:.3f}")
    console.print(table)
    for r in rows:
        if r["docs"] == GOAL_DOCS:
            scaled = r["seconds"] * GOAL_QUESTIONS / r["n"]
            console.print(f"goal: {GOAL_QUESTIONS:,} questions on {GOAL_DOCS:,} passages in <= {GOAL_S:.0f} s: "
                          f"{scaled:.0f} s ({'met' if scaled <= GOAL_S else 'NOT met'})")
    if len(rows) >= 2:
        slope, icpt = np.polyfit([r["docs"] for r in rows], [r["seconds"] * GOAL_QUESTIONS / r["n"] for r in rows], 1)
        console.print(f"extrapolated to {WIKI18:,} passages (a line through {len(rows)} sizes): "
                      f"{slope * WIKI18 + icpt:.0f} s for {GOAL_QUESTIONS:,} questions")


if __name__ == "__main__":
    main()
