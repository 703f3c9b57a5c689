"""Averages over benchmarks, labelled as papers print them (docs/methods.md §1.5).

Papers report the 7-set average (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue, Bamboogle)
two ways, often without saying which: FactAgent's "51.2" is the mean weighted by test-set
size, its plain mean is 46.0. A 5-point gap decides a state-of-the-art claim, so zsearch
never prints an unlabelled average; it prints and records both, under these labels:

- ``avg (plain)``: (1/k) Σ_i s_i, each dataset counted once;
- ``avg (weighted by n)``: Σ_i n_i s_i / Σ_i n_i, which is the pooled mean over all their
  questions.

n_i is the number of questions scored from dataset i's file, never a number from a table:
a file of another version, or a ``--limit`` subset, is weighted by what was scored. Under
``--limit`` the weights are the scored counts (equal limits give equal weights, so the two
averages nearly agree), and the average rows and the printed lines are marked partial: no
paper's full-set number. :data:`STANDARD_SIZES` is for labelling only (``100 of 3610``).

Each average is an EVAL_SUMMARY row: ``dataset`` is its label, ``average`` says which
(``plain`` / ``weighted by n``), ``datasets``, ``sizes`` and ``dataset_em`` list what it
averages, each set's n beside its EM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Collection, Sequence

from zsearch_cli.data.qa import BENCHMARK_SPLITS
from zsearch_cli.protocol import PROTOCOL_FIELDS

PLAIN = "plain"
WEIGHTED = "weighted by n"
KINDS = (PLAIN, WEIGHTED)


def label(kind: str) -> str:
    """``avg (plain)`` / ``avg (weighted by n)``: the one spelling of each, everywhere."""
    return f"avg ({kind})"


PLAIN_LABEL, WEIGHTED_LABEL = label(PLAIN), label(WEIGHTED)

STANDARD_SIZES: dict[str, int] = {
    "nq": 3610, "triviaqa": 11313, "popqa": 14267,             # test
    "hotpotqa": 7405, "2wikimultihopqa": 12576, "musique": 2417,  # dev
    "bamboogle": 125,                                           # test
}
"""The seven evaluation sets' sizes in FlashRAG's files (the splits of data/qa.py
BENCHMARK_SPLITS), 51,713 questions: for labelling a partial run, never as weights."""

_ALIASES = {"2wiki": "2wikimultihopqa"}
_SPLIT_WORDS = frozenset({"train", "dev", "test", "val", "validation"})
SCORES = ("em", "f1", "subem", "answered", "avg_searches", "avg_turns", "avg_tokens")
"""The EVAL_SUMMARY columns an average row averages (each the same way)."""


def benchmark_of(key: str) -> str | None:
    """The standard benchmark a dataset key is the evaluation set of (``nq/test``,
    ``test.parquet/nq``, ``data/nq_test.jsonl`` -> ``nq``); None for any other data, and for
    another split of a benchmark (``nq/dev`` is not the 3,610 of NQ test)."""
    parts = [p.split(".")[0].lower() for p in key.split("/")]
    for i in range(len(parts) - 1, -1, -1):
        name, _, split = parts[i].rpartition("_")  # a flat nq_test.jsonl
        if not (split in _SPLIT_WORDS and _ALIASES.get(name, name) in STANDARD_SIZES):
            after = parts[i + 1] if i + 1 < len(parts) else ""  # FlashRAG's nq/test.jsonl
            name, split = parts[i], after if after in _SPLIT_WORDS else ""
        name = _ALIASES.get(name, name)
        if name in STANDARD_SIZES:  # no split named (a merged file's part): the evaluation set
            return name if split in ("", BENCHMARK_SPLITS[name]) else None
    return None


def standard_size(key: str) -> int | None:
    name = benchmark_of(key)
    return STANDARD_SIZES[name] if name else None


def mean(values: Sequence[float], weights: Sequence[float]) -> float:
    total = sum(weights)
    return sum(w * v for v, w in zip(values, weights)) / total if total else 0.0


def average_rows(summaries: Sequence[dict[str, Any]], leave_out: Collection[str] = ()) -> list[dict[str, Any]]:
    """Two EVAL_SUMMARY rows, plain then weighted by n, for each method with at least two
    datasets among ``summaries`` (rows of one run). ``leave_out``: keys whose questions are
    already in others (KEY/pooled), which would count twice."""
    by_method: dict[str, list[dict[str, Any]]] = {}
    for s in summaries:
        if s.get("average") is None and s["dataset"] not in leave_out:
            by_method.setdefault(s["method"], []).append(s)
    out = []
    for method, members in by_method.items():
        if len(members) < 2:
            continue
        sizes = [int(s["n"]) for s in members]
        standard = [s.get("standard_n") or standard_size(s["dataset"]) for s in members]
        shared = {f: members[0].get(f) for f in PROTOCOL_FIELDS
                  if all(s.get(f) == members[0].get(f) for s in members)}  # a field that differs is null
        marks = [s.get("full_set") for s in members]  # validation summaries have none
        full = None if all(m is None for m in marks) else all(m is not False for m in marks)
        for kind, weights in ((PLAIN, [1] * len(sizes)), (WEIGHTED, sizes)):
            out.append({**shared, "dataset": label(kind), "method": method, "model": shared.get("model"),
                        "n": sum(sizes), "missing": sum(int(s.get("missing") or 0) for s in members),
                        **{k: mean([s[k] for s in members], weights) for k in SCORES},
                        "full_set": full, "average": kind,
                        "standard_n": None if None in standard else sum(x for x in standard if x),
                        "datasets": [s["dataset"] for s in members], "sizes": sizes,
                        "dataset_em": [float(s["em"]) for s in members]})
    return out


def write_averages(out: Path, rows: Sequence[dict[str, Any]], config: dict[str, Any]) -> list[Path]:
    """OUT/METHOD.averages.summary.parquet, each method's two rows: beside the dataset
    folders, where ``*.summary.parquet`` (em.png, ``export --eval``) finds them."""
    from zsearch_cli.artifacts import write_artifact
    from zsearch_cli.schemas import EVAL_SUMMARY

    return [write_artifact([r for r in rows if r["method"] == m], Path(out) / f"{m}.averages.summary.parquet",
                           EVAL_SUMMARY, config) for m in dict.fromkeys(r["method"] for r in rows)]


def n_cell(row: dict[str, Any]) -> str:
    """The n a table prints: a dataset's scored count (``of`` its standard size when partial
    or different), an average's sets and questions."""
    k = len(row.get("datasets") or ())
    partial = row.get("full_set") is False
    if row.get("average") == PLAIN:
        return f"{k} sets" + (" (partial)" if partial else "")
    if row.get("average") == WEIGHTED:
        return f"{row['n']} in {k} sets" + (" (partial)" if partial else "")
    n, std = row["n"], row.get("standard_n")
    if partial:
        return f"{n}" + (f" of {std}" if std else "") + f" (--limit {row.get('limit')})"
    return f"{n}" + (f" (standard {std})" if std and std != n else "")


def legend(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Lines under a table with average rows: what each label means, every set's EM beside
    its n, and whether the run was partial."""
    lines = []
    for r in rows:
        if r.get("average") != PLAIN:
            continue
        sets = list(zip(r["datasets"], r["sizes"], r["dataset_em"]))
        seven = ("; the 7 standard sets" if sorted(filter(None, map(benchmark_of, r["datasets"])))
                 == sorted(STANDARD_SIZES) and len(sets) == 7 else "")
        lines.append(f"{r['method']}: {PLAIN_LABEL} = the mean over {len(sets)} datasets, each counted once; "
                     f"{WEIGHTED_LABEL} = each weighted by n, the questions scored from its file (the pooled mean of "
                     f"{r['n']}){seven}. EM (n): " + ", ".join(f"{d} {em:.3f} ({n})" for d, n, em in sets))
        if r.get("full_set") is False:
            sizes = ", ".join(f"{d} {n}" + (f" of {standard_size(d)}" if standard_size(d) else "") for d, n, _ in sets)
            lines.append(f"{r['method']}: PARTIAL run (--limit): the weights are the questions scored ({sizes}), "
                         f"not the test-set sizes, so {WEIGHTED_LABEL} is not a paper's full-set number")
    return lines
