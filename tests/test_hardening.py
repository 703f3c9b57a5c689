"""Hardening of files and secrets: written files follow the umask, and no message or log
line shows an API key."""

from __future__ import annotations

import logging
import os
import socket
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.errors import ZsearchError

runner = CliRunner()


@pytest.fixture(params=[0o022, 0o002], ids=["umask022", "umask002"])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_parquet_outputs_follow_the_umask(tmp_path, umask):
    # Before: mkstemp's 0600 survived the atomic rename, whatever the umask.
    from zsearch_cli.artifacts import write_artifact
    from zsearch_cli.schemas import QA

    path = write_artifact([{"id": "1", "question": "q?", "golden_answers": ["a"], "metadata": "{}"}],
                          tmp_path / "qa.parquet", QA)
    assert _mode(path) == 0o666 & ~umask


def test_index_folders_follow_the_umask(tmp_path, umask):
    # Before: mkdtemp's 0700 became the index folder's mode.
    out = tmp_path / "index"
    result = runner.invoke(app, ["index", "--out", str(out), "--kind", "bm25"])
    assert result.exit_code == 0, result.output
    assert _mode(out) == 0o777 & ~umask
    for p in out.rglob("*"):
        assert _mode(p) == (0o777 if p.is_dir() else 0o666) & ~umask, p


def test_checkpoint_folders_follow_the_umask(tmp_path, umask, monkeypatch):
    # Before: a fixed 0755, so group members could not write under umask 002.
    from zsearch_cli.train.checkpoint import atomic_dir

    monkeypatch.setenv("ZSEARCH_CACHE", str(tmp_path / "cache"))
    folder = atomic_dir(tmp_path / "step-1", lambda tmp: (tmp / "trainer_state.json").write_text("{}"))
    assert _mode(folder) == 0o777 & ~umask
    assert _mode(folder / "trainer_state.json") == 0o666 & ~umask
    # the signing key is the one exception: a secret stays the user's own
    assert _mode(tmp_path / "cache" / "checkpoint.key") == 0o600


# ----------------------------------------------------------------------------- secrets

KEY = "sk-serp-5e3f9a1b7c"


def test_redact_knows_keys_tokens_and_passwords(monkeypatch):
    from zsearch_cli.errors import redact

    monkeypatch.setenv("SERPAPI_API_KEY", KEY)
    text = redact(f"GET https://serpapi.com/search.json?q=x&api_key={KEY}&num=3 and {KEY} alone, "
                  "Authorization: Bearer abcdefgh12345678, http://user:hunter22@host/v1, 'api_key': 'zzzz9999'")
    assert KEY not in text and "abcdefgh12345678" not in text and "hunter22" not in text and "zzzz9999" not in text
    assert "q=x" in text and "num=3" in text and "host/v1" in text


def test_serpapi_key_is_not_in_errors():
    # Before: requests' ConnectionError names the URL, api_key=... included.
    from zsearch_cli.search.base import SearchRequest
    from zsearch_cli.search.web import SerpAPISearch

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    search = SerpAPISearch(api_key=KEY, base_url=f"http://127.0.0.1:{port}/search.json", timeout=1, retries=1,
                           backoff=0)
    with pytest.raises(ZsearchError) as info:
        search.search([SearchRequest("q", "r0", "q?", ("a",))], 3)
    assert "search.json" in str(info.value) and KEY not in str(info.value)


def test_cli_errors_and_log_lines_are_redacted(monkeypatch, caplog, capsys):
    monkeypatch.setenv("SERPAPI_API_KEY", KEY)
    from zsearch_cli.cli_base import one_line_errors

    @one_line_errors
    def failing() -> None:
        raise ZsearchError(f"https://serpapi.com/search.json?q=x&api_key={KEY} failed")

    with pytest.raises(BaseException):
        failing()
    err = capsys.readouterr().err
    assert "error:" in err and "q=x" in err and KEY not in err
    # any library's log line: urllib3 logs the request URL (with the key) at DEBUG
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("urllib3.connectionpool").debug('%s://%s "GET %s"', "https", "serpapi.com",
                                                          f"/search.json?api_key={KEY}")
    assert caplog.records and all(KEY not in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------------------- error content


def _qa_rows(bad_row: int, bad_answers) -> list[dict]:
    rows = [{"id": str(i), "question": f"q{i}?", "golden_answers": [f"a{i}"]} for i in range(4)]
    rows[bad_row]["golden_answers"] = bad_answers
    return rows


@pytest.mark.parametrize("answers, needle", [
    ([1, 2], "must be a list of strings"),      # before: "has a value of the wrong type", no row
    (["a", None], "null"),                     # before: accepted, then crashed in scoring
    (["a", 3.5], "must be a list of strings"),
])
def test_jsonl_bad_golden_answers_name_the_row_and_column(tmp_path, answers, needle):
    import json

    from zsearch_cli.artifacts import read_artifact
    from zsearch_cli.schemas import QA

    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _qa_rows(2, answers)))
    with pytest.raises(ZsearchError) as info:
        read_artifact(path, QA)
    message = str(info.value)
    assert f"{path}: row 2: column 'golden_answers'" in message and needle in message, message


def test_parquet_wrong_types_name_the_row_and_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zsearch_cli.artifacts import read_artifact
    from zsearch_cli.schemas import QA, TRAJECTORY

    # golden_answers as list<int64> (the reported case): row 0 is the first bad one
    path = tmp_path / "qa.parquet"
    pq.write_table(pa.table({"id": ["0", "1"], "question": ["q?", "r?"], "golden_answers": [[1], [2]]}), path)
    with pytest.raises(ZsearchError, match=r"row 0: column 'golden_answers' must be a list of strings"):
        read_artifact(path, QA)
    # a null inside the list, in Parquet
    pq.write_table(pa.table({"id": ["0", "1"], "question": ["q?", "r?"], "golden_answers": [["a"], ["b", None]]}),
                   path)
    with pytest.raises(ZsearchError, match=r"row 1: column 'golden_answers' holds a null"):
        read_artifact(path, QA)
    # an int column that does not fit its type (int64 -> int32) at row 1
    from zsearch_cli.schemas import TRAJECTORY as T

    table = pa.table({f.name: pa.nulls(2, f.type) for f in T.schema})
    table = table.set_column(T.schema.get_field_index("sample_index"), "sample_index",
                             pa.array([0, 2**40], pa.int64()))
    path = tmp_path / "traj.parquet"
    pq.write_table(table, path)
    with pytest.raises(ZsearchError, match=r"row 1: column 'sample_index'"):
        read_artifact(path, TRAJECTORY)
    # a string column where a number belongs
    table = table.set_column(T.schema.get_field_index("sample_index"), "sample_index", pa.array(["0", "x"]))
    pq.write_table(table, path)
    with pytest.raises(ZsearchError, match=r"row 0: column 'sample_index' must be int32"):
        read_artifact(path, TRAJECTORY)


def test_search_r1_parquet_with_a_null_gold_names_the_row(tmp_path):
    # Before: str(None) made the gold answer the string "None", silently.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zsearch_cli.data.qa import load_qa

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({
        "question": ["Who?", "What?"],
        "reward_model": [{"ground_truth": {"target": ["Bob"]}}, {"ground_truth": {"target": ["x", None]}}],
    }), path)
    with pytest.raises(ZsearchError, match=r"row 1: column 'reward_model.ground_truth.target'"):
        load_qa(path)
