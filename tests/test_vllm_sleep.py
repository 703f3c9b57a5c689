"""``--vllm-sleep``: the refusals, each one line and before any model loads (no vLLM needed).
The order of the sleep, wake-up and sync calls is tested on the real engine in
tests/vllm/test_sleep.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.errors import ZsearchError
from zsearch_cli.train.config import TrainConfig, check_config


def _platform(monkeypatch, sleeps: bool) -> None:
    """vLLM's current_platform, as models/vllm_setup.py sees it: a GPU one that sleeps, or the CPU build's."""
    fake = SimpleNamespace(is_sleep_mode_available=lambda: sleeps, device_type="cuda" if sleeps else "cpu")
    monkeypatch.setattr("zsearch_cli.models.vllm_setup.vllm_platform", lambda: fake)


def _refused(message: str, **overrides) -> None:
    with pytest.raises(ZsearchError) as err:
        check_config(TrainConfig.from_flat(**overrides))
    assert message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("level", [1, 2])
def test_a_platform_without_sleep_mode_is_refused(monkeypatch, level):
    _platform(monkeypatch, sleeps=False)
    _refused(f"--vllm-sleep {level}: vLLM has no sleep mode on this platform (cpu;", backend="vllm", vllm_sleep=level)
    _platform(monkeypatch, sleeps=True)  # the same options where vLLM sleeps pass
    check_config(TrainConfig.from_flat(backend="vllm", vllm_sleep=level))


def test_the_hf_backend_is_refused(monkeypatch):
    _refused("--vllm-sleep 1 with --backend hf: the HF backend has no engine to put to sleep", backend="hf", vllm_sleep=1)
    monkeypatch.setattr("zsearch_cli.models.factory.vllm_available", lambda: False)
    _refused("--vllm-sleep 2 with --backend auto (no vLLM with CUDA here: auto is hf)", backend="auto", vllm_sleep=2)


def test_rollout_overlap_is_refused(monkeypatch):
    _platform(monkeypatch, sleeps=True)  # refused even where vLLM sleeps
    _refused("--vllm-sleep 1 with --rollout-overlap: the engine rolls out the next steps during the update",
             backend="vllm", vllm_sleep=1, rollout_overlap=1)


def test_off_by_default_and_out_of_range_is_refused(tmp_path):
    assert TrainConfig().run.vllm_sleep == 0
    check_config(TrainConfig.from_flat(backend="hf", rollout_overlap=1))  # 0 checks nothing
    result = CliRunner().invoke(app, ["train", "--out", str(tmp_path), "--vllm-sleep", "3"])
    assert result.exit_code == 2 and "--vllm-sleep" in result.output and "<= 2" in result.output, result.output


def test_the_cli_refuses_before_any_model_loads(tmp_path):
    # --model names no model: the refusal must come first.
    result = CliRunner().invoke(app, ["train", "--out", str(tmp_path / "run"), "--model", str(tmp_path / "no-such-model"),
                                      "--backend", "hf", "--vllm-sleep", "1"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and text.count("error:") == 1, result.output
    assert "--vllm-sleep 1 with --backend hf" in text and "no-such-model" not in text
