"""Index directories: build (``zsearch index``), load, search (``zsearch search``, the server).

Layout of an index directory::

    manifest.json    kinds, corpus fingerprint, n_docs, every parameter, version, time
    corpus.arrow     the corpus as an uncompressed Arrow IPC file, memory-mapped at load
                     so a 21M-passage corpus is never held as Python objects
    bm25/            bm25s's CSC .npy files (or rank-bm25's postings), see bm25.py
    dense/           embeddings.npy (float32 memmap) + index.faiss, see dense.py

A build writes everything into a temporary sibling directory and renames it over the
target only once complete, so a crash never leaves a half-written index behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from zsearch_cli import __version__
from zsearch_cli.config import err_console
from zsearch_cli.data.corpus import corpus_fingerprint, iter_corpus_batches
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.schemas import CORPUS, _check_unique

FORMAT = 1
MANIFEST = "manifest.json"
CORPUS_FILE = "corpus.arrow"
KINDS = ("bm25", "dense")
METHODS = ("bm25", "dense", "hybrid")
DEFAULTS: dict[str, Any] = {
    "kind": "bm25", "bm25_backend": "bm25s", "k1": 1.2, "b": 0.75, "stemmer": "english",
    "stopwords": "en", "encoder": "minilm", "faiss_type": "Flat", "batch_size": 128,
    "max_length": 256, "device": "auto",
}


# ----------------------------------------------------------------------------- options


def parse_kinds(kind: str | Sequence[str]) -> list[str]:
    """``'hybrid'`` / ``'bm25,dense'`` / ``['dense']`` -> kinds in canonical order."""
    parts = kind.split(",") if isinstance(kind, str) else list(kind)
    kinds: set[str] = set()
    for part in (p.strip().lower() for p in parts):
        if part == "hybrid":
            kinds.update(KINDS)
        elif part in KINDS:
            kinds.add(part)
        elif part:
            raise ZsearchError(f"unknown index kind {part!r} (choose from: bm25, dense, hybrid)")
    if not kinds:
        raise ZsearchError("no index kind given (choose from: bm25, dense, hybrid)")
    return [k for k in KINDS if k in kinds]


def resolve_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """Defaults for missing keys, plus the checks a typo should fail fast on (before any work)."""
    from zsearch_cli.retrieval.bm25 import BACKENDS

    opts = {**DEFAULTS, **{k: v for k, v in (options or {}).items() if k in DEFAULTS and v is not None}}
    opts["kind"] = ",".join(parse_kinds(opts["kind"]))
    if opts["bm25_backend"] not in BACKENDS:
        raise ZsearchError(f"unknown BM25 backend {opts['bm25_backend']!r} (choose from: {', '.join(BACKENDS)})")
    if not float(opts["k1"]) >= 0 or not 0 <= float(opts["b"]) <= 1:
        raise ZsearchError(f"BM25 needs k1 >= 0 and 0 <= b <= 1 (got k1={opts['k1']}, b={opts['b']})")
    for key in ("batch_size", "max_length"):
        if int(opts[key]) < 1:
            raise ZsearchError(f"{key} must be at least 1 (got {opts[key]})")
    return opts


# ----------------------------------------------------------------------------- build


@contextlib.contextmanager
def _progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr; yields ``advance(n)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err_console, transient=True) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


def _write_corpus(src: Path, dest: Path) -> tuple[int, str]:
    """Stream ``src`` into ``dest`` (Arrow IPC), fingerprinting on the way; returns (rows, fingerprint)."""
    with pa.OSFile(str(dest), "wb") as sink, pa.ipc.new_file(sink, CORPUS.schema) as writer:
        def tee() -> Iterator[pa.RecordBatch]:
            for batch in iter_corpus_batches(src):
                writer.write_batch(batch)
                yield batch

        fingerprint = corpus_fingerprint(tee())
    table = _open_corpus(dest)
    if table.num_rows == 0:
        raise ZsearchError(f"{src}: file has no rows (expected a corpus)")
    _check_unique(table.column("id"), "id", str(src))
    return table.num_rows, fingerprint


def _open_corpus(path: Path) -> pa.Table:
    """Zero-copy: the table's buffers point into the memory-mapped file."""
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


def _corpus_batches(path: Path) -> Iterator[pa.RecordBatch]:
    reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
    for i in range(reader.num_record_batches):
        yield reader.get_batch(i)


