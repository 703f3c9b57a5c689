"""Building an index directory (``zsearch index``): the options and their presets, the
corpus copied into ``corpus.arrow``, the BM25 and dense parts, each part sealed
(:mod:`.index_format` holds the layout and the seals; :mod:`.index` loads and searches).

A build writes everything into a temporary sibling directory and renames it over the
target only once complete, so a crash never leaves a half-written index behind.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa

from zsearch_cli import __version__
from zsearch_cli.data.corpus import WITH_CONTENTS, corpus_fingerprint, iter_corpus_batches
from zsearch_cli.errors import ZsearchError
from zsearch_cli.progress import err_console
from zsearch_cli.retrieval.index_format import (CORPUS_FILE, FORMAT, KINDS, MANIFEST, corpus_batches, open_corpus,
                                                seal_part)
from zsearch_cli.artifacts import check_unique

DEFAULTS: dict[str, Any] = {
    "kind": "bm25", "bm25_backend": "bm25s", "bm25_preset": "zsearch", "k1": 1.2, "b": 0.75,
    "stemmer": "english", "stopwords": "en", "analyzer": "simple", "bm25_norms": "exact",
    "encoder": "minilm", "faiss_type": "Flat", "batch_size": 128, "max_length": 256, "device": "auto",
    "query_prefix": None, "passage_prefix": None, "adopt_faiss": None,
    "encode_slice": 16_384,
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
    if opts["adopt_faiss"] is not None:
        opts["adopt_faiss"] = str(opts["adopt_faiss"])  # a Path from a library caller; the manifest is JSON
    if opts["adopt_faiss"] and "kind" not in given:
        opts["kind"] = "dense"  # --adopt-faiss alone: the adopted part only; --kind hybrid adds BM25
    opts["kind"] = ",".join(parse_kinds(opts["kind"]))
    if opts["bm25_norms"] not in ("exact", "lucene"):
        raise ZsearchError(f"unknown BM25 length norms {opts['bm25_norms']!r} (choose from: exact, lucene)")
    if opts["bm25_norms"] == "lucene" and opts["bm25_backend"] != "bm25s":
        raise ZsearchError("Lucene length norms (--bm25-preset pyserini) need --bm25-backend bm25s")
    if opts["bm25_backend"] not in BACKENDS:
        raise ZsearchError(f"unknown BM25 backend {opts['bm25_backend']!r} (choose from: {', '.join(BACKENDS)})")
    if not float(opts["k1"]) >= 0 or not 0 <= float(opts["b"]) <= 1:
        raise ZsearchError(f"BM25 needs k1 >= 0 and 0 <= b <= 1 (got k1={opts['k1']}, b={opts['b']})")
    for key in ("batch_size", "max_length", "encode_slice"):
        if int(opts[key]) < 1:
            raise ZsearchError(f"{key} must be at least 1 (got {opts[key]})")
    return opts


# ----------------------------------------------------------------------------- build


@contextlib.contextmanager
def _progress(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr, plain lines in a log file (progress.py); yields ``advance(n)``."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

    from zsearch_cli.progress import ProgressLines, progress_bar

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    unit = "postings" if "postings" in description else "docs"
    with progress_bar(*columns, console=err_console, transient=True) as progress, \
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
    table = open_corpus(dest)
    if table.num_rows == 0:
        raise ZsearchError(f"{src}: file has no rows (expected a corpus)")
    check_unique(table.column("id"), "id", str(src))
    return table.num_rows, fingerprint


def _check_target(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ZsearchError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).is_file():
        raise ZsearchError(f"{out}: exists and is not a zsearch index; refusing to overwrite it")


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
    adoption = None
    if opts["adopt_faiss"]:  # the file's header against the encoder, before the corpus is read
        from zsearch_cli.retrieval.adopt import Adoption, adopt_kinds

        adopt_kinds(kinds, opts["adopt_faiss"])
        adoption = Adoption(opts)
    from zsearch_cli.retrieval.encode_shards import Launch

    launch = Launch.from_env(kinds, opts)  # one process, or one of `accelerate launch`'s (dense only)
    if launch.rank > 0:  # a helper: encodes its slices of process 0's corpus; process 0 writes the index
        return launch.follow(out, opts)
    from zsearch_cli.files import new_folder_beside, swap_in

    tmp = new_folder_beside(out)  # the folder rule (files.py): beside, aside, in, removed; stale temps cleaned
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
        if adoption is not None:  # against the corpus now, not after BM25's hour on wiki-18
            manifest["dense"] = adoption.adopt(tmp / CORPUS_FILE, n_docs, tmp / "dense")
        if "dense" in kinds and adoption is None:  # before BM25: a bad encoder fails first, helpers wait less
            from zsearch_cli.retrieval.encode_shards import encode_dense

            manifest["dense"] = encode_dense(launch, tmp / CORPUS_FILE, n_docs, fingerprint, out, tmp / "dense",
                                             opts, _progress)
        if tokenizer is not None:
            from zsearch_cli.retrieval.bm25 import build_bm25

            manifest["bm25"] = build_bm25(corpus_batches(tmp / CORPUS_FILE), n_docs, tmp / "bm25", tokenizer,
                                          float(opts["k1"]), float(opts["b"]), opts["bm25_backend"], _progress,
                                          norms=opts["bm25_norms"])
        manifest["corpus"]["bytes"] = (tmp / CORPUS_FILE).stat().st_size
        for kind in kinds:
            seal_part(tmp / kind, fingerprint, n_docs)
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2)
        swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    launch.finish(out)  # the encode's work folder goes; helper processes may leave
    return out
