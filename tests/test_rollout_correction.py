"""Rollout correction (docs/methods.md §4.8): TIS weights, rejection, diagnostics, and how the
policy losses take them. Hand values with the arithmetic in the comments; masked positions
hold NaN / −inf garbage on purpose."""

from __future__ import annotations

import math
import re

import pytest
import torch

from zsearch_cli.algos import Correction, check_correction, rejection_bounds, rollout_correction
from zsearch_cli.algos.common import k3_kl, seq_mean_token_mean
from zsearch_cli.algos.grpo import GRPOConfig, grpo_policy_loss
from zsearch_cli.algos.gspo import GSPOConfig, gspo_policy_loss
from zsearch_cli.algos.hrpo import HRPOConfig, hrpo_policy_loss
from zsearch_cli.algos.ppo import PPOConfig, ppo_policy_loss
from zsearch_cli.config.parts import CorrectionOptions
from zsearch_cli.errors import ZsearchError

NAN = float("nan")


def close(x, y, tol=1e-6):
    x, y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    torch.testing.assert_close(x, y, atol=tol, rtol=0)


# Hand batch, 2 x 3. ρ_t = π_old/π_rollout:
#   row 0: ρ = [0.4, 1.0, 3.0]               Π = 1.2,  geometric mean 1.2^(1/3) = 1.0627
#   row 1: ρ = [1.5, 1.2, (padding)]         Π = 1.8,  geometric mean 1.8^(1/2) = 1.3416
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
RHO = torch.tensor([[0.4, 1.0, 3.0], [1.5, 1.2, 1.0]])
ROLLOUT = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.1, NAN]])
OLD = torch.where(MASK, ROLLOUT + RHO.log(), torch.tensor(float("-inf")))


def corr(**kw) -> Correction:
    return rollout_correction(OLD, ROLLOUT, MASK, CorrectionOptions(**kw))


def test_no_correction_is_all_ones_and_keeps_the_mask():
    c = corr()
    assert torch.equal(c.weights, torch.ones(2, 3))
    assert torch.equal(c.keep, MASK)
    assert c.kept_rows.tolist() == [True, True]


def test_token_tis_hand_values_with_the_cap():
    # w = min(ρ, 2): [0.4, 1, 2 (3 capped)], [1.5, 1.2, 1 (padding)]
    c = corr(rollout_is="token")
    close(c.weights, [[0.4, 1.0, 2.0], [1.5, 1.2, 1.0]])
    assert torch.equal(c.keep, MASK)
    close(c.stats["weight_mean"], (0.4 + 1.0 + 2.0 + 1.5 + 1.2) / 5)  # 1.22
    close(c.stats["weight_max"], 2.0)
    close(c.stats["truncated_frac"], 1 / 5)  # only the 3.0
    # a cap of 1.3 truncates 3.0 and 1.5: 2 of 5
    c = corr(rollout_is="token", rollout_is_cap=1.3)
    close(c.weights, [[0.4, 1.0, 1.3], [1.3, 1.2, 1.0]])
    close(c.stats["truncated_frac"], 2 / 5)


def test_sequence_tis_is_the_capped_product():
    # w_0 = min(0.4·1·3, 2) = 1.2, w_1 = min(1.5·1.2, 2) = 1.8, on every policy token
    c = corr(rollout_is="sequence")
    close(c.weights, [[1.2, 1.2, 1.2], [1.8, 1.8, 1.0]])
    close(c.stats["truncated_frac"], 0.0)
    # C = 1.6 caps row 1 (1.8 -> 1.6): its 2 tokens of 5 are truncated
    c = corr(rollout_is="sequence", rollout_is_cap=1.6)
    close(c.weights, [[1.2, 1.2, 1.2], [1.6, 1.6, 1.0]])
    close(c.stats["truncated_frac"], 2 / 5)
    close(c.stats["weight_max"], 1.6)
    assert not c.weights.requires_grad


def test_sequence_tis_of_a_huge_mismatch_is_the_cap_not_inf():
    old = torch.zeros(1, 200)
    c = rollout_correction(old, old - 1.0, torch.ones(1, 200), CorrectionOptions(rollout_is="sequence"))
    # Π ρ = e^200 overflows fp32; the weight is still exactly C and the stats are finite
    assert torch.all(c.weights == 2.0)
    assert all(torch.isfinite(v) for v in c.stats.values())
    close(c.stats["chi2_seq"], math.exp(40.0) - 1.0, tol=1e12)  # exponent clamped at 20, squared


