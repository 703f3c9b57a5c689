"""Dense encoding on several processes (retrieval/encode_shards.py, docs/methods.md §7.1).

Every multi-process run is real: `accelerate launch` starts 2 CPU processes that meet over
gloo (as tests/test_distributed.py launches them), each running the `zsearch index` CLI from
this file (``_worker``) with two hooks. Around the marker writer: it logs which process marked
which slice, and (``ZSEARCH_TEST_KILL_RANK``) SIGKILLs that process right after its first
marker, once process 0 has marked its whole share: a kill planted for real. Around the
encoder: process 1 waits 1 s before each slice, so it always finishes last. The bundled MiniLM
encodes 256 generated passages of 3 to 60 words in slices of 32 (8 slices: 4 per process).

The one-process baseline runs in this process with 1 torch thread, as each launched process
has: the processes' thread count is kept out of the comparison (measured the same bytes with
1 and 2 threads here, but a BLAS does not promise it).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SLICE, N = 32, 256
QUERIES = ["river city music", "planet energy ocean", "the history of war", "forest language science king"]
OPTS = {"kind": "dense", "encoder": "minilm", "device": "cpu", "max_length": 64, "batch_size": 8,
        "encode_slice": SLICE}


def _flags(opts: dict[str, Any]) -> list[str]:
    return [a for k, v in opts.items() for a in (f"--{k.replace('_', '-')}", str(v))]


# ------------------------------------------------------------------ the launched processes


def _worker(argv: list[str]) -> None:
    """One launched process: the `zsearch` CLI, its markers logged (and maybe its kill planted)."""
    import time

    import torch

    import zsearch_cli.retrieval.dense as dense
    import zsearch_cli.retrieval.encode_shards as shards
    from zsearch_cli.cli import app

    log, kill = os.environ["ZSEARCH_TEST_SLICE_LOG"], os.environ.get("ZSEARCH_TEST_KILL_RANK")
    mark, encode = shards._mark_done, dense.Encoder.encode

    def logged_mark(work: Path, index: int, rows: Any, sha: str, build: str, rank: int) -> None:
        mark(work, index, rows, sha, build, rank)
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{rank} {index}\n")
        if kill is not None and rank == int(kill):
            # first the others finish their shares (else they race the kill): a process 0 that
            # did not wait for every slice would now build and rename in an index
            deadline = time.monotonic() + 120
            while len(list((work / "done").glob("*.json"))) < N // SLICE // 2 + 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGKILL)

    def slow_encode(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(1)  # process 1 writes each slice last: process 0 must wait for it
        return encode(self, *args, **kwargs)

    shards._mark_done = logged_mark
    if os.environ.get("RANK") == "1":
        dense.Encoder.encode = slow_encode
    torch.set_num_threads(1)
    sys.argv = ["zsearch", *argv]
    app()


def _launch(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``accelerate launch`` 2 processes on CPU running ``zsearch`` ``args`` through ``_worker``."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", __file__]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "ZSEARCH_TEST_SLICE_LOG": str(log), **(env or {})}
    return subprocess.run([*launch, *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=300)


def _marks(log: Path) -> list[tuple[int, int]]:
    """(rank, slice) per marker written, in order."""
    if not log.is_file():
        return []
    return [tuple(map(int, line.split())) for line in log.read_text().splitlines()]  # type: ignore[misc]


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    words = ("the of and river mountain city music science history war king language planet energy ocean "
             "forest bridge island engine painter").split()
    path = tmp_path_factory.mktemp("shards") / "corpus.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(N):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 60)))
            fh.write(json.dumps({"id": f"p{i}", "title": f"Passage {i}", "text": text}) + "\n")
    return path


@pytest.fixture(scope="module")
def single(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The one-process build (this process, 1 torch thread)."""
    import torch

    from zsearch_cli.retrieval.index import build_index

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return build_index(corpus, tmp_path_factory.mktemp("single") / "idx", OPTS)
    finally:
        torch.set_num_threads(threads)


def _same_index(a: Path, b: Path) -> None:
    """The same embedding bytes, the same faiss file, the same search results and scores."""
    from zsearch_cli.retrieval.index import load_index

    assert (a / "dense" / "embeddings.npy").read_bytes() == (b / "dense" / "embeddings.npy").read_bytes()
    assert (a / "dense" / "index.faiss").read_bytes() == (b / "dense" / "index.faiss").read_bytes()
    hits_a, hits_b = load_index(a).search(QUERIES, 10, "dense"), load_index(b).search(QUERIES, 10, "dense")
    assert [[(h.id, h.score) for h in q] for q in hits_a] == [[(h.id, h.score) for h in q] for q in hits_b]


