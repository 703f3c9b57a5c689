"""Corpus ingest: wiki-18 jsonl (``{id, contents}``) or ``{id, title, text}`` jsonl/Parquet,
streamed into the CORPUS Parquet artifact without holding passages as Python objects.

wiki-18 ``contents`` is ``"Title"\\ntext``; the title loses its one pair of surrounding
quotes. For the index, :func:`iter_corpus_batches` can also keep the ``contents`` string
exactly as the file holds it (``with_contents``), so the server returns passages
byte-identical to Search-R1's own server: rebuilding it from (title, text) would drop a
title's own leading quote and any trailing whitespace.
"""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zsearch_cli.errors import ZsearchError
from zsearch_cli.artifacts import ArtifactWriter, check_unique, file_kind, iter_jsonl
from zsearch_cli.schemas import CORPUS

BATCH_ROWS = 50_000
CONTENTS_FIELD = pa.field("contents", pa.string())
"""The raw wiki-18 string, null for passages given as title/text."""
WITH_CONTENTS = CORPUS.schema.append(CONTENTS_FIELD)


def split_contents(contents: str) -> tuple[str, str]:
    """``'"Title"\\ntext'`` -> ``('Title', 'text')``; no newline means no title.

    Only one pair of quotes is removed: ``'""Weird Al" Yankovic"'`` keeps its own quote."""
    head, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents.strip()
    head = head.strip()
    if len(head) >= 2 and head[0] == head[-1] == '"':
        head = head[1:-1]
    return head.strip(), rest.strip()


def join_contents(title: str, text: str) -> str:
    """The inverse of :func:`split_contents`: Search-R1's ``contents`` string."""
    return f'"{title}"\n{text}'


def _jsonl_batches(path: Path, with_contents: bool) -> Iterator[pa.RecordBatch]:
    try:
        yield from _jsonl_batches_unguarded(path, with_contents)
    except (zlib.error, EOFError, OSError) as err:  # a corrupt (not just truncated) gzip stream
        raise ZsearchError(f"{path}: corrupt or unreadable compressed file ({type(err).__name__}: {err})") from None


def _jsonl_batches_unguarded(path: Path, with_contents: bool) -> Iterator[pa.RecordBatch]:
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    raws: list[str | None] = []
    schema = WITH_CONTENTS if with_contents else CORPUS.schema

    def batch() -> pa.RecordBatch:
        return pa.record_batch([ids, titles, texts] + ([raws] if with_contents else []), schema=schema)

    for row, obj in iter_jsonl(path):
        doc_id = obj.get("id", obj.get("_id"))
        if doc_id is None:
            raise ZsearchError(f"{path}: row {row}: missing column 'id'")
        if "contents" in obj:
            if not isinstance(obj["contents"], str):
                raise ZsearchError(f"{path}: row {row}: column 'contents' must be a string")
            title, text = split_contents(obj["contents"])
            raws.append(obj["contents"])
        elif "text" in obj:
            title, text = obj.get("title") or "", obj["text"]
            if not isinstance(text, str) or not isinstance(title, str):
                raise ZsearchError(f"{path}: row {row}: columns 'title' and 'text' must be strings")
            raws.append(None)
        else:
            raise ZsearchError(f"{path}: row {row}: needs 'contents' (wiki-18) or 'text' (and 'title')")
        ids.append(str(doc_id))
        titles.append(title)
        texts.append(text)
        if len(ids) >= BATCH_ROWS:
            yield batch()
            ids, titles, texts, raws = [], [], [], []
    if ids:
        yield batch()


def _check_no_nulls(path: Path, batch: pa.RecordBatch, first_row: int, columns: list[str]) -> None:
    """A null in a required column is an error naming its (0-based) row and column."""
    for name in columns:
        col = batch.column(name)
        if col.null_count:
            row = first_row + int(np.flatnonzero(np.asarray(col.is_null()))[0])
            raise ZsearchError(f"{path}: row {row}: column {name!r} is null (every passage needs one)")


