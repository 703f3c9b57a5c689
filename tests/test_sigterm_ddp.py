"""Issue 36.8 under DDP: SIGTERM to every process of an `accelerate launch` run (as Slurm
sends it to a job step) while step 2 is stalled in a real call that never returns. The main
process abandons the step and writes step 1's state alone (no collective: the other process
may never reach one again); the other process is ended by the launcher. A resume with 2
processes continues the run and says it is not bit-identical (the other process's generators
were not saved).

The processes run tests/test_sigterm_abandon.py's entry point (the stalled reward), launched as
tests/test_distributed.py launches them: 2 CPU processes over gloo.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_sigterm_abandon import TINY, SilentServer

ROOT = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).resolve().parent / "test_sigterm_abandon.py"


def _launch(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **env}
    with open(log, "w") as fh:  # its own session: the signal goes to the launcher and both processes
        return subprocess.Popen([*launch, str(DRIVER), *args], cwd=ROOT, env=full_env, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _args(model: Path, index: Path, out: Path, *more: str) -> list[str]:
    # 2 processes x 1 prompt x G 2: each process scores 2 samples per step, as the driver counts
    return ["train", "--model", str(model), "--index", str(index), "--out", str(out), "--steps", "3",
            "--save-every", "5", "--batch-size", "2", "-G", "2", "--seed", "5", "--lr", "1e-3", *more, *TINY]


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.close()


def test_sigterm_under_ddp_the_main_process_writes_the_last_step_alone(tmp_path, tiny_model_dir, demo_index,
                                                                       silent_server):
    out = tmp_path / "run"
    log = tmp_path / "launch.log"
    env = {"STALL_URL": silent_server.url, "STALL_AT": "reward", "STALL_STEP": "2"}
    proc = _launch(_args(tiny_model_dir, demo_index, out), env, log)
    deadline = time.time() + 240
    while len(silent_server.connections) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)  # both processes are inside step 2's stalled call
    assert proc.poll() is None and len(silent_server.connections) == 2, log.read_text()[-4000:]
    time.sleep(0.5)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the launch did not end within 120 s of SIGTERM:\n" + log.read_text()[-4000:])
    took = time.monotonic() - sent
    text = log.read_text()
    step1 = out / "checkpoints" / "step-1"
    # the main process's line: step 2 abandoned, step 1 written (a checkpoint was due: --save-every 5, none yet)
    assert (f"train: SIGTERM: step 2 abandoned; checkpoint of step 1 written to {step1}; resume with --resume"
            in text), text[-4000:]
    assert took < 60, f"{took:.0f} s"  # the launcher's own grace for the other process is 30 s
    state = json.loads((step1 / "trainer_state.json").read_text())
    assert state["step"] == 1 and state["processes_saved"] == 1 and state["num_processes"] == 2
    assert not (step1 / "ranks.pt").exists()

    # --resume with 2 processes: step 2 is run again from step 1's weights and optimizer state
    resumed = _launch([*_args(tiny_model_dir, demo_index, out), "--resume"], {}, tmp_path / "resume.log")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "resume.log").read_text()[-4000:]
    again = (tmp_path / "resume.log").read_text()
    assert "written by the main process alone when a signal stopped the run" in again
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (out / "final").is_dir()
