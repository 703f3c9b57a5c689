"""The collapse guard inside ``zsearch train`` (train/stability.py, docs/stability.md Actions):
a planted collapse stops the run with a one-line report (``--on-collapse stop``) or rolls it
back to the newest healthy checkpoint with half the lr (``rollback``); a NaN stops even
under ``warn``; a normal run raises nothing; ``zsearch plot`` marks the events.

The tiny random model never answers, so the real reward is 0 throughout: the collapses are
planted through the reward (a length reward, so gradients are non-zero and the weights
move, plus 1.0 while "healthy"; dropping the 1.0 is a reward collapse from ~1.1 to ~0.1).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.errors import ZsearchError
from zsearch_cli.artifacts import read_artifact, read_metadata
from zsearch_cli.schemas import METRICS

runner = CliRunner()
PER_STEP = 4  # --batch-size 2 x -G 2: reward calls per step
ONSET = 8  # the planted collapse's first step (>= warm-up 5 + a few healthy steps)
BOUND = 4  # the 5-step-mean reward check fires within 4 steps of the onset (docs/stability.md)


def _args(out: Path, model: Path, index: Path, steps: int, *extra: str, save_every: int = 0) -> list[str]:
    return ["train", "--algo", "grpo", "--model", str(model), "--index", str(index), "--steps", str(steps),
            "--batch-size", "2", "-G", "2", "--max-turn-tokens", "12", "--max-turns", "2", "--device", "cpu",
            "--out", str(out), "--lr", "1e-3", "--save-every", str(save_every), *extra]


def _one_line(output: str) -> str:
    return " ".join(output.split())


def _events(out: Path) -> list[dict]:
    path = out / "guard.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.fixture()
def collapsing_reward(monkeypatch):
    """The CLI's reward: text length / 1000, plus 1.0 before step ONSET (counted by calls)."""
    import zsearch_cli.train.step_samples as collect

    calls = {"n": 0}

    def reward(prediction, turns, *args, **kwargs) -> float:
        step = calls["n"] // PER_STEP + 1
        calls["n"] += 1
        return len("".join(turns)) / 1000 + (1.0 if step < ONSET else 0.0)

    monkeypatch.setattr(collect, "trajectory_reward", reward)
    return calls


def test_stop_ends_a_planted_collapse_with_a_one_line_report(tmp_path, tiny_model_dir, demo_index, collapsing_reward):
    out = tmp_path / "planted-collapse"  # tests/conftest.py: an expected alarm
    result = runner.invoke(app, _args(out, tiny_model_dir, demo_index, 16, "--on-collapse", "stop"))
    text = _one_line(result.output)
    # Fails if the guard missed the collapse (exit 0 after 16 steps) or the report is not one error line.
    assert result.exit_code == 2, result.output
    assert text.count("error:") == 1 and "collapse guard: step" in text
    assert "reward_drop: rollout/reward_mean" in text and "below threshold" in text and "peak baseline" in text
    (event,) = _events(out)  # stops at the first event
    assert event["check"] == "reward_drop" and event["action"] == "stop"
    assert ONSET <= event["step"] <= ONSET + BOUND, event  # not before the onset (no false alarm), soon after
    assert f"step {event['step']}:" in text
    # the rows so far are in metrics.parquet (with the event step), the events in its metadata
    rows = read_artifact(out / "metrics.parquet", METRICS).to_pylist()
    assert [r["step"] for r in rows] == list(range(1, event["step"] + 1))
    assert [r["guard/events"] for r in rows] == [0.0] * (event["step"] - 1) + [1.0]
    meta = read_metadata(out / "metrics.parquet")["config"]["collapse_guard"]
    assert [e["step"] for e in meta["events"]] == [event["step"]] and meta["on_collapse"] == "stop"
    report = json.loads((out / "guard_report.json").read_text())
    assert report["step"] == event["step"] and report["events"][0]["check"] == "reward_drop"
    assert not (out / "final").exists()
    # a run stopped after doing work keeps the config that replays it (it was removed as if refused)
    assert "on_collapse: stop" in (out / "config.yaml").read_text()

    # zsearch plot marks the event: the PNG is written without error
    plotted = runner.invoke(app, ["plot", str(out)])
    assert plotted.exit_code == 0, plotted.output
    assert (out / "curves.png").stat().st_size > 1000


