"""Corpus ingest: wiki-18 jsonl (``{id, contents}``) or ``{id, title, text}`` jsonl/Parquet,
streamed into the CORPUS Parquet artifact without holding passages as Python objects.

wiki-18 ``contents`` is ``"Title"\\ntext``; the title loses its surrounding quotes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zsearch_cli.errors import ZsearchError
from zsearch_cli.schemas import CORPUS, ArtifactWriter, _check_unique, file_kind, iter_jsonl

BATCH_ROWS = 50_000


def split_contents(contents: str) -> tuple[str, str]:
    """``'"Title"\\ntext'`` -> ``('Title', 'text')``; no newline means no title."""
    head, sep, rest = contents.partition("\n")
    if not sep:
        return "", contents.strip()
    return head.strip().strip('"').strip(), rest.strip()


def join_contents(title: str, text: str) -> str:
    """The inverse of :func:`split_contents`: Search-R1's ``contents`` string."""
    return f'"{title}"\n{text}'


def _jsonl_batches(path: Path) -> Iterator[pa.RecordBatch]:
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []
    for row, obj in iter_jsonl(path):
        doc_id = obj.get("id", obj.get("_id"))
        if doc_id is None:
            raise ZsearchError(f"{path}: row {row}: missing column 'id'")
        if "contents" in obj:
            if not isinstance(obj["contents"], str):
                raise ZsearchError(f"{path}: row {row}: column 'contents' must be a string")
            title, text = split_contents(obj["contents"])
        elif "text" in obj:
            title, text = obj.get("title") or "", obj["text"]
            if not isinstance(text, str) or not isinstance(title, str):
                raise ZsearchError(f"{path}: row {row}: columns 'title' and 'text' must be strings")
        else:
            raise ZsearchError(f"{path}: row {row}: needs 'contents' (wiki-18) or 'text' (and 'title')")
        ids.append(str(doc_id))
        titles.append(title)
        texts.append(text)
        if len(ids) >= BATCH_ROWS:
            yield pa.record_batch([ids, titles, texts], schema=CORPUS.schema)
            ids, titles, texts = [], [], []
    if ids:
        yield pa.record_batch([ids, titles, texts], schema=CORPUS.schema)


def _parquet_batches(path: Path) -> Iterator[pa.RecordBatch]:
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
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=cols):
        if "contents" in cols:
            pairs = [split_contents(c or "") for c in batch.column("contents").to_pylist()]
            title = pa.array([p[0] for p in pairs], pa.string())
            text = pa.array([p[1] for p in pairs], pa.string())
        else:
            text = batch.column("text")
            title = batch.column("title") if "title" in cols else pa.array([""] * batch.num_rows, pa.string())
        try:
            yield pa.record_batch(
                [batch.column("id").cast(pa.string()), title.cast(pa.string()), text.cast(pa.string())],
                schema=CORPUS.schema,
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise ZsearchError(f"{path}: corpus columns must be strings ({err})") from None


def iter_corpus_batches(path: str | Path) -> Iterator[pa.RecordBatch]:
    """Record batches of (id, title, text) from any supported corpus file."""
    path = Path(path)
    kind = file_kind(path)
    yield from (_parquet_batches(path) if kind == "parquet" else _jsonl_batches(path))


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
        _check_unique(ids, "id", str(src))
    except ZsearchError:
        out.unlink(missing_ok=True)
        raise
    return len(ids)


def corpus_fingerprint(batches: Iterator[pa.RecordBatch]) -> str:
    """A content hash over ids, titles and texts, independent of file format and batching.

    Each column feeds two running hashes, one of its value lengths and one of its bytes,
    so how the rows are cut into batches does not change the result."""
    hashers = {(name, part): hashlib.blake2b(digest_size=16) for name in CORPUS.schema.names for part in ("len", "data")}
    n = 0
    for batch in batches:
        for name in CORPUS.schema.names:
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
