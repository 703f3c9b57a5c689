"""The QA sets ``--datasets`` names, resolved to files and keys (``zsearch eval``, ``zsearch audit``).

Datasets are keyed by :func:`zsearch_cli.data.qa.dataset_key` (``nq/test`` for a FlashRAG
file under ``--data-dir``, else the file's path); two inputs with one key are an error. A file
whose ``--group-by`` column (default ``data_source``) holds several values, as Search-R1's
merged test file with its seven benchmarks, becomes one dataset per value, KEY/VALUE: a single
EM over seven benchmarks is not any number a paper reports. ``--pooled`` adds the whole file
as KEY/pooled, labelled as such: an input that names the datasets it pools
(:attr:`DatasetInput.pools`), so that ``zsearch eval`` builds it from their rows instead of
rolling every question out a second time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from zsearch_cli.data.demo import demo_qa
from zsearch_cli.data.qa import (BENCHMARK_SPLITS, NO_GROUPING, dataset_key, find_dataset_file, group_labels,
                                 resolve_datasets, split_groups)
from zsearch_cli.errors import ZsearchError


@dataclass(frozen=True)
class DatasetInput:
    key: str
    """Unique and readable: ``nq/test``, ``demo``, or the file's path (see data/qa.py dataset_key)."""
    split: str | None
    path: Path
    pools: tuple[str, ...] = ()
    """For KEY/pooled: the keys of the datasets whose rows it pools (scored from those rows,
    never rolled out itself); empty for a dataset of its own."""


POOLED = "pooled"
"""The key suffix of a split file scored whole (``--pooled``)."""


def split_by_group(qa_tables: Sequence[tuple[DatasetInput, Any]], group_by: str,
                   pooled: bool) -> tuple[list[tuple[DatasetInput, Any]], list[str]]:
    """Each file whose ``group_by`` column holds several values becomes one input per value
    (key KEY/VALUE, rows in file order), plus KEY/pooled with ``pooled`` (after them, with
    the whole file's rows for their order, and ``pools`` naming them); returns the inputs
    and the lines to print about them. With ``group_by`` none, a file that holds several
    ``data_source`` values stays whole, and a line says so."""
    out: list[tuple[DatasetInput, Any]] = []
    notes: list[str] = []
    for d, qa in qa_tables:
        column = group_by if group_by != NO_GROUPING else "data_source"
        groups = split_groups(qa, group_labels(d.path, qa, column))
        if not groups:
            out.append((d, qa))
        elif group_by == NO_GROUPING:
            out.append((d, qa))
            notes.append(f"{d.key}: holds {len(groups)} data_source values ({', '.join(g for g, _ in groups)}), "
                         "scored as ONE pooled number (--group-by none)")
        else:
            members = [(DatasetInput(f"{d.key}/{label}", d.split, d.path), sub) for label, sub in groups]
            out += members
            if pooled:
                out.append((DatasetInput(f"{d.key}/{POOLED}", d.split, d.path, tuple(m.key for m, _ in members)), qa))
            notes.append(f"{d.key}: {len(groups)} datasets by {group_by} "
                         f"({', '.join(f'{g} {t.num_rows}' for g, t in groups)}), each scored on its own"
                         + (f"; {d.key}/{POOLED} pools them" if pooled else ""))
    seen: set[str] = set()
    for d, _ in out:
        if d.key in seen:
            raise ZsearchError(f"--datasets: two inputs map to dataset key {d.key!r} (a {group_by} value equals "
                               "another input's key); pass that file alone, or use another --group-by")
        seen.add(d.key)
    return out, notes


def dataset_files(spec: str, data_dir: Path, download: bool = False) -> list[DatasetInput]:
    """The QA files ``--datasets`` names, with their keys; two inputs with one key are an error."""
    out: list[DatasetInput] = []
    for name in (["demo"] if spec.strip() == "demo" else resolve_datasets(spec)):
        if name == "demo":
            out.append(DatasetInput("demo", "test", demo_qa("test")))
        elif name in BENCHMARK_SPLITS and not Path(name).is_file():
            path = find_dataset_file(name, BENCHMARK_SPLITS[name], data_dir, download)
            key, split = dataset_key(path, data_dir)
            out.append(DatasetInput(key, split or BENCHMARK_SPLITS[name], path))
        elif name.lower().endswith((".jsonl", ".parquet", ".gz", ".json")) or Path(name).is_file():
            out.append(DatasetInput(*dataset_key(Path(name), data_dir), Path(name)))
        else:
            known = ", ".join(["demo", "all", *BENCHMARK_SPLITS])
            raise ZsearchError(f"unknown dataset {name!r}: use one of {known}, or a QA file path")
    seen: dict[str, Path] = {}
    for d in out:
        if d.key in seen:
            raise ZsearchError(f"--datasets: {seen[d.key]} and {d.path} both map to dataset key {d.key!r}; "
                               "pass each dataset once (or give one of them as a path outside --data-dir)")
        seen[d.key] = d.path
    return out
