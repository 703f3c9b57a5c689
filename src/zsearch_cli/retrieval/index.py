"""Loading and searching an index directory (``zsearch search``, the server, the audit):
:func:`load_index` checks it and :class:`SearchIndex` answers batched top-k queries.

The layout and its seals are in :mod:`.index_format`, the build in :mod:`.index_build`;
the names they made public when all three lived here are imported back below, so
``from zsearch_cli.retrieval.index import build_index`` (and every other such import)
keeps working.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import pyarrow as pa

from zsearch_cli.data.corpus import WITH_CONTENTS, corpus_fingerprint, iter_corpus_batches
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.retrieval.index_build import BM25_PRESETS, DEFAULTS, build_index, parse_kinds, resolve_options
from zsearch_cli.retrieval.index_format import (CORPUS_FILE, FORMAT, KINDS, MANIFEST, PART_SEAL, check_index_files,
                                                open_corpus, read_manifest, rebuild_error)

if TYPE_CHECKING:
    from zsearch_cli.retrieval.bm25 import BM25Searcher

__all__ = [
    "BM25_PRESETS", "CORPUS_FILE", "DEFAULTS", "FORMAT", "KINDS", "MANIFEST", "METHODS", "PART_SEAL", "SearchIndex",
    "build_index", "check_index_files", "load_index", "parse_kinds", "print_search", "read_manifest",
    "resolve_options",
]

METHODS = ("bm25", "dense", "hybrid")
"""The search methods an index may offer (``auto`` picks one of them)."""


def load_index(index_dir: Path, corpus: Path | None = None, *, device: str = "auto",
               n_threads: int | None = None) -> "SearchIndex":
    """Open an index directory. With ``corpus``, first check the index was built from it.

    ``device`` places the query encoder and dense search (auto = CUDA when present);
    ``n_threads`` is bm25s's per-batch thread count (None = one per core, 0 = serial)."""
    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    if corpus is not None:
        expected = manifest["corpus"]["fingerprint"]
        actual = corpus_fingerprint(iter_corpus_batches(corpus))
        if actual != expected:
            raise ZsearchError(
                f"{corpus}: does not match the corpus index {index_dir} was built from "
                f"(fingerprint {actual[:12]} != {expected[:12]}); rebuild with `zsearch index {corpus} --out {index_dir}`"
            )
    return SearchIndex(index_dir, manifest, device=device, n_threads=n_threads)


