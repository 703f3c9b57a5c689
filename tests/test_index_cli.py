"""`zsearch index` / `zsearch search` through the CLI, and the index directory contract."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from zsearch_cli import __version__
from zsearch_cli.cli import app
from zsearch_cli.data.corpus import corpus_fingerprint, iter_corpus_batches
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.index import build_index, load_index

ROWS = [
    {"id": "a1", "title": "Komodo dragon", "text": "The Komodo dragon is the largest living lizard, found in Indonesia."},
    {"id": "a2", "title": "Saturn", "text": "Saturn is the sixth planet from the Sun and has prominent rings."},
    {"id": "a3", "title": "Espresso", "text": "Espresso is coffee brewed by forcing hot water through finely ground beans."},
    {"id": "a4", "title": "Marathon", "text": "The marathon is a long-distance foot race of 42.195 kilometres."},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", ROWS)


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_index_then_search(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    result = run("index", str(corpus), "--out", str(out))
    assert result.exit_code == 0, result.output
    result = run("search", "which planet has rings", "--index", str(out), "-k", "2")
    assert result.exit_code == 0, result.output
    assert "bm25 top-2" in result.stdout and "a2" in result.stdout and "Saturn" in result.stdout
    assert "a1" not in result.stdout  # no query term: not a hit

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kinds"] == ["bm25"] and manifest["n_docs"] == 4
    assert manifest["corpus"]["fingerprint"] == corpus_fingerprint(iter_corpus_batches(corpus))
    assert manifest["zsearch_version"] == __version__ and manifest["created"]
    assert manifest["params"]["k1"] == 1.2 and manifest["params"]["bm25_backend"] == "bm25s"
    assert manifest["bm25"]["variant"] == "lucene"


def test_search_flags_reach_the_index(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    result = run("index", str(corpus), "--out", str(out), "--bm25-backend", "rank-bm25", "--k1", "0.9",
                 "--stemmer", "none", "--stopwords", "none")
    assert result.exit_code == 0, result.output
    params = json.loads((out / "manifest.json").read_text())["params"]
    assert (params["bm25_backend"], params["k1"], params["stemmer"]) == ("rank-bm25", 0.9, "none")
    result = run("search", "lizard", "--index", str(out), "--method", "dense")
    assert result.exit_code == 2 and "has no 'dense' search; it has: bm25" in result.stderr


@pytest.mark.parametrize("name, content, message", [
    ("missing.jsonl", None, "no such file"),
    ("empty.jsonl", "", "file is empty"),
    ("corpus.txt", "some text\n", "unknown file type"),
    ("dups.jsonl", '{"id": "x", "text": "a"}\n{"id": "y", "text": "b"}\n{"id": "x", "text": "c"}\n',
     "duplicate value 'x' (rows 0 and 2)"),
    ("blank.jsonl", "\n\n", "has no rows"),
    ("bad.jsonl", '{"id": "x", "text": "a"}\n{"id": "y"\n', "line 2: not valid JSON"),
])
def test_bad_corpus_is_one_line_exit_2(tmp_path: Path, name: str, content: str | None, message: str) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_text(content, encoding="utf-8")
    result = run("index", str(path), "--out", str(tmp_path / "idx"))
    assert result.exit_code == 2
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in result.output
    assert str(path) in err and message in err
    assert not (tmp_path / "idx").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # temp build removed


def test_bad_options_exit_2(corpus: Path, tmp_path: Path) -> None:
    result = run("index", str(corpus), "--out", str(tmp_path / "i"), "--kind", "sparse")
    assert result.exit_code == 2 and "unknown index kind 'sparse'" in result.stderr
    result = run("search", "q", "--index", str(tmp_path / "nothing"))
    assert result.exit_code == 2 and "not a zsearch index" in result.stderr


def test_no_corpus_argument_uses_the_demo_corpus(corpus: Path, tmp_path: Path, monkeypatch) -> None:
    import zsearch_cli.data.demo as demo

    monkeypatch.setattr(demo, "demo_corpus", lambda: corpus)
    result = run("index", "--out", str(tmp_path / "idx"))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "idx" / "manifest.json").read_text())["corpus"]["source"] == str(corpus)


def test_formats_share_a_fingerprint_and_corpus_check(tmp_path: Path) -> None:
    wiki = tmp_path / "wiki.jsonl.gz"
    with gzip.open(wiki, "wt", encoding="utf-8") as fh:
        for r in ROWS:
            fh.write(json.dumps({"id": r["id"], "contents": f'"{r["title"]}"\n{r["text"]}'}) + "\n")
    parquet = tmp_path / "corpus.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    index = load_index(build_index(wiki, tmp_path / "idx", {}), corpus=parquet)  # same passages: accepted
    assert [p.id for p in index.search(["espresso coffee"], 1)[0]] == ["a3"]

    other = write_jsonl(tmp_path / "other.jsonl", ROWS[:3])
    with pytest.raises(ZsearchError, match="other.jsonl: does not match the corpus"):
        load_index(tmp_path / "idx", corpus=other)


def test_index_api(corpus: Path, tmp_path: Path) -> None:
    index = load_index(build_index(corpus, tmp_path / "idx", {"kind": "bm25"}))
    assert len(index) == 4 and index.methods == ["bm25"]
    assert index.get(2).id == "a3" and index.get(2).title == "Espresso" and index.get(2).score is None
    assert index.name == load_index(tmp_path / "idx").name and "bm25" in index.name
    hits = index.search(["planet rings", "coffee beans", "saturn coffee"], topk=10)
    assert [[p.id for p in h] for h in hits[:2]] == [["a2"], ["a3"]]  # only passages with a query term
    assert {p.id for p in hits[2]} == {"a2", "a3"}
    assert hits[0][0].contents == '"Saturn"\n' + ROWS[1]["text"]
    with pytest.raises(ZsearchError, match="unknown search method 'fuzzy'"):
        index.search(["q"], 3, "fuzzy")
    with pytest.raises(ZsearchError, match="topk must be at least 1"):
        index.search(["q"], 0)
    with pytest.raises(ZsearchError, match="out of range"):
        index.get(4)
    assert index.search([], 3) == []


def test_corpus_is_memory_mapped(corpus: Path, tmp_path: Path) -> None:
    before = pa.total_allocated_bytes()
    index = load_index(build_index(corpus, tmp_path / "idx", {}))
    assert index._table.nbytes > 0
    assert pa.total_allocated_bytes() - before < index._table.nbytes  # buffers live in the mmap


def test_hits_are_read_from_the_right_record_batch(tmp_path: Path, monkeypatch) -> None:
    """corpus.arrow with many record batches: every row maps back to its own passage."""
    import zsearch_cli.data.corpus as corpus_mod

    monkeypatch.setattr(corpus_mod, "BATCH_ROWS", 3)
    rows = [{"id": f"r{i}", "title": None if i == 4 else f"Title {i}", "text": f"word{i} shared {'odd' * (i % 2)}"}
            for i in range(11)]
    index = load_index(build_index(write_jsonl(tmp_path / "c.jsonl", rows), tmp_path / "idx", {"kind": "bm25"}))
    assert index._table.column("id").num_chunks == 4
    for i, row in enumerate(rows):
        got = index.get(i)
        assert (got.id, got.title, got.text) == (row["id"], row["title"] or "", row["text"])
    hits = index.search([f"word{i}" for i in range(11)] + ["shared", "odd", "absent"], topk=20)
    assert [[p.id for p in h] for h in hits[:11]] == [[f"r{i}"] for i in range(11)]
    assert {p.id for p in hits[11]} == {f"r{i}" for i in range(11)}
    assert sorted(p.id for p in hits[12]) == sorted(f"r{i}" for i in range(1, 11, 2))
    assert hits[13] == [] and hits[4][0].title == ""
    assert all(p.text == rows[int(p.id[1:])]["text"] for h in hits for p in h)


def test_public_views_of_the_parts_over_many_record_batches(tmp_path: Path, monkeypatch) -> None:
    """bm25, column, records and scan: what the corpus audit reads, row for row as get() reads it."""
    import pyarrow.compute as pc

    import zsearch_cli.data.corpus as corpus_mod
    from zsearch_cli.retrieval.bm25 import BM25Searcher

    monkeypatch.setattr(corpus_mod, "BATCH_ROWS", 3)
    rows = [{"id": f"r{i}", "title": None if i == 4 else f"Title {i}", "text": f"word{i} shared"} for i in range(8)]
    index = load_index(build_index(write_jsonl(tmp_path / "c.jsonl", rows), tmp_path / "idx", {"kind": "bm25"}))
    assert isinstance(index.bm25, BM25Searcher)
    assert all(term in index.bm25.vocab for term in index.bm25.tokenizer.terms("shared word3"))
    expected = [(i, r["id"], r["title"] or "", r["text"]) for i, r in enumerate(rows)]
    assert list(index.scan()) == expected  # in corpus order across the three batches, null title as ""
    assert [rec[:3] for rec in index.records([7, 0, 4])] == [e[1:] for e in (expected[7], expected[0], expected[4])]
    ids = index.column("id")
    assert ids.num_chunks == 3 and ids.to_pylist() == [r["id"] for r in rows]
    titles = index.column("title")  # the audit's vectorised pass: which named titles exist
    assert pc.filter(titles, pc.is_in(titles, value_set=pa.array(["Title 5", "Title 9"]))).to_pylist() == ["Title 5"]
    with pytest.raises(ZsearchError, match="no column 'score'"):
        index.column("score")


def test_the_old_import_path_still_names_everything() -> None:
    # retrieval/index.py was split into index_format (layout), index_build and index (load,
    # search): code that imports any of its public names from the one module keeps working.
    import zsearch_cli.retrieval.index as index
    import zsearch_cli.retrieval.index_build as index_build
    import zsearch_cli.retrieval.index_format as index_format

    for name in ("build_index", "load_index", "print_search", "read_manifest", "SearchIndex", "DEFAULTS",
                 "BM25_PRESETS", "parse_kinds", "resolve_options", "check_index_files", "FORMAT", "MANIFEST",
                 "CORPUS_FILE", "PART_SEAL", "KINDS", "METHODS"):
        assert name in index.__all__ and hasattr(index, name), name
    assert index.build_index is index_build.build_index and index.DEFAULTS is index_build.DEFAULTS
    assert index.read_manifest is index_format.read_manifest and index.MANIFEST == index_format.MANIFEST


def test_rebuild_is_atomic(corpus: Path, tmp_path: Path) -> None:
    out = build_index(corpus, tmp_path / "idx", {})
    old = (out / "manifest.json").read_text()
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "x", "text": "a"}, {"id": "x", "text": "b"}])
    with pytest.raises(ZsearchError, match="duplicate"):
        build_index(bad, out, {})
    assert (out / "manifest.json").read_text() == old  # failed build left the old index alone
    smaller = write_jsonl(tmp_path / "small.jsonl", ROWS[:2])
    build_index(smaller, out, {})
    assert len(load_index(out)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "corpus.jsonl", "idx", "small.jsonl"]

    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(ZsearchError, match="not a zsearch index; refusing to overwrite"):
        build_index(corpus, precious, {})


def test_dense_option_mistakes_fail_before_any_work(corpus: Path, tmp_path: Path) -> None:
    result = run("index", str(corpus), "--out", str(tmp_path / "i"), "--kind", "dense", "--faiss-type", "IVF,PQ")
    assert result.exit_code == 2 and "unsupported faiss type 'IVF,PQ'" in result.stderr
    result = run("index", str(corpus), "--out", str(tmp_path / "i"), "--kind", "hybrid", "--encoder", "./no/such/model")
    assert result.exit_code == 2 and "encoder path ./no/such/model does not exist" in result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["corpus.jsonl"]
