"""Issue 36.8: SIGTERM during a step that takes minutes. ``zsearch train`` prints one line at
once, abandons the step before its first optimizer step, writes the last completed step's
state and exits within seconds; ``--resume`` then replays the abandoned step exactly.

The runs are real ``zsearch train`` processes (this file is their entry point, as in
test_progress_and_replay.py) on the tiny model, with stderr in a file. A step is made to take
minutes by a real call to a real server on 127.0.0.1 that accepts and never answers (a stalled
LLM judge, retriever or metrics service): in the reward (the rollout), in the policy's forward
pass (the update, before its optimizer step) or right after the first optimizer step. The
client waits up to 600 s, so only abandoning the step can end the run within the test's bound.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import TORCH_THREADS
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import METRICS

TINY = ["--max-turns", "1", "--max-turn-tokens", "8", "--device", "cpu"]
QUICK_EXIT = 15.0
"""Seconds from the signal to the exit: the step would take 600 s; writing the tiny model's
checkpoint takes about one (a loaded CI machine gets the rest)."""
STALL = 600.0


class SilentServer:
    """Accepts connections and never answers; counts them."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/judge"
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)  # kept open, never read or answered

    def close(self) -> None:
        self.sock.close()
        for conn in self.connections:
            conn.close()


@pytest.fixture
def silent_server():
    server = SilentServer()
    yield server
    server.close()


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(TORCH_THREADS), "TOKENIZERS_PARALLELISM": "false", **extra}


def _args(model: Path, index: Path, out: Path, steps: int, *more: str) -> list[str]:
    return ["train", "--model", str(model), "--index", str(index), "--out", str(out), "--steps", str(steps),
            "--save-every", "2", "--batch-size", "1", "-G", "2", "--seed", "5", "--lr", "1e-3", *more, *TINY]