def test_warn_logs_the_collapse_and_finishes(tmp_path, tiny_model_dir, demo_index, collapsing_reward):
    out = tmp_path / "planted-collapse"  # tests/conftest.py: an expected alarm
    result = runner.invoke(app, _args(out, tiny_model_dir, demo_index, 13))  # default: --on-collapse warn
    assert result.exit_code == 0, result.output
    events = _events(out)
    # Fails if warn stopped, or if nothing was detected (the run would then prove nothing).
    assert events and all(e["action"] == "warn" for e in events)
    assert "guard: step" in result.output  # the console line of each event
    rows = read_artifact(out / "metrics.parquet", METRICS).to_pylist()
    assert len(rows) == 13 and sum(r["guard/events"] for r in rows) == len(events)
    assert (out / "final").is_dir()


def test_a_nan_stops_even_under_warn(tmp_path, tiny_model_dir, demo_index, monkeypatch):
    import zsearch_cli.train.step_samples as collect

    monkeypatch.setattr(collect, "trajectory_reward", lambda *a, **k: float("nan"))
    out = tmp_path / "planted-collapse"  # tests/conftest.py: an expected alarm
    result = runner.invoke(app, _args(out, tiny_model_dir, demo_index, 4))  # warn
    text = _one_line(result.output)
    # Fails if the NaN went unnoticed (exit 0) or a warn let it through.
    assert result.exit_code == 2, result.output
    assert text.count("error:") == 1 and "collapse guard: step 1: nonfinite: rollout/reward_mean is nan" in text
    assert "non-finite values stop under every --on-collapse" in text
    events = _events(out)
    assert events and {e["step"] for e in events} == {1} and all(e["action"] == "stop" for e in events)
    assert all(e["check"] == "nonfinite" for e in events) and events[0]["value"] == "nan"


