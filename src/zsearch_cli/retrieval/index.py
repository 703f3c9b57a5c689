"""Index directories: build (``zsearch index``), load, search (``zsearch search``, the server).

Layout of an index directory::

    manifest.json    kinds, corpus fingerprint, n_docs, every parameter, version, time,
                     and corpus.arrow's size in bytes
    corpus.arrow     the corpus as an uncompressed Arrow IPC file, memory-mapped at load
                     so a 21M-passage corpus is never held as Python objects
    bm25/            bm25s's CSC .npy files (or rank-bm25's postings), see bm25.py
    dense/           embeddings.npy (float32 memmap) + index.faiss, see dense.py
    */part.json      each part's own seal: the corpus fingerprint and n_docs it was built
                     from, and every file's size in bytes

Loading checks every seal before touching a file: a part copied in from an index of
another corpus would otherwise return other passages' rows (silently wrong results when
that corpus was smaller), and a missing or truncated file would fail deep inside numpy
or faiss with a traceback. Each mismatch is one "rebuild the index" line naming the file.

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
from zsearch_cli.progress import err_console
from zsearch_cli.data.corpus import WITH_CONTENTS, corpus_fingerprint, iter_corpus_batches
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.schemas import CORPUS, _check_unique

FORMAT = 2
"""2: parts carry a part.json seal and the manifest corpus.arrow's size."""
PART_SEAL = "part.json"
MANIFEST = "manifest.json"
CORPUS_FILE = "corpus.arrow"
KINDS = ("bm25", "dense")
METHODS = ("bm25", "dense", "hybrid")
DEFAULTS: dict[str, Any] = {
    "kind": "bm25", "bm25_backend": "bm25s", "bm25_preset": "zsearch", "k1": 1.2, "b": 0.75,
    "stemmer": "english", "stopwords": "en", "analyzer": "simple", "bm25_norms": "exact",
    "encoder": "minilm", "faiss_type": "Flat", "batch_size": 128, "max_length": 256, "device": "auto",
}
BM25_PRESETS: dict[str, dict[str, Any]] = {
    "zsearch": {},
    # Pyserini's BM25 as Search-R1 and DSPO ran it: Lucene's EnglishAnalyzer chain, Lucene
    # BM25Similarity (one-byte length norms, float32 arithmetic), k1 0.9, b 0.4.
    "pyserini": {"k1": 0.9, "b": 0.4, "stemmer": "porter-lucene", "stopwords": "en", "analyzer": "lucene",
                 "bm25_norms": "lucene"},
}
"""BM25 defaults per ``--bm25-preset``; options given explicitly still win."""


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

    given = {k: v for k, v in (options or {}).items() if k in DEFAULTS and v is not None}
    preset = given.get("bm25_preset", DEFAULTS["bm25_preset"])
    if preset not in BM25_PRESETS:
        raise ZsearchError(f"unknown BM25 preset {preset!r} (choose from: {', '.join(BM25_PRESETS)})")
    opts = {**DEFAULTS, **BM25_PRESETS[preset], **given}
    opts["kind"] = ",".join(parse_kinds(opts["kind"]))
    if opts["bm25_norms"] not in ("exact", "lucene"):
        raise ZsearchError(f"unknown BM25 length norms {opts['bm25_norms']!r} (choose from: exact, lucene)")
    if opts["bm25_norms"] == "lucene" and opts["bm25_backend"] != "bm25s":
        raise ZsearchError("Lucene length norms (--bm25-preset pyserini) need --bm25-backend bm25s")
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
    """A rich progress bar on stderr, plain lines in a log file (progress.py); yields ``advance(n)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from zsearch_cli.progress import ProgressLines

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    unit = "postings" if "postings" in description else "docs"
    with Progress(*columns, console=err_console, transient=True) as progress, \
            ProgressLines(f"index: {description}", total, unit) as lines:
        task = progress.add_task(description, total=total)

        def advance(n: int) -> None:
            progress.advance(task, n)
            lines.advance(n)

        yield advance


def _write_corpus(src: Path, dest: Path) -> tuple[int, str]:
    """Stream ``src`` into ``dest`` (Arrow IPC), fingerprinting on the way; returns (rows, fingerprint)."""
    with pa.OSFile(str(dest), "wb") as sink, pa.ipc.new_file(sink, WITH_CONTENTS) as writer:
        def tee() -> Iterator[pa.RecordBatch]:
            for batch in iter_corpus_batches(src, with_contents=True):
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    except (OverflowError, ValueError):
        return False
    return True


def _clean_stale_temps(out: Path) -> None:
    """Remove temp folders of builds into ``out`` that were killed: their names carry the
    owner's pid (``.NAME.PID.xxxx.tmp``, ``.NAME.old-PID-ns``) and that pid is gone.
    A live owner (a concurrent build) keeps its folder; names without a pid are left alone."""
    prefix = f".{out.name}."
    if not out.parent.is_dir():
        return
    for path in out.parent.iterdir():
        name = path.name
        if not name.startswith(prefix) or not path.is_dir():
            continue
        rest = name[len(prefix):]
        if rest.endswith(".tmp"):
            pid_text = rest.split(".", 1)[0]
        elif rest.startswith("old-"):
            pid_text = rest[4:].split("-", 1)[0]
        else:
            continue
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            shutil.rmtree(path, ignore_errors=True)


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
    tokenizer = Tokenizer(opts["stemmer"], opts["stopwords"], opts["analyzer"]) if "bm25" in kinds else None
    if "dense" in kinds:
        from zsearch_cli.retrieval.dense import check_faiss_type, pick_device, resolve_encoder

        resolve_encoder(opts["encoder"])
        check_faiss_type(opts["faiss_type"].strip())
        pick_device(opts["device"])
    from zsearch_cli.files import mkdtemp_like_mkdir

    _clean_stale_temps(out)
    # The owner's pid is in the name, so a later build can tell a killed build's leftovers
    # from a concurrent live one.
    tmp = mkdtemp_like_mkdir(prefix=f".{out.name}.{os.getpid()}.", suffix=".tmp", dir=out.parent)  # mode as mkdir gives
    try:
        from zsearch_cli.progress import heartbeat

        with heartbeat("index", f"reading the corpus {src}"):
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

            manifest["bm25"] = build_bm25(_corpus_batches(tmp / CORPUS_FILE), n_docs, tmp / "bm25", tokenizer,
                                          float(opts["k1"]), float(opts["b"]), opts["bm25_backend"], _progress,
                                          norms=opts["bm25_norms"])
        if "dense" in kinds:
            from zsearch_cli.retrieval.dense import Encoder, build_dense

            encoder = Encoder(opts["encoder"], opts["device"], int(opts["max_length"]), int(opts["batch_size"]))
            with _progress(f"encode ({encoder.device})", n_docs) as advance:
                manifest["dense"] = build_dense(_corpus_batches(tmp / CORPUS_FILE), n_docs, tmp / "dense",
                                                encoder, opts["faiss_type"], advance)
        manifest["corpus"]["bytes"] = (tmp / CORPUS_FILE).stat().st_size
        for kind in kinds:
            _seal_part(tmp / kind, fingerprint, n_docs)
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2)
        _swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _seal_part(part: Path, fingerprint: str, n_docs: int) -> None:
    """Write ``part/part.json``: what the part was built from, and each file's size."""
    files = {str(f.relative_to(part)): f.stat().st_size for f in sorted(part.rglob("*")) if f.is_file()}
    with open(part / PART_SEAL, "w", encoding="utf-8") as fh:
        json.dump({"corpus_fingerprint": fingerprint, "n_docs": n_docs, "files": files}, fh, indent=2)


