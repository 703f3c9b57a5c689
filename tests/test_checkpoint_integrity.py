"""Damaged checkpoints: one line naming the file, ``--resume`` falls back to the newest
complete checkpoint and says so, and nothing from a checkpoint is unpickled unless it is
this user's own.

Real runs: ``zsearch sft`` on the tiny model writes step-2 and step-4 checkpoints (about a
second), and the tests damage them the ways a full disk, a killed copy or a hostile file
would.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.errors import ZsearchError
from zsearch_cli.train import checkpoint as ckpt

runner = CliRunner()
ARGS = ("--max-steps", "4", "--lr", "1e-3", "--batch-size", "2", "--eval-fraction", "0", "--save-every", "2",
        "--device", "cpu", "--keep-checkpoints", "3")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """A private $ZSEARCH_CACHE, so the signing key is this test's."""
    monkeypatch.setenv("ZSEARCH_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def run(tmp_path, tiny_model_dir) -> tuple[Path, list[str]]:
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Question {i}?", "completion": f"Answer {i}."}) + "\n"
                            for i in range(6)))
    out = tmp_path / "run"
    base = ["sft", str(data), "--model", str(tiny_model_dir), "--out", str(out), *ARGS]
    result = runner.invoke(app, base)
    assert result.exit_code == 0, result.output
    shutil.rmtree(out / "final")  # as if killed after the step-4 checkpoint
    return out, base


def _resume(base: list[str], steps: int = 6):
    argv = [a for a in base]
    argv[argv.index("--max-steps") + 1] = str(steps)
    return runner.invoke(app, [*argv, "--resume"])


def _one_line(result) -> str:
    lines = [ln for ln in result.output.strip().splitlines() if ln.startswith("error:")]
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_a_checkpoint_is_complete_only_with_its_manifest_and_sizes(run):
    out, _ = run
    step4 = out / "checkpoints" / "step-4"
    manifest = json.loads((step4 / ckpt.MANIFEST).read_text())
    assert {"optimizer.pt", "scheduler.pt", "rng.pt", "model.safetensors", ckpt.STATE_FILE} <= set(manifest["files"])
    assert all("sha256" in e for n, e in manifest["files"].items() if n.endswith(".pt"))
    assert ckpt.checkpoint_problem(step4) is None
    (step4 / "scheduler.pt").write_bytes((step4 / "scheduler.pt").read_bytes() + b"x")
    assert "scheduler.pt has" in ckpt.checkpoint_problem(step4)


@pytest.mark.parametrize("damage, named", [
    (lambda d: (d / "optimizer.pt").unlink(), "optimizer.pt is missing"),
    (lambda d: os.truncate(d / "model.safetensors", (d / "model.safetensors").stat().st_size // 2),
     "model.safetensors"),
    (lambda d: (d / "zsearch-manifest.json").unlink(), "optimizer.pt"),  # killed before the manifest; legacy rules apply
])
def test_resume_falls_back_to_the_newest_complete_checkpoint_and_says_so(run, damage, named):
    out, base = run
    if named == "optimizer.pt":  # without a manifest, make the legacy check find something missing too
        (out / "checkpoints" / "step-4" / "optimizer.pt").unlink()
    damage(out / "checkpoints" / "step-4")
    result = _resume(base)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "skipping step-4" in text and named in text and "using step-2" in text, text
    assert "resuming from" in text and "step 2/" in text, text


def test_no_complete_checkpoint_is_one_line_naming_the_file(run):
    out, base = run
    for step in ("step-2", "step-4"):
        (out / "checkpoints" / step / "optimizer.pt").unlink()
    line = _one_line(_resume(base))
    assert "step-4" in line and "optimizer.pt is missing" in line, line


def test_a_corrupt_pickle_of_the_right_size_is_one_line_naming_it(run):
    out, base = run
    for step in ("step-2", "step-4"):
        path = out / "checkpoints" / step / "rng.pt"
        path.write_bytes(b"\0" * path.stat().st_size)  # same size: passes the completeness check
    line = _one_line(_resume(base))
    assert "rng.pt" in line and "damaged" in line, line


class _Payload:
    """A pickle that runs code when loaded: what a crafted checkpoint would carry."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _fake_deepspeed_accelerator():
    class Acc:
        distributed_type = "DEEPSPEED"
        num_processes = 1

    return Acc()


def test_deepspeed_resume_never_unpickles_a_foreign_file(tmp_path):
    # Before: ZeRO partitions were read with torch.load(weights_only=False), so this file
    # ran its payload on --resume.
    marker = tmp_path / "pwned"
    folder = tmp_path / "step-1"
    folder.mkdir()
    with open(folder / "optimizer.pt", "wb") as fh:
        pickle.dump({"zero_partitions": [_Payload(marker)]}, fh, protocol=2)
    with pytest.raises(ZsearchError, match=r"optimizer.pt: .*did not write it"):
        ckpt.load_optimizer_state(_fake_deepspeed_accelerator(), None, None, folder / "optimizer.pt")
    assert not marker.exists()
    # a manifest listing its hash is not enough: it must be signed with this user's key
    ckpt.write_manifest(folder)
    manifest = json.loads((folder / ckpt.MANIFEST).read_text())
    manifest["hmac_sha256"] = "0" * 64
    (folder / ckpt.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ZsearchError, match="did not write it"):
        ckpt.load_pickle(folder / "optimizer.pt", trusted_objects=True)
    assert not marker.exists()


def test_deepspeed_objects_load_from_a_file_this_user_wrote(tmp_path):
    folder = tmp_path / "step-1"

    def write(tmp: Path) -> None:
        torch.save({"zero_partitions": [{"loss_scaler": _Scaler(), "state": torch.ones(2)}]}, tmp / "optimizer.pt")

    ckpt.atomic_dir(folder, write)
    state = ckpt.load_pickle(folder / "optimizer.pt", trusted_objects=True)
    assert isinstance(state["zero_partitions"][0]["loss_scaler"], _Scaler)
    # and the same file, changed by one byte after signing, is refused
    data = bytearray((folder / "optimizer.pt").read_bytes())
    data[-30] ^= 1
    (folder / "optimizer.pt").write_bytes(bytes(data))
    with pytest.raises(ZsearchError, match="optimizer.pt"):
        ckpt.load_pickle(folder / "optimizer.pt", trusted_objects=True)
    # outside DeepSpeed nothing but weights_only is ever tried
    with pytest.raises(ZsearchError, match="damaged"):
        ckpt.load_pickle(folder / "optimizer.pt")


class _Scaler:
    """Stands in for DeepSpeed's loss scaler: a plain object weights_only refuses."""

    def __init__(self):
        self.cur_scale = 65536.0


def test_a_truncated_model_file_is_one_line_naming_it(tmp_path, tiny_model_dir):
    # Before: safetensors' own traceback (SafetensorError) from `eval --model`.
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 100)
    line = _one_line(runner.invoke(app, ["eval", "--model", str(model), "--method", "direct", "--limit", "1",
                                         "--out", str(tmp_path / "eval"), "--device", "cpu"]))
    assert "model.safetensors is truncated" in line and str(model) in line, line