def test_token_rejection_icepop_band():
    # default band [0.5, 2.0]: 0.4 and 3.0 are outside, 1.0, 1.5, 1.2 inside
    c = corr(rollout_rs="token")
    assert c.keep.tolist() == [[False, True, False], [True, True, False]]
    close(c.stats["rejected_frac"], 2 / 5)
    close(c.stats["rejected_seq_frac"], 0.0)
    assert torch.equal(c.weights, torch.ones(2, 3))  # rejection alone does not weight


def test_sequence_and_geometric_rejection_differ():
    # band [0.5, 1.1]. product: 1.2 and 1.8 both > 1.1 -> every token rejected.
    c = corr(rollout_rs="sequence", rollout_rs_low=0.5, rollout_rs_high=1.1)
    assert not c.keep.any()
    close(c.stats["rejected_frac"], 1.0)
    close(c.stats["rejected_seq_frac"], 1.0)
    assert c.kept_rows.tolist() == [False, False]
    close(c.stats["weight_mean"], 0.0)  # no kept token: 0 by convention
    # geometric mean: 1.0627 inside, 1.3416 outside -> row 1 only
    c = corr(rollout_rs="geometric", rollout_rs_low=0.5, rollout_rs_high=1.1)
    assert c.keep.tolist() == [[True, True, True], [False, False, False]]
    close(c.stats["rejected_frac"], 2 / 5)
    close(c.stats["rejected_seq_frac"], 1 / 2)
    # band [0.5, 1.5]: product 1.2 in, 1.8 out
    c = corr(rollout_rs="sequence", rollout_rs_high=1.5)
    assert c.keep.tolist() == [[True, True, True], [False, False, False]]


def test_is_and_rejection_together():
    # token TIS + token rejection: kept tokens carry their capped weight
    c = corr(rollout_is="token", rollout_rs="token")
    assert c.keep.tolist() == [[False, True, False], [True, True, False]]
    close(c.stats["weight_mean"], (1.0 + 1.5 + 1.2) / 3)  # over the kept tokens only
    close(c.stats["truncated_frac"], 0.0)  # the capped 3.0 was rejected


def test_default_bounds_and_validation():
    assert rejection_bounds(CorrectionOptions(rollout_rs="token")) == (0.5, 2.0)
    assert rejection_bounds(CorrectionOptions(rollout_rs="sequence")) == (0.5, 2.0)
    low, high = rejection_bounds(CorrectionOptions(rollout_rs="geometric"))
    assert high == 1.001 and low == pytest.approx(1 / 1.001)
    assert rejection_bounds(CorrectionOptions(rollout_rs="token", rollout_rs_high=4.0)) == (0.25, 4.0)
    assert rejection_bounds(CorrectionOptions(rollout_rs="token", rollout_rs_low=0.1, rollout_rs_high=4.0)) == (0.1, 4.0)
    check_correction(CorrectionOptions(rollout_is="sequence", rollout_rs="token"))  # a valid one passes
    # each value by its option's declaration (choices, range), then the rules between them
    bad = [(dict(rollout_is="tok"), "unknown --rollout-is 'tok': use one of none, token, sequence"),
           (dict(rollout_rs="seq"), "unknown --rollout-rs 'seq'"),
           (dict(rollout_is_cap=0.5), "--rollout-is-cap must be >= 1"),
           (dict(rollout_is_cap=float("inf")), "--rollout-is-cap must be >= 1"),
           (dict(rollout_rs_low=0.5), "--rollout-rs is none"),
           (dict(rollout_rs="token", rollout_rs_low=1.5), "must contain 1"),
           (dict(rollout_rs="token", rollout_rs_high=0.9), "must contain 1"),
           (dict(rollout_rs="token", rollout_rs_low=-1.0), "--rollout-rs-low must be > 0")]
    for kw, message in bad:
        with pytest.raises(ZsearchError, match=re.escape(message)) as err:
            check_correction(CorrectionOptions(**kw))
        assert "\n" not in str(err.value)