def _rebuild(index_dir: Path, what: str) -> ZsearchError:
    return ZsearchError(f"{index_dir}: {what}; rebuild the index with `zsearch index ... --out {index_dir}`")


def check_index_files(index_dir: Path, manifest: dict[str, Any]) -> None:
    """Every part's seal against the manifest, and every file's presence and size."""
    fingerprint, n_docs = manifest["corpus"]["fingerprint"], manifest["n_docs"]
    corpus = index_dir / CORPUS_FILE
    if not corpus.is_file():
        raise _rebuild(index_dir, f"{CORPUS_FILE} is missing")
    if corpus.stat().st_size != manifest["corpus"].get("bytes"):
        raise _rebuild(index_dir, f"{CORPUS_FILE} is {corpus.stat().st_size} bytes, the manifest says "
                                  f"{manifest['corpus'].get('bytes')} (truncated or replaced)")
    for kind in manifest["kinds"]:
        seal_path = index_dir / kind / PART_SEAL
        try:
            with open(seal_path, encoding="utf-8") as fh:
                seal = json.load(fh)
            files = dict(seal["files"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise _rebuild(index_dir, f"{kind}/{PART_SEAL} is missing or unreadable ({type(err).__name__})") from None
        if seal.get("corpus_fingerprint") != fingerprint or seal.get("n_docs") != n_docs:
            raise _rebuild(index_dir, f"part {kind}/ was built from another corpus "
                                      f"({seal.get('n_docs')} passages, fingerprint {str(seal.get('corpus_fingerprint'))[:12]}; "
                                      f"this index: {n_docs} passages, {fingerprint[:12]})")
        for name, size in files.items():
            path = index_dir / kind / name
            if not path.is_file():
                raise _rebuild(index_dir, f"{kind}/{name} is missing")
            if path.stat().st_size != size:
                raise _rebuild(index_dir, f"{kind}/{name} is {path.stat().st_size} bytes, its part.json says "
                                          f"{size} (truncated or replaced)")


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
    if not isinstance(manifest.get("corpus"), dict) or not isinstance(manifest.get("kinds"), list) \
            or not isinstance(manifest.get("n_docs"), int):
        raise ZsearchError(f"{path}: index manifest lacks corpus/kinds/n_docs; rebuild the index")
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
        check_index_files(self.index_dir, manifest)
        try:
            self._table = _open_corpus(self.index_dir / CORPUS_FILE)
        except (pa.ArrowInvalid, OSError) as err:
            raise _rebuild(self.index_dir, f"{CORPUS_FILE} is unreadable ({err})") from None
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
        (pid, title, text, raw), = self._records([row])
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
                ids = [rec[0] for rec in self._records(rw)]
                order = sorted(range(len(rw)), key=lambda j: (-float(sc[j]), ids[j]))[:k]
                out_scores[qi, : len(order)] = sc[order]
                out_rows[qi, : len(order)] = rw[order]
            todo, depth = unresolved, min(n, depth * 4)
        return out_scores, out_rows

    def _records(self, rows: Sequence[int]) -> list[tuple[str, str, str, str | None]]:
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
        records = iter(self._records([r for hits in kept for r, _ in hits]))
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
