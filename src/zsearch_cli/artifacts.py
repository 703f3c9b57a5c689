"""Parquet artifacts: what an :class:`Artifact` is, and the one way stages read and write one.

:func:`read_artifact` reads a Parquet or jsonl file and validates it, naming the file, column and
row of the first problem; :func:`write_artifact` and :class:`ArtifactWriter` write atomically (a
temp file renamed into place), with the zsearch version, the artifact's name, the resolved config
and the protocol of its numbers in the Parquet key-value metadata. The artifacts themselves, every
table zsearch reads or writes, are declared in ``zsearch_cli/schemas.py``.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from zsearch_cli import __version__
from zsearch_cli.errors import ZsearchError, read_back, stored_config, stored_value
from zsearch_cli.files import mkstemp_like_open
from zsearch_cli.text_check import text_problem

META_VERSION = b"zsearch.version"
META_ARTIFACT = b"zsearch.artifact"
META_CONFIG = b"zsearch.config"
META_PROTOCOL = b"zsearch.protocol"


@dataclass(frozen=True)
class Artifact:
    """A named table layout and the row-level rules its input must satisfy."""

    name: str
    schema: pa.Schema
    unique: str | None = None
    """Column whose values must be unique (usually ``id``)."""
    nonempty: tuple[str, ...] = ()
    """String columns that must not be empty or whitespace."""
    optional: frozenset[str] = field(default_factory=frozenset)
    """Columns that may be absent on input; they are filled with nulls."""
    text: tuple[str, ...] = ()
    """String columns that reach a tokenizer: no NUL (text_check.py; jsonl input is checked
    for lone surrogates too, which Parquet cannot hold)."""
    stored: frozenset[str] = field(default_factory=frozenset)
    """String columns written in the stored form of errors.stored_value, as the metadata's config
    is: the protocol values (an option as given, a --search spec) hold no key."""



# ----------------------------------------------------------------------------- validation


def _type_ok(actual: pa.DataType, expected: pa.DataType) -> bool:
    if actual == expected or pa.types.is_null(actual):
        return True
    if pa.types.is_string(expected) and (pa.types.is_large_string(actual) or pa.types.is_string(actual)):
        return True
    if pa.types.is_integer(expected) and pa.types.is_integer(actual):
        return True
    if pa.types.is_floating(expected) and (pa.types.is_floating(actual) or pa.types.is_integer(actual)):
        return True
    if pa.types.is_list(expected) or pa.types.is_large_list(expected):
        if pa.types.is_list(actual) or pa.types.is_large_list(actual):
            return _type_ok(actual.value_type, expected.value_type)
        return False
    return False


def _describe(t: pa.DataType) -> str:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = t.value_type
        return "a list of strings" if pa.types.is_string(inner) or pa.types.is_large_string(inner) \
            else f"a list of {inner}"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "a string"
    return str(t)


def _fits(value: Any, expected: pa.DataType) -> bool:
    """Whether a python value (not None) belongs in a column of type ``expected``."""
    if pa.types.is_list(expected) or pa.types.is_large_list(expected):
        return isinstance(value, list) and all(v is None or _fits(v, expected.value_type) for v in value)
    if pa.types.is_string(expected) or pa.types.is_large_string(expected):
        return isinstance(value, str)
    if pa.types.is_boolean(expected):
        return isinstance(value, bool)
    if pa.types.is_integer(expected):
        return isinstance(value, int) and not isinstance(value, bool)
    if pa.types.is_floating(expected):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def _got(value: Any) -> str:
    if isinstance(value, list):
        odd = next((v for v in value if v is not None and not isinstance(v, str)), None)
        return f"a list holding {type(odd).__name__} {odd!r:.40}" if odd is not None else "a list"
    return type(value).__name__


def validate(table: pa.Table, artifact: Artifact, source: str | os.PathLike) -> pa.Table:
    """Check ``table`` against ``artifact`` and return it cast to the artifact's schema.

    Raises :class:`ZsearchError` naming ``source``, the column and the first bad row.
    """
    src = str(source)
    if table.num_rows == 0:
        raise ZsearchError(f"{src}: file has no rows (expected a {artifact.name} table)")
    cols = []
    for fld in artifact.schema:
        if fld.name not in table.column_names:
            if fld.name in artifact.optional:
                cols.append(pa.nulls(table.num_rows, fld.type))
                continue
            have = ", ".join(table.column_names)
            raise ZsearchError(f"{src}: missing column '{fld.name}' (a {artifact.name} table needs it; found: {have})")
        col = table.column(fld.name)
        if not _type_ok(col.type, fld.type):
            bad_row = _first_bad_type_row(col, fld.type)
            where = f"row {bad_row}: " if bad_row is not None else ""
            raise ZsearchError(
                f"{src}: {where}column '{fld.name}' must be {_describe(fld.type)}, got {_describe(col.type)}"
            )
        try:
            cols.append(col.cast(fld.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            bad_row = _first_uncastable_row(col, fld.type)
            where = f"row {bad_row}: " if bad_row is not None else ""
            raise ZsearchError(f"{src}: {where}column '{fld.name}' cannot be read as {_describe(fld.type)}: {err}") \
                from None
    out = pa.Table.from_arrays(cols, schema=artifact.schema)
    for name in artifact.nonempty + ((artifact.unique,) if artifact.unique else ()):
        col = out.column(name)
        nulls = pc.is_null(col)
        if pc.any(nulls).as_py():
            raise ZsearchError(f"{src}: row {_first_true(nulls)}: column '{name}' is missing (null)")
        if name in artifact.nonempty:
            empty = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(col)), 0)
            if pc.any(empty).as_py():
                raise ZsearchError(f"{src}: row {_first_true(empty)}: column '{name}' is empty")
    for fld in artifact.schema:  # a null answer, doc id or document inside a list is never meant
        if pa.types.is_list(fld.type) and pa.types.is_string(fld.type.value_type):
            col = out.column(fld.name).combine_chunks()
            inner_nulls = pc.is_null(pc.list_flatten(col))
            if pc.any(inner_nulls).as_py():
                row = pc.list_parent_indices(col)[_first_true(inner_nulls)].as_py()
                raise ZsearchError(f"{src}: row {row}: column '{fld.name}' holds a null (a list of strings may not)")
    for name in artifact.text:  # NUL is valid UTF-8 (Parquet holds it) but no text a tokenizer should get
        nul = pc.fill_null(pc.match_substring(out.column(name), "\x00"), False)
        if pc.any(nul).as_py():
            raise ZsearchError(f"{src}: row {_first_true(nul)}: column '{name}' holds a NUL character")
    if artifact.unique:
        check_unique(out.column(artifact.unique), artifact.unique, src)
    return out


def _first_true(mask: pa.ChunkedArray | pa.Array) -> int:
    return int(pc.index(mask, True).as_py())


def _first_bad_type_row(col: pa.ChunkedArray, expected: pa.DataType) -> int | None:
    """The first row whose python value does not fit ``expected`` (only on the error path:
    the message must point at a row)."""
    for i, value in enumerate(col.to_pylist()):
        if value is not None and not _fits(value, expected):
            return i
    return None


def _converts(value: Any, expected: pa.DataType) -> bool:
    try:
        pa.array([value], type=expected)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError):
        return False


def _first_uncastable_row(col: pa.ChunkedArray, expected: pa.DataType) -> int | None:
    """The first row whose value the cast to ``expected`` fails on (e.g. out of int32 range)."""
    for i, value in enumerate(col.to_pylist()):
        if value is not None and not _converts(value, expected):
            return i
    return None


def check_unique(col: pa.ChunkedArray, name: str, src: str) -> None:
    counts = pc.value_counts(col)
    dup_mask = pc.greater(counts.field("counts"), 1)
    if pc.any(dup_mask).as_py():
        value = pc.filter(counts.field("values"), dup_mask)[0].as_py()
        rows = pc.indices_nonzero(pc.equal(col, value)).to_pylist()
        raise ZsearchError(f"{src}: column '{name}' has duplicate value {value!r} (rows {rows[0]} and {rows[1]})")


# ----------------------------------------------------------------------------- reading


def iter_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(row, object)`` from a ``.jsonl`` or ``.jsonl.gz`` file, skipping blank lines."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:  # bytes, decoded line by line: invalid UTF-8 is named by its line
            row = 0
            for lineno, raw in enumerate(fh, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as err:
                    raise ZsearchError(f"{path}: line {lineno}: not valid UTF-8 (byte {err.start + 1} of the line: "
                                       f"{err.reason})") from None
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ZsearchError(f"{path}: line {lineno}: not valid JSON ({err.msg})") from None
                if not isinstance(obj, dict):
                    raise ZsearchError(f"{path}: line {lineno}: expected a JSON object, got {type(obj).__name__}")
                yield row, obj
                row += 1
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise ZsearchError(f"{path}: cannot read as jsonl ({err})") from None


def file_kind(path: Path) -> str:
    """``'parquet'`` or ``'jsonl'`` by name; a clear error for anything else or a missing file."""
    path = Path(path)
    if not path.exists():
        raise ZsearchError(f"{path}: no such file")
    if path.is_dir():
        raise ZsearchError(f"{path}: is a directory, expected a .parquet or .jsonl file")
    if path.stat().st_size == 0:
        raise ZsearchError(f"{path}: file is empty")
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz")):
        return "jsonl"
    raise ZsearchError(f"{path}: unknown file type (expected .parquet, .jsonl or .jsonl.gz)")


def read_parquet(path: Path) -> pa.Table:
    try:
        return pq.read_table(path, memory_map=True)
    except (pa.ArrowInvalid, OSError) as err:
        raise ZsearchError(f"{path}: not a readable Parquet file ({err})") from None


def rows_to_table(rows: list[dict[str, Any]], artifact: Artifact, source: Path) -> pa.Table:
    """Build a table from python rows, naming the row of the first value of the wrong type."""
    data: dict[str, list[Any]] = {}
    for fld in artifact.schema:
        values = []
        for i, row in enumerate(rows):
            v = row.get(fld.name)
            if fld.name == "metadata" and v is not None and not isinstance(v, str):
                v = json.dumps(v, ensure_ascii=False, sort_keys=True)
            if v is not None and not _fits(v, fld.type):
                raise ZsearchError(f"{source}: row {i}: column '{fld.name}' must be {_describe(fld.type)}, got {_got(v)}")
            for text in (v if isinstance(v, list) else [v]):  # what a tokenizer (and pyarrow) cannot take
                # a lone surrogate anywhere (pyarrow cannot encode it); a NUL in the columns that reach
                # a tokenizer (model output written back, e.g. a trajectory, may hold one)
                problem = text_problem(text, nul=fld.name in artifact.text) if isinstance(text, str) else None
                if problem:
                    raise ZsearchError(f"{source}: row {i}: column '{fld.name}' {problem}")
            values.append(v)
        if all(v is None for v in values) and fld.name not in artifact.optional and fld.name not in rows[0]:
            raise ZsearchError(f"{source}: missing column '{fld.name}' (a {artifact.name} table needs it)")
        try:
            data[fld.name] = pa.array(values, type=fld.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
            row = next((i for i, v in enumerate(values) if not _converts(v, fld.type)), None)
            where = f"row {row}: " if row is not None else ""
            raise ZsearchError(f"{source}: {where}column '{fld.name}' has a value of the wrong type ({err})") from None
    return pa.table(data, schema=artifact.schema)


def jsonl_rows(path: Path, artifact: Artifact) -> list[dict[str, Any]]:
    """Every object of a jsonl file meant as ``artifact``; an empty file is an error."""
    rows = [obj for _, obj in iter_jsonl(path)]
    if not rows:
        raise ZsearchError(f"{path}: file has no rows (expected a {artifact.name} table)")
    return rows


def read_artifact(path: str | os.PathLike, artifact: Artifact) -> pa.Table:
    """Read a Parquet or jsonl file as ``artifact``, validated."""
    path = Path(path)
    if file_kind(path) == "parquet":
        table = read_parquet(path)
    else:
        table = rows_to_table(jsonl_rows(path, artifact), artifact, path)
    return validate(table, artifact, path)


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The zsearch metadata of a Parquet file: version, artifact and resolved config."""
    meta = pq.read_schema(path).metadata or {}
    out: dict[str, Any] = {}
    if META_VERSION in meta:
        out["version"] = meta[META_VERSION].decode()
    if META_ARTIFACT in meta:
        out["artifact"] = meta[META_ARTIFACT].decode()
    # read back for comparison with the options given now (eval's reuse of rows, collect's
    # resume): a withheld key equals the key given again (errors.read_back)
    if META_CONFIG in meta:
        out["config"] = read_back(json.loads(meta[META_CONFIG]))
    if META_PROTOCOL in meta:
        out["protocol"] = read_back(json.loads(meta[META_PROTOCOL]))
    return out


