"""``zsearch train --rollout-overlap K``: the loss takes the sampler's logprobs as pi_old, the
mismatch guard looks only at tokens the current weights sampled, every trained token is at
most K versions old, validation still runs, and a resumed run keeps the data order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import METRICS, ROLLOUT

from helpers import make_trajectory

runner = CliRunner()


def test_overlap_takes_pi_old_from_the_sampler_and_checks_only_fresh_tokens(tiny_model_dir):
    from accelerate import Accelerator

    from zsearch_cli.train.config import TrainConfig, resolve_config
    from zsearch_cli.train.logprobs import collate, policy_forward
    from zsearch_cli.train.policy import load_policy
    from zsearch_cli.train.step_samples import Sample
    from zsearch_cli.train.update import StepModels, rollout_tensors, step_batch

    gen = torch.Generator().manual_seed(0)
    trajs = [make_trajectory(f"q{i}#0", prompt_ids=torch.randint(3, 200, (4,), generator=gen).tolist(),
                             response_ids=torch.randint(3, 200, (6,), generator=gen).tolist(),
                             loss_mask=[1, 1, 0, 1, 1, 1]) for i in range(2)]
    cfg0 = resolve_config(TrainConfig.from_flat(algo="grpo", model=str(tiny_model_dir), group_size=2, temperature=1.0))
    policy, _ = load_policy(cfg0, "cpu", "float32")
    with torch.no_grad():
        true, _ = policy_forward(policy, collate(trajs, 0, "cpu"), 1.0)  # [2, 6]
    # Version 3 is the policy being trained: its tokens carry the true logprobs. Tokens of
    # version 2 (one update old) carry other ones, as an older policy would have given.
    for i, t in enumerate(trajs):
        t.policy_version = [3, 2, -1, 2, 3, 3] if i == 0 else [2, 2, -1, 2, 2, 2]
        t.logprobs = [float(true[i, j]) if v == 3 else (float(true[i, j]) - 1.0 if v == 2 else 0.0)
                      for j, v in enumerate(t.policy_version)]
    samples = [Sample(t, step=4, gen_batch=0, group_key="g") for t in trajs]
    m = StepModels(policy, None, None, None, None, Accelerator(cpu=True), 0, torch.device("cpu"))

    for overlap in (0, 1):
        # two epochs: pi_old must then come from a forward before the update (with one epoch and
        # one mini-batch it is the update's own forward, train/update.py fused_old_logp)
        cfg = resolve_config(TrainConfig.from_flat(algo="grpo", model=str(tiny_model_dir), group_size=2, temperature=1.0,
                                         rollout_overlap=overlap, ppo_epochs=2))
        batch = rollout_tensors(m, step_batch(samples, 0), cfg, version=3)
        mask = batch.tokens.mask.bool()
        if overlap:
            # pi_old is what sampled each token; the mismatch only sees the 3 version-3 tokens.
            assert torch.equal(batch.old_logp[mask], batch.sampler_logp[mask])
            assert batch.logp_mismatch < 1e-5
        else:
            # on-policy: pi_old is recomputed; the stale tokens (7 of 10) are 1 nat off.
            assert torch.allclose(batch.old_logp[mask], true[mask], atol=1e-5)
            assert batch.logp_mismatch == pytest.approx(0.7, abs=1e-4)
    assert step_batch(samples, 0).versions[0].tolist() == [3, 2, -1, 2, 3, 3]


def _train(out: Path, model: Path, index: Path, steps: int, *extra: str) -> None:
    args = ["train", "--algo", "grpo", "--model", str(model), "--index", str(index), "--steps", str(steps),
            "--batch-size", "2", "-G", "2", "--max-turn-tokens", "12", "--max-turns", "2", "--device", "cpu",
            "--out", str(out), "--save-rollouts", "--lr", "1e-3", "--rollout-overlap", "1", *extra]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output


def _rollouts(out: Path, step: int) -> list[dict]:
    return read_artifact(out / "rollouts" / f"step-{step:06d}.parquet", ROLLOUT).to_pylist()


def test_overlap_training_stays_within_the_bound_validates_and_resumes_in_data_order(tmp_path, tiny_model_dir,
                                                                                    demo_index):
    from zsearch_cli.data.demo import demo_qa

    val = demo_qa("test")
    full = tmp_path / "full"
    _train(full, tiny_model_dir, demo_index, 4, "--val-data", str(val), "--val-every", "2", "--val-limit", "2")
    metrics = read_artifact(full / "metrics.parquet", METRICS).to_pylist()
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    staleness = [m["rollout/staleness"] for m in metrics]
    assert staleness[0] == 0 and all(0 <= s <= 1 for s in staleness) and max(staleness) > 0
    assert all(m["rollout/logp_mismatch"] is None or m["rollout/logp_mismatch"] < 1e-3 for m in metrics)
    assert [m["val/em"] is not None for m in metrics] == [False, True, False, True]  # ran on the rollout thread
    for step in (1, 2, 3, 4):
        versions = {v for r in _rollouts(full, step) for v, k in zip(r["policy_version"], r["loss_mask"]) if k}
        assert versions <= {step - 2, step - 1} and min(versions) >= 0, (step, versions)

    # A run of 3 steps checkpoints after step 2 while step 3 is already drawn (and rolling
    # out); resumed from that checkpoint to 4 steps, steps 3 and 4 draw the same rows as the
    # uninterrupted run.
    part = tmp_path / "part"
    _train(part, tiny_model_dir, demo_index, 3, "--save-every", "2")
    assert sorted(p.name for p in (part / "checkpoints").iterdir()) == ["step-2"]
    _train(part, tiny_model_dir, demo_index, 4, "--save-every", "2", "--resume")
    for step in (3, 4):
        assert sorted(r["id"] for r in _rollouts(part, step)) == sorted(r["id"] for r in _rollouts(full, step))
        assert {r["group_id"] for r in _rollouts(part, step)} == {r["group_id"] for r in _rollouts(full, step)}
