"""What ``zsearch eval`` prints and draws: the summary table with its protocol lines, and the
EM bar chart (OUT/em.png)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

from zsearch_cli.averages import KINDS, label, legend, n_cell
from zsearch_cli.protocol import Protocol
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import EVAL_SUMMARY

# A log file or pipe gets rich's default 80 columns, which squeezes the 10-column table
# into one letter per line; a terminal keeps its own width.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)


def print_summaries(summaries: Sequence[dict[str, Any]], protocols: Sequence[Protocol] = (),
                    averages: Sequence[dict[str, Any]] = ()) -> None:
    """The table (each set's n beside its EM; a subset is marked in n), its average rows
    labelled ``avg (plain)`` / ``avg (weighted by n)`` with a legend (averages.py), then
    one protocol line per distinct protocol."""
    if not summaries:
        return
    table = Table(title="zsearch eval")
    audited = any(s.get("audit_answerable") is not None for s in summaries)  # `zsearch audit`: the ceiling
    for col in ("dataset", "method", "n", "EM", *(("ceiling", f"R@{summaries[0].get('topk')}") if audited
                                                  else ()), "F1", "subEM", "missing",
                "answered", "searches", "turns"):
        # fold, never cut with an ellipsis: a dataset key must stay readable in a narrow terminal
        table.add_column(col, justify="left" if col in ("dataset", "method") else "right", overflow="fold")
    rows = [*summaries, *averages]
    for i, s in enumerate(rows):
        ceiling = [f"{v:.3f}" if v is not None else "-" for v in (s.get("audit_answerable"), s.get("audit_recall"))]
        table.add_row(s["dataset"], s["method"], n_cell(s), f"{s['em']:.3f}",
                      *(ceiling if audited else ()), f"{s['f1']:.3f}", f"{s['subem']:.3f}", str(s.get("missing", 0)),
                      f"{s['answered']:.2f}", f"{s['avg_searches']:.2f}", f"{s['avg_turns']:.2f}",
                      end_section=i == len(summaries) - 1 and bool(averages))
    stdout = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 140)  # a log: 140, not 80, columns
    stdout.print(table)
    lines = legend(averages)
    for p in protocols:
        if p.decoding == "unknown":
            line = (f"protocol: predictions scored with metric {p.metric_version}; model, retriever and decoding "
                    "unknown (another system's output)")
        else:
            line = p.one_line()
        if line not in lines:
            lines.append(line)
    for line in lines:
        stdout.print(line, markup=False, highlight=False)


def plot_em(out: Path) -> Path | None:
    """A bar chart of EM per dataset, one bar per method, from every summary under ``out``;
    the averages (OUT/METHOD.averages.summary.parquet) last, under the table's labels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for p in sorted(out.rglob("*.summary.parquet")) for r in read_artifact(p, EVAL_SUMMARY).to_pylist()]
    if not rows:
        return None
    kinds = {r["average"] for r in rows if r.get("average")}
    datasets = sorted({r["dataset"] for r in rows if not r.get("average")}) + [label(k) for k in KINDS if k in kinds]
    methods = sorted({r["method"] for r in rows})
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(datasets) * len(methods)), 3.5))
    for j, m in enumerate(methods):
        em = {r["dataset"]: r["em"] for r in rows if r["method"] == m}
        xs = [i + j * width for i in range(len(datasets))]
        color = f"C{j % 10}"
        # The edge draws a zero-height bar as a line at 0: an all-zero result shows its bars.
        bars = ax.bar(xs, [em.get(d, 0.0) for d in datasets], width=width, label=m, color=color,
                      edgecolor=color, linewidth=2)
        ax.bar_label(bars, labels=[f"{em[d]:.3f}" if d in em else "" for d in datasets], fontsize=8, padding=2)
    ax.set_xticks([i + width * (len(methods) - 1) / 2 for i in range(len(datasets))], datasets)
    ax.set_ylabel("EM")
    ax.set_ylim(0, 1.1)  # room for the value labels above a bar at 1.0
    ax.legend()
    fig.tight_layout()
    path = out / "em.png"
    tmp = out / ".em.png.tmp.png"
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return path