class SearchIndex:
    """A loaded index: batched, thread-safe top-k search returning :class:`Passage` lists."""

    def __init__(self, index_dir: Path, manifest: dict[str, Any], device: str = "auto",
                 n_threads: int | None = None):
        self.index_dir = Path(index_dir)
        self.manifest = manifest
        kinds = manifest["kinds"]
        self.methods: list[str] = kinds + (["hybrid"] if set(KINDS) <= set(kinds) else [])
        params = hashlib.blake2b(json.dumps(manifest["params"], sort_keys=True).encode(), digest_size=4).hexdigest()
        self.name: str = f"{manifest['corpus']['fingerprint'][:16]}-{'+'.join(kinds)}-{params}"
        check_index_files(self.index_dir, manifest)
        try:
            self._table = open_corpus(self.index_dir / CORPUS_FILE)
        except (pa.ArrowInvalid, OSError) as err:
            raise rebuild_error(self.index_dir, f"{CORPUS_FILE} is unreadable ({err})") from None
        if self._table.num_rows != manifest["n_docs"]:
            raise ZsearchError(f"{self.index_dir}: {CORPUS_FILE} has {self._table.num_rows} rows, "
                               f"the manifest says {manifest['n_docs']}; rebuild the index")
        # Each record batch's (id, title, text) arrays and first row, so a hit is read from
        # its own batch: zero-copy views of the mapped file, nothing loaded up front.
        batches = [b for b in self._table.to_batches() if b.num_rows]
        self._batch_start = np.cumsum([0] + [b.num_rows for b in batches[:-1]], dtype=np.int64)
        self._batch_cols = [tuple(b.column(c) for c in WITH_CONTENTS.names) for b in batches]
        self._bm25 = self._dense = None
        if "bm25" in kinds:
            from zsearch_cli.retrieval.bm25 import BM25Searcher

            self._bm25 = BM25Searcher(self.index_dir / "bm25", manifest["bm25"], n_threads=n_threads)
        if "dense" in kinds:
            from zsearch_cli.retrieval.dense import DenseSearcher

            self._dense = DenseSearcher(self.index_dir / "dense", manifest["dense"], device=device)

    def __len__(self) -> int:
        return self._table.num_rows

    # Read-only views of the parts, for code that works on them (the corpus audit): it then
    # needs none of the private attributes, whose layout is this class's to change.

    @property
    def bm25(self) -> BM25Searcher | None:
        """The BM25 part (its tokenizer, vocabulary and postings), or None for an index built
        without one."""
        return self._bm25

    def column(self, name: str) -> pa.ChunkedArray:
        """A corpus column (``id``, ``title``, ``text`` or ``contents``), zero-copy: its chunks
        point into the memory-mapped ``corpus.arrow``, so a vectorised pass over it (pyarrow
        compute) reads the file's pages and never builds a Python object per row."""
        if name not in WITH_CONTENTS.names:
            raise ZsearchError(f"the corpus has no column {name!r} (it has: {', '.join(WITH_CONTENTS.names)})")
        return self._table.column(name)

    def scan(self) -> Iterator[tuple[int, str, str, str]]:
        """``(row, id, title, text)`` of every passage in corpus order, nulls as ``""``, read
        a record batch at a time: one conversion per column and batch, where :meth:`records`
        reads value by value (right for a few rows, slow for all of them)."""
        for start, (ids, titles, texts, _) in zip(self._batch_start.tolist(), self._batch_cols):
            for j, (pid, title, text) in enumerate(zip(ids.to_pylist(), titles.to_pylist(), texts.to_pylist())):
                yield start + j, pid or "", title or "", text or ""

    def __repr__(self) -> str:
        return f"SearchIndex({str(self.index_dir)!r}, methods={self.methods}, n_docs={len(self)})"

    def resolve_method(self, method: str) -> str:
        """``auto`` -> hybrid when both kinds exist, else the one built; anything else is checked."""
        if method == "auto":
            return "hybrid" if "hybrid" in self.methods else self.methods[0]
        if method not in METHODS:
            raise ZsearchError(f"unknown search method {method!r} (choose from: auto, {', '.join(METHODS)})")
        if method not in self.methods:
            raise ZsearchError(f"index {self.index_dir} has no {method!r} search; it has: {', '.join(self.methods)}")
        return method

    def get(self, row: int) -> Passage:
        """The passage at corpus row ``row`` (score None)."""
        if not 0 <= row < len(self):
            raise ZsearchError(f"row {row} is out of range (the index has {len(self)} passages)")
        (pid, title, text, raw), = self.records([row])
        return Passage(pid, title, text, raw_contents=raw)

    def search(self, queries: Sequence[str], topk: int, method: str = "auto") -> list[list[Passage]]:
        """Top-``topk`` passages for each query, best first.

        Fewer come back only when the corpus is smaller, or for BM25 when fewer passages
        contain a query term (BM25 never returns zero-score passages)."""
        if isinstance(queries, str):
            queries = [queries]
        method = self.resolve_method(method)
        if topk < 1:
            raise ZsearchError(f"topk must be at least 1 (got {topk})")
        queries = list(queries)
        if not queries:
            return []
        k = min(topk, len(self))
        if method == "bm25" and self.manifest["params"].get("bm25_preset") == "pyserini":
            scores, rows = self._search_ties_by_id(queries, k)
        elif method == "bm25":
            scores, rows = self._bm25.search(queries, k)
        elif method == "dense":
            scores, rows = self._dense.search(queries, k)
        else:
            from zsearch_cli.retrieval.hybrid import DEPTH, rrf_fuse_batch

            depth = min(len(self), max(k, DEPTH))
            _, bm25_rows = self._bm25.search(queries, depth)
            _, dense_rows = self._dense.search(queries, depth)
            rows, scores = rrf_fuse_batch(bm25_rows, dense_rows, k)
        return self._passages(rows, scores)

    def _search_ties_by_id(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """BM25 top-``k`` with equal scores ordered by passage id (as a string), not by row:
        Anserini sorts its hits by (score, docid), so this is Pyserini's order. Each query is
        searched deep enough to see every passage tied with its k-th best."""
        n = len(self)
        out_scores = np.zeros((len(queries), k), dtype=np.float32)
        out_rows = np.full((len(queries), k), -1, dtype=np.int64)
        todo, depth = list(range(len(queries))), min(n, 2 * k + 8)
        while todo:
            scores, rows = self._bm25.search([queries[i] for i in todo], depth)
            unresolved = []
            for qi, sc, rw in zip(todo, scores, rows):
                valid = rw >= 0
                sc, rw = sc[valid], rw[valid]
                if len(rw) >= k and depth < n and len(rw) == depth and sc[-1] == sc[k - 1]:
                    unresolved.append(qi)  # the tie at the k-th score may go deeper
                    continue
                if len(rw) > k:
                    keep = sc >= sc[k - 1]
                    sc, rw = sc[keep], rw[keep]
                ids = [rec[0] for rec in self.records(rw)]
                order = sorted(range(len(rw)), key=lambda j: (-float(sc[j]), ids[j]))[:k]
                out_scores[qi, : len(order)] = sc[order]
                out_rows[qi, : len(order)] = rw[order]
            todo, depth = unresolved, min(n, depth * 4)
        return out_scores, out_rows

    def records(self, rows: Sequence[int]) -> list[tuple[str, str, str, str | None]]:
        """``(id, title, text, contents)`` of each corpus row: nulls as ``""``, except the
        raw wiki-18 ``contents``, None for passages given as title/text.

        Read value by value from the row's record batch, zero-copy. ``Table.take`` on the
        chunked columns concatenates all their chunks first: a 50-row take on the 77 MB
        100k-passage bench corpus peaks at 74 MB of heap and takes ~8 ms (on wiki-18 it
        would copy the whole multi-GB corpus per call); a scalar read is ~1 us.
        """
        rows = np.asarray(rows, dtype=np.int64)
        where = np.searchsorted(self._batch_start, rows, side="right") - 1
        local = rows - self._batch_start[where]
        cols = self._batch_cols
        out = []
        for b, j in zip(where.tolist(), local.tolist()):
            pid, title, text, raw = (col[j].as_py() for col in cols[b])
            out.append((pid or "", title or "", text or "", raw))
        return out

    def _passages(self, rows: Sequence[Sequence[int]], scores: Sequence[Sequence[float]]) -> list[list[Passage]]:
        """The hits of each query (rows >= 0) as :class:`Passage` lists, read in one pass."""
        kept = [[(int(r), float(s)) for r, s in zip(rr, ss) if r >= 0] for rr, ss in zip(rows, scores)]
        records = iter(self.records([r for hits in kept for r, _ in hits]))
        passages = []
        for hits in kept:
            row_passages = []
            for _, s in hits:
                pid, title, text, raw = next(records)
                row_passages.append(Passage(pid, title, text, s, raw_contents=raw))
            passages.append(row_passages)
        return passages


def print_search(query: str, index_dir: Path, method: str = "auto", topk: int = 3) -> None:
    """Search one query and print a rich table (rank, score, id, title, text snippet)."""
    from rich.console import Console
    from rich.table import Table

    index = load_index(index_dir)
    used = index.resolve_method(method)
    hits = index.search([query], topk, used)[0]
    table = Table(title=f"{used} top-{topk} for {query!r}", title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("score", justify="right")
    table.add_column("id", no_wrap=True)
    table.add_column("title")
    table.add_column("text")
    for rank, p in enumerate(hits, start=1):
        snippet = p.text if len(p.text) <= 160 else p.text[:157].rstrip() + "..."
        table.add_row(str(rank), f"{p.score:.4f}" if p.score is not None else "", p.id, p.title, snippet)
    console = Console()
    console.print(table)
    if not hits:
        console.print("no passage contains any query term" if used == "bm25" else "no results")
