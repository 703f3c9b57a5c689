"""Text a tokenizer cannot take (issue 36): a lone surrogate, a NUL, invalid UTF-8, in the QA
files of eval and train and in corpora, is one line naming the file, the row (or line) and the
column, at read time, before any model loads."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zsearch_cli.data.qa import load_qa
from zsearch_cli.errors import ZsearchError
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import CORPUS


def test_a_lone_surrogate_in_a_jsonl_question_names_the_row(tmp_path):
    path = tmp_path / "qa.jsonl"
    # the second row's question holds JSON's \\ud800: valid JSON, no valid text
    path.write_text('{"id": "a", "question": "ok?", "golden_answers": ["x"]}\n'
                    '{"id": "b", "question": "bad \\ud800 one?", "golden_answers": ["y"]}\n')
    with pytest.raises(ZsearchError, match=r"qa.jsonl: row 1: column 'question' holds a lone surrogate \(U\+D800\) "
                                           r"at character 4$"):
        load_qa(path)


def test_a_nul_in_a_parquet_corpus_names_the_row_and_column(tmp_path):
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"id": ["1", "2"], "title": ["t", "u"], "text": ["fine", "a\x00b"]}), path)
    with pytest.raises(ZsearchError, match=r"corpus.parquet: row 1: column 'text' holds a NUL character$"):
        read_artifact(path, CORPUS)


def test_invalid_utf8_in_a_jsonl_file_names_the_line(tmp_path):
    path = tmp_path / "corpus.jsonl"
    lines = [b'{"id": "1", "title": "t", "text": "fine"}'] * 3 + [b'{"id": "9", "title": "t", "text": "caf\xe9"}']
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(ZsearchError, match=r"corpus.jsonl: line 4: not valid UTF-8 \(byte 39 of the line: "
                                           r"invalid continuation byte\)$"):
        read_artifact(path, CORPUS)