def test_a_normal_run_raises_no_event(tmp_path, tiny_model_dir, demo_index):
    import zsearch_cli.train.step_samples as collect

    out = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:  # a moving, noisy but healthy reward
        mp.setattr(collect, "trajectory_reward", lambda p, turns, *a, **k: len("".join(turns)) / 1000)
        result = runner.invoke(app, _args(out, tiny_model_dir, demo_index, 8))
    assert result.exit_code == 0, result.output
    rows = read_artifact(out / "metrics.parquet", METRICS).to_pylist()
    # Fails on any false alarm; guard/events is None if the guard did not run at all.
    assert [r["guard/events"] for r in rows] == [0.0] * 8
    assert [r["guard/rollbacks"] for r in rows] == [0.0] * 8
    assert _events(out) == [] and not (out / "guard.jsonl").exists()
    assert read_metadata(out / "metrics.parquet")["config"]["collapse_guard"]["events"] == []

    off = tmp_path / "off"  # --no-guard: no guard columns at all
    assert runner.invoke(app, _args(off, tiny_model_dir, demo_index, 2, "--no-guard")).exit_code == 0
    assert all(r["guard/events"] is None for r in read_artifact(off / "metrics.parquet", METRICS).to_pylist())


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_rollback_restores_the_healthy_checkpoint_halves_the_lr_and_finishes(tmp_path, tiny_model_dir, demo_index):
    from zsearch_cli.train.config import TrainConfig
    from zsearch_cli.train.stability import Stability
    from zsearch_cli.train.trainer import Trainer

    out = tmp_path / "planted-collapse"  # tests/conftest.py: an expected alarm
    steps, onset = 18, 12
    cfg = TrainConfig.from_flat(algo="grpo", model=str(tiny_model_dir), index=demo_index, steps=steps, batch_size=2,
                      group_size=2, max_turns=2, max_turn_tokens=12, device="cpu", lr=1e-3, out=out, save_every=1,
                      on_collapse="rollback")
    now = {"step": 0}
    trainer: Trainer | None = None

    def reward(t) -> float:  # collapses at `onset` until the first rollback, healthy after it
        collapsed = now["step"] >= onset and not trainer.stability.rollbacks
        return len("".join(t.policy_texts)) / 1000 + (0.0 if collapsed else 1.0)

    trainer = Trainer(cfg, reward_fn=reward)
    step_fn = trainer.train_step

    def train_step(step: int):
        now["step"] = step
        return step_fn(step)

    trainer.train_step = train_step
    seen: dict = {}
    act = Stability.act

    def spy(self, tr, step, metrics):  # weights just before and just after the rollback
        before = _weights(tr.policy)
        lr_before = tr.scheduler.base_lrs[0]
        cursor = tr.data.state()
        back = act(self, tr, step, metrics)
        if back is not None:
            seen.update(step=step, back=back, before=before, after=_weights(tr.policy), lr_before=lr_before,
                        lr_after=tr.scheduler.base_lrs[0], group_lr=tr.optimizer.param_groups[0]["lr"],
                        saved=load_file(str(out / "checkpoints" / f"step-{back}" / "model.safetensors")),
                        healthy=(out / "checkpoints" / f"step-{back}" / "healthy").is_file(),
                        newer=sorted(p.name for p in (out / "checkpoints").iterdir() if int(p.name[5:]) > back),
                        cursor=(cursor, tr.data.state()),
                        saved_cursor=json.loads((out / "checkpoints" / f"step-{back}" / "trainer_state.json")
                                                .read_text())["data"])
        return back

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Stability, "act", spy)
        trainer.train()

    # Fails if no rollback happened at all, or went to a checkpoint inside the collapse window.
    assert seen, "no rollback"
    lag = trainer.stability.lag
    assert onset <= seen["step"] <= onset + BOUND and seen["back"] <= seen["step"] - lag - 1 and seen["healthy"]
    # The weights are the checkpoint's, exactly; and the comparison can fail: they were not
    # those before the rollback.
    saved, after, before = seen["saved"], seen["after"], seen["before"]
    assert saved.keys() <= after.keys()
    assert all(torch.equal(after[k], saved[k]) for k in saved)
    assert any(not torch.equal(before[k], saved[k]) for k in saved), "the rollback changed nothing"
    # lr halved (schedule and current lr), the data cursor kept, newer checkpoints dropped
    assert seen["lr_after"] == pytest.approx(seen["lr_before"] / 2) and seen["group_lr"] == pytest.approx(5e-4)
    assert seen["newer"] == []
    # the run went on to the last step: one row per step in metrics.parquet, the lr halved
    # after the checkpoint, guard/rollbacks 1 at the end; guard.jsonl keeps the event
    rows = read_artifact(out / "metrics.parquet", METRICS).to_pylist()
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert rows[-1]["guard/rollbacks"] == 1.0
    assert sum(r["guard/events"] for r in rows) == 0  # the event's row was dropped with the collapsed steps
    back = seen["back"]
    assert [r["actor/lr"] for r in rows] == [pytest.approx(1e-3)] * back + [pytest.approx(5e-4)] * (steps - back)
    events = _events(out)
    assert [e["action"] for e in events] == ["rollback"] and events[0]["step"] == seen["step"]
    jsonl_steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert jsonl_steps == list(range(1, seen["step"] + 1)) + list(range(seen["back"] + 1, steps + 1))  # append-only
    meta = read_metadata(out / "metrics.parquet")["config"]["collapse_guard"]
    assert meta["rollbacks"] == [{"step": seen["step"], "to": seen["back"]}]
    # the data cursor was not rewound to the checkpoint's: the replayed steps draw new batches
    assert seen["cursor"][0] == seen["cursor"][1] != seen["saved_cursor"]
    assert (out / "final").is_dir()
    # the checkpoints carry the guard state, with the rollback
    state = json.loads((out / "checkpoints" / f"step-{steps}" / "trainer_state.json").read_text())
    assert state["guard"]["rollbacks"] == meta["rollbacks"] and state["guard"]["lr_scale"] == 0.5
    assert not math.isnan(rows[-1]["rollout/reward_mean"])