# ----------------------------------------------------------------------------- writing


def _metadata(artifact: Artifact, config: dict[str, Any] | None,
              protocol: dict[str, Any] | None = None) -> dict[bytes, bytes]:
    meta = {
        META_VERSION: __version__.encode(),
        META_ARTIFACT: artifact.name.encode(),
        # a run folder is shared: no key of a --search URL or spec in it (errors.stored_config)
        META_CONFIG: json.dumps(stored_config(config or {}), default=str, sort_keys=True).encode(),
    }
    if protocol is not None:  # see zsearch_cli/protocol.py
        meta[META_PROTOCOL] = json.dumps(stored_config(protocol), default=str, sort_keys=True).encode()
    return meta


class ArtifactWriter:
    """Stream record batches into ``path`` atomically: a temp file in the same directory,
    renamed over ``path`` only when the ``with`` block exits cleanly."""

    def __init__(self, path: str | os.PathLike, artifact: Artifact, config: dict[str, Any] | None = None,
                 protocol: dict[str, Any] | None = None):
        self.path = Path(path)
        self.artifact = artifact
        self.schema = artifact.schema.with_metadata(_metadata(artifact, config, protocol))
        self.rows = 0
        self._tmp: str | None = None
        self._writer: pq.ParquetWriter | None = None

    def __enter__(self) -> "ArtifactWriter":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # mode as open() would give it (mkstemp's 0600 would survive the rename)
        fd, self._tmp = mkstemp_like_open(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        self._writer = pq.ParquetWriter(self._tmp, self.schema, compression="zstd")
        return self

    def write(self, data: pa.Table | pa.RecordBatch | Iterable[dict[str, Any]]) -> None:
        if not isinstance(data, (pa.Table, pa.RecordBatch)):
            rows = list(data)
            self._check_keys(rows)
            data = pa.Table.from_pylist(rows, schema=self.artifact.schema)
        elif data.schema.remove_metadata() != self.artifact.schema:
            data = data.select(self.artifact.schema.names).cast(self.artifact.schema)
        if isinstance(data, pa.RecordBatch):
            data = pa.Table.from_batches([data])
        data = _stored_form(data, self.artifact.stored)
        assert self._writer is not None
        self._writer.write_table(data.replace_schema_metadata(self.schema.metadata))
        self.rows += data.num_rows

    def _check_keys(self, rows: list[dict[str, Any]]) -> None:
        """A key the schema lacks is an error, not silently dropped: a value someone meant
        to save would otherwise vanish (declare it in the artifact's schema above)."""
        names = set(self.artifact.schema.names)
        unknown = sorted({key for row in rows for key in row} - names)
        if unknown:
            raise ZsearchError(f"{self.path}: a {self.artifact.name} table has no column {', '.join(map(repr, unknown))} "
                               "(declare it in zsearch_cli/schemas.py, or leave it out)")

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self._writer is not None and self._tmp is not None
        self._writer.close()
        if exc_type is None:
            os.replace(self._tmp, self.path)
        else:
            os.unlink(self._tmp)


def _stored_form(table: pa.Table, columns: frozenset[str]) -> pa.Table:
    """``table`` with its string ``columns`` (protocol values: options as given, ``--model``, the
    ``--search`` spec as ``retriever``) in the stored form the metadata has
    (errors.stored_config), so no row holds a key either."""
    for i, name in enumerate(table.schema.names):
        if name in columns and pa.types.is_string(table.schema.field(i).type):
            values = table.column(i).to_pylist()
            stored = [stored_value(v) if isinstance(v, str) else v for v in values]
            if stored != values:
                table = table.set_column(i, table.schema.field(i), pa.array(stored, table.schema.field(i).type))
    return table


def write_artifact(
    table: pa.Table | list[dict[str, Any]],
    path: str | os.PathLike,
    artifact: Artifact,
    config: dict[str, Any] | None = None,
    protocol: dict[str, Any] | None = None,
) -> Path:
    """Write a whole table atomically with zsearch metadata (and the protocol of the numbers
    in it, when given); returns the path."""
    with ArtifactWriter(path, artifact, config, protocol) as writer:
        writer.write(table)
    return Path(path)
