"""Index folders that were tampered with, truncated or half-built: one "rebuild" line each,
never a traceback and never passages of another corpus. Also corpus files that are broken."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zsearch_cli.data.corpus import ingest_corpus
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.index import build_index, load_index


def write_corpus(path: Path, n: int, word: str) -> Path:
    rows = [{"id": f"{word}{i}", "title": f"{word} {i}", "text": f"{word} passage number {i} about topic{i % 7}"}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def two_indexes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("integrity")
    big = build_index(write_corpus(root / "big.jsonl", 60, "alpha"), root / "big", {"kind": "bm25"})
    small = build_index(write_corpus(root / "small.jsonl", 20, "beta"), root / "small", {"kind": "bm25"})
    return big, small


def copy_index(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


@pytest.mark.parametrize("host, donor", [("big", "small"), ("small", "big")])
def test_bm25_part_from_another_corpus_is_refused(two_indexes, tmp_path: Path, host: str, donor: str) -> None:
    # big host + small donor: postings point at rows 0..19 only -> used to return the
    # wrong passages silently; small host + big donor: rows past the end -> a crash.
    indexes = dict(zip(("big", "small"), two_indexes))
    target = copy_index(indexes[host], tmp_path / "idx")
    shutil.rmtree(target / "bm25")
    shutil.copytree(indexes[donor] / "bm25", target / "bm25")
    with pytest.raises(ZsearchError, match=r"part bm25/ was built from another corpus.*rebuild the index") as err:
        load_index(target)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("victim, action, words", [
    ("bm25/data.csc.index.npy", "truncate", "bm25/data.csc.index.npy is"),
    ("bm25/indices.csc.index.npy", "delete", "bm25/indices.csc.index.npy is missing"),
    ("bm25/vocab.index.json", "truncate", "bm25/vocab.index.json is"),
    ("bm25/part.json", "delete", "bm25/part.json is missing"),
    ("corpus.arrow", "truncate", "corpus.arrow is"),
    ("corpus.arrow", "delete", "corpus.arrow is missing"),
])
def test_missing_or_truncated_files_are_one_line_rebuild_errors(two_indexes, tmp_path: Path, victim: str,
                                                               action: str, words: str) -> None:
    target = copy_index(two_indexes[0], tmp_path / "idx")
    path = target / victim
    if action == "delete":
        path.unlink()
    else:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ZsearchError, match="rebuild the index") as err:
        load_index(target).search(["alpha"], 3)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_intact_index_still_loads_and_searches(two_indexes) -> None:
    hits = load_index(two_indexes[1]).search(["beta passage number 3"], 1)
    assert hits[0][0].id == "beta3"


# ----------------------------------------------------------------------------- stale temp folders


def test_stale_temp_folders_of_dead_builds_are_cleaned(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "c.jsonl", 5, "gamma")
    out = tmp_path / "idx"
    # A build killed with SIGKILL leaves its temp folder; simulate one owned by a dead pid
    # and one owned by a live process (ours), which must be left alone.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".idx.{dead_pid}.abc.tmp"
    stale.mkdir()
    (stale / "owner.pid").write_text(str(dead_pid))
    (stale / "corpus.arrow").write_bytes(b"x" * 1000)
    live = tmp_path / f".idx.{os.getpid()}.def.tmp"
    live.mkdir()
    (live / "owner.pid").write_text(str(os.getpid()))
    build_index(corpus, out, {"kind": "bm25"})
    assert not stale.exists()
    assert live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["c.jsonl", "idx", live.name])


def test_killed_build_leaves_a_temp_folder_the_next_build_removes(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "c.jsonl", 5, "delta")
    out = tmp_path / "idx"
    code = ("import os, sys\n"
            "import zsearch_cli.retrieval.index_build as ix\n"
            "def die(*a, **k): os._exit(9)\n"
            "ix.seal_part = die\n"
            f"ix.build_index({str(corpus)!r}, {str(out)!r}, {{'kind': 'bm25'}})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".idx.")]
    assert len(leftovers) == 1  # the kill left its temp folder behind
    build_index(corpus, out, {"kind": "bm25"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "idx"]


# ----------------------------------------------------------------------------- broken corpus files


def test_corrupt_gzip_is_one_line_error(tmp_path: Path) -> None:
    good = gzip.compress(b"".join(json.dumps({"id": str(i), "text": "word " * 50}).encode() + b"\n"
                                  for i in range(200)))
    bad = bytearray(good)
    for i in range(40, len(bad) - 20, 7):  # damage the deflate stream, keep the header valid
        bad[i] ^= 0x5A
    path = tmp_path / "corpus.jsonl.gz"
    path.write_bytes(bytes(bad))
    with pytest.raises(ZsearchError, match="corpus.jsonl.gz") as err:
        ingest_corpus(path, tmp_path / "out.parquet")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("ids, col", [(["a", None, "c"], "id"), (["a", None, None], "id")])
def test_null_ids_in_parquet_name_row_and_column(tmp_path: Path, ids: list, col: str) -> None:
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"id": pa.array(ids, pa.string()), "text": ["x", "y", "z"]}), path)
    with pytest.raises(ZsearchError, match=r"corpus.parquet: row 1: column 'id' is null"):
        ingest_corpus(path, tmp_path / "out.parquet")


def test_null_text_in_parquet_names_row_and_column(tmp_path: Path) -> None:
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": pa.array(["x", "y", None], pa.string())}), path)
    with pytest.raises(ZsearchError, match=r"corpus.parquet: row 2: column 'text' is null"):
        ingest_corpus(path, tmp_path / "out.parquet")