def test_diagnostics_hand_values():
    c = corr()
    # k3 per token, ρ − 1 − log ρ: 0.4 -> −0.6 + ln 2.5; 1 -> 0; 3 -> 2 − ln 3; 1.5 -> 0.5 − ln 1.5; 1.2 -> 0.2 − ln 1.2
    k3 = ((-0.6 + math.log(2.5)) + 0.0 + (2 - math.log(3)) + (0.5 - math.log(1.5)) + (0.2 - math.log(1.2))) / 5
    close(c.stats["k3_kl"], k3)  # (0.3163 + 0 + 0.9014 + 0.0945 + 0.0177)/5 = 0.2660
    # χ² token: mean ρ² − 1 = (0.16 + 1 + 9 + 2.25 + 1.44)/5 − 1 = 2.77 − 1 = 1.77
    close(c.stats["chi2_token"], 1.77, tol=1e-5)
    # χ² seq: mean (Π ρ)² − 1 = (1.44 + 3.24)/2 − 1 = 1.34
    close(c.stats["chi2_seq"], 1.34, tol=1e-5)
    close(c.stats["weight_mean"], 1.0)
    close(c.stats["weight_max"], 1.0)
    close(c.stats["truncated_frac"], 0.0)
    close(c.stats["rejected_frac"], 0.0)
    assert set(c.stats) == {"k3_kl", "chi2_token", "chi2_seq", "weight_mean", "weight_max",
                            "truncated_frac", "rejected_frac", "rejected_seq_frac"}
    assert all(v.dim() == 0 and not v.requires_grad for v in c.stats.values())
    # the diagnostics are computed before rejection: the same with token rejection on
    r = corr(rollout_rs="token", rollout_is="token")
    for key in ("k3_kl", "chi2_token", "chi2_seq"):
        assert torch.equal(r.stats[key], c.stats[key])


def test_diagnostics_of_an_all_masked_batch_are_zero():
    m = torch.zeros(2, 3, dtype=torch.bool)
    c = rollout_correction(torch.full((2, 3), NAN), torch.full((2, 3), NAN), m, CorrectionOptions(rollout_is="token"))
    assert all(float(v) == 0.0 for v in c.stats.values())
    assert not c.keep.any() and torch.equal(c.weights, torch.ones(2, 3))


# ------------------------------------------------------------------ the denominator (slime #657)
# logp vs old: ρ_θ = [1.1, 0.9, 1.0], [1.05, 0.95, pad]; all inside the 0.2 clip.
# A = [1, −2]: per-token terms −A·ρ: row 0 [−1.1, −0.9, −1.0], row 1 [2.1, 1.9].
# The rollout disagrees (π_old/π_rollout = 5) only on token (0, 2): token rejection drops it.
THETA_RATIO = torch.tensor([[1.1, 0.9, 1.0], [1.05, 0.95, 1.0]])
DEN_OLD = torch.tensor([[-1.0, -0.7, -2.0], [-0.5, -1.5, NAN]])
DEN_LOGP = torch.where(MASK, DEN_OLD + THETA_RATIO.log(), torch.tensor(7.0))
DEN_ROLLOUT = DEN_OLD - torch.tensor([[0.0, 0.0, math.log(5.0)], [0.0, 0.0, 0.0]])
ADV = torch.tensor([1.0, -2.0])


def test_rejected_token_leaves_the_denominator_grpo():
    c = rollout_correction(DEN_OLD, DEN_ROLLOUT, MASK, CorrectionOptions(rollout_rs="token"))
    assert c.keep.tolist() == [[True, True, False], [True, True, False]]
    cfg = GRPOConfig(beta=0.0)
    loss, _ = grpo_policy_loss(DEN_LOGP, DEN_OLD, ADV, MASK & c.keep, cfg, weights=c.weights)
    # remaining tokens only: row 0 (−1.1 − 0.9)/2 = −1, row 1 (2.1 + 1.9)/2 = 2; (−1 + 2)/2 = 0.5
    close(loss, 0.5)
    # the bug slime #657 fixed: weight 0 but still counted: row 0 (−1.1 − 0.9 + 0)/3 = −2/3; (−2/3 + 2)/2
    counted, _ = grpo_policy_loss(DEN_LOGP, DEN_OLD, ADV, MASK, cfg, weights=c.keep.float())
    close(counted, 2 / 3)
    assert abs(float(loss) - float(counted)) > 0.1


def test_rejected_token_leaves_the_denominator_ppo():
    c = rollout_correction(DEN_OLD, DEN_ROLLOUT, MASK, CorrectionOptions(rollout_rs="token"))
    adv = ADV[:, None].expand(2, 3)
    loss, _ = ppo_policy_loss(DEN_LOGP, DEN_OLD, adv, MASK & c.keep, PPOConfig(), weights=c.weights)
    # token mean over the 4 kept tokens: (−1.1 − 0.9 + 2.1 + 1.9)/4 = 0.5
    close(loss, 0.5)
    counted, _ = ppo_policy_loss(DEN_LOGP, DEN_OLD, adv, MASK, PPOConfig(), weights=c.keep.float())
    close(counted, 0.4)  # the same sum over 5 tokens


