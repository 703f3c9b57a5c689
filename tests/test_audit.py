"""``zsearch audit`` on a corpus built here, every number computed by hand, and the ceiling
``zsearch eval`` reads from it (only when the fingerprints match)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from zsearch_cli.audit.answers import AnswerSet, holds
from zsearch_cli.audit.ceiling import find_ceiling
from zsearch_cli.audit.corpus import RECALL_AT, support_targets
from zsearch_cli.cli import app
from zsearch_cli.commands.audit import run_audit
from zsearch_cli.config.commands import AuditOptions
from zsearch_cli.config.fields import build
from zsearch_cli.retrieval.index import build_index
from zsearch_cli.rewards import normalize_answer
from zsearch_cli.schemas import AUDIT_SUMMARY

FILLER = "alpha beta gamma delta"

CORPUS = [
    # Three passages with every term of q1 ("which river flows through the city of linz"; "the" and
    # "of" are stopwords): which, river, flow, through, citi, linz. 7 terms each with the title,
    # as p4 has.
    {"id": "p1", "title": "Rivers", "text": "which river flows through city linz"},
    {"id": "p2", "title": "Cities", "text": "city linz river flows which through"},
    {"id": "p3", "title": "Travel", "text": "through linz city which flows river"},
    # p4 shares only "linz" with q1, so it scores below p1-p3 (their linz part is the same: tf 1,
    # length 7, plus five more positive terms) and above every other passage (no q1 term): rank 4.
    {"id": "p4", "title": "Danube", "text": "danube passes linz on its way east"},
    # q2's gold "New York": p5 has both BM25 terms (new, york), so it is a candidate, but
    # "new york" is no token sequence of "new yorkshire inn stands in york" (only a substring).
    {"id": "p5", "title": "Yorkshire", "text": "A new Yorkshire inn stands in York."},
    # q3's gold "Jean-Paul Sartre" (normalised "jeanpaul sartre") is found through the raw
    # spelling's BM25 terms (jean, paul, sartr); p6 has no term of q3, so it is never retrieved.
    {"id": "p6", "title": "Philosophy", "text": "Jean-Paul Sartre wrote Nausea in 1938."},
    # q4's gold "No" is a stopword (no BM25 term): found by streaming the corpus; no q4 term here.
    {"id": "p7", "title": "Answers", "text": "No, said the board."},
    *[{"id": f"f{i}", "title": "Filler", "text": FILLER} for i in range(6)],
]

QUESTIONS = [
    {"id": "q1", "question": "Which river flows through the city of Linz?", "golden_answers": ["Danube"],
     "metadata": {"supporting_facts": {"title": ["Danube", "Upper Austria"], "sent_id": [0, 0]}}},
    {"id": "q2", "question": "Where do the Yankees play?", "golden_answers": ["New York"],
     "metadata": {"paragraphs": [{"title": "Yorkshire", "is_supporting": True}, {"title": "Ural", "is_supporting": False}]}},
    {"id": "q3", "question": "Which writer won the 1964 Nobel prize?", "golden_answers": ["Jean-Paul Sartre"]},
    {"id": "q4", "question": "Did the council agree?", "golden_answers": ["No"]},
]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    corpus = _write(root / "corpus.jsonl", CORPUS)
    qa = _write(root / "qa.jsonl", QUESTIONS)
    index = build_index(corpus, root / "index", {"kind": "bm25"})
    summaries = run_audit(build(AuditOptions, {"index": index, "datasets": str(qa)}), {})
    return root, index, qa, summaries


def _rows(index: Path) -> dict[str, dict]:
    (path,) = list((index / "audit").rglob("audit.examples.parquet"))
    return {r["id"]: r for r in pq.read_table(path).to_pylist()}


def test_answerable_and_recall_at_k_by_hand(built):
    root, index, qa, (summary,) = built
    rows = _rows(index)
    # q1: only p4 holds "danube", and the question ranks p4 fourth (see CORPUS)
    assert rows["q1"]["retrieved_ids"][:4][-1] == "p4" and rows["q1"]["answer_rank"] == 4
    assert rows["q1"]["answerable"] and rows["q1"]["gold_passage_id"] == "p4"
    # q2: "new york" is in p5 as a substring only, not as a token sequence
    assert not rows["q2"]["answerable"] and rows["q2"]["answers_found"] == [] and rows["q2"]["gold_passage_id"] is None
    # q3: in p6, which the question never retrieves; q4: a stopword answer found by the corpus scan
    assert (rows["q3"]["answerable"], rows["q3"]["answer_rank"], rows["q3"]["answer_passage_ids"]) == (True, None, ["p6"])
    assert (rows["q4"]["answerable"], rows["q4"]["gold_passage_id"]) == (True, "p7")
    # 3 of 4 answerable; only q1 is retrieved, at rank 4: in recall@5 and @10, not in @1 or @3
    assert summary["answerable"] == 0.75
    assert (summary["recall_at_1"], summary["recall_at_3"], summary["recall_at_5"], summary["recall_at_10"]) == (
        0.0, 0.0, 0.25, 0.25)


def test_support_coverage_reads_flashrag_metadata(built):
    root, index, qa, (summary,) = built
    rows = _rows(index)
    # HotpotQA/2Wiki supporting_facts: "Danube" is a title here, "Upper Austria" is not
    assert (rows["q1"]["support"], rows["q1"]["support_missing"], rows["q1"]["support_covered"]) == (
        ["Danube", "Upper Austria"], ["Upper Austria"], False)
    # MuSiQue paragraphs: only the supporting one counts, and it exists
    assert (rows["q2"]["support"], rows["q2"]["support_covered"]) == (["Yorkshire"], True)
    # no support named: null, and not counted
    assert rows["q3"]["support_covered"] is None
    assert (summary["support_n"], summary["support_coverage"]) == (2, 0.5)
    assert support_targets({"supporting_facts": [["A", 0], ["B", 1]]}) == ("title", ["A", "B"])
    assert support_targets({"supporting_ids": ["x"]}) == ("id", ["x"]) and support_targets("not json") is None


def test_the_audit_is_stamped_and_the_ceiling_needs_matching_fingerprints(built):
    root, index, qa, (summary,) = built
    manifest = json.loads((index / "manifest.json").read_text())
    assert summary["corpus_fingerprint"] == manifest["corpus"]["fingerprint"] and summary["retriever"] == "bm25"
    assert summary["dataset_fingerprint"].startswith("sha256:")
    assert [f"recall_at_{k}" for k in RECALL_AT] == [c for c in AUDIT_SUMMARY.schema.names if c.startswith("recall")]
    protocol = {k: summary[k] for k in ("corpus_fingerprint", "dataset_fingerprint", "retriever", "bm25_k1",
                                        "bm25_b", "bm25_analyzer", "encoder")}
    key = summary["dataset"]
    ceiling = find_ceiling(index / "audit", key, protocol, ["q1", "q2"], topk=5)
    # over the eval's own questions: q1 answerable (rank 4 <= 5), q2 not
    assert (ceiling.answerable, ceiling.recall, ceiling.gold) == (0.5, 0.5, {"q1": "p4"})
    assert find_ceiling(index / "audit", key, protocol, ["q1"], topk=3).recall == 0.0
    # another corpus, another QA file, a question the audit lacks: no ceiling
    assert find_ceiling(index / "audit", key, {**protocol, "corpus_fingerprint": "x"}, ["q1"], 3) is None
    assert find_ceiling(index / "audit", key, {**protocol, "dataset_fingerprint": "x"}, ["q1"], 3) is None
    assert find_ceiling(index / "audit", key, protocol, ["q1", "q9"], 3) is None
    # another retriever: the ceiling stands, its recall does not
    assert find_ceiling(index / "audit", key, {**protocol, "retriever": "dense"}, ["q1"], 3).recall is None


@pytest.fixture(scope="module")
def demo_bm25(tmp_path_factory) -> Path:
    """The demo corpus's BM25 index (built by the library: this module tests `audit`, not `index`)."""
    return build_index(None, tmp_path_factory.mktemp("demo") / "index", {"kind": "bm25"})


