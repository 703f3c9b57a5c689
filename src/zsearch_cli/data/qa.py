"""QA loaders: FlashRAG jsonl, Search-R1 Parquet, and our own QA artifact.

``--datasets all`` means the seven benchmarks of the papers with the splits of
docs/methods.md §6, looked up as files under ``--data-dir`` in FlashRAG's layout
(``DATA_DIR/nq/test.jsonl``) or a flat one (``DATA_DIR/nq_test.jsonl``/``.parquet``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from zsearch_cli.errors import ZsearchError
from zsearch_cli.artifacts import file_kind, iter_jsonl, read_artifact, read_parquet, validate
from zsearch_cli.schemas import QA

# The evaluation splits of docs/methods.md §6: NQ/TriviaQA/PopQA/Bamboogle test, the rest dev.
BENCHMARK_SPLITS: dict[str, str] = {
    "nq": "test",
    "triviaqa": "test",
    "popqa": "test",
    "hotpotqa": "dev",
    "2wikimultihopqa": "dev",
    "musique": "dev",
    "bamboogle": "test",
}
HUB_REPO = "RUC-NLPIR/FlashRAG_datasets"


def _from_search_r1(table: pa.Table, path: Path) -> pa.Table:
    """Search-R1's training Parquet: question in ``question`` or extra_info, golds in
    ``reward_model.ground_truth.target``."""
    rows: list[dict[str, Any]] = []
    for i, rec in enumerate(table.to_pylist()):
        rm = rec.get("reward_model") or {}
        gt = (rm.get("ground_truth") or {}) if isinstance(rm, dict) else {}
        target = gt.get("target") if isinstance(gt, dict) else None
        if target is None:
            raise ZsearchError(f"{path}: row {i}: column 'reward_model.ground_truth.target' is missing")
        if isinstance(target, (str, int, float)) and not isinstance(target, bool):
            target = [target]
        if not isinstance(target, (list, tuple)) or not target or any(t is None for t in target):
            # str(None) would become the gold answer "None": refuse, naming the row
            raise ZsearchError(f"{path}: row {i}: column 'reward_model.ground_truth.target' must be a non-empty "
                               f"list of answers without nulls, got {target!r:.80}")
        question = rec.get("question")
        extra = rec.get("extra_info") or {}
        if question is None and isinstance(extra, dict):
            question = extra.get("question")
        if question is None:
            raise ZsearchError(f"{path}: row {i}: no 'question' column (nor extra_info.question)")
        doc_id = rec.get("id") or (extra.get("index") if isinstance(extra, dict) else None)
        meta = {"data_source": rec.get("data_source")} if rec.get("data_source") else {}
        rows.append({
            "id": str(doc_id if doc_id is not None else i),
            "question": question,
            "golden_answers": [str(t) for t in list(target)],
            "metadata": json.dumps(meta),
        })
    sources = table.column("data_source").to_pylist() if "data_source" in table.column_names else [None] * len(rows)
    return validate(key_by_source(pa.Table.from_pylist(rows, schema=QA.schema), sources), QA, path)


def source_keyed_ids(ids: list[Any], sources: list[Any]) -> list[str] | None:
    """Ids keyed by (data_source, id), or None where a file does not need it.

    Search-R1's merged test file (``qa_search_test_merge.py``) keeps FlashRAG's per-source ids,
    so ``test_0`` is a row of NQ, of TriviaQA, of PopQA and of Bamboogle. Where a file holds
    several ``data_source`` values and its ids repeat, each row's id becomes ``source/id``, so
    ids need only be unique within a source (the artifacts' unique-id check then refuses a repeat
    within one source, naming it). Files whose ids are unique keep them."""
    own = [str(x) for x in ids]
    labels = [None if s in (None, "") else str(s) for s in sources]
    if len(set(own)) == len(own) or len({s for s in labels if s is not None}) < 2:
        return None
    return [i if s is None else f"{s}/{i}" for i, s in zip(own, labels)]


def key_by_source(table: pa.Table, sources: list[Any]) -> pa.Table:
    """``table`` with :func:`source_keyed_ids` where needed, each row's own id kept in
    ``metadata.source_id`` and its source in ``metadata.data_source``."""
    ids = table.column("id").to_pylist()
    keyed = source_keyed_ids(ids, sources)
    if keyed is None:
        return table
    metas = table.column("metadata").to_pylist() if "metadata" in table.column_names else [None] * len(ids)
    new_meta = []
    for own, source, meta in zip(ids, sources, metas):
        try:
            obj = json.loads(meta) if meta else {}
        except ValueError:
            obj = {}
        obj = obj if isinstance(obj, dict) else {"metadata": obj}
        if source not in (None, ""):
            obj.update(data_source=str(source), source_id=str(own))
        new_meta.append(json.dumps(obj))
    table = table.set_column(table.column_names.index("id"), "id", pa.array(keyed, pa.string()))
    if "metadata" in table.column_names:
        return table.set_column(table.column_names.index("metadata"), "metadata", pa.array(new_meta, pa.string()))
    return table.append_column("metadata", pa.array(new_meta, pa.string()))


def load_qa(path: str | Path) -> pa.Table:
    """Load a QA file in any supported form, validated against the QA artifact."""
    path = Path(path)
    if file_kind(path) == "parquet":
        table = read_parquet(path)
        if "reward_model" in table.column_names and "golden_answers" not in table.column_names:
            return _from_search_r1(table, path)
        if "metadata" in table.column_names and not pa.types.is_string(table.schema.field("metadata").type):
            meta = [json.dumps(m, default=str) if m is not None else None for m in table.column("metadata").to_pylist()]
            table = table.set_column(table.column_names.index("metadata"), "metadata", pa.array(meta, pa.string()))
        if "data_source" in table.column_names and "id" in table.column_names:
            table = key_by_source(table, table.column("data_source").to_pylist())
        return validate(table, QA, path)
    return read_artifact(path, QA)


def find_dataset_file(name: str, split: str, data_dir: Path, download: bool = False) -> Path:
    """The file for one benchmark under ``data_dir``; with ``download``, fetched from the
    FlashRAG hub dataset into ``data_dir`` when missing; else an error saying where to put it."""
    candidates = []
    for ext in (".jsonl", ".jsonl.gz", ".parquet"):
        candidates += [data_dir / name / f"{split}{ext}", data_dir / f"{name}_{split}{ext}", data_dir / f"{name}{ext}"]
    for cand in candidates:
        if cand.is_file():
            return cand
    where = (f"put FlashRAG's file at {data_dir / name / (split + '.jsonl')} "
             f"(from the hub dataset {HUB_REPO}, folder {name}/)")
    if download:
        return _download(name, split, data_dir, where)
    raise ZsearchError(f"dataset '{name}' ({split} split) not found under {data_dir}: {where}, or pass --download")


def _download(name: str, split: str, data_dir: Path, where: str) -> Path:
    """Fetch ``{name}/{split}.jsonl`` from the FlashRAG hub dataset (needs network access)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        raise ZsearchError(f"dataset '{name}' ({split} split) could not be downloaded from {HUB_REPO} "
                           f"(HF_HUB_OFFLINE is set); without network access, {where}")
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(HUB_REPO, f"{name}/{split}.jsonl", repo_type="dataset", local_dir=data_dir)
    except Exception as err:  # noqa: BLE001 - offline, missing file, auth: all end the same way
        raise ZsearchError(
            f"dataset '{name}' ({split} split) could not be downloaded from {HUB_REPO} "
            f"({type(err).__name__}); without network access, {where}"
        ) from None
    return Path(path)


