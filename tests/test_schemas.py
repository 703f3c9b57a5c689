"""Artifact validation: every bad-input case gives one line naming file, column and row."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zsearch_cli import __version__
from zsearch_cli.data.corpus import corpus_fingerprint, ingest_corpus, iter_corpus_batches, split_contents
from zsearch_cli.data.qa import find_dataset_file, load_qa
from zsearch_cli.errors import ZsearchError
from zsearch_cli.artifacts import read_artifact, read_metadata, write_artifact
from zsearch_cli.schemas import CORPUS, QA


def _jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GOOD = [
    {"id": "q1", "question": "Who wrote Hamlet?", "golden_answers": ["Shakespeare"], "metadata": {"type": "single-hop"}},
    {"id": "q2", "question": "Capital of France?", "golden_answers": ["Paris"]},
]


def _error(fn, *args) -> str:
    with pytest.raises(ZsearchError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg  # one line, always
    return msg


def test_good_flashrag_jsonl_loads(tmp_path):
    table = load_qa(_jsonl(tmp_path / "qa.jsonl", GOOD))
    assert table.schema == QA.schema
    assert table.column("golden_answers").to_pylist() == [["Shakespeare"], ["Paris"]]
    # metadata dicts are kept as JSON text; a missing one is null
    assert json.loads(table.column("metadata")[0].as_py()) == {"type": "single-hop"}
    assert table.column("metadata")[1].as_py() is None


def test_missing_file(tmp_path):
    assert "no such file" in _error(load_qa, tmp_path / "nope.jsonl")


def test_empty_file(tmp_path):
    (tmp_path / "e.jsonl").write_text("")
    assert "e.jsonl: file is empty" in _error(load_qa, tmp_path / "e.jsonl")


def test_not_parquet_or_jsonl(tmp_path):
    (tmp_path / "qa.txt").write_text("hello")
    assert "unknown file type" in _error(load_qa, tmp_path / "qa.txt")
    # a .parquet name with garbage inside
    (tmp_path / "bad.parquet").write_text("not parquet at all")
    assert "not a readable Parquet file" in _error(load_qa, tmp_path / "bad.parquet")
    # invalid JSON names the line
    (tmp_path / "bad.jsonl").write_text('{"id": "1"}\n{oops\n')
    assert "bad.jsonl: line 2: not valid JSON" in _error(load_qa, tmp_path / "bad.jsonl")


def test_missing_column(tmp_path):
    rows = [{"id": "q1", "question": "x?"}]
    msg = _error(load_qa, _jsonl(tmp_path / "qa.jsonl", rows))
    assert "qa.jsonl" in msg and "missing column 'golden_answers'" in msg


def test_missing_column_parquet(tmp_path):
    pq.write_table(pa.table({"id": ["1"], "golden_answers": [["a"]]}), tmp_path / "qa.parquet")
    msg = _error(load_qa, tmp_path / "qa.parquet")
    assert "qa.parquet: missing column 'question'" in msg


def test_wrong_type_parquet(tmp_path):
    pq.write_table(pa.table({"id": ["1"], "question": [5], "golden_answers": [["a"]]}), tmp_path / "qa.parquet")
    msg = _error(load_qa, tmp_path / "qa.parquet")
    assert "column 'question' must be a string" in msg


def test_duplicate_ids(tmp_path):
    rows = GOOD + [{"id": "q1", "question": "Again?", "golden_answers": ["x"]}]
    msg = _error(load_qa, _jsonl(tmp_path / "qa.jsonl", rows))
    assert "column 'id' has duplicate value 'q1' (rows 0 and 2)" in msg


def test_empty_question(tmp_path):
    rows = GOOD + [{"id": "q3", "question": "   ", "golden_answers": ["x"]}]
    msg = _error(load_qa, _jsonl(tmp_path / "qa.jsonl", rows))
    assert "qa.jsonl: row 2: column 'question' is empty" in msg


def test_golden_answers_not_a_list(tmp_path):
    rows = GOOD + [{"id": "q3", "question": "Why?", "golden_answers": "because"}]
    msg = _error(load_qa, _jsonl(tmp_path / "qa.jsonl", rows))
    assert "row 2: column 'golden_answers' must be a list of strings, got str" in msg
    # the same in Parquet: a string column where a list is expected
    pq.write_table(pa.table({"id": ["1"], "question": ["q"], "golden_answers": ["a"]}), tmp_path / "qa.parquet")
    assert "column 'golden_answers' must be a list of strings, got a string" in _error(load_qa, tmp_path / "qa.parquet")


def test_search_r1_parquet(tmp_path):
    table = pa.table({
        "data_source": ["nq"],
        "question": ["who sang x"],
        "reward_model": [{"ground_truth": {"target": ["Bob", "Robert"]}, "style": "rule"}],
        "extra_info": [{"index": 7, "split": "train"}],
    })
    pq.write_table(table, tmp_path / "train.parquet")
    qa = load_qa(tmp_path / "train.parquet")
    assert qa.column("id").to_pylist() == ["7"]
    assert qa.column("golden_answers").to_pylist() == [["Bob", "Robert"]]


def test_atomic_write_with_metadata(tmp_path):
    out = tmp_path / "sub" / "qa.parquet"
    write_artifact(load_qa(_jsonl(tmp_path / "qa.jsonl", GOOD)), out, QA, {"topk": 3})
    meta = read_metadata(out)
    assert meta == {"version": __version__, "artifact": "qa", "config": {"topk": 3}}
    assert [p.name for p in out.parent.iterdir()] == ["qa.parquet"]  # no temp file left behind
    assert read_artifact(out, QA).num_rows == 2


def test_failed_write_leaves_old_file(tmp_path):
    out = tmp_path / "qa.parquet"
    write_artifact(load_qa(_jsonl(tmp_path / "qa.jsonl", GOOD)), out, QA)
    before = out.read_bytes()
    with pytest.raises(Exception):
        write_artifact([{"id": 1, "question": object()}], out, QA)
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_wiki18_corpus_ingest_gz(tmp_path):
    src = tmp_path / "wiki.jsonl.gz"
    with gzip.open(src, "wt") as fh:
        fh.write(json.dumps({"id": "0", "contents": '"Paris"\nParis is the capital of France.'}) + "\n")
        fh.write(json.dumps({"id": "1", "contents": '"Berlin"\nBerlin is in Germany.'}) + "\n")
    n = ingest_corpus(src, tmp_path / "corpus.parquet")
    table = read_artifact(tmp_path / "corpus.parquet", CORPUS)
    assert n == 2 and table.column("title").to_pylist() == ["Paris", "Berlin"]
    assert split_contents('"A b"\ntext here') == ("A b", "text here")


def test_corpus_duplicate_ids_named(tmp_path):
    src = _jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    assert "c.jsonl: column 'id' has duplicate value 'a'" in _error(ingest_corpus, src, tmp_path / "o.parquet")
    assert not (tmp_path / "o.parquet").exists()


def test_fingerprint_ignores_format_and_batching(tmp_path):
    rows = [{"id": str(i), "title": f"T{i}", "text": f"text {i}"} for i in range(10)]
    a = corpus_fingerprint(iter_corpus_batches(_jsonl(tmp_path / "c.jsonl", rows)))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet", row_group_size=3)
    b = corpus_fingerprint(iter_corpus_batches(tmp_path / "c.parquet"))
    assert a == b
    rows[3]["text"] = "changed"
    assert corpus_fingerprint(iter_corpus_batches(_jsonl(tmp_path / "d.jsonl", rows))) != a


def test_dataset_lookup_error_says_where(tmp_path):
    msg = _error(find_dataset_file, "nq", "test", tmp_path)
    assert str(tmp_path / "nq" / "test.jsonl") in msg and "FlashRAG" in msg


def test_a_key_the_schema_lacks_is_an_error_when_writing(tmp_path):
    # Silently dropping it would lose a value someone meant to save (as the proposer's
    # columns once were in the saved rollouts).
    row = {"id": "q1", "question": "Who?", "golden_answers": ["x"], "hops": 2}
    msg = _error(write_artifact, [row], tmp_path / "qa.parquet", QA)
    assert "has no column 'hops'" in msg and "schemas.py" in msg
    assert not (tmp_path / "qa.parquet").exists()


def test_every_protocol_column_is_written_in_stored_form():
    """A string column named like a protocol field (``retriever`` holds the --search spec as
    given, a URL's key included) must be declared ``stored`` by its artifact, or the key would
    reach the rows though the metadata withholds it; the writer applies what is declared."""
    from zsearch_cli.schemas import ALL_ARTIFACTS, PROTOCOL_COLUMNS

    names = {name for name, _ in PROTOCOL_COLUMNS}
    for artifact in ALL_ARTIFACTS.values():
        strings = {f.name for f in artifact.schema if pa.types.is_string(f.type)}
        assert strings & names <= artifact.stored, artifact.name


def test_a_stored_column_is_written_without_its_key(tmp_path):
    from zsearch_cli.schemas import METRICS

    spec = "http://127.0.0.1:8000/retrieve?api_key=sk-secret-123"
    path = write_artifact([{"step": 1, "retriever": spec, "model": "m"}], tmp_path / "m.parquet", METRICS)
    row = read_artifact(path, METRICS).to_pylist()[0]
    assert "sk-secret-123" not in row["retriever"] and row["retriever"].startswith("http://127.0.0.1:8000/retrieve")