def test_pruning_never_removes_the_last_complete_checkpoint(tmp_path):
    # step-4 is damaged; a resumed run from step-2 saves step-3 with keep=1: step-3 stays,
    # step-2 goes, and the damaged step-4 is neither counted nor trusted.
    root = tmp_path / "checkpoints"
    for step in (2, 3, 4):
        ckpt.atomic_dir(root / f"step-{step}", lambda d: (d / ckpt.STATE_FILE).write_text("{}"))
    (root / "step-4" / ckpt.STATE_FILE).write_text("{} ")
    assert [n for n, _ in ckpt.checkpoints(tmp_path)] == [2, 3]
    for _, old in ckpt.checkpoints(tmp_path)[:-1]:
        shutil.rmtree(old)
    notes = []
    assert ckpt.latest_checkpoint(tmp_path, note=notes.append) == root / "step-3"
    assert "skipping step-4" in notes[0] and ckpt.STATE_FILE in notes[0]


def test_train_resume_skips_a_truncated_checkpoint(tmp_path, tiny_model_dir, demo_index):
    # The RL trainer's --resume: step-2's weights are cut short (a full disk, a killed copy).
    out = tmp_path / "train"
    argv = ["train", "--model", str(tiny_model_dir), "--index", str(demo_index), "--out", str(out),
            "--steps", "2", "--save-every", "1", "--batch-size", "2", "-G", "2", "--max-turns", "1",
            "--max-turn-tokens", "8", "--device", "cpu", "--keep-checkpoints", "3"]
    assert runner.invoke(app, argv).exit_code == 0
    shutil.rmtree(out / "final")
    weights = out / "checkpoints" / "step-2" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 1)
    argv[argv.index("--steps") + 1] = "3"
    result = runner.invoke(app, [*argv, "--resume"])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, text
    assert "skipping step-2 (model.safetensors" in text and "using step-1" in text, text
    assert "resuming from" in text and "step 1/3" in text, text


def test_a_checkpoint_with_old_metric_rows_is_refused_in_one_line(tmp_path):
    # Before metrics were namespaced and counted from 1, a checkpoint's rows said step 0 and
    # "reward_mean": resuming would mix the two conventions in one metrics file.
    from types import SimpleNamespace

    from zsearch_cli.train.checkpoint import METRICS_FORMAT, STATE_FILE, check_resumable

    old = tmp_path / "step-1"
    old.mkdir()
    (old / STATE_FILE).write_text(json.dumps({"step": 1, "metrics": [{"step": 0, "reward_mean": 0.5}]}))
    with pytest.raises(ZsearchError) as err:
        check_resumable(old, None)
    assert "written by an older zsearch" in str(err.value) and "\n" not in str(err.value)
    (old / STATE_FILE).write_text(json.dumps({"step": 1, "metrics_format": METRICS_FORMAT, "metrics": []}))
    check_resumable(old, SimpleNamespace(distributed_type="NO", num_processes=1))  # today's format resumes
