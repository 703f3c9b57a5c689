"""The corpus audit of one QA set against one index: which gold answers occur in some
passage (answerable), at what rank the index's retriever, queried with the question itself,
first returns a passage holding one (answer recall@k), and whether the supporting titles the
data names exist in the corpus (support coverage).

Fast because it never reads the whole corpus per question. A passage can hold an answer as a
token sequence only if it has every BM25 term of that answer, so the candidates are the
intersection of the answer's posting lists (shortest first) in the index's own BM25 part;
only those are read and checked (:mod:`.answers`), in corpus order, stopping at the first
that holds it. The terms come from two spellings of the answer, as given and normalised
(their candidate sets are united): the BM25 tokenizer splits at punctuation that FlashRAG's
normalisation deletes, so "Jean-Paul" is found through the raw spelling's terms (jean, paul)
and "U.S." in a passage writing "US" through the normalised one (us). Not found: a passage
that writes an answer with punctuation inside a word that no gold spelling has ("U.S." for
the gold "US"). An answer with no BM25 term at all (only stopwords: "no", "it") is looked for
by streaming the corpus until its first occurrence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zsearch_cli.audit.answers import AnswerSet
from zsearch_cli.errors import ZsearchError

AUDIT_VERSION = "audit-v1"
"""Bump when what the audit counts changes (the normalisation, the matching, the depth)."""
RECALL_AT = (1, 3, 5, 10)
DEPTH = max(RECALL_AT)
"""Passages retrieved per question: recall@k is read off the first answer rank for k <= DEPTH."""
SEARCH_BATCH = 256
"""Questions retrieved per call (the BM25 searcher spreads a batch over its threads)."""
_FIRST_CHUNK = 16
"""Candidates read at once, growing 4x: a frequent answer is found in the first few."""


class PostingLists:
    """Term id -> the corpus rows holding it (ascending), from the index's BM25 part: the
    CSC columns of the bm25s backend, or the rank-bm25 backend's (doc, term) postings sorted
    by term once."""

    def __init__(self, searcher: Any, directory: Path):
        if searcher.backend == "bm25s":
            scores = searcher.model.scores
            self.indptr, self.rows = np.asarray(scores["indptr"]), np.asarray(scores["indices"])
        else:
            term = np.load(directory / "postings.term.npy")
            order = np.argsort(term, kind="stable")  # docs stay ascending within a term
            self.rows = np.load(directory / "postings.doc.npy")[order]
            counts = np.bincount(term, minlength=len(searcher.vocab))
            self.indptr = np.r_[0, np.cumsum(counts)]

    def size(self, term: int) -> int:
        return int(self.indptr[term + 1] - self.indptr[term])

    def rows_of(self, term: int) -> np.ndarray:
        return self.rows[self.indptr[term] : self.indptr[term + 1]]


class AnswerLocator:
    """Finds, for a question's golds, a corpus row holding each (see the module docstring).

    ``index`` is a loaded :class:`~zsearch_cli.retrieval.index.SearchIndex` with a BM25 part."""

    def __init__(self, index: Any):
        searcher = index.bm25
        if searcher is None:
            raise ZsearchError(f"{index.index_dir}: the audit needs the index's BM25 part (its inverted index); "
                               "build one with `zsearch index --kind bm25` (or hybrid)")
        self.index = index
        self.tokenizer, self.vocab = searcher.tokenizer, searcher.vocab
        self.postings = PostingLists(searcher, index.index_dir / "bm25")

    # ------------------------------------------------------------------ candidates

    def _term_rows(self, spelling: str) -> np.ndarray | None:
        """Rows having every BM25 term of ``spelling``; None when it has no term (no constraint)."""
        terms = self.tokenizer.terms(spelling)
        if not terms:
            return None
        ids = [self.vocab.get(t) for t in dict.fromkeys(terms)]
        if any(i is None for i in ids):  # a term no passage has
            return np.zeros(0, dtype=np.int64)
        ids.sort(key=self.postings.size)
        rows = self.postings.rows_of(ids[0])
        for term in ids[1:]:
            if not len(rows):
                break
            rows = np.intersect1d(rows, self.postings.rows_of(term), assume_unique=True)
        return np.asarray(rows, dtype=np.int64)

    def candidates(self, raw: str, normalized: str) -> np.ndarray | None:
        """Rows that may hold the answer, ascending; None = any row may (scan the corpus)."""
        found = []
        for spelling in dict.fromkeys((raw, normalized)):
            rows = self._term_rows(spelling)
            if rows is None:
                return None
            found.append(rows)
        return found[0] if len(found) == 1 else np.union1d(*found)

    # ------------------------------------------------------------------ reading passages

    def _texts(self, rows: Sequence[int]) -> Iterator[tuple[int, str, str, str]]:
        for row, (pid, title, text, _) in zip(rows, self.index.records(rows)):
            yield int(row), pid, title, text

    def first_holding(self, answers: AnswerSet, which: int) -> tuple[int, str] | None:
        """(row, passage id) of the first passage in corpus order holding gold ``which``."""
        rows = self.candidates(answers.raw[which], answers.normalized[which])
        if rows is None:
            passages: Iterator[tuple[int, str, str, str]] = self.index.scan()  # no BM25 term: every passage
        else:
            passages = self._chunked(rows)
        for row, pid, title, text in passages:
            if answers.found_in([title, text], [which]):
                return row, pid
        return None

    def _chunked(self, rows: np.ndarray) -> Iterator[tuple[int, str, str, str]]:
        at, size = 0, _FIRST_CHUNK
        while at < len(rows):
            yield from self._texts(rows[at : at + size].tolist())
            at, size = at + size, size * 4


@dataclass
class Question:
    id: str
    question: str
    golden_answers: list[str]
    metadata: str | None


def audit_questions(locator: AnswerLocator, questions: Sequence[Question], dataset: str, method: str,
                    on_done: Callable[[int], None] = lambda n: None) -> list[dict[str, Any]]:
    """One AUDIT_EXAMPLE row per question (support columns filled by :func:`add_support`)."""
    rows: list[dict[str, Any]] = []
    for start in range(0, len(questions), SEARCH_BATCH):
        batch = questions[start : start + SEARCH_BATCH]
        hits = locator.index.search([q.question for q in batch], DEPTH, method)
        for q, passages in zip(batch, hits):
            rows.append(_audit_one(locator, q, passages, dataset))
        on_done(len(batch))
    return rows


def _audit_one(locator: AnswerLocator, q: Question, passages: Sequence[Any], dataset: str) -> dict[str, Any]:
    answers = AnswerSet(q.golden_answers)
    found: dict[int, str] = {}  # gold index -> a passage id holding it
    rank = gold = None
    for r, p in enumerate(passages, 1):
        held = answers.found_in([p.title, p.text]) if answers else []
        for i in held:
            found.setdefault(i, p.id)
        if held and rank is None:
            rank, gold = r, p.id
    for i in range(len(answers.normalized)):
        if i not in found:
            hit = locator.first_holding(answers, i)
            if hit is not None:
                found[i] = hit[1]
                gold = gold or hit[1]
    return {
        "dataset": dataset, "id": q.id, "question": q.question, "golden_answers": list(q.golden_answers),
        "answerable": bool(found), "answers_found": [answers.raw[i] for i in sorted(found)],
        "answer_passage_ids": [found[i] for i in sorted(found)], "gold_passage_id": gold, "answer_rank": rank,
        "retrieved_ids": [p.id for p in passages],
        "support_kind": None, "support": None, "support_missing": None, "support_covered": None,
    }


# ----------------------------------------------------------------------------- support coverage


def support_targets(metadata: str | dict | None) -> tuple[str, list[str]] | None:
    """``("title", titles)`` or ``("id", passage ids)`` the question's metadata names as its
    support, None when it names none. Read, in FlashRAG's files: HotpotQA and 2Wiki
    ``supporting_facts`` (``{"title": [...], "sent_id": [...]}`` or ``[[title, sent], ...]``),
    MuSiQue ``paragraphs`` (those with ``is_supporting``); also ``supporting_titles`` and
    (zsearch's demo set) ``supporting_ids``."""
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata)
        except ValueError:
            return None
    if not isinstance(metadata, dict):
        return None
    facts = metadata.get("supporting_facts")
    titles: list[Any] | None = None
    if isinstance(facts, dict) and isinstance(facts.get("title"), list):
        titles = facts["title"]
    elif isinstance(facts, list):
        titles = [f[0] if isinstance(f, (list, tuple)) and f else f.get("title") if isinstance(f, dict) else None
                  for f in facts]
    elif isinstance(metadata.get("paragraphs"), list):
        titles = [p.get("title") for p in metadata["paragraphs"] if isinstance(p, dict) and p.get("is_supporting")]
    elif isinstance(metadata.get("supporting_titles"), list):
        titles = metadata["supporting_titles"]
    if titles is not None:
        clean = list(dict.fromkeys(str(t) for t in titles if t not in (None, "")))
        return ("title", clean) if clean else None
    ids = metadata.get("supporting_ids")
    if isinstance(ids, list) and ids:
        return "id", list(dict.fromkeys(str(i) for i in ids))
    return None


