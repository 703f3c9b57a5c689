"""The on-disk layout of an index directory, which the build (:mod:`.index_build`) writes
and the loader (:mod:`.index`) checks::

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

Both sides read the names and the seal format from here, so the writer and the checker
cannot drift apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa

from zsearch_cli.errors import ZsearchError

FORMAT = 2
"""2: parts carry a part.json seal and the manifest corpus.arrow's size."""
PART_SEAL = "part.json"
MANIFEST = "manifest.json"
CORPUS_FILE = "corpus.arrow"
KINDS = ("bm25", "dense")
"""The parts an index can have, in canonical order."""


def open_corpus(path: Path) -> pa.Table:
    """Zero-copy: the table's buffers point into the memory-mapped file."""
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


def corpus_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The record batches of a corpus file, one at a time (memory-mapped)."""
    reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
    for i in range(reader.num_record_batches):
        yield reader.get_batch(i)


def seal_part(part: Path, fingerprint: str, n_docs: int) -> None:
    """Write ``part/part.json``: what the part was built from, and each file's size."""
    files = {str(f.relative_to(part)): f.stat().st_size for f in sorted(part.rglob("*")) if f.is_file()}
    with open(part / PART_SEAL, "w", encoding="utf-8") as fh:
        json.dump({"corpus_fingerprint": fingerprint, "n_docs": n_docs, "files": files}, fh, indent=2)


def rebuild_error(index_dir: Path, what: str) -> ZsearchError:
    """The one-line error for a damaged index: what is wrong, and the command that fixes it."""
    return ZsearchError(f"{index_dir}: {what}; rebuild the index with `zsearch index ... --out {index_dir}`")


def check_index_files(index_dir: Path, manifest: dict[str, Any]) -> None:
    """Every part's seal against the manifest, and every file's presence and size."""
    fingerprint, n_docs = manifest["corpus"]["fingerprint"], manifest["n_docs"]
    corpus = index_dir / CORPUS_FILE
    if not corpus.is_file():
        raise rebuild_error(index_dir, f"{CORPUS_FILE} is missing")
    if corpus.stat().st_size != manifest["corpus"].get("bytes"):
        raise rebuild_error(index_dir, f"{CORPUS_FILE} is {corpus.stat().st_size} bytes, the manifest says "
                                       f"{manifest['corpus'].get('bytes')} (truncated or replaced)")
    for kind in manifest["kinds"]:
        seal_path = index_dir / kind / PART_SEAL
        try:
            with open(seal_path, encoding="utf-8") as fh:
                seal = json.load(fh)
            files = dict(seal["files"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise rebuild_error(index_dir, f"{kind}/{PART_SEAL} is missing or unreadable ({type(err).__name__})") from None
        if seal.get("corpus_fingerprint") != fingerprint or seal.get("n_docs") != n_docs:
            raise rebuild_error(index_dir, f"part {kind}/ was built from another corpus "
                                           f"({seal.get('n_docs')} passages, fingerprint {str(seal.get('corpus_fingerprint'))[:12]}; "
                                           f"this index: {n_docs} passages, {fingerprint[:12]})")
        for name, size in files.items():
            path = index_dir / kind / name
            if not path.is_file():
                raise rebuild_error(index_dir, f"{kind}/{name} is missing")
            if path.stat().st_size != size:
                raise rebuild_error(index_dir, f"{kind}/{name} is {path.stat().st_size} bytes, its part.json says "
                                               f"{size} (truncated or replaced)")


def read_manifest(index_dir: Path) -> dict[str, Any]:
    """``manifest.json`` of an index directory, checked for the fields every reader needs."""
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
