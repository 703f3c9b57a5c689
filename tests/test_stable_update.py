"""Issue 24 in the trainer's update (train/update.py): loss aggregation as its own choice,
--mask-truncated, and the rollout correction (TIS weights, rejection), on the tiny model
with plain SGD so that the weights after one update are the gradient."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from zsearch_cli.errors import ZsearchError
from zsearch_cli.train.config import TrainConfig, algo_config, check_config, get_spec, resolve_config

from helpers import make_trajectory

B, G = 3, 2


def _samples(truncate: int | None = None, masked: dict[int, list[int]] | None = None) -> list[Any]:
    """B prompts × G samples of unequal lengths with an observation token in the middle;
    sample ``truncate`` ended on the token cap; ``masked[i]`` = positions whose loss mask is 0."""
    from zsearch_cli.train.step_samples import Sample

    gen = torch.Generator().manual_seed(123)
    out = []
    for p in range(B):
        prompt = torch.randint(3, 200, (4,), generator=gen).tolist()
        for g in range(G):
            i = p * G + g
            n = 3 + (5 * p + 3 * g) % 7
            mask = [1] * n
            mask[1] = 0
            for j in (masked or {}).get(i, []):
                mask[j] = 0
            traj = make_trajectory(f"q{p}#{g}", prompt_ids=prompt, loss_mask=mask, group_id=f"0:q{p}",
                                   response_ids=torch.randint(3, 200, (n,), generator=gen).tolist())
            if i == truncate:
                traj.finish_reason, traj.prediction = "length", None
            out.append(Sample(traj, step=0, gen_batch=0, group_key=traj.group_id,
                              reward=float((p + g) % 2) + 0.1 * p))
    return out


def _update(model_dir, samples, sampler_shift: dict[tuple[int, int], float] | None = None, zero_adv: int | None = None,
            **overrides) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """Weights after one SGD update on ``samples`` (the sampler's logprobs = the policy's own,
    shifted by ``sampler_shift[(i, t)]`` nats), and the update's statistics."""
    from accelerate import Accelerator

    from zsearch_cli.train.logprobs import collate, policy_forward
    from zsearch_cli.train.policy import load_policy
    from zsearch_cli.train.update import StepModels, advantages, optimize, rollout_tensors, step_batch

    cfg = resolve_config(TrainConfig.from_flat(**{**dict(algo="grpo", model=str(model_dir), batch_size=B, group_size=G,
                                               lr=1e-2, beta=0.0, micro_batch_size=B * G, seed=0,
                                               temperature=1.0), **overrides}))
    spec, acfg = get_spec(cfg.algo), algo_config(cfg)
    torch.manual_seed(0)
    policy, _ = load_policy(cfg, "cpu", "float32")
    trajs = [s.trajectory for s in samples]
    with torch.no_grad():
        # the trainer's own forward (its LM head: chunked unless --logits-chunk 0), so that an
        # unshifted token's ratio is exactly 1
        chunk = cfg.batch.logits_chunk
        true, _ = policy_forward(policy, collate(trajs, 0, "cpu"), 1.0, chunk=chunk)  # [N, T]
    for i, t in enumerate(trajs):  # a sampler that agrees with the policy, except where planted
        t.logprobs = [float(true[i, j]) - (sampler_shift or {}).get((i, j), 0.0) if k else 0.0
                      for j, k in enumerate(t.loss_mask)]
    acc = Accelerator(cpu=True)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1e-2)
    policy, optimizer = acc.prepare(policy, optimizer)
    m = StepModels(policy, None, None, optimizer, None, acc, 0, acc.device)
    batch = advantages(spec, acfg, rollout_tensors(m, step_batch(samples, 0), cfg), acc)
    if zero_adv is not None:
        batch.advantages[zero_adv] = 0.0
    stats = optimize(m, spec, acfg, cfg, batch, done=0)
    return {k: v.detach().clone() for k, v in acc.unwrap_model(policy).state_dict().items()}, stats


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_each_aggregation_is_the_same_update_in_any_micro_batching(tiny_model_dir, agg):
    # Gradient accumulation must reproduce the mini-batch loss: micro-batches of 1 and 4
    # sequences against one of all 6. A token mean weights micro-batches by their share of
    # trained tokens, the per-sequence means by their share of sequences; swapping the two
    # (the bug this guards against) moves the update by ~1e-4 here.
    whole, _ = _update(tiny_model_dir, _samples(), loss_agg=agg)
    for micro in (1, 4):
        split, _ = _update(tiny_model_dir, _samples(), loss_agg=agg, micro_batch_size=micro)
        assert _max_diff(whole, split) < 1e-7, (agg, micro)