def _parquet_batches(path: Path, with_contents: bool) -> Iterator[pa.RecordBatch]:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise ZsearchError(f"{path}: not a readable Parquet file ({err})") from None
    names = pf.schema_arrow.names
    if "id" not in names:
        raise ZsearchError(f"{path}: missing column 'id' (a corpus needs id and text, or id and contents)")
    if "text" in names:
        cols = ["id", "text"] + (["title"] if "title" in names else [])
    elif "contents" in names:
        cols = ["id", "contents"]
    else:
        raise ZsearchError(f"{path}: missing column 'text' (or wiki-18 'contents')")
    first_row = 0
    batches = pf.iter_batches(batch_size=BATCH_ROWS, columns=cols)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowInvalid, OSError) as err:
            raise ZsearchError(f"{path}: corrupt Parquet data ({err})") from None
        if batch is None:
            return
        _check_no_nulls(path, batch, first_row, cols[:2])
        raw = None
        try:
            if "contents" in cols:
                raw = batch.column("contents").cast(pa.string())
                pairs = [split_contents(c) for c in raw.to_pylist()]
                title = pa.array([p[0] for p in pairs], pa.string())
                text = pa.array([p[1] for p in pairs], pa.string())
            else:
                text = batch.column("text")
                title = batch.column("title") if "title" in cols else pa.array([""] * batch.num_rows, pa.string())
            columns = [batch.column("id").cast(pa.string()), title.cast(pa.string()), text.cast(pa.string())]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise ZsearchError(f"{path}: corpus columns must be strings ({err})") from None
        if with_contents:
            columns.append(raw if raw is not None else pa.nulls(batch.num_rows, pa.string()))
        yield pa.record_batch(columns, schema=WITH_CONTENTS if with_contents else CORPUS.schema)
        first_row += batch.num_rows


def iter_corpus_batches(path: str | Path, with_contents: bool = False) -> Iterator[pa.RecordBatch]:
    """Record batches of (id, title, text) from any supported corpus file; with
    ``with_contents`` a fourth column holds each wiki-18 ``contents`` string as stored."""
    path = Path(path)
    kind = file_kind(path)
    yield from (_parquet_batches(path, with_contents) if kind == "parquet" else _jsonl_batches(path, with_contents))


def ingest_corpus(src: str | Path, out: str | Path, config: dict[str, Any] | None = None) -> int:
    """Stream ``src`` into a CORPUS Parquet at ``out``; checks ids are present and unique.

    Returns the number of passages."""
    src, out = Path(src), Path(out)
    with ArtifactWriter(out, CORPUS, config) as writer:
        for batch in iter_corpus_batches(src):
            writer.write(batch)
        if writer.rows == 0:
            raise ZsearchError(f"{src}: file has no rows (expected a corpus)")
    ids = pq.read_table(out, columns=["id"], memory_map=True).column("id")
    try:
        check_unique(ids, "id", str(src))
    except ZsearchError:
        out.unlink(missing_ok=True)
        raise
    return len(ids)


def corpus_fingerprint(batches: Iterator[pa.RecordBatch]) -> str:
    """A content hash over ids, titles and texts, independent of file format and batching.

    Each column feeds two running hashes, one of its value lengths and one of its bytes,
    so how the rows are cut into batches does not change the result."""
    names = CORPUS.schema.names  # the passages' meaning: a wiki-18 file and its title/text twin agree
    hashers = {(name, part): hashlib.blake2b(digest_size=16) for name in names for part in ("len", "data")}
    n = 0
    for batch in batches:
        for name in names:
            arr = batch.column(name)
            if arr.null_count:
                arr = arr.fill_null("")
            arr = arr.cast(pa.large_string()) if not pa.types.is_large_string(arr.type) else arr
            offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]
            hashers[(name, "len")].update(np.diff(offsets).tobytes())
            hashers[(name, "data")].update(memoryview(arr.buffers()[2])[offsets[0] : offsets[-1]])
        n += batch.num_rows
    total = hashlib.blake2b(str(n).encode(), digest_size=16)
    for h in hashers.values():
        total.update(h.digest())
    return total.hexdigest()