def resolve_datasets(spec: str) -> list[str]:
    """``'all'`` or a comma list -> benchmark names (any case, returned lower-case) and file
    paths (returned exactly as given: paths are case-sensitive)."""
    if spec.strip() == "all":
        return list(BENCHMARK_SPLITS)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    return [n.lower() if n.lower() in BENCHMARK_SPLITS or n.lower() in ("demo", "all") else n for n in names]


_QA_SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".parquet")


def _stem(name: str) -> str:
    for suffix in _QA_SUFFIXES:
        if name.lower().endswith(suffix):
            return name[: -len(suffix)]
    return name


def dataset_key(path: Path, data_dir: Path | None) -> tuple[str, str | None]:
    """(key, split) naming a QA file in eval outputs, unique per file and readable:

    - under ``data_dir`` in FlashRAG's layout (``DATA_DIR/nq/test.jsonl``): ``nq/test``, split
      ``test``; flat (``DATA_DIR/nq_test.jsonl``, ``DATA_DIR/nq.jsonl``) for the seven
      benchmarks: ``nq/test`` too (the benchmark's split when the name has none);
    - anywhere else: the path relative to the working directory (``FlashRAG_datasets/nq/test.jsonl``),
      or the absolute path for a file outside it; split unknown (None).
    """
    resolved = Path(os.path.abspath(path))
    try:
        rel = resolved.relative_to(Path(os.path.abspath(data_dir))) if data_dir is not None else None
    except ValueError:
        rel = None
    if rel is not None and len(rel.parts) == 2:
        split = _stem(rel.parts[1])
        return f"{rel.parts[0]}/{split}", split
    if rel is not None and len(rel.parts) == 1:
        stem = _stem(rel.parts[0])
        if stem.lower() in BENCHMARK_SPLITS:
            return f"{stem}/{BENCHMARK_SPLITS[stem.lower()]}", BENCHMARK_SPLITS[stem.lower()]
        name, _, split = stem.rpartition("_")
        if name.lower() in BENCHMARK_SPLITS and split:
            return f"{name}/{split}", split
    cwd = Path(os.getcwd())
    try:
        return str(resolved.relative_to(cwd)), None
    except ValueError:
        return str(resolved), None


