"""``zsearch eval --probe``: the eval repeated with counterfactual retrievers
(``search/probes.py``), and what the differences mean.

The ``real`` probe is the plain eval (method ``agent``, its files and rows reused); every
other probe is scored as its own method, ``agent+empty`` …, under OUT/KEY/, with the probe in
its protocol's retriever (``bm25+empty``). After the last dataset each dataset gets one
PROBE_SUMMARY file (OUT/KEY/METHOD.probes.parquet) and one printed table: per probe EM, F1,
subEM, searches and turns per question, and the behaviour measures (audit/behaviour.py);
across probes the search reliance EM(real) − EM(empty) and the gold headroom
EM(gold) − EM(real). The ``gold`` and ``random`` probes read the index's corpus; ``gold``
needs ``zsearch audit`` of the same corpus and QA file (audit/ceiling.py).

This module also looks up that audit for every eval, probes or not, for the ceiling beside EM.
Options read (the one place): ``probe``, ``method``, ``seed``, ``rollout.topk``,
``retrieval.index`` of :class:`~zsearch_cli.config.commands.EvalOptions`.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

from zsearch_cli.audit.behaviour import example_measures, list_warning
from zsearch_cli.audit.ceiling import Ceiling, default_audit_dir, find_ceiling, gold_passages
from zsearch_cli.errors import ZsearchError
from zsearch_cli.protocol import Protocol
from zsearch_cli.artifacts import write_artifact
from zsearch_cli.schemas import PROBE_SUMMARY
from zsearch_cli.search.probes import parse_probes, probe_backend

SEARCHING_METHODS = ("agent", "rag")


class ProbePlan:
    """What one ``zsearch eval`` runs: its probes (``["real"]`` without ``--probe``), the
    audit matched to each dataset, and the per-probe results for the final report."""

    def __init__(self, opts: Any):
        self.method, self.seed = opts.method, int(opts.seed)
        self.topk = int(opts.rollout.topk)
        self.index_dir = Path(opts.retrieval.index) if opts.retrieval.index is not None else Path("runs/index")
        self.explicit = opts.probe is not None
        self.probes = parse_probes(opts.probe) if self.explicit else ["real"]
        if self.explicit and self.method not in SEARCHING_METHODS:
            raise ZsearchError(f"--probe changes what search returns: it needs --method agent or rag "
                               f"(got --method {self.method})")
        self.ceilings: dict[str, Ceiling | None] = {}
        self.results: dict[str, dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]] = {}
        self._corpus: Any = None

    def label(self, probe: str) -> str:
        """The method column and file stem of a probe's results."""
        return self.method if probe == "real" else f"{self.method}+{probe}"

    def protocol(self, probe: str, protocol: Protocol) -> Protocol:
        return protocol if probe == "real" else dataclasses.replace(protocol, retriever=f"{protocol.retriever}+{probe}")

    # ------------------------------------------------------------------ the audit

    def find_ceilings(self, key: str, protocol: Protocol, ids: Sequence[str]) -> Ceiling | None:
        """The matching audit of dataset ``key`` (stored for :meth:`backend`); ``gold`` needs one."""
        found = None
        if self.method in SEARCHING_METHODS:
            found = find_ceiling(default_audit_dir(self.index_dir), key, protocol.as_dict(), ids, self.topk)
        if found is None and "gold" in self.probes:
            raise ZsearchError(f"--probe gold: no audit of {key} matching this eval's corpus and QA file under "
                               f"{default_audit_dir(self.index_dir)}; run `zsearch audit --index {self.index_dir} "
                               f"--datasets ...` with the same datasets first")
        self.ceilings[key] = found
        return found

    def prepare(self, out: Path, key: str, protocol: Protocol, ids: Sequence[str]) -> list[tuple[Path, Protocol]]:
        """Before any model loads: dataset ``key``'s audit (:meth:`find_ceilings`), and the
        example files an earlier run left for its probes, with the protocol each must match."""
        from zsearch_cli.scoring import dataset_dir

        self.find_ceilings(key, protocol, ids)
        files = [(dataset_dir(out, key) / f"{self.label(p)}.examples.parquet", self.protocol(p, protocol))
                 for p in self.probes]
        return [(path, proto) for path, proto in files if path.exists()]

    def protocol_record(self, key: str, protocol: Protocol) -> dict[str, Any]:
        """The protocol metadata of a dataset's files: the protocol, plus the audit it was read against."""
        ceiling = self.ceilings.get(key)
        return {**protocol.as_dict(), **({"audit": ceiling.record()} if ceiling else {})}

    def ceiling_columns(self, key: str) -> dict[str, float | None]:
        """EVAL_SUMMARY's audit columns for dataset ``key``."""
        c = self.ceilings.get(key)
        return {"audit_answerable": c.answerable if c else None, "audit_recall": c.recall if c else None}

    # ------------------------------------------------------------------ backends

    def _corpus_of(self, search: Any) -> Any:
        if self._corpus is None:
            self._corpus = getattr(search, "index", None)
            if self._corpus is None:
                from zsearch_cli.retrieval.index import load_index

                self._corpus = load_index(self.index_dir)
        return self._corpus

    def backend(self, probe: str, search: Any, key: str) -> Any:
        """The search backend dataset ``key`` runs with under ``probe``."""
        if probe in ("real", "empty", "shuffled") or search is None:
            return probe_backend(probe, search) if search is not None else None
        corpus = self._corpus_of(search)
        ceiling = self.ceilings.get(key)
        gold = gold_passages(corpus, ceiling.gold) if probe == "gold" and ceiling else None
        return probe_backend(probe, search, corpus=corpus, seed=self.seed, gold=gold)

    # ------------------------------------------------------------------ results

    def add(self, probe: str, key: str, summary: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        self.results.setdefault(key, {})[probe] = (summary, rows)

    def report(self, out: Path, config: dict[str, Any]) -> list[dict[str, Any]]:
        """Write each dataset's PROBE_SUMMARY and print the probe table (only with ``--probe``)."""
        if not self.explicit:
            return []
        from zsearch_cli.scoring import dataset_dir

        written = []
        for key, by_probe in self.results.items():
            em = {p: s["em"] for p, (s, _) in by_probe.items()}
            rows = []
            for probe, (summary, examples) in by_probe.items():
                rows.append({"dataset": key, "method": self.label(probe), "probe": probe, "n": summary["n"],
                             **{k: summary[k] for k in ("em", "f1", "subem", "avg_searches", "avg_turns")},
                             **example_measures(examples),
                             "reliance": em["real"] - em["empty"] if {"real", "empty"} <= set(em) else None,
                             "gold_headroom": em["gold"] - em["real"] if {"real", "gold"} <= set(em) else None})
            real = by_probe.get("real", next(iter(by_probe.values())))[0]
            write_artifact(rows, dataset_dir(out, key) / f"{self.method}.probes.parquet", PROBE_SUMMARY, config,
                           self.protocol_record(key, _protocol_of(real)))
            written += rows
        print_probes(written)
        return written


def _protocol_of(summary: dict[str, Any]) -> Protocol:
    return Protocol(**{f.name: summary.get(f.name) for f in dataclasses.fields(Protocol)})


def print_probes(rows: Sequence[dict[str, Any]]) -> None:
    """One table over every dataset and probe, then reliance / headroom and warnings per dataset."""
    if not rows:
        return

    def num(v: Any, fmt: str = ".3f") -> str:
        return "-" if v is None else format(v, fmt)

    table = Table(title="zsearch eval --probe")
    cols = ("dataset", "probe", "EM", "F1", "subEM", "searches", "turns", "attributed", "over-search",
            "under-search", "subEM-EM")
    for col in cols:
        table.add_column(col, justify="left" if col in ("dataset", "probe") else "right", overflow="fold")
    for r in rows:
        table.add_row(r["dataset"], r["probe"], num(r["em"]), num(r["f1"]), num(r["subem"]),
                      num(r["avg_searches"], ".2f"), num(r["avg_turns"], ".2f"), num(r["answer_attribution"]),
                      num(r["over_search"]), num(r["under_search"]), num(r["subem_em_gap"]))
    stdout = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 140)
    stdout.print(table)
    lines = []
    for key in dict.fromkeys(r["dataset"] for r in rows):
        first = next(r for r in rows if r["dataset"] == key)
        lines.append(f"{key}: search reliance EM(real)-EM(empty) {num(first['reliance'], '+.3f')}, "
                     f"gold headroom EM(gold)-EM(real) {num(first['gold_headroom'], '+.3f')}")
        lines += [w for r in rows if r["dataset"] == key
                  for w in [list_warning(key, r["probe"], r)] if w is not None]
    for line in lines:
        stdout.print(line, markup=False, highlight=False)