def test_audit_command_line_on_the_demo_corpus(demo_bm25, tmp_path):
    result = CliRunner().invoke(app, ["audit", "--index", str(demo_bm25), "--out", str(tmp_path / "a"),
                                      "--limit", "10"])
    assert result.exit_code == 0, result.output
    assert "answerable" in result.output and "demo" in result.output
    (summary,) = pq.read_table(tmp_path / "a" / "demo" / "audit.summary.parquet").to_pylist()
    assert summary["n"] == 10 and summary["limit"] == 10 and summary["support_n"] == 10


def test_a_dense_only_index_is_refused_in_one_line(tmp_path):
    from zsearch_cli.audit.corpus import AnswerLocator
    from zsearch_cli.errors import ZsearchError
    from zsearch_cli.retrieval.index import load_index

    # a real dense-only index (the bundled MiniLM over four passages): its bm25 view is None
    index = load_index(build_index(_write(tmp_path / "corpus.jsonl", CORPUS[:4]), tmp_path / "dense",
                                   {"kind": "dense"}))
    assert index.bm25 is None
    with pytest.raises(ZsearchError, match="needs the index's BM25 part") as err:
        AnswerLocator(index)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text", ["The U.S. Open!", "  an   apple a day ", "Jean-Paul's café, l'été", "x_y & z"])
def test_matching_is_flashrag_normalisation_as_a_token_sequence(text):
    answers = AnswerSet(["apple", "us open", "café", "xy z"])
    norm = normalize_answer(text)
    expected = [i for i, a in enumerate(answers.normalized) if holds(norm, a)]
    # the pre-filter never drops a text that holds an answer
    assert answers.found_in([text]) == expected
    assert not holds("new yorkshire inn", "new york") and holds("in new york city", "new york")
