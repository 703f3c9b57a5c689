"""Exact resume: 6 steps straight == 3 steps, ``kill -9``, ``--resume`` for the other 3.

Both runs are real ``zsearch train`` processes on the tiny model. The killed run is stopped
with SIGKILL as soon as its step-3 checkpoint exists (it is then somewhere in step 4), so
nothing gets a chance to flush or clean up. On CPU in fp32 the final weights must be
**bit-identical**: every input to steps 4-6 is restored exactly — weights from safetensors,
AdamW moments and step counts, the lr scheduler, the data cursor, and the sampling seeds,
which derive from (seed, step, turn) and per-row generators rather than from a global RNG
stream (the global RNG states are saved and restored too). The PPO variant adds the critic,
its optimizer and shuffled mini-batches over 2 epochs; the LoRA variant resumes an adapter
on a freshly loaded base.

The tiny random model never writes an ``<answer>`` tag, so with the real reward every
reward, advantage and gradient would be 0, the weights would never move, and "bit-identical
after resume" would hold for any resume at all. The processes therefore run this file,
which rewards the length of the model's text instead (different within every group), and
the test checks that the weights moved and that resuming from other weights would differ.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

import zsearch_cli.train.step_samples as collect
from helpers import TORCH_THREADS
from zsearch_cli.cli import app
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import METRICS


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory) -> Path:
    from typer.testing import CliRunner

    from zsearch_cli.cli import app

    out = tmp_path_factory.mktemp("resume") / "index"
    result = CliRunner().invoke(app, ["index", "--out", str(out), "--kind", "bm25"])
    assert result.exit_code == 0, result.output
    return out


def _cmd(out: Path, model: Path, index: Path, extra: list[str]) -> list[str]:
    return [sys.executable, __file__, "train", "--model", str(model), "--index", str(index),
            "--out", str(out), "--steps", "6", "--save-every", "3", "--batch-size", "2", "--max-turns", "2",
            "--max-turn-tokens", "16", "--device", "cpu", "--lr", "1e-3", "--seed", "3", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(TORCH_THREADS), "TOKENIZERS_PARALLELISM": "false"}


def _weights_file(folder: Path) -> Path:
    name = "adapter_model.safetensors" if (folder / "adapter_config.json").exists() else "model.safetensors"
    return folder / name


def _weights(out: Path) -> dict:
    return load_file(str(_weights_file(out / "final")))


def _differing(a: dict, b: dict) -> list[str]:
    return [k for k in a if k in b and not (a[k] == b[k]).all()]


@pytest.mark.parametrize("extra", [
    ["--algo", "ppo", "--ppo-epochs", "2", "--mini-batch-size", "1", "--critic-lr", "1e-3"],
    ["--algo", "grpo", "-G", "2", "--lora-r", "4", "--beta", "0.01"],
], ids=["ppo-full", "grpo-lora"])
def test_kill_and_resume_is_bit_identical(extra, tmp_path, tiny_model_dir, demo_index, monkeypatch):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = subprocess.run(_cmd(straight, tiny_model_dir, demo_index, extra), env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    proc = subprocess.Popen(_cmd(killed, tiny_model_dir, demo_index, extra), env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    checkpoint = killed / "checkpoints" / "step-3"
    deadline = time.time() + 300
    while not checkpoint.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert checkpoint.is_dir(), proc.stderr.read()[-3000:]
    assert proc.returncode == -signal.SIGKILL and not (killed / "final").exists(), "the run ended before the kill"
    # The control: the same killed run, resumed from a checkpoint whose weights are those of
    # step 6 (same files, sizes and options; only the weights are wrong).
    wrong_start = tmp_path / "wrong"
    shutil.copytree(killed, wrong_start)
    shutil.copyfile(_weights_file(straight / "checkpoints" / "step-6"),
                    _weights_file(wrong_start / "checkpoints" / "step-3"))

    resumed = subprocess.run(_cmd(killed, tiny_model_dir, demo_index, [*extra, "--resume"]), env=_env(),
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "step 3/6" in resumed.stderr
    assert wrong_start.is_dir()

    a, b = _weights(straight), _weights(killed)
    assert a.keys() == b.keys()
    different = _differing(a, b)
    assert not different, f"{len(different)} tensors differ after resume, e.g. {different[:3]}"
    # The comparison can fail: the updates moved the weights from the start ...
    start = _weights_file(tiny_model_dir) if "--lora-r" not in extra else None
    if start is not None:
        assert _differing(a, load_file(str(start))), "the run never changed the weights: the test proves nothing"
    else:
        assert any(float(v.abs().max()) > 0 for k, v in a.items() if "lora_B" in k), "LoRA B is still 0"
    assert all(r["actor/grad_norm"] > 0 for r in read_artifact(straight / "metrics.parquet", METRICS).to_pylist())
    # ... and resuming from other weights ends elsewhere (in this process: only the weights
    # are compared, and a fresh process would cost its imports again).
    monkeypatch.setattr(collect, "trajectory_reward", _length_reward)
    args = _cmd(wrong_start, tiny_model_dir, demo_index, [*extra, "--resume"])[2:]  # without python and this file
    control = CliRunner().invoke(app, args)
    assert control.exit_code == 0, control.output[-3000:]
    assert _differing(a, _weights(wrong_start)), "resuming from the wrong checkpoint gave the same weights"

    rows_a = read_artifact(straight / "metrics.parquet", METRICS).to_pylist()
    rows_b = read_artifact(killed / "metrics.parquet", METRICS).to_pylist()
    assert [r["step"] for r in rows_b] == list(range(1, 7))
    jsonl = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in jsonl] == list(range(1, 7))  # lines written after step-3 by the killed run are gone
    for key in ("rollout/reward_mean", "rollout/response_length", "actor/grad_norm", "actor/kl_ref", "critic/vf_loss",
                "actor/lr", "actor/ratio_max"):
        assert [r[key] for r in rows_a] == [r[key] for r in rows_b], key
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["step-3", "step-6"]


def _length_reward(prediction, turns, *args, **kwargs) -> float:
    """The model's text length / 1000: differs within every group, so gradients are non-zero."""
    return len("".join(turns)) / 1000


if __name__ == "__main__":  # a `zsearch train` process started by the tests above
    collect.trajectory_reward = _length_reward
    sys.argv = ["zsearch", *sys.argv[1:]]
    app()