def add_support(index: Any, rows: list[dict[str, Any]], questions: Sequence[Question]) -> None:
    """Fill each row's support columns: which named titles (or ids) exist in the corpus.
    One vectorised pass over the corpus's title (id) column per kind, whatever its size."""
    targets = [support_targets(q.metadata) for q in questions]
    present: dict[str, set[str]] = {}
    for kind in ("title", "id"):
        wanted = sorted({v for t in targets if t and t[0] == kind for v in t[1]})
        if not wanted:
            continue
        value_set = pa.array(wanted, pa.string())
        seen: set[str] = set()
        for column in index.column(kind).chunks:
            seen.update(pc.filter(column, pc.is_in(column, value_set=value_set)).to_pylist())
        present[kind] = seen
    for row, target in zip(rows, targets):
        if target is None:
            continue
        kind, values = target
        missing = [v for v in values if v not in present.get(kind, set())]
        row.update(support_kind=kind, support=values, support_missing=missing, support_covered=not missing)


# ----------------------------------------------------------------------------- summary


def summarize_audit(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The numbers of one dataset: answerable, answer recall@k, support coverage (None where
    no question names support)."""
    n = len(rows)

    def share(values: Sequence[bool]) -> float | None:
        return float(sum(values) / len(values)) if values else None

    supported = [r["support_covered"] for r in rows if r["support_covered"] is not None]
    out: dict[str, Any] = {"n": n, "answerable": share([r["answerable"] for r in rows]) or 0.0,
                           "support_n": len(supported), "support_coverage": share(supported)}
    for k in RECALL_AT:
        out[f"recall_at_{k}"] = share([r["answer_rank"] is not None and r["answer_rank"] <= k for r in rows]) or 0.0
    return out