# ----------------------------------------------------------------------------- groups in one file

NO_GROUPING = "none"
UNLABELLED = "unlabelled"
"""The group of rows whose group column is empty in a file where other rows have a value."""


def group_labels(path: Path, qa: pa.Table, column: str) -> list[str | None]:
    """The value of ``column`` for each row of ``qa`` (as :func:`load_qa` returned it from
    ``path``, same order), None where a row has none.

    Looked up first in each row's ``metadata`` JSON (where :func:`load_qa` puts Search-R1's
    ``data_source``), else as a top-level column or key of the raw file, which the QA artifact
    does not keep. ``column`` ``none`` gives no labels."""
    n = qa.num_rows
    if column == NO_GROUPING:
        return [None] * n
    labels: list[str | None] = [None] * n
    for i, meta in enumerate(qa.column("metadata").to_pylist()):
        try:
            obj = json.loads(meta) if meta else None
        except ValueError:
            obj = None
        if isinstance(obj, dict) and obj.get(column) not in (None, ""):
            labels[i] = str(obj[column])
    if any(v is not None for v in labels):
        return labels
    if file_kind(path) == "parquet":
        if column not in pq.read_schema(path).names:
            return labels
        raw = pq.read_table(path, columns=[column]).column(column).to_pylist()
    else:
        raw = [obj.get(column) for _, obj in iter_jsonl(Path(path))]
    if len(raw) != n:  # defensive: load_qa keeps every row, in order
        raise ZsearchError(f"{path}: {len(raw)} values in column {column!r} for {n} questions")
    return [None if v in (None, "") else str(v) for v in raw]


def split_groups(qa: pa.Table, labels: list[str | None]) -> list[tuple[str, pa.Table]]:
    """``qa`` split by label, groups in order of first appearance, rows in file order; []
    when the file holds fewer than two distinct labels (nothing to split). Rows without a
    label in a file that has labels form the group ``unlabelled``."""
    distinct = list(dict.fromkeys(v for v in labels if v is not None))
    if len(distinct) < 2:
        return []
    groups: dict[str, list[int]] = {}
    for i, v in enumerate(labels):
        groups.setdefault(UNLABELLED if v is None else v, []).append(i)
    return [(label, qa.take(pa.array(rows, pa.int64()))) for label, rows in groups.items()]
