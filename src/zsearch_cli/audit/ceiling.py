"""The audit behind an eval: ``zsearch eval`` looks for ``zsearch audit``'s files of the
same dataset key under INDEX/audit (the audit's default ``--out``) and uses them only when
they were computed from the same corpus (fingerprint) and the same QA file (sha256) and
cover every question the eval scores. The ceiling is then the share of those questions
that are answerable; answer recall@topk is added when the audit's retriever is the eval's
(method, BM25 k1/b/analyzer, encoder) and topk is within the audit's depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from zsearch_cli.audit.corpus import AUDIT_VERSION, DEPTH
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import AUDIT_EXAMPLE, AUDIT_SUMMARY

AUDIT_DIR = "audit"
EXAMPLES_FILE = "audit.examples.parquet"
SUMMARY_FILE = "audit.summary.parquet"
RETRIEVER_FIELDS = ("retriever", "bm25_k1", "bm25_b", "bm25_analyzer", "encoder")
"""What must equal between the audit and the eval for its recall@k to be the eval's retriever's."""


def default_audit_dir(index_dir: str | Path) -> Path:
    return Path(index_dir) / AUDIT_DIR


@dataclass
class Ceiling:
    answerable: float
    """The share of the eval's questions with a gold answer somewhere in the corpus."""
    recall: float | None
    """Answer recall@topk of the eval's retriever (None: another retriever, or topk past the depth)."""
    n: int
    path: Path
    gold: dict[str, str] = field(default_factory=dict)
    """Question id -> a passage id holding its answer (the ``gold`` probe's first passage)."""

    def record(self) -> dict[str, Any]:
        """What the eval's protocol metadata records about it."""
        return {"answerable": self.answerable, "recall": self.recall, "n": self.n, "file": str(self.path),
                "audit_version": AUDIT_VERSION}


def find_ceiling(root: Path, key: str, protocol: Mapping[str, Any], ids: Sequence[str],
                 topk: int | None) -> Ceiling | None:
    """The matching audit of dataset ``key`` under ``root`` for an eval with ``protocol``
    (its corpus and dataset fingerprints, its retriever) over questions ``ids``; None when
    there is none, or it does not match (see the module docstring)."""
    from zsearch_cli.scoring import dataset_dir

    folder = dataset_dir(root, key)
    summary_path, examples_path = folder / SUMMARY_FILE, folder / EXAMPLES_FILE
    if not (summary_path.is_file() and examples_path.is_file()):
        return None
    summary = read_artifact(summary_path, AUDIT_SUMMARY).to_pylist()[0]
    if (summary["audit_version"] != AUDIT_VERSION or not protocol.get("corpus_fingerprint")
            or summary["corpus_fingerprint"] != protocol.get("corpus_fingerprint")
            or summary["dataset_fingerprint"] != protocol.get("dataset_fingerprint")):
        return None
    rows = {r["id"]: r for r in read_artifact(examples_path, AUDIT_EXAMPLE).to_pylist()}
    if not ids or any(i not in rows for i in ids):
        return None
    chosen = [rows[i] for i in ids]
    same_retriever = all(summary.get(f) == protocol.get(f) for f in RETRIEVER_FIELDS)
    recall = None
    if same_retriever and topk is not None and topk <= DEPTH:
        recall = sum(r["answer_rank"] is not None and r["answer_rank"] <= topk for r in chosen) / len(chosen)
    return Ceiling(answerable=sum(r["answerable"] for r in chosen) / len(chosen), recall=recall, n=len(chosen),
                   path=examples_path, gold={r["id"]: r["gold_passage_id"] for r in chosen if r["gold_passage_id"]})


def gold_passages(index: Any, gold: Mapping[str, str]) -> dict[str, Any]:
    """Question id -> the :class:`Passage` with the audit's gold passage id, read from the
    index's corpus (one vectorised pass over its id column)."""
    wanted = sorted(set(gold.values()))
    if not wanted:
        return {}
    rows: dict[str, int] = {}
    offset = 0
    for chunk in index.column("id").chunks:
        hits = pc.indices_nonzero(pc.is_in(chunk, value_set=pa.array(wanted, pa.string())))
        for j in hits.to_pylist():
            rows.setdefault(chunk[j].as_py(), offset + j)
        offset += len(chunk)
    passages = {pid: index.get(row) for pid, row in rows.items()}
    return {qid: passages[pid] for qid, pid in gold.items() if pid in passages}