def test_a_fully_rejected_sequence_contributes_nothing():
    # π_old/π_rollout = 3 on token (1, 0) only: row 1's product is 3 > 2, row 0's is 1
    rollout = DEN_OLD - torch.tensor([[0.0, 0.0, 0.0], [math.log(3.0), 0.0, 0.0]])
    c = rollout_correction(DEN_OLD, rollout, MASK, CorrectionOptions(rollout_rs="sequence"))
    assert c.kept_rows.tolist() == [True, False]
    lp = DEN_LOGP.clone().requires_grad_(True)
    loss, _ = grpo_policy_loss(lp, DEN_OLD, ADV, MASK & c.keep, GRPOConfig(beta=0.0), weights=c.weights)
    loss.backward()
    # row 0's token mean (−1.1 − 0.9 − 1.0)/3 = −1; row 1 adds 0 but, as every empty row, counts in 1/N
    close(loss, -1.0 / 2)
    assert torch.all(lp.grad[1] == 0)


# ------------------------------------------------------------------ on-policy: nothing changes


def random_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(4, 6, generator=g) > 0.3
    mask[:, 0] = True
    old = -torch.rand(4, 6, generator=g) * 3
    logp = old + 0.1 * torch.randn(4, 6, generator=g)
    ref = old + 0.1 * torch.randn(4, 6, generator=g)
    old = torch.where(mask, old, torch.tensor(NAN))
    logp = torch.where(mask, logp, torch.tensor(float("-inf")))
    return logp, old, ref, mask


LOSSES = [
    (grpo_policy_loss, GRPOConfig(), False),
    (gspo_policy_loss, GSPOConfig(beta=0.01), False),
    (ppo_policy_loss, PPOConfig(), True),
    (hrpo_policy_loss, HRPOConfig(beta=0.01), False),
]


@pytest.mark.parametrize("loss_fn,cfg,token_adv", LOSSES)
@pytest.mark.parametrize("mode", ["token", "sequence"])
def test_on_policy_correction_changes_nothing(loss_fn, cfg, token_adv, mode):
    logp, old, ref, mask = random_batch()
    adv = torch.randn(4, 6) if token_adv else torch.randn(4)
    c = rollout_correction(old, old.clone(), mask, CorrectionOptions(rollout_is=mode, rollout_rs=mode))
    assert torch.equal(c.weights, torch.ones(4, 6)) and torch.equal(c.keep, mask)
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    plain, ps = loss_fn(a, old, adv, mask, cfg, ref_logp=ref)
    fixed, fs = loss_fn(b, old, adv, mask & c.keep, cfg, ref_logp=ref, weights=c.weights)
    plain.backward()
    fixed.backward()
    assert torch.equal(plain, fixed) and torch.equal(a.grad, b.grad)
    assert ps.keys() == fs.keys() and all(torch.equal(ps[k], fs[k]) for k in ps)


# ------------------------------------------------------------------ weights are constants


@pytest.mark.parametrize("loss_fn,cfg,token_adv", LOSSES)
def test_weights_scale_each_tokens_gradient_and_are_detached(loss_fn, cfg, token_adv):
    logp, old, _, mask = random_batch(1)
    cfg = type(cfg)(beta=0.0)
    adv = torch.randn(4, 6) if token_adv else torch.randn(4)
    w = (0.5 + 1.5 * torch.rand(4, 6)).requires_grad_(True)
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    loss_fn(a, old, adv, mask, cfg)[0].backward()
    loss, _ = loss_fn(b, old, adv, mask, cfg, weights=w)
    loss.backward()
    assert w.grad is None  # the weights never enter the graph
    # ∂L_w/∂logp_t = w_t · ∂L/∂logp_t on policy tokens, 0 elsewhere
    torch.testing.assert_close(b.grad, torch.where(mask, w.detach() * a.grad, torch.zeros(4, 6)), rtol=1e-6, atol=1e-9)
    assert torch.all(b.grad[~mask] == 0)


def test_weights_do_not_touch_the_kl_term():
    logp, old, ref, mask = random_batch(2)
    cfg = GRPOConfig(beta=0.1)
    loss, _ = grpo_policy_loss(logp, old, torch.randn(4), mask, cfg, ref_logp=ref, weights=torch.zeros(4, 6))
    # zero weights leave only β · (per-sequence token mean of the k3 D_t)
    close(loss, 0.1 * seq_mean_token_mean(k3_kl(logp, ref, mask), mask))


def test_weights_garbage_off_the_mask_is_ignored():
    logp, old, _, mask = random_batch(3)
    w = torch.where(mask, torch.ones(4, 6), torch.tensor(NAN))
    lp = logp.clone().requires_grad_(True)
    loss, _ = grpo_policy_loss(lp, old, torch.randn(4), mask, GRPOConfig(beta=0.0), weights=w)
    loss.backward()
    assert torch.isfinite(loss) and torch.all(torch.isfinite(lp.grad))
    with pytest.raises(ValueError):
        grpo_policy_loss(logp, old, torch.randn(4), mask, GRPOConfig(), weights=torch.ones(4, 5))