def test_the_three_aggregations_are_three_different_updates(tiny_model_dir):
    updates = [_update(tiny_model_dir, _samples(), loss_agg=a)[0]
               for a in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")]
    assert _max_diff(updates[0], updates[1]) > 1e-6 and _max_diff(updates[1], updates[2]) > 1e-6


def test_mask_truncated_drops_the_sample_from_the_loss_but_not_from_its_group(tiny_model_dir):
    # Sample 2 hit the token cap. Under the per-sequence mean (beta = 0), a sample with no
    # trained token adds 0 and still counts in 1/N, which is exactly a sample whose advantage
    # is 0 while its reward still sets its group's baseline: both updates must be equal.
    masked, stats = _update(tiny_model_dir, _samples(truncate=2), mask_truncated=True)
    by_hand, _ = _update(tiny_model_dir, _samples(truncate=2), zero_adv=2)
    unmasked, _ = _update(tiny_model_dir, _samples(truncate=2))
    assert _max_diff(masked, by_hand) < 1e-7
    assert _max_diff(masked, unmasked) > 1e-6  # the option changes the update


def test_rejected_tokens_leave_the_loss_and_its_denominator(tiny_model_dir):
    # The sampler gave tokens (0, 2) and (3, 0) far lower logprobs than the trainer's pi_old:
    # rho = e^2 > 2, outside token rejection's [0.5, 2]. The update must equal one where those
    # tokens were never trained (loss mask 0: out of the numerator AND the token count).
    shift = {(0, 2): 2.0, (3, 0): 2.0}
    rejected, stats = _update(tiny_model_dir, _samples(), sampler_shift=shift, rollout_rs="token")
    never, _ = _update(tiny_model_dir, _samples(masked={0: [2], 3: [0]}))
    assert _max_diff(rejected, never) < 1e-7
    policy_tokens = sum(sum(s.trajectory.loss_mask) for s in _samples())
    assert stats["offpolicy/rejected_frac"] == pytest.approx(2 / policy_tokens)
    # without rejection those tokens train, and the diagnostics see the mismatch
    kept, stats = _update(tiny_model_dir, _samples(), sampler_shift=shift)
    assert _max_diff(kept, never) > 1e-6
    # k3 per token: rho - 1 - log rho = e^2 - 3 on the two planted tokens, 0 elsewhere
    assert stats["offpolicy/k3_kl"] == pytest.approx(2 * (torch.e ** 2 - 3) / policy_tokens, rel=1e-4)


def test_token_tis_caps_the_weights(tiny_model_dir):
    # rho = e^2 on one token, capped at C = 2; every other weight is 1.
    _, stats = _update(tiny_model_dir, _samples(), sampler_shift={(1, 0): 2.0}, rollout_is="token")
    assert stats["offpolicy/weight_max"] == pytest.approx(2.0)
    policy_tokens = sum(sum(s.trajectory.loss_mask) for s in _samples())
    assert stats["offpolicy/capped_frac"] == pytest.approx(1 / policy_tokens)
    assert stats["offpolicy/weight_mean"] == pytest.approx((policy_tokens + 1) / policy_tokens)
    # a weight of 1 everywhere is today's loss exactly
    plain, _ = _update(tiny_model_dir, _samples())
    weighted_ones, _ = _update(tiny_model_dir, _samples(), rollout_is="token")
    assert _max_diff(plain, weighted_ones) == 0.0


@pytest.mark.parametrize("overrides, message", [
    (dict(rollout_is="token", rollout_overlap=1), "nothing to correct"),
    (dict(rollout_rs="geometric", rollout_overlap=2), "nothing to correct"),
    (dict(algo="hrpo", rollout_overlap=1), "no clipped ratio"),
    (dict(on_collapse="rollback", save_every=0), "needs checkpoints"),
    (dict(on_collapse="rollback", rollout_overlap=1), "rollback with --rollout-overlap"),
    (dict(on_collapse="panic"), "unknown --on-collapse"),
    (dict(rollout_rs="tok"), "unknown --rollout-rs .tok.: use one of none, token, sequence, geometric"),
    (dict(algo="gspo", loss_agg="seq-mean-token-sum-norm"), "loss_agg must be one of"),
])
def test_unsafe_combinations_are_one_line_errors(overrides, message):
    with pytest.raises(ZsearchError, match=message) as err:
        check_config(TrainConfig.from_flat(**overrides))
    assert "\n" not in str(err.value)


def test_paper_defaults_of_the_aggregation():
    assert algo_config(resolve_config(TrainConfig.from_flat(algo="ppo"))).loss_agg == "token-mean"
    for algo in ("grpo", "reinforce", "gspo", "dspo", "hrpo"):
        assert algo_config(resolve_config(TrainConfig.from_flat(algo=algo))).loss_agg == "seq-mean-token-mean"
    assert resolve_config(TrainConfig.from_flat(algo="grpo")).loss.loss_agg == "seq-mean-token-mean"  # recorded, never null


@pytest.mark.parametrize("algo", ["grpo", "gspo"])
def test_one_forward_fewer_when_the_update_is_on_policy(tiny_model_dir, monkeypatch, algo):
    # One epoch, one mini-batch: pi_old is the update's own forward, detached (ratio exactly 1),
    # instead of a separate no-grad forward before it. The update, the mismatch and the
    # diagnostics must equal the two-forward path's (to float rounding), with one policy
    # forward fewer per micro-batch.
    from zsearch_cli.train import update

    calls = {"n": 0}
    real = update.policy_forward

    def counting(model, *args, **kwargs):
        calls["n"] += 1
        return real(model, *args, **kwargs)

    monkeypatch.setattr(update, "policy_forward", counting)
    shift = {(0, 2): 0.3, (4, 3): -0.2}  # a sampler slightly off, so the diagnostics are not all 0
    fused, fused_stats = _update(tiny_model_dir, _samples(), sampler_shift=shift, algo=algo, micro_batch_size=4)
    fused_calls = calls["n"]
    monkeypatch.setattr(update, "fused_old_logp", lambda *a: False)
    calls["n"] = 0
    separate, separate_stats = _update(tiny_model_dir, _samples(), sampler_shift=shift, algo=algo,
                                       micro_batch_size=4)
    assert (fused_calls, calls["n"]) == (2, 4)  # 6 sequences in micro-batches of 4: 2 forwards saved
    assert _max_diff(fused, separate) < 1e-6
    assert fused_stats["actor/ratio_mean"] == 1.0 and separate_stats["actor/ratio_mean"] == pytest.approx(1, abs=1e-6)
    for key in ("offpolicy/k3_kl", "offpolicy/chi2_token", "actor/pg_loss"):
        assert fused_stats[key] == pytest.approx(separate_stats[key], rel=1e-5, abs=1e-7), key
    assert fused_stats["offpolicy/k3_kl"] > 0


def test_the_separate_forward_stays_where_pi_old_is_needed_first():
    from zsearch_cli.train.update import fused_old_logp

    base = dict(algo="grpo")
    assert fused_old_logp(TrainConfig.from_flat(**base), 10, has_critic=False)
    for extra in (dict(ppo_epochs=2), dict(mini_batch_size=5), dict(rollout_overlap=1), dict(rollout_is="token"),
                  dict(rollout_rs="geometric")):
        assert not fused_old_logp(TrainConfig.from_flat(**base, **extra), 10, has_critic=False), extra
    assert not fused_old_logp(TrainConfig.from_flat(algo="ppo"), 10, has_critic=True)


def test_a_checkpoint_of_an_older_zsearch_resumes(tmp_path, tiny_model_dir, demo_index):
    # A checkpoint written before the options of issues 23/24 existed records none of them;
    # --resume must read them as the values that run used (defaults; loss_agg: the algo's),
    # not refuse it as "rollout_is=None->'none'". Deleting any other key still refuses.
    import json

    from typer.testing import CliRunner

    from zsearch_cli.cli import app

    runner = CliRunner()
    out = tmp_path / "run"
    args = ["train", "--algo", "grpo", "-G", "2", "--batch-size", "2", "--model", str(tiny_model_dir), "--index",
            str(demo_index), "--out", str(out), "--save-every", "1", "--max-turns", "1", "--max-turn-tokens", "8",
            "--device", "cpu"]
    assert runner.invoke(app, [*args, "--steps", "1"]).exit_code == 0
    state_path = out / "checkpoints" / "step-1" / "trainer_state.json"
    state = json.loads(state_path.read_text())
    for key in ("rollout_is", "rollout_is_cap", "rollout_rs", "rollout_rs_low", "rollout_rs_high", "loss_agg",
                "mask_truncated", "merge_lora", "guard", "on_collapse"):
        del state["config"][key]
    state_path.write_text(json.dumps(state))
    from zsearch_cli.train.integrity import write_manifest

    write_manifest(state_path.parent)  # as that version wrote it: a complete checkpoint
    result = runner.invoke(app, [*args, "--steps", "2", "--resume"])
    assert result.exit_code == 0, result.output
    # a real difference is still refused
    result = runner.invoke(app, [*args, "--steps", "3", "--resume", "--loss-agg", "token-mean"])
    assert result.exit_code == 2 and "loss_agg='seq-mean-token-mean'->'token-mean'" in result.output
