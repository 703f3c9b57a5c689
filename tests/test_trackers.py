"""`zsearch train --report-to`: the metrics reach the tracker (accelerate's TensorBoard tracker,
read back from its event files), and a tracker whose package is missing is a one-line error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app

runner = CliRunner()


def _train(out: Path, model: Path, index: Path, report_to: str):
    return runner.invoke(app, ["train", "--algo", "grpo", "-G", "2", "--batch-size", "2", "--model", str(model),
                               "--index", str(index), "--out", str(out), "--steps", "2", "--save-every", "0",
                               "--max-turns", "1", "--max-turn-tokens", "8", "--device", "cpu",
                               "--report-to", report_to])


def _scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag in the event files under ``run_dir``: [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, list[tuple[int, float]]] = {}
    for events in sorted({p.parent for p in run_dir.rglob("events.out.tfevents.*")}):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return found


def test_tensorboard_gets_every_step_of_reward_and_loss(tmp_path, tiny_model_dir, demo_index):
    pytest.importorskip("tensorboard")
    from zsearch_cli.train.metrics import load_metrics

    out = tmp_path / "run"
    result = _train(out, tiny_model_dir, demo_index, "tensorboard")
    assert result.exit_code == 0, result.output
    scalars = _scalars(out)
    rows = load_metrics(out)
    for key in ("rollout/reward_mean", "actor/loss", "actor/lr", "rollout/response_length", "actor/ratio_mean"):
        assert [s for s, _ in scalars[key]] == [1, 2], key  # one point per step, none twice, counted from 1
        assert [v for _, v in scalars[key]] == pytest.approx([r[key] for r in rows]), key
    # The tiny model's reward and loss are 0 at every step, so for them "equal" could hide a
    # tracker that logs zeros; these two are non-zero and must arrive as they are.
    assert all(r["actor/lr"] > 0 and r["rollout/response_length"] > 0 for r in rows)
    # The hyper-parameters are the resolved ones: no "algorithm default" left as null/absent.
    import yaml

    (hparams_file,) = list(out.rglob("hparams.yml"))
    hparams = yaml.safe_load(hparams_file.read_text())
    assert (hparams["lr"], hparams["beta"], hparams["clip_eps"], hparams["reward"]) == (1e-6, 0.001, 0.2, "em")
    assert hparams["group_size"] == 2 and hparams["mini_batch_size"] == 4


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_missing_tracker_package_is_a_one_line_error(tmp_path, tiny_model_dir, demo_index):
    result = _train(tmp_path / "run", tiny_model_dir, demo_index, "wandb")
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "--report-to wandb: the wandb package is not installed (pip install wandb)" in text
    assert text.count("error:") == 1
