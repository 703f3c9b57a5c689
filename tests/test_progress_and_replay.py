"""Issue 23 (4, 5): progress lines in a log file, SIGTERM leaves resumable state, and every
run folder's config.yaml replays the run.

The CLI runs are real processes with stderr in a file (not a terminal), on the tiny model.
They run this file, which rewards the length of the model's text (as test_resume.py does),
so the updates are not all zero and "the same metrics" means something.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from helpers import TORCH_THREADS
from zsearch_cli.cli import app
from zsearch_cli.progress import ProgressLines, StopSignals, Stopped
from zsearch_cli.artifacts import read_artifact, read_metadata
from zsearch_cli.schemas import EVAL_EXAMPLE, METRICS, ROLLOUT

runner = CliRunner()
TINY = ["--max-turns", "1", "--max-turn-tokens", "8", "--device", "cpu"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(TORCH_THREADS), "TOKENIZERS_PARALLELISM": "false", "ZSEARCH_LOG_EVERY": "0.2"}


def _start(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w") as fh:  # stderr and stdout to a file: no terminal, as under nohup or Slurm
        return subprocess.Popen([sys.executable, __file__, *args], env=_env(), stdout=fh, stderr=subprocess.STDOUT)


def _run(args: list[str], log: Path, timeout: float = 120) -> tuple[int, str]:
    proc = _start(args, log)
    return proc.wait(timeout=timeout), log.read_text()


def _wait_for(proc: subprocess.Popen, ready, timeout: float = 90) -> None:
    deadline = time.time() + timeout
    while not ready() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the signal"
    assert ready(), "timed out waiting for the run"


def _body(path: Path) -> str:
    return "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith("#"))


# ----------------------------------------------------------------------------- the helpers alone


def test_progress_lines_throttle_heartbeat_and_eta(capsys):
    with ProgressLines("eval demo", 10, "questions", done=2, enabled=True, every=0.2) as lines:
        time.sleep(0.35)  # the phase outlasts its grace (min(every, 2 s)): the started line
        lines.advance(3, em=0.5)  # not due yet (a line went out < 0.2 s ago): no line
        time.sleep(0.5)  # the heartbeat prints a line with the new counts
        lines.phase("rolling out")
        time.sleep(0.5)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "eval demo: 2/10 questions | started"
    assert any(line.startswith("eval demo: 5/10 questions, em 0.500 | elapsed") and "ETA" in line for line in err)
    assert any(line.startswith("eval demo: still rolling out (5/10 questions") for line in err)
    with ProgressLines("quiet", 3, enabled=False) as lines:  # a terminal: rich's bar shows, no lines
        lines.advance(3)
    assert capsys.readouterr().err == ""
    # a phase that fails at once prints nothing: its one-line error stays the only line
    with pytest.raises(ValueError):
        with ProgressLines("index", enabled=True, every=30):
            raise ValueError("no such file")
    assert capsys.readouterr().err == ""


def test_stop_signals_defer_to_the_loop_then_raise():
    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.name == "SIGTERM"  # between steps: only a flag
        with pytest.raises(Stopped) as err:
            stop.check()
        assert err.value.code == 143
        with pytest.raises(Stopped):  # a second signal does not wait
            os.kill(os.getpid(), signal.SIGINT)
    finished = False
    with StopSignals(immediate=True) as stop:
        with pytest.raises(Stopped) as err:
            with stop.deferred():  # a file being written is finished first
                os.kill(os.getpid(), signal.SIGINT)
                finished = stop.requested
    assert finished and err.value.code == 130
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


# ----------------------------------------------------------------------------- eval


def test_eval_logs_progress_and_sigterm_resumes(tmp_path, tiny_model_dir, demo_index):
    out = tmp_path / "eval"
    args = ["eval", "--model", str(tiny_model_dir), "--index", str(demo_index), "--out", str(out),
            "--limit", "40", "--batch-size", "2", *TINY]
    examples = out / "demo" / "agent.examples.parquet"
    proc = _start(args, tmp_path / "eval1.log")
    # the first batch is scored and written, and a progress line reached the log before the end
    _wait_for(proc, lambda: examples.exists() and "eval demo (agent): " in (tmp_path / "eval1.log").read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    log = (tmp_path / "eval1.log").read_text()
    stopped = [line for line in log.splitlines() if "stopped by" in line]
    assert len(stopped) == 1 and "Traceback" not in log, log[-3000:]
    scored = read_artifact(examples, EVAL_EXAMPLE).num_rows
    assert 2 <= scored < 40  # at least the first batch (2) was written; under load maybe only it
    assert stopped[0] == (f"eval: stopped by SIGTERM after {scored}/40 questions of demo; "
                          "rerun the same command to resume")
    assert (out / "config.yaml").is_file()

    code, log = _run(args, tmp_path / "eval2.log")
    assert code == 0, log[-3000:]
    assert f"demo: {scored} examples already scored, {40 - scored} to go" in log
    assert read_artifact(examples, EVAL_EXAMPLE).num_rows == 40
    assert any(line.startswith("eval demo (agent): 40/40 questions, em ") for line in log.splitlines())


# ----------------------------------------------------------------------------- train


def test_train_sigterm_checkpoints_and_resumes(tmp_path, tiny_model_dir, demo_index):
    # 60 steps: the signal always lands mid-run, whatever this machine's speed
    out = tmp_path / "run"
    args = ["train", "--model", str(tiny_model_dir), "--index", str(demo_index), "--out", str(out), "--steps", "60",
            "--save-every", "100", "--batch-size", "2", "-G", "2", "--seed", "3", "--lr", "1e-3", *TINY]
    proc = _start(args, tmp_path / "train1.log")
    _wait_for(proc, lambda: (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().strip())
    proc.send_signal(signal.SIGTERM)  # a checkpoint of the last completed step is due (none saved yet)
    assert proc.wait(timeout=90) == 143
    log = (tmp_path / "train1.log").read_text()
    assert "train: loading" in log and "train grpo: " in log  # plain progress lines in the log
    # (the "still rolling out …" heartbeat depends on how long a step takes here: its rule is
    # tested in-process, test_progress_lines_throttle_heartbeat_and_eta)
    lines = [line for line in log.splitlines() if "SIGTERM" in line]
    assert "Traceback" not in log and len(lines) == 2, log[-3000:]
    assert lines[0].startswith("train: SIGTERM during step ") or lines[0].startswith("train: SIGTERM after step ")
    saved = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert len(saved) == 1 and saved[0].startswith("step-")
    done = int(saved[0].split("-")[1])
    assert 1 <= done < 60
    path = out / "checkpoints" / saved[0]
    # the step under way is abandoned (train/signals.py; tests/test_sigterm_abandon.py), or, when
    # the signal came while a finished step was being recorded, that step is written
    assert lines[1] in (f"train: SIGTERM: step {done + 1} abandoned; checkpoint of step {done} written to {path}; "
                        "resume with --resume", f"train: SIGTERM: checkpoint written to {path}; resume with --resume")
    assert not (out / "final").exists()

    # A refused command leaves the run's config.yaml as it was.
    before = (out / "config.yaml").read_text()
    refused = runner.invoke(app, [*args[:-len(TINY)], "--seed", "4", *TINY])
    assert refused.exit_code == 2 and "already holds checkpoints" in refused.output
    assert (out / "config.yaml").read_text() == before

    resumed = [*args, "--resume"]
    resumed[resumed.index("--steps") + 1] = str(done + 1)  # one more step is enough to show the resume
    code, log = _run(resumed, tmp_path / "train2.log")
    assert code == 0, log[-3000:]
    assert "resuming from" in log and f"(step {done}/{done + 1})" in log
    assert [r["step"] for r in read_artifact(out / "metrics.parquet", METRICS).to_pylist()] == list(range(1, done + 2))
    assert (out / "final").is_dir()


def test_train_sigterm_without_checkpoints_says_so(tmp_path, tiny_model_dir, demo_index):
    out = tmp_path / "run"
    args = ["train", "--model", str(tiny_model_dir), "--index", str(demo_index), "--out", str(out), "--steps", "60",
            "--save-every", "0", "--batch-size", "1", "-G", "2", *TINY]
    proc = _start(args, tmp_path / "train.log")
    _wait_for(proc, lambda: "train grpo: " in (tmp_path / "train.log").read_text())
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=90) == 130
    log = (tmp_path / "train.log").read_text()
    said = [line for line in log.splitlines() if line.startswith("train: SIGINT: ")]
    assert len(said) == 1 and "no checkpoint (--save-every 0)" in said[0], log[-3000:]
    assert said[0].endswith("the run cannot be resumed")
    assert "Traceback" not in log and not (out / "checkpoints").exists()


# ----------------------------------------------------------------------------- replay


def test_config_yaml_replays_the_run(tmp_path, tiny_model_dir, demo_index):
    run1, run2 = tmp_path / "run1", tmp_path / "run2"
    code, log = _run(["train", "--model", str(tiny_model_dir), "--index", str(demo_index), "--out", str(run1),
                      "--steps", "2", "--batch-size", "2", "-G", "2", "--seed", "5", "--lr", "1e-3", "--dtype",
                      "float32", "--save-every", "0", "--save-rollouts", "--algo-arg", "scale_std=false", *TINY],
                     tmp_path / "run1.log")
    assert code == 0, log[-3000:]
    recorded = yaml.safe_load((run1 / "config.yaml").read_text())
    header = (run1 / "config.yaml").read_text().splitlines()[:3]
    assert header[0].startswith("# zsearch ") and "--algo-arg scale_std=false" in header[2]
    # the replay the header suggests is the one run below (it suggested no --out, which is refused)
    assert header[1] == f"#   zsearch train --config {run1 / 'config.yaml'} --out NEW_FOLDER"
    assert recorded["algo_arg"] == ["scale_std=false"] and "algo_args" not in recorded
    assert recorded["out"] == str(run1) and recorded["index_dir"] == str(demo_index) and recorded["steps"] == 2
    assert "config" not in recorded and "print_config" not in recorded

    code, log = _run(["train", "--config", str(run1 / "config.yaml"), "--out", str(run2)], tmp_path / "run2.log")
    assert code == 0, log[-3000:]
    assert read_metadata(run2 / "metrics.parquet")["config"]["algo_args"] == {"scale_std": False}
    a = read_artifact(run1 / "metrics.parquet", METRICS).to_pylist()
    b = read_artifact(run2 / "metrics.parquet", METRICS).to_pylist()
    assert len(a) == len(b) == 2 and any(r["actor/grad_norm"] > 0 for r in a), "the updates did nothing"
    for ra, rb in zip(a, b):
        for key, value in ra.items():
            if isinstance(value, float) and not key.startswith("time/"):
                assert rb[key] == pytest.approx(value, abs=1e-6, rel=0), key
    for step in (1, 2):
        name = f"rollouts/step-{step:06d}.parquet"
        ids = [[r["response_ids"] for r in read_artifact(run / name, ROLLOUT).to_pylist()] for run in (run1, run2)]
        assert ids[0] == ids[1]
    assert _body(run2 / "config.yaml") == _body(run1 / "config.yaml").replace(str(run1), str(run2))

    # --print-config: the file's body, and nothing run
    printed = runner.invoke(app, ["train", "--config", str(run1 / "config.yaml"), "--print-config"])
    assert printed.exit_code == 0 and printed.output == _body(run1 / "config.yaml")


def test_print_config_does_no_work_and_reads_older_keys(tmp_path):
    old = tmp_path / "old.yaml"  # as an older version's metadata recorded it: algo_args, a mapping
    old.write_text("algo_args: {scale_std: false, baseline: rloo}\nsteps: 3\n")
    result = runner.invoke(app, ["train", "--config", str(old), "--out", str(tmp_path / "never"), "--print-config"])
    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.output)
    assert printed["algo_arg"] == ["scale_std=false", "baseline=rloo"] and printed["steps"] == 3
    assert not (tmp_path / "never").exists()
    again = tmp_path / "again.yaml"
    again.write_text(result.output)
    assert runner.invoke(app, ["train", "--config", str(again), "--print-config"]).output == result.output
    # a preset's values are left to the preset (replaying applies it the same way)
    preset = yaml.safe_load(runner.invoke(app, ["train", "--preset", "search-r1", "--print-config"]).output)
    assert preset["preset"] == "search-r1" and "lr" not in preset
    result = runner.invoke(app, ["eval", "--limit", "3", "--print-config"])
    assert result.exit_code == 0 and yaml.safe_load(result.output)["limit"] == 3


def _length_reward(prediction, turns, *args, **kwargs) -> float:
    """The model's text length / 1000: differs within every group, so gradients are non-zero."""
    return len("".join(turns)) / 1000


if __name__ == "__main__":  # a `zsearch` process started by the tests above
    import zsearch_cli.train.step_samples as collect

    collect.trajectory_reward = _length_reward
    sys.argv = ["zsearch", *sys.argv[1:]]
    app()
