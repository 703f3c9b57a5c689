"""Issue 36.7: a missing or truncated ``--model`` is the command's first and only line, before
the loading phase starts (it came after a "loading … | started" line and seconds of work)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _zsearch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zsearch_cli.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def cut_model(tmp_path, tiny_model_dir) -> Path:
    model = tmp_path / "cut"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)  # a copy that stopped halfway
    return model


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_cut_model_is_the_first_and_only_line(tmp_path, cut_model, command, demo_index):
    # every cheap check passes (a real index, the demo data), so the model's files are what fails
    done = _zsearch(command, "--model", str(cut_model), "--out", str(tmp_path / "out"), "--index", str(demo_index))
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"error: --model {cut_model}: model.safetensors is truncated"), lines
    assert not (tmp_path / "out").exists()  # refused before any work: no run folder left behind


def test_a_missing_model_folder_and_a_folder_that_is_no_model(tmp_path, demo_index):
    done = _zsearch("train", "--model", str(tmp_path / "nowhere" / "model"), "--out", str(tmp_path / "out"),
                    "--index", str(demo_index))
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 2 and lines == [f"error: --model {tmp_path / 'nowhere' / 'model'}: no such model folder"]
    (tmp_path / "empty").mkdir()
    done = _zsearch("eval", "--model", str(tmp_path / "empty"), "--out", str(tmp_path / "out2"), "--index",
                    str(demo_index))
    assert done.returncode == 2 and "no config.json (nor adapter_config.json): not a model folder" in done.stderr