def _stop_in_stalled_step(args: list[str], log: Path, env: dict[str, str], server: SilentServer) -> tuple[int, float, str]:
    """Start the run, wait until it is stuck in the planted call, send SIGTERM; returns the exit
    code, the seconds from the signal to the exit and the log."""
    with open(log, "w") as fh:
        proc = subprocess.Popen([sys.executable, __file__, *args], env=env, stdout=fh, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while not server.connections and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None and server.connections, log.read_text()[-3000:]
    time.sleep(0.5)  # well inside the call
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("SIGTERM did not end a stalled step within 60 s:\n" + log.read_text()[-3000:])
    return code, time.monotonic() - sent, log.read_text()


def _metric_rows(out: Path) -> list[dict]:
    rows = read_artifact(out / "metrics.parquet", METRICS).to_pylist()
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def test_sigterm_in_a_stalled_rollout_writes_the_last_step_and_resume_is_exact(tmp_path, tiny_model_dir, demo_index,
                                                                               silent_server):
    # Steps 1-3 complete (checkpoint step-2 by --save-every 2); step 4's reward call stalls.
    out = tmp_path / "run"
    env = _env(STALL_URL=silent_server.url, STALL_AT="reward", STALL_STEP="4")
    code, took, log = _stop_in_stalled_step(_args(tiny_model_dir, demo_index, out, 6), tmp_path / "stop.log", env,
                                            silent_server)
    assert code == 143, log[-3000:]
    assert took < QUICK_EXIT, f"{took:.1f} s from SIGTERM to exit"
    assert "Traceback" not in log, log[-3000:]
    said = [line for line in log.splitlines() if "SIGTERM" in line]
    # one line at once (the handler), one when the state is written
    assert said[0] == "train: SIGTERM during step 4/6: abandoning it; the last completed step's state follows"
    assert said[1] == (f"train: SIGTERM: step 4 abandoned; checkpoint of step 3 written to "
                       f"{out / 'checkpoints' / 'step-3'}; resume with --resume"), said
    assert len(said) == 2
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2", "step-3"]
    assert [r["step"] for r in _metric_rows(out)] == [1, 2, 3]

    # The resume replays step 4 as if nothing had happened: same metrics as a run never stopped.
    resumed = subprocess.run([sys.executable, __file__, *_args(tiny_model_dir, demo_index, out, 6), "--resume"],
                             env=_env(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "(step 3/6)" in resumed.stderr
    whole = tmp_path / "whole"
    straight = subprocess.run([sys.executable, __file__, *_args(tiny_model_dir, demo_index, whole, 6)],
                              env=_env(), capture_output=True, text=True, timeout=300)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert _metric_rows(out) == _metric_rows(whole)


def test_sigterm_in_a_stalled_update_before_its_optimizer_step(tmp_path, tiny_model_dir, demo_index, silent_server):
    # Step 3's update stalls in the policy's forward pass: no optimizer step has run, so the
    # weights are step 2's (checkpoint step-2 exists already: nothing new to write).
    out = tmp_path / "run"
    env = _env(STALL_URL=silent_server.url, STALL_AT="forward", STALL_STEP="3")
    code, took, log = _stop_in_stalled_step(_args(tiny_model_dir, demo_index, out, 6), tmp_path / "stop.log", env,
                                            silent_server)
    assert code == 143 and took < QUICK_EXIT and "Traceback" not in log, (took, log[-3000:])
    said = [line for line in log.splitlines() if "SIGTERM" in line]
    assert said == ["train: SIGTERM during step 3/6: abandoning it; the last completed step's state follows",
                    f"train: SIGTERM: step 3 abandoned; latest checkpoint {out / 'checkpoints' / 'step-2'} (step 2); "
                    "resume with --resume"], said
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"]


def test_sigterm_after_the_first_optimizer_step_writes_nothing_new(tmp_path, tiny_model_dir, demo_index,
                                                                   silent_server):
    # Two optimizer steps per step (--ppo-epochs 2); step 4 stalls right after its first one.
    # The weights are then part of the way through step 4: no checkpoint of them, step-2 stays
    # the resume point, and its weights are those written at step 2.
    out = tmp_path / "run"
    env = _env(STALL_URL=silent_server.url, STALL_AT="optimizer", STALL_STEP="4")
    args = _args(tiny_model_dir, demo_index, out, 6, "--ppo-epochs", "2")
    code, took, log = _stop_in_stalled_step(args, tmp_path / "stop.log", env, silent_server)
    assert code == 143 and took < QUICK_EXIT and "Traceback" not in log, (took, log[-3000:])
    said = [line for line in log.splitlines() if "SIGTERM" in line]
    assert said[1] == (f"train: SIGTERM: step 4 abandoned after its first optimizer step; latest checkpoint "
                       f"{out / 'checkpoints' / 'step-2'} (step 2); resume with --resume"), said
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"]
    assert json.loads((out / "checkpoints" / "step-2" / "trainer_state.json").read_text())["step"] == 2


def test_stop_signals_abandon_at_once_but_never_inside_a_write(capfd):
    from zsearch_cli.progress import StopSignals, Stopped

    with StopSignals() as stop:
        stop.announce = lambda signum: f"announced {signal.Signals(signum).name}"
        with pytest.raises(Stopped) as stopped, stop.abandonable():
            try:  # an `except Exception` on the way (a retry loop) does not swallow it
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except Exception:  # noqa: BLE001
                pytest.fail("Stopped was caught as an Exception")
        assert stopped.value.abandoned and stopped.value.signum == signal.SIGTERM
        assert capfd.readouterr().err == "announced SIGTERM\n"  # printed by the handler, at once
    with StopSignals() as stop:
        with stop.abandonable():
            with stop.deferred():  # a checkpoint being written: only the flag
                os.kill(os.getpid(), signal.SIGTERM)
            assert stop.requested
        with pytest.raises(Stopped) as stopped, stop.abandonable():  # a flagged signal abandons on entry
            pytest.fail("entered")
        assert stopped.value.abandoned
    with StopSignals() as stop:  # outside abandonable work: between steps, only the flag
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and not stop.abandoning


# ----------------------------------------------------------------------------- the run's entry point


def _length_reward(prediction, turns, *args, **kwargs) -> float:
    """The model's text length / 1000: differs within every group, so the updates are not zero."""
    return len("".join(turns)) / 1000


def _stall() -> None:
    """The planted minutes-long call: a request to a server that never answers."""
    import requests

    requests.get(os.environ["STALL_URL"], timeout=STALL)


def _plant() -> None:
    """Make step STALL_STEP stall where STALL_AT says: in its reward, in the policy's forward
    pass during its update, or right after its first optimizer step."""
    import zsearch_cli.train.step_samples as collect
    import zsearch_cli.train.trainer as trainer_module

    where, at = os.environ.get("STALL_AT"), int(os.environ.get("STALL_STEP", "0"))
    calls = {"reward": 0}
    per_step = 2  # --batch-size 1 x -G 2

    def reward(*args, **kwargs) -> float:
        calls["reward"] += 1
        if where == "reward" and calls["reward"] > per_step * (at - 1):
            _stall()
        return _length_reward(*args, **kwargs)

    collect.trajectory_reward = reward
    real_optimize = trainer_module.optimize

    def optimize(m, spec, acfg, cfg, batch, done):
        if done + 1 == at and where == "forward":
            m.accelerator.unwrap_model(m.policy).register_forward_hook(lambda *_: _stall())
        if done + 1 == at and where == "optimizer":
            inner = getattr(m.optimizer, "optimizer", m.optimizer)
            inner.register_step_post_hook(lambda *_: _stall())
        return real_optimize(m, spec, acfg, cfg, batch, done)

    trainer_module.optimize = optimize


if __name__ == "__main__":  # a `zsearch` process started by the tests above
    _plant()
    from zsearch_cli.cli import app

    sys.argv = ["zsearch", *sys.argv[1:]]
    app()