def _check_target(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ZsearchError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise ZsearchError(f"{out}: exists and is not a zsearch index; refusing to overwrite it")


def _swap_in(tmp: Path, out: Path) -> None:
    """Rename the finished build over ``out`` (the old index, if any, is removed after)."""
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        os.rename(out, old)
    os.rename(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build_index(corpus: Path | None, out: Path, options: dict) -> Path:
    """Build the index kinds in ``options['kind']`` over ``corpus`` into directory ``out``.

    ``corpus`` None means the bundled demo corpus. ``options`` is the CLI's resolved options
    dict; missing keys take :data:`DEFAULTS`. Returns ``out``.
    """
    from zsearch_cli.data.demo import demo_corpus
    from zsearch_cli.retrieval.tokenize import Tokenizer

    opts = resolve_options(options)
    kinds = parse_kinds(opts["kind"])
    src = Path(corpus) if corpus is not None else demo_corpus()
    out = Path(out)
    _check_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Catch option mistakes now, not after ingesting (and tokenizing) a 21M-passage corpus.
    tokenizer = Tokenizer(opts["stemmer"], opts["stopwords"]) if "bm25" in kinds else None
    if "dense" in kinds:
        from zsearch_cli.retrieval.dense import check_faiss_type, pick_device, resolve_encoder

        resolve_encoder(opts["encoder"])
        check_faiss_type(opts["faiss_type"].strip())
        pick_device(opts["device"])
    from zsearch_cli.files import mkdtemp_like_mkdir

    tmp = mkdtemp_like_mkdir(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)  # mode as mkdir gives
    try:
        n_docs, fingerprint = _write_corpus(src, tmp / CORPUS_FILE)
        manifest: dict[str, Any] = {
            "format": FORMAT, "zsearch_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "kinds": kinds, "n_docs": n_docs,
            "corpus": {"fingerprint": fingerprint, "source": str(src), "file": CORPUS_FILE},
            "params": opts,
        }
        if tokenizer is not None:
            from zsearch_cli.retrieval.bm25 import build_bm25

            with _progress("BM25 tokenize", n_docs) as advance:
                manifest["bm25"] = build_bm25(_corpus_batches(tmp / CORPUS_FILE), n_docs, tmp / "bm25", tokenizer,
                                              float(opts["k1"]), float(opts["b"]), opts["bm25_backend"], advance)
        if "dense" in kinds:
            from zsearch_cli.retrieval.dense import Encoder, build_dense

            encoder = Encoder(opts["encoder"], opts["device"], int(opts["max_length"]), int(opts["batch_size"]))
            with _progress(f"encode ({encoder.device})", n_docs) as advance:
                manifest["dense"] = build_dense(_corpus_batches(tmp / CORPUS_FILE), n_docs, tmp / "dense",
                                                encoder, opts["faiss_type"], advance)
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2)
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# ----------------------------------------------------------------------------- load / search


def read_manifest(index_dir: Path) -> dict[str, Any]:
    path = Path(index_dir) / MANIFEST
    if not path.is_file():
        raise ZsearchError(f"{index_dir}: not a zsearch index (no {MANIFEST}); build one with `zsearch index`")
    try:
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
    except (OSError, json.JSONDecodeError) as err:
        raise ZsearchError(f"{path}: unreadable index manifest ({err})") from None
    if manifest.get("format") != FORMAT:
        raise ZsearchError(f"{path}: index format {manifest.get('format')!r} is not {FORMAT}; rebuild the index")
    return manifest


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
        self._table = _open_corpus(self.index_dir / CORPUS_FILE)
        if self._table.num_rows != manifest["n_docs"]:
            raise ZsearchError(f"{self.index_dir}: {CORPUS_FILE} has {self._table.num_rows} rows, "
                               f"the manifest says {manifest['n_docs']}; rebuild the index")
        # Each record batch's (id, title, text) arrays and first row, so a hit is read from
        # its own batch: zero-copy views of the mapped file, nothing loaded up front.
        batches = [b for b in self._table.to_batches() if b.num_rows]
        self._batch_start = np.cumsum([0] + [b.num_rows for b in batches[:-1]], dtype=np.int64)
        self._batch_cols = [tuple(b.column(c) for c in ("id", "title", "text")) for b in batches]
        self._bm25 = self._dense = None
        if "bm25" in kinds:
            from zsearch_cli.retrieval.bm25 import BM25Searcher

            self._bm25 = BM25Searcher(self.index_dir / "bm25", manifest["bm25"], n_threads=n_threads)
        if "dense" in kinds:
            from zsearch_cli.retrieval.dense import DenseSearcher

            self._dense = DenseSearcher(self.index_dir / "dense", manifest["dense"], device=device)

    def __len__(self) -> int:
        return self._table.num_rows

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
        (pid, title, text), = self._records([row])
        return Passage(pid, title, text)

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
        if method == "bm25":
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

    def _records(self, rows: Sequence[int]) -> list[tuple[str, str, str]]:
        """``(id, title, text)`` of each corpus row, nulls as ``""``.

        Read value by value from the row's record batch, zero-copy. ``Table.take`` on the
        chunked columns concatenates all their chunks first: a 50-row take on the 77 MB
        100k-passage bench corpus peaks at 74 MB of heap and takes ~8 ms (on wiki-18 it
        would copy the whole multi-GB corpus per call); a scalar read is ~1 us.
        """
        rows = np.asarray(rows, dtype=np.int64)
        where = np.searchsorted(self._batch_start, rows, side="right") - 1
        local = rows - self._batch_start[where]
        cols = self._batch_cols
        return [tuple(col[j].as_py() or "" for col in cols[b]) for b, j in zip(where.tolist(), local.tolist())]

    def _passages(self, rows: Sequence[Sequence[int]], scores: Sequence[Sequence[float]]) -> list[list[Passage]]:
        """The hits of each query (rows >= 0) as :class:`Passage` lists, read in one pass."""
        kept = [[(int(r), float(s)) for r, s in zip(rr, ss) if r >= 0] for rr, ss in zip(rows, scores)]
        records = iter(self._records([r for hits in kept for r, _ in hits]))
        return [[Passage(*next(records), s) for _, s in hits] for hits in kept]


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
