"""`zsearch train` and `zsearch eval` with ``--backend vllm`` on the real engine (CPU build):
the weight sync after every update, its two guards, a clean exit, and eval trajectories
equal to the HF backend's under greedy decoding.

CLI runs with vLLM go through a subprocess: that is what users run, it shows whether the
process exits cleanly (the engine's shutdown at exit), and it keeps one engine per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import LOGP_TOLERANCE
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import EVAL_EXAMPLE, METRICS

TOL = LOGP_TOLERANCE["float32"]
SMALL = ["--max-turn-tokens", "16", "--max-turns", "2", "--device", "cpu"]


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("vllm_train") / "index"
    result = CliRunner().invoke(app, ["index", "--out", str(out), "--kind", "bm25"])
    assert result.exit_code == 0, result.output
    return out


def _zsearch(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m zsearch_cli ARGS`` in a fresh process; a failure shows its stderr."""
    proc = subprocess.run([sys.executable, "-m", "zsearch_cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def odd_share(traj) -> float:
    """A reward the random tiny model's samples differ in (the share of odd token ids), so every
    GRPO group has non-zero advantages and every step a non-zero gradient."""
    ids = traj.response_ids
    return sum(i % 2 for i in ids) / max(len(ids), 1)


def _trainer(tmp_path, model_dir, index, **overrides):
    from zsearch_cli.train.config import TrainConfig
    from zsearch_cli.train.trainer import Trainer

    options = dict(algo="grpo", model=str(model_dir), index=index, out=tmp_path / "run", steps=3, batch_size=2,
                   group_size=2, max_turn_tokens=16, max_turns=2, device="cpu", lr=1e-3, backend="vllm",
                   save_every=0)
    return Trainer(TrainConfig.from_flat(**{**options, **overrides}), reward_fn=odd_share)


def test_three_steps_stay_synced(tmp_path, vllm_tiny_dir, demo_index):
    from zsearch_cli.models.hf import HFBackend
    from zsearch_cli.models.base import SamplingParams

    trainer = _trainer(tmp_path, vllm_tiny_dir, demo_index)
    try:
        rows = [trainer.train_step(step) for step in (1, 2, 3)]
        # After the last sync the engine is the trained policy: same greedy ids as HF on it.
        prompts = [trainer.tokenizer.encode(t) for t in ("Who wrote the novel?", "The river flows")]
        greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
        policy = trainer.accelerator.unwrap_model(trainer.policy)
        want = HFBackend(policy, trainer.tokenizer).generate(prompts, greedy)
        assert [o.token_ids for o in trainer.generation.generate(prompts, greedy)] == [o.token_ids for o in want]
    finally:
        trainer.close()
    print("logp_mismatch", [r["rollout/logp_mismatch"] for r in rows],
          "sync_mismatch", [r["rollout/sync_mismatch"] for r in rows])
    for r in rows:
        assert r["actor/grad_norm"] > 0 and r["rollout/reward_std"] > 0
        assert 0 < r["rollout/logp_mismatch"] < TOL and 0 <= r["rollout/sync_mismatch"] < TOL
        assert r["time/sync"] is not None and r["time/sync"] < r["time/update"]


def test_a_sync_that_leaves_the_engine_stale_stops_training(tmp_path, vllm_tiny_dir, demo_index):
    # A sync that does nothing: the engine keeps the weights it started with.
    trainer = _trainer(tmp_path, vllm_tiny_dir, demo_index)
    try:
        trainer.generation.update_weights = lambda weights: None
        # The rollout guard (logp_mismatch), with the probe check out of the way: step 2's
        # rollouts come from the starting weights, the training forward from the updated policy.
        trainer._probe_mismatch = lambda policy: 0.0
        trainer.train_step(1)
        with pytest.raises(ZsearchError, match=r"step 2: the rollout logprobs differ .* \(logp_mismatch; tolerance"):
            trainer.train_step(2)
        # The probe guard, which runs right after each sync, catches it before any rollout.
        del trainer._probe_mismatch
        with pytest.raises(ZsearchError, match=r"the vLLM weight sync failed: .* \(tolerance 1e-03 for float32\)") as err:
            trainer.sync_generation()
        assert "\n" not in str(err.value)
    finally:
        trainer.close()


def test_train_cli_lora_exits_cleanly_and_evals(tmp_path, vllm_tiny_dir, demo_index):
    # LoRA: the engine gets base + merged delta each step. The process must exit 0 without the
    # "Invalid process group" traceback the engine's late shutdown used to print.
    out = tmp_path / "lora"
    proc = _zsearch("train", "--backend", "vllm", "--algo", "reinforce", "-G", "1", "--model", str(vllm_tiny_dir),
                    "--index", str(demo_index), "--steps", "2", "--batch-size", "2", "--lora-r", "4", "--lr", "1e-2",
                    "--out", str(out), *SMALL)
    assert "Traceback" not in proc.stderr and "Invalid process group" not in proc.stderr, proc.stderr[-3000:]
    assert (out / "final" / "adapter_config.json").is_file()
    metrics = read_artifact(out / "metrics.parquet", METRICS).to_pylist()
    assert len(metrics) == 2 and all(m["rollout/sync_mismatch"] < TOL and m["rollout/logp_mismatch"] < TOL
                                     for m in metrics)


def test_eval_vllm_trajectories_equal_hf_greedy(tmp_path, vllm_tiny_dir, demo_index):
    common = ["--model", str(vllm_tiny_dir), "--limit", "4", "--index", str(demo_index), *SMALL]
    result = CliRunner().invoke(app, ["eval", *common, "--backend", "hf", "--out", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    proc = _zsearch("eval", *common, "--backend", "vllm", "--out", str(tmp_path / "vllm"))
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    hf = read_artifact(tmp_path / "hf" / "demo" / "agent.examples.parquet", EVAL_EXAMPLE).to_pylist()
    vl = read_artifact(tmp_path / "vllm" / "demo" / "agent.examples.parquet", EVAL_EXAMPLE).to_pylist()
    assert len(hf) == len(vl) == 4
    for a, b in zip(hf, vl):  # every column: the decoded trajectory, the per-turn log, the answer
        assert b == a
    # Several turns each, with the engine's observations between them: the random model's turns
    # are invalid actions, answered by the protocol's retry message (it never searches).
    assert all(r["turns"] > 1 for r in vl) and "My previous action is invalid" in vl[0]["trajectory"]


def test_overlapped_rollouts_sync_the_engine_between_turns(tmp_path, vllm_tiny_dir, demo_index):
    # --rollout-overlap 1 on the real engine: the stream steps vLLM on its own thread while the
    # policy trains, and each weight sync runs there once no request is decoding (the engine's
    # update_weights refuses otherwise). Tokens the current weights sampled must score as
    # the policy does (the trainer stops otherwise); every token is at most one version old.
    from zsearch_cli.schemas import ROLLOUT

    trainer = _trainer(tmp_path, vllm_tiny_dir, demo_index, steps=4, rollout_overlap=1, save_rollouts=True)
    trainer.train()
    metrics = read_artifact(tmp_path / "run" / "metrics.parquet", METRICS).to_pylist()
    staleness = [m["rollout/staleness"] for m in metrics]
    assert staleness[0] == 0 and all(0 <= s <= 1 for s in staleness) and max(staleness) > 0
    for m in metrics:
        assert m["rollout/logp_mismatch"] is None or m["rollout/logp_mismatch"] < TOL
        assert 0 <= m["rollout/sync_mismatch"] < TOL and m["actor/grad_norm"] > 0
    for step in (1, 2, 3, 4):
        rows = read_artifact(tmp_path / "run" / "rollouts" / f"step-{step:06d}.parquet", ROLLOUT).to_pylist()
        versions = {v for r in rows for v, k in zip(r["policy_version"], r["loss_mask"]) if k}
        assert versions and versions <= {step - 2, step - 1} and min(versions) >= 0, (step, versions)


def test_overlap_under_top_p_takes_the_first_update_at_ratio_one(tmp_path, vllm_tiny_dir, demo_index):
    # Issue 24.2 on the real engine: vLLM's processed_logprobs are renormalised over the top-p
    # nucleus and, with --rollout-overlap, they are pi_old. The trainer replays the nucleus on
    # its own logits, so step 1 (all tokens sampled by the weights that take the update, its
    # statistics taken before the optimizer step) has every ratio at 1. Before, ratio_mean was
    # the mean nucleus mass (~0.9 here), and the mismatch guard was skipped at top_p < 1.
    trainer = _trainer(tmp_path, vllm_tiny_dir, demo_index, steps=2, rollout_overlap=1, top_p=0.9)
    trainer.train()
    metrics = read_artifact(tmp_path / "run" / "metrics.parquet", METRICS).to_pylist()
    assert metrics[0]["actor/ratio_mean"] == pytest.approx(1.0, abs=TOL)
    assert metrics[0]["actor/ratio_max"] == pytest.approx(1.0, abs=10 * TOL)
    for m in metrics:
        assert m["rollout/logp_mismatch"] is None or m["rollout/logp_mismatch"] < TOL
