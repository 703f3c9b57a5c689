"""A faiss file that lives outside the index folder (``zsearch index --adopt-faiss``): its
fingerprint, opening it without copying it, and the vectors it stores.

The adopted file (Search-R1's / FlashRAG's ``e5_Flat.index``: 21M x 768 float32, ~60 GiB) is
never copied into the index folder. The manifest records its path, size and fingerprint
(:func:`fingerprint`), and every load checks both again (:func:`open_adopted`) before faiss
maps it, so an index whose adopted file was moved, replaced, truncated or re-encoded refuses
in one line instead of returning other vectors' passages.

This module knows faiss files only; checking that the vectors are the encoder's embeddings
of the corpus is :mod:`.adopt`'s work (which imports the encoder; this one must not, since
the dense searcher imports it).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from zsearch_cli.errors import ZsearchError

FINGERPRINT_BLOCKS = 64
FINGERPRINT_BLOCK_BYTES = 256 * 1024
FINGERPRINT_METHOD = f"sha256 of size + {FINGERPRINT_BLOCKS} blocks of {FINGERPRINT_BLOCK_BYTES // 1024} KiB " \
                     f"at fixed offsets (first and last included)"
"""Recorded beside the fingerprint, so a later zsearch that samples differently can tell
an old fingerprint from a changed file."""


def fingerprint(path: Path) -> str:
    """A fingerprint of a (huge) file from its size and 64 blocks at fixed offsets.

    Why not hash the whole file: sha256 of 60 GiB takes about a minute from the page cache
    and several from disk, and the check runs at every load. Why a sample is sound here:
    what actually happens to such a file changes the sampled bytes. A rebuild with another
    encoder, prefix, pooling or corpus order changes every stored vector, so every block; a
    truncated or extended file changes the size (and ntotal in the header, block 0); another
    faiss type changes the header. Blocks sit at fixed offsets (not random ones) so the same
    file always gives the same fingerprint. What it misses is a deliberate in-place patch of
    a few bytes between blocks, which no copy, download or rebuild produces. Files up to
    64 x 256 KiB (16 MiB) are hashed whole.
    """
    size = os.path.getsize(path)
    digest = hashlib.sha256(size.to_bytes(8, "little"))
    with open(path, "rb") as fh:
        if size <= FINGERPRINT_BLOCKS * FINGERPRINT_BLOCK_BYTES:
            digest.update(fh.read())
        else:
            last = size - FINGERPRINT_BLOCK_BYTES
            for i in range(FINGERPRINT_BLOCKS):
                fh.seek(i * last // (FINGERPRINT_BLOCKS - 1))
                digest.update(fh.read(FINGERPRINT_BLOCK_BYTES))
    return "sha256s:" + digest.hexdigest()


def _faiss_message(err: Exception) -> str:
    """faiss's 'Error in <signature> at <file>:<line>: <what>' -> '<what>', on one line."""
    text = " ".join(str(err).split())
    return re.sub(r"^Error in .*? at \S+:\d+: ", "", text) or type(err).__name__


def open_flat(path: Path) -> Any:
    """The faiss index in ``path``, memory-mapped where this faiss can (``IO_FLAG_MMAP_IFC``,
    faiss >= 1.10: the flat codes stay in the file and the page cache, shared by every
    process that maps it, and nothing is read up front); older faiss loads it once."""
    import faiss

    flag = getattr(faiss, "IO_FLAG_MMAP_IFC", None)
    try:
        return faiss.read_index(str(path), flag) if flag is not None else faiss.read_index(str(path))
    except RuntimeError as err:  # faiss's C++ errors (not a faiss file, truncated, unknown type)
        raise ZsearchError(f"{path}: not a readable faiss index ({_faiss_message(err)})") from None


class _Storage:
    """An array interface over a flat index's storage that holds the index: the array made
    from it keeps this object (and so the index and its mapping) alive. A bare
    ``rev_swig_ptr`` view would point into freed memory once the index is collected."""

    def __init__(self, index: Any):
        import faiss

        flat = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)
        self.index = index
        self.__array_interface__ = {**flat.__array_interface__, "shape": (index.ntotal, index.d),
                                    "data": (flat.__array_interface__["data"][0], True)}  # read-only: may be a mapped file


def flat_vectors(index: Any) -> np.ndarray:
    """The ``[ntotal, d]`` float32 vectors of a flat index, as a view of its storage (the
    mapped file when :func:`open_flat` mapped it): nothing is copied, and the view keeps the
    index alive."""
    return np.asarray(_Storage(index))


def adopted_record(path: Path) -> dict[str, Any]:
    """What the manifest records of an adopted file (``dense.adopted``): where it is, its
    size and fingerprint. The path is absolute but not resolved, so a symlink the user keeps
    pointing at the file stays valid."""
    path = Path(path).expanduser().absolute()
    return {"path": str(path), "bytes": path.stat().st_size, "fingerprint": fingerprint(path),
            "fingerprint_method": FINGERPRINT_METHOD}


def check_adopted(record: dict[str, Any], index_dir: Path) -> Path:
    """The adopted file is where the manifest says, with the recorded size and fingerprint;
    else one line naming what changed. Returns its path."""
    path = Path(record["path"])
    again = f"adopt it again with `zsearch index CORPUS --adopt-faiss FILE --out {index_dir}`"
    if not path.is_file():
        raise ZsearchError(f"{index_dir}: the adopted faiss index {path} is missing (moved or deleted?); {again}")
    size = path.stat().st_size
    if size != record["bytes"]:
        raise ZsearchError(f"{index_dir}: the adopted faiss index {path} is {size} bytes, it was {record['bytes']} "
                           f"when adopted (replaced or truncated); {again}")
    now = fingerprint(path)
    if now != record["fingerprint"]:
        raise ZsearchError(f"{index_dir}: the adopted faiss index {path} changed since it was adopted "
                           f"(fingerprint {now[8:20]} != {record['fingerprint'][8:20]}); {again}")
    return path


def open_adopted(record: dict[str, Any], index_dir: Path) -> Any:
    """:func:`check_adopted`, then :func:`open_flat` (the dense searcher's way in)."""
    return open_flat(check_adopted(record, index_dir))


def gpu_cloner_options() -> Any:
    """faiss-gpu copies a flat index to the GPU; in fp16 an adopted 21M x 768 file takes
    ~32 GB there instead of ~64 GB, and Search-R1's retrieval server does the same
    (``useFloat16``)."""
    import faiss

    options = faiss.GpuClonerOptions()
    options.useFloat16 = True
    return options
