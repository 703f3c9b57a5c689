"""Issue 36.11: rich's last progress-bar frame leaked into log files. With stderr not a
terminal rich draws no bar while a phase runs, but prints its final frame when the bar stops
(a line of ``━``, or an empty line for a transient bar). Every bar is now made by
``progress.progress_bar``, which is off in log mode, where the plain lines remain.

The commands are real processes with stderr in a file, as under nohup or Slurm (stdout, where
results such as eval's table go, in another file: a table may draw ``━`` there)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from helpers import TORCH_THREADS
from zsearch_cli.progress import progress_bar
from zsearch_cli.artifacts import write_artifact
from zsearch_cli.schemas import SFT_EXAMPLE

BAR_GLYPHS = ("━", "╸", "╺")
"""What rich's BarColumn draws; never in a log file."""


def _run(args: list[str], log: Path, cwd: Path) -> str:
    """Run ``zsearch ARGS`` with stderr in ``log``; returns the log."""
    env = {**os.environ, "OMP_NUM_THREADS": str(TORCH_THREADS), "TOKENIZERS_PARALLELISM": "false", "ZSEARCH_LOG_EVERY": "0.2"}
    with open(log, "w") as err, open(log.with_suffix(".out"), "w") as out:
        code = subprocess.run([sys.executable, "-m", "zsearch_cli", *args], stdout=out, stderr=err, env=env, cwd=cwd,
                              timeout=300).returncode
    text = log.read_text()
    assert code == 0, text[-3000:]
    return text


def _no_bar(log: str) -> None:
    assert not any(glyph in log for glyph in BAR_GLYPHS), log[-3000:]
    # a transient bar's last frame is an empty line (its erased bar)
    assert "" not in log.splitlines(), [line for line in log.splitlines()][:40]


def test_sft_log_has_its_plain_lines_and_no_bar(tmp_path, tiny_model_dir):
    rows = [{"id": f"e{i}", "prompt": f"Question {i}: who wrote it?", "completion": f"It was {i}."} for i in range(4)]
    data = write_artifact(rows, tmp_path / "pairs.parquet", SFT_EXAMPLE)
    log = _run(["sft", str(data), "--model", str(tiny_model_dir), "--out", str(tmp_path / "run"), "--device", "cpu",
                "--max-steps", "3", "--batch-size", "2", "--save-every", "0"], tmp_path / "sft.log", tmp_path)
    assert any(line.startswith("sft: 3/3 steps") for line in log.splitlines()), log[-3000:]
    _no_bar(log)  # before: the bar's last frame, "sft ━━━━━━━━ 3/3 loss … eval -", in the log


def test_eval_and_index_logs_have_their_plain_lines_and_no_bar(tmp_path, tiny_model_dir):
    log = _run(["index", "--out", str(tmp_path / "index"), "--kind", "bm25"], tmp_path / "index.log", tmp_path)
    assert "index: " in log
    _no_bar(log)
    log = _run(["eval", "--model", str(tiny_model_dir), "--index", str(tmp_path / "index"), "--out",
                str(tmp_path / "eval"), "--limit", "4", "--batch-size", "2", "--max-turns", "1", "--max-turn-tokens",
                "4", "--device", "cpu"], tmp_path / "eval.log", tmp_path)
    assert any(line.startswith("eval demo (agent): 4/4 questions") for line in log.splitlines()), log[-3000:]
    _no_bar(log)


def test_progress_bar_is_off_in_log_mode_only(monkeypatch):
    class Terminal:
        def isatty(self) -> bool:
            return True

        closed = False

    assert progress_bar().disable  # pytest's captured stderr is no terminal
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert not progress_bar().disable and progress_bar(disable=True).disable
