"""``--vllm-sleep`` on the real engine (CPU build): the order of the calls in ``zsearch train``.

vLLM's CPU build has no sleep mode (``is_sleep_mode_available()`` is False, its worker's
sleep and wake-up only log a warning), so what can be tested here is the order, not the
freed memory: the platform is made to say yes, ``LLM.sleep`` and ``LLM.wake_up`` are
replaced by recorders, and the weight sync (``collective_rpc("reload_weights")``), the prefix
cache reset, generation (``LLM.generate``: rollouts and the sync probe) and the update are
recorded while they run for real. Each step must be exactly: rollout (generate…), sleep,
update, wake-up, sync, then generate again; at level 2 the weights wake before the sync and
the KV cache after it.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.models.base import LOGP_TOLERANCE
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import METRICS

TOL = LOGP_TOLERANCE["float32"]


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm_sleep") / "index"
    result = CliRunner().invoke(app, ["index", "--out", str(out), "--kind", "bm25"])
    assert result.exit_code == 0, result.output
    return out


def _record(monkeypatch) -> list[str]:
    import vllm
    from vllm.platforms import current_platform

    import zsearch_cli.train.trainer as trainer_module

    calls: list[str] = []
    monkeypatch.setattr(type(current_platform), "is_sleep_mode_available", lambda self: True)
    monkeypatch.setattr(vllm.LLM, "sleep", lambda self, level=1, mode="abort": calls.append(f"sleep({level})"))
    monkeypatch.setattr(vllm.LLM, "wake_up", lambda self, tags=None: calls.append(f"wake_up({tags})"))

    def wrap(owner, name, label):
        real = getattr(owner, name)

        def recorded(*args, **kwargs):
            text = label(*args, **kwargs) if callable(label) else label
            if text is not None:
                calls.append(text)
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, recorded)

    wrap(vllm.LLM, "__init__", lambda llm, *a, **k: f"engine(enable_sleep_mode={k.get('enable_sleep_mode')})")
    wrap(vllm.LLM, "collective_rpc", lambda llm, method, *a, **k: "sync" if method == "reload_weights" else None)
    wrap(vllm.LLM, "reset_prefix_cache", "reset_prefix_cache")
    wrap(vllm.LLM, "generate", "generate")
    wrap(trainer_module, "sample_step", lambda engine, data, spec, acfg, step, **k: f"rollout(step {step})")
    wrap(trainer_module, "optimize", "update")
    return calls


def _runs(calls: list[str]) -> list[str]:
    """``calls`` with each run of consecutive ``generate`` as one (a rollout's turns)."""
    return [c for i, c in enumerate(calls) if not (c == "generate" and i and calls[i - 1] == "generate")]


@pytest.mark.parametrize("level, wake_and_sync", [
    (1, ["wake_up(None)", "sync", "reset_prefix_cache"]),
    (2, ["wake_up(['weights'])", "sync", "reset_prefix_cache", "wake_up(['kv_cache'])"]),
])
def test_train_sleeps_during_the_update_and_wakes_before_the_sync(tmp_path, monkeypatch, vllm_tiny_dir, demo_index,
                                                                  level, wake_and_sync):
    calls = _record(monkeypatch)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", "--backend", "vllm", "--vllm-sleep", str(level), "--algo", "grpo", "-G", "2", "--batch-size", "2",
        "--steps", "2", "--model", str(vllm_tiny_dir), "--index", str(demo_index), "--out", str(out), "--lr", "1e-3",
        "--max-turn-tokens", "16", "--max-turns", "2", "--device", "cpu", "--save-every", "0"])
    assert result.exit_code == 0, result.output
    print(calls)
    start = ["engine(enable_sleep_mode=True)", "sync", "reset_prefix_cache", "generate"]  # the first sync, its probe
    step = ["generate", f"sleep({level})", "update", *wake_and_sync, "generate"]  # rollout turns … sync probe
    assert _runs(calls) == _runs([*start, "rollout(step 1)", *step, "rollout(step 2)", *step])
    # Each step's rollout generated at least once before the sleep (the run above is collapsed).
    for n in (1, 2):
        after = calls[calls.index(f"rollout(step {n})") + 1:]
        assert after[0] == "generate" and after.index(f"sleep({level})") >= 1
    # The engine the next rollout samples from holds the updated weights.
    metrics = read_artifact(out / "metrics.parquet", METRICS).to_pylist()
    assert len(metrics) == 2 and all(m["rollout/sync_mismatch"] < TOL and m["rollout/logp_mismatch"] < TOL
                                     for m in metrics)


def test_the_cpu_build_has_no_sleep_mode_and_is_refused_in_one_line(tmp_path):
    # The real CPU platform: refused before any model loads (--model names none).
    result = CliRunner().invoke(app, ["train", "--backend", "vllm", "--vllm-sleep", "1", "--out", str(tmp_path / "run"),
                                      "--model", str(tmp_path / "no-such-model"), "--device", "cpu"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and text.count("error:") == 1, result.output
    assert "--vllm-sleep 1: vLLM has no sleep mode on this platform (cpu;" in text and "no-such-model" not in text


def test_a_sleeping_engine_refuses_to_generate(engine):
    from zsearch_cli.errors import ZsearchError
    from zsearch_cli.models.base import SamplingParams

    with pytest.raises(ZsearchError, match=r"sleep\(\): this vLLM engine was built without sleep mode"):
        engine.sleep()
    params = SamplingParams(max_new_tokens=2, temperature=0.0)
    engine.asleep = {"kv_cache"}  # between a level-2 sync and its KV cache wake-up
    try:
        for call in (lambda: engine.generate([[1, 2]], params), lambda: engine.submit([[1, 2]], params),
                     lambda: engine.sequence_logprobs([1, 2, 3])):
            with pytest.raises(ZsearchError, match=r"while the vLLM engine sleeps \(kv_cache freed\)"):
                call()
    finally:
        engine.asleep = set()
    assert len(engine.generate([[1, 2]], params)[0].token_ids) == 2  # awake again: it generates


def test_gpu_memory_utilization_reaches_the_engine(tmp_path, vllm_tiny_dir, demo_index):
    # The CPU build sizes its KV cache by VLLM_CPU_KVCACHE_SPACE, and the engine's settings refuse
    # a GPU share there: that refusal, raised where the engine is built, shows the flag reached
    # it (dropped on the way, the run would train and exit 0).
    result = CliRunner().invoke(app, [
        "train", "--backend", "vllm", "--gpu-memory-utilization", "0.6", "--algo", "grpo", "-G", "2",
        "--batch-size", "2", "--steps", "1", "--model", str(vllm_tiny_dir), "--index", str(demo_index),
        "--out", str(tmp_path / "run"), "--max-turn-tokens", "8", "--device", "cpu", "--save-every", "0"])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "--gpu-memory-utilization applies to GPUs" in text, result.output
    # and with the HF backend it is refused before anything loads
    result = CliRunner().invoke(app, ["train", "--backend", "hf", "--gpu-memory-utilization", "0.6",
                                      "--model", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "r2")])
    text = " ".join(result.output.split())
    assert result.exit_code == 2 and "--gpu-memory-utilization with --backend hf" in text, result.output