def _nothing_complete(folder: Path, out: Path) -> None:
    """No index at ``out``, and nothing anywhere beside it that looks like one."""
    from zsearch_cli.errors import ZsearchError
    from zsearch_cli.retrieval.index import load_index

    assert not out.exists()
    assert not list(folder.rglob("manifest.json")) and not list(folder.rglob("part.json"))
    with pytest.raises(ZsearchError):
        load_index(out)


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return " ".join(capsys.readouterr().err.split())  # rich wraps long lines


# ------------------------------------------------------------------ tests


def test_two_processes_write_the_bytes_of_one(corpus: Path, single: Path, tmp_path: Path) -> None:
    out, log = tmp_path / "idx", tmp_path / "marks.log"
    done = _launch(["index", str(corpus), "--out", str(out), *_flags(OPTS)], log)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    _same_index(single, out)
    # each process its contiguous run of slices, each slice once; the work folder is gone
    assert sorted(_marks(log)) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 4), (1, 5), (1, 6), (1, 7)]
    assert not (tmp_path / ".idx.encode").exists()
    record = json.loads((out / "manifest.json").read_text())["dense"]["encode"]
    assert record["processes"] == 2 and record["threads"] == [1, 1] and record["slices_encoded"] == 8
    assert json.loads((single / "manifest.json").read_text())["dense"]["encode"]["processes"] == 1


def test_a_killed_process_leaves_no_index_and_the_rerun_encodes_only_the_rest(corpus: Path, single: Path,
                                                                             tmp_path: Path) -> None:
    out, args = tmp_path / "idx", ["index", str(corpus), "--out", str(tmp_path / "idx"), *_flags(OPTS)]
    killed = _launch(args, tmp_path / "killed.log", env={"ZSEARCH_TEST_KILL_RANK": "1"})
    assert killed.returncode != 0
    before = _marks(tmp_path / "killed.log")
    assert sorted(before) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 4)], before  # process 1 died after slice 4
    _nothing_complete(tmp_path, out)
    kept = sorted(int(p.stem) for p in (tmp_path / ".idx.encode" / "done").glob("*.json"))
    assert kept == [0, 1, 2, 3, 4]

    done = _launch(args, tmp_path / "rerun.log")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert sorted(_marks(tmp_path / "rerun.log")) == [(0, 5), (0, 6), (1, 7)]  # only the unfinished ones, once each
    assert f"{len(kept)} of {N // SLICE} slices were done" in " ".join(done.stderr.split())
    _same_index(single, out)
    assert not (tmp_path / ".idx.encode").exists()


def test_a_damaged_or_foreign_work_folder_is_not_trusted(corpus: Path, single: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """One process: an interrupted build, one of its finished slices damaged on disk (it must be
    encoded again), then an interrupted build of other options (its slices must all be dropped)."""
    import torch

    import zsearch_cli.retrieval.encode_shards as shards
    from zsearch_cli.retrieval.index import build_index

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the baseline
    mark, marked = shards._mark_done, []

    def stop_after(n: int | None):
        def hook(*args: Any) -> None:
            mark(*args)
            marked.append(args[1])
            if n is not None and len(marked) == n:
                raise KeyboardInterrupt
        return hook

    out, work = tmp_path / "idx", tmp_path / ".idx.encode"
    try:
        monkeypatch.setattr(shards, "_mark_done", stop_after(3))
        with pytest.raises(KeyboardInterrupt):
            build_index(corpus, out, OPTS)
        _nothing_complete(tmp_path, out)
        assert marked == [0, 1, 2] and "the same command resumes them" in _err(capsys)
        emb = np.load(work / "embeddings.npy", mmap_mode="r+")
        emb[SLICE + 5, :3] = 0.5  # slice 1 damaged after it was marked done
        emb.flush()
        del emb
        marked.clear()
        monkeypatch.setattr(shards, "_mark_done", stop_after(None))
        build_index(corpus, out, OPTS)
        assert marked == [1, 3, 4, 5, 6, 7]
        _same_index(single, out)
        assert not work.exists()

        # another build's leftovers (another --batch-size changes the bytes) are discarded, not mixed in
        marked.clear()
        monkeypatch.setattr(shards, "_mark_done", stop_after(2))
        with pytest.raises(KeyboardInterrupt):
            build_index(corpus, tmp_path / "other", {**OPTS, "batch_size": 5})
        marked.clear()
        os.rename(tmp_path / ".other.encode", tmp_path / ".again.encode")
        monkeypatch.setattr(shards, "_mark_done", stop_after(None))
        capsys.readouterr()
        build_index(corpus, tmp_path / "again", OPTS)
        assert marked == list(range(N // SLICE))
        assert "discarding the encoded slices of another build (it differs in batch_size)" in _err(capsys)
        _same_index(single, tmp_path / "again")
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":  # a process started by the tests' `accelerate launch`
    code: Any = 0
    try:
        _worker(sys.argv[1:])
    except SystemExit as done:  # typer's app() ends with SystemExit
        code = done.code
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))