def test_rollback_without_a_healthy_checkpoint_stops(tmp_path, tiny_model_dir, demo_index, collapsing_reward):
    out = tmp_path / "planted-collapse"  # tests/conftest.py: an expected alarm
    # one checkpoint every 50 steps: none exists when the collapse comes
    result = runner.invoke(app, _args(out, tiny_model_dir, demo_index, 16, "--on-collapse", "rollback", save_every=50))
    text = _one_line(result.output)
    assert result.exit_code == 2, result.output
    assert "reward_drop" in text and "no healthy checkpoint to roll back to yet" in text
    assert [e["action"] for e in _events(out)] == ["stop"]


def test_the_guard_state_is_checkpointed_and_resumed(tmp_path, tiny_model_dir, demo_index):
    from zsearch_cli.train.config import TrainConfig
    from zsearch_cli.train.trainer import Trainer

    out = tmp_path / "run"
    kw = dict(algo="grpo", model=str(tiny_model_dir), index=demo_index, batch_size=2, group_size=2, max_turns=2,
              max_turn_tokens=12, device="cpu", lr=1e-3, out=out, save_every=3)
    reward = lambda t: len("".join(t.policy_texts)) / 1000  # noqa: E731
    first = Trainer(TrainConfig.from_flat(steps=6, **kw), reward_fn=reward)
    first.train()
    saved = first.stability.guard.state_dict()
    assert saved["baseline"]["rollout/reward_mean"], "the guard learnt no baseline"
    resumed = Trainer(TrainConfig.from_flat(steps=8, resume=True, **kw), reward_fn=reward)
    # Fails if the resume started a fresh guard (empty baseline): it would not see a collapse
    # for another warm-up.
    assert resumed.start_step == 6 and resumed.stability.guard.state_dict() == saved


@pytest.mark.parametrize("save_every", [1, 0])
def test_a_failure_mid_run_names_its_step_and_how_to_go_on(tmp_path, tiny_model_dir, demo_index, save_every):
    # issue 36.11: an error in step 2 of 3 (here the reward's judge failing, through the
    # library's reward_fn hook) named no step and gave no --resume hint though step-1 was saved.
    from zsearch_cli.errors import ZsearchError
    from zsearch_cli.train.config import TrainConfig
    from zsearch_cli.train.trainer import run_training

    calls = []

    def judge(trajectory):
        calls.append(1)
        if len(calls) > 2:  # B 1 x G 2: the first step's two samples are judged, the third call fails
            raise ZsearchError("judge http://127.0.0.1:9/v1: connection refused")
        return 0.5 * len(calls)

    out = tmp_path / "run"
    cfg = TrainConfig.from_flat(algo="grpo", model=str(tiny_model_dir), index=demo_index, out=out, steps=3,
                                batch_size=1, group_size=2, device="cpu", max_turn_tokens=4, max_turns=1,
                                save_every=save_every, guard=False)
    with pytest.raises(ZsearchError) as err:
        run_training(cfg, reward_fn=judge)
    text = str(err.value)
    assert text.startswith("judge http://127.0.0.1:9/v1: connection refused (in step 2/3; ")
    if save_every:
        assert f"the newest checkpoint is {out / 'checkpoints' / 'step-1'}: rerun the same command with --resume" in text
    else:
        assert "no checkpoint to resume from (--save-every N writes them)" in text
