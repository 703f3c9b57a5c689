"""zsearch_cli.algos (docs/methods.md §4, §6).

Tier 1: every advantage, loss, KL, GAE and filter against hand-computed values, with the
arithmetic in the comments. Tier 2: equivalences between objectives and the ``ALGOS`` table.
Masked (retrieved/padded) positions hold NaN / −inf / 7.0 garbage on purpose: results must
ignore them and their gradient must be exactly 0.
"""

from __future__ import annotations

import math

import pytest
import torch

from zsearch_cli.algos import (
    ALGOS,
    AlgoSpec,
    entropy_from_logits,
    filter_mixed_groups,
    first_groups,
    need_more,
)
from zsearch_cli.algos.common import k3_kl, masked_whiten
from zsearch_cli.algos.dspo import DSPOConfig
from zsearch_cli.algos.grpo import GRPOConfig, grpo_advantages, grpo_policy_loss
from zsearch_cli.algos.gspo import GSPOConfig, gspo_policy_loss, sequence_log_ratio
from zsearch_cli.algos.hrpo import HRPOConfig, hrpo_advantages, hrpo_policy_loss
from zsearch_cli.algos.ppo import (
    PPOConfig,
    gae,
    ppo_advantages,
    ppo_policy_loss,
    ppo_value_loss,
    token_rewards,
)
from zsearch_cli.algos.reinforce import ReinforceConfig, reinforce_advantages


def close(x, y, tol=1e-6):
    """assert_close in float32 with an absolute tolerance."""
    x, y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    torch.testing.assert_close(x, y, atol=tol, rtol=0)


# =============================================================================
# Advantages and the DSPO filter
# =============================================================================

D = 1e-6  # δ

# Three prompt groups interleaved, plus a singleton:
#   a: [0, 1, 2]  mean 1, unbiased var ((−1)² + 0² + 1²)/(3−1) = 1, std 1
#   b: [3, 3]     mean 3, std 0  -> A = 0/(0 + δ) = 0 (δ keeps it finite)
#   c: [0.7]      singleton: no baseline (mean := 0, std := 1)
IDS = ["a", "b", "a", "c", "b", "a"]
R = torch.tensor([0.0, 3.0, 1.0, 0.7, 3.0, 2.0])


def test_grpo_zscore_with_delta():
    adv = grpo_advantages(R, IDS, GRPOConfig())
    # a: (0−1)/(1+δ), (1−1)/(1+δ), (2−1)/(1+δ); b: 0; c: 0.7/(1+δ)
    close(adv, [-1 / (1 + D), 0.0, 0.0, 0.7 / (1 + D), 0.0, 1 / (1 + D)])


def test_grpo_delta_is_added_to_std_not_var():
    # δ = 1 makes its placement visible: a -> (r − 1)/(1 + 1) = ±0.5
    adv = grpo_advantages(R, IDS, GRPOConfig(delta=1.0))
    close(adv, [-0.5, 0.0, 0.0, 0.35, 0.0, 0.5])


def test_grpo_std_is_unbiased():
    # [0, 1]: mean 0.5, unbiased var (0.25 + 0.25)/(2−1) = 0.5, std = sqrt(0.5) = 0.7071068
    # (the biased std would be 0.5 and give ±1)
    adv = grpo_advantages(torch.tensor([0.0, 1.0]), ["p", "p"], GRPOConfig())
    s = math.sqrt(0.5)
    close(adv, [-0.5 / (s + D), 0.5 / (s + D)])


def test_grpo_no_std_scaling_is_dr_grpo():
    # A = r − mean_g: a -> −1, 0, 1; b -> 0, 0; c (singleton, mean := 0) -> 0.7
    adv = grpo_advantages(R, IDS, GRPOConfig(scale_std=False))
    close(adv, [-1.0, 0.0, 0.0, 0.7, 0.0, 1.0])


def test_group_ids_may_be_a_tensor():
    ids = torch.tensor([0, 1, 0, 2, 1, 0])
    close(grpo_advantages(R, ids, GRPOConfig()), grpo_advantages(R, IDS, GRPOConfig()))


def test_reinforce_no_baseline_is_the_reward():
    close(reinforce_advantages(R, IDS, ReinforceConfig()), R)


def test_rloo():
    # a: 0 − (1+2)/2 = −1.5; 1 − (0+2)/2 = 0; 2 − (0+1)/2 = 1.5
    # b: 3 − 3 = 0 (twice); c: singleton, no leave-one-out baseline -> 0.7
    adv = reinforce_advantages(R, IDS, ReinforceConfig(baseline="rloo"))
    close(adv, [-1.5, 0.0, 0.0, 0.7, 0.0, 1.5])


def test_hrpo_two_hop_groups_and_a_singleton():
    hops = [1, 1, 2, 2, 2, 3]
    r = torch.tensor([0.2, 0.6, 1.0, 0.0, 0.5, 0.9])
    adv = hrpo_advantages(r, hops, HRPOConfig())
    # h=1: [0.2, 0.6] mean 0.4, unbiased var (0.04 + 0.04)/1 = 0.08, std 0.2828427
    s1 = math.sqrt(0.08)
    # h=2: [1.0, 0.0, 0.5] mean 0.5, unbiased var (0.25 + 0.25 + 0)/2 = 0.25, std 0.5
    # h=3: singleton -> 0
    close(adv, [-0.2 / (s1 + D), 0.2 / (s1 + D), 0.5 / (0.5 + D), -0.5 / (0.5 + D), 0.0, 0.0])


def test_hrpo_groups_by_hop_not_by_position():
    # same values as above, shuffled: each sample keeps its advantage
    hops = [2, 1, 3, 2, 1, 2]
    r = torch.tensor([1.0, 0.2, 0.9, 0.0, 0.6, 0.5])
    s1 = math.sqrt(0.08)
    close(hrpo_advantages(r, hops, HRPOConfig()),
          [0.5 / (0.5 + D), -0.2 / (s1 + D), 0.0, -0.5 / (0.5 + D), 0.2 / (s1 + D), 0.0])


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError):
        grpo_advantages(R, IDS[:-1], GRPOConfig())


def test_dspo_filter_keeps_only_mixed_groups():
    ids = ["p1"] * 3 + ["p2"] * 3 + ["p3"] * 2 + ["p4"] + ["p5"] * 2
    # p1 mixed (kept); p2 all 1 and p3 all 0 (dropped); p4 singleton (dropped); p5 F1-like mixed (kept)
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.25, 0.5])
    keep = filter_mixed_groups(r, ids)
    assert keep.tolist() == [True] * 3 + [False] * 6 + [True] * 2


def test_need_more():
    assert need_more(3, 4, 1, 10)  # 3 < B = 4 and 1 < 10 batches
    assert not need_more(4, 4, 1, 10)  # B reached
    assert not need_more(3, 4, 10, 10)  # budget spent: train on what was kept
    assert need_more(3, 4, 100, 0)  # max_gen_batches <= 0: unlimited
    assert need_more(["g1", "g2"], 4, 1, 10)  # a collection of kept group ids works too


def test_first_groups():
    assert first_groups(["a", "a", "b", "b", "c"], 2).tolist() == [True, True, True, True, False]


def test_every_spec_advantage_runs():
    for spec in ALGOS.values():
        if spec.advantages is not None:
            assert spec.advantages(R, IDS, spec.config_cls()).shape == R.shape


# =============================================================================
# Policy losses, KL, entropy, stats
# =============================================================================

MASK = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 0]], dtype=torch.float32)
ON = MASK.bool()
ADV = torch.tensor([2.0, -1.0])
OLD = torch.tensor([[-1.0, -2.0, -0.5, -1.5], [-0.7, -1.2, -0.3, -2.0]])
GRPO_NOKL = GRPOConfig(beta=0.0)


def make_logp(row_ratios: tuple[float, float]) -> torch.Tensor:
    """logp = old_logp + ln ρ_row on policy tokens, garbage elsewhere; a leaf with grad."""
    lr = torch.tensor([[math.log(row_ratios[0])], [math.log(row_ratios[1])]])
    logp = (OLD + lr).clone()
    logp[0, 2] = float("nan")
    logp[1, 0] = float("-inf")
    logp[1, 3] = float("nan")
    return logp.requires_grad_(True)


def old_with_garbage() -> torch.Tensor:
    old = OLD.clone()
    old[0, 2] = float("-inf")
    return old


def grad_of(loss_fn, logp):
    loss, stats = loss_fn(logp)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.all(logp.grad[~ON] == 0), "retrieved/padded tokens must get exactly zero gradient"
    return loss, logp.grad, stats


def expected_grad(row0: float, row1: float) -> torch.Tensor:
    return torch.tensor([[row0, row0, 0.0, row0], [0.0, row1, row1, 0.0]])


# ----------------------------------------------------------------------------- k3 KL


def test_k3_kl_hand_values():
    logp = torch.zeros(1, 3)
    ref = torch.tensor([[math.log(2), -math.log(2), 0.0]])
    d = k3_kl(logp, ref, torch.ones(1, 3))
    # ref − logp = ln2: 2 − ln2 − 1; = −ln2: 1/2 + ln2 − 1; equal: 0
    close(d, [[2 - math.log(2) - 1, 0.5 + math.log(2) - 1, 0.0]])


def test_k3_kl_masked_positions_are_zero():
    d = k3_kl(torch.zeros(1, 2), torch.tensor([[float("inf"), math.log(2)]]), torch.tensor([[0.0, 1.0]]))
    close(d, [[0.0, 1 - math.log(2)]])


# ----------------------------------------------------------------------------- GRPO token loss


def test_grpo_ratio_one():
    # ρ = 1: each token's term is −A_i; L = −(1/2)(2 + (−1)) = −0.5
    # ∂L/∂logp_t = −A_i/(N |y_i|): row 0 −2/(2·3) = −1/3; row 1 +1/(2·2) = 0.25
    logp = make_logp((1.0, 1.0))
    old = old_with_garbage()
    loss, grad, stats = grad_of(lambda lp: grpo_policy_loss(lp, old, ADV, MASK, GRPO_NOKL), logp)
    close(loss, -0.5)
    close(grad, expected_grad(-1 / 3, 0.25))
    close(stats["clipfrac"], 0.0)
    close(stats["approx_kl"], 0.0)
    close(stats["ratio_mean"], 1.0)
    close(stats["ratio_max"], 1.0)


def test_grpo_inside_clip():
    # ρ_0 = 1.1 (A=+2), ρ_1 = 0.9 (A=−1), ε = 0.2: no clip.
    # row 0: −2·1.1 = −2.2; row 1: +0.9; L = (−2.2 + 0.9)/2 = −0.65
    # ∂/∂logp of −Aρ is −Aρ: row 0 −2.2/(2·3) = −0.3666667; row 1 0.9/(2·2) = 0.225
    logp = make_logp((1.1, 0.9))
    loss, grad, stats = grad_of(lambda lp: grpo_policy_loss(lp, OLD, ADV, MASK, GRPO_NOKL), logp)
    close(loss, -0.65)
    close(grad, expected_grad(-2.2 / 6, 0.9 / 4))
    close(stats["clipfrac"], 0.0)
    # approx_kl = mean over the 5 policy tokens of (ρ−1) − ln ρ:
    # 3·(0.1 − ln1.1) + 2·(−0.1 − ln0.9) = 3·0.0046898 + 2·0.0053605, /5 = 0.0049581
    close(stats["approx_kl"], (3 * (0.1 - math.log(1.1)) + 2 * (-0.1 - math.log(0.9))) / 5)
    close(stats["ratio_mean"], (3 * 1.1 + 2 * 0.9) / 5)  # 1.02
    close(stats["ratio_max"], 1.1)


def test_grpo_outside_clip_active_side():
    # A=+2, ρ=1.5 -> clip(ρ) = 1.2 active: −2.4; A=−1, ρ=0.5 -> min(−0.5, −0.8) = −0.8: +0.8
    # L = (−2.4 + 0.8)/2 = −0.8, zero gradient everywhere, every token clipped
    logp = make_logp((1.5, 0.5))
    loss, grad, stats = grad_of(lambda lp: grpo_policy_loss(lp, OLD, ADV, MASK, GRPO_NOKL), logp)
    close(loss, -0.8)
    close(grad, torch.zeros(2, 4))
    close(stats["clipfrac"], 1.0)


def test_grpo_outside_clip_inactive_side():
    # A=+2, ρ=0.5: min(1.0, 0.8·2) = 1.0 unclipped -> −1.0
    # A=−1, ρ=1.5: min(−1.5, −1.2) = −1.5 unclipped -> +1.5
    # L = (−1.0 + 1.5)/2 = 0.25; grads −Aρ/(N|y|): row 0 −1/(2·3); row 1 1.5/(2·2)
    logp = make_logp((0.5, 1.5))
    loss, grad, stats = grad_of(lambda lp: grpo_policy_loss(lp, OLD, ADV, MASK, GRPO_NOKL), logp)
    close(loss, 0.25)
    close(grad, expected_grad(-1 / 6, 0.375))
    close(stats["clipfrac"], 0.0)


def test_grpo_with_k3_penalty():
    # ρ = 1 and logp_ref − logp_θ = ln2 on every token: each token's term is −A_i + β(1 − ln2),
    # so L = −0.5 + β(1 − ln2). ∂D_t/∂logp_θ = 1 − e^{ln2} = −1: each grad shifts by −β/(N|y_i|).
    cfg = GRPOConfig(beta=0.001)
    logp = make_logp((1.0, 1.0))
    ref = OLD + math.log(2)
    loss, grad, stats = grad_of(lambda lp: grpo_policy_loss(lp, OLD, ADV, MASK, cfg, ref_logp=ref), logp)
    close(loss, -0.5 + 0.001 * (1 - math.log(2)))
    close(grad, expected_grad(-1 / 3 - 0.001 / 6, 0.25 - 0.001 / 4))
    close(stats["kl_ref"], 1 - math.log(2))


@pytest.mark.parametrize(
    ("loss_fn", "cfg"),
    [
        (grpo_policy_loss, GRPOConfig(beta=0.1)),
        (gspo_policy_loss, GSPOConfig(beta=0.1)),
        (hrpo_policy_loss, HRPOConfig(beta=0.1)),
    ],
)
def test_kl_term_is_a_per_sequence_token_mean_in_every_loss(loss_fn, cfg):
    # A = 0 and ρ = 1, so only β·(1/N) Σ_i (1/|y_i|) Σ_t D_t is left. logp_ref − logp_θ = ln2
    # on row 0's first token and both of row 1's (D = 1 − ln2, ∂D/∂logp_θ = −1), 0 elsewhere
    # (D = 0, gradient 0). Row means: (1 − ln2)/3 and (1 − ln2); N = 2, so
    # L = 0.1·(1 − ln2)·(1/3 + 1)/2 = 0.1·(1 − ln2)·2/3 (a mean over all 5 tokens would give
    # 0.1·(1 − ln2)·3/5). Gradient −β/(N|y_i|): −0.1/6 on row 0's first token, −0.1/4 on row 1's.
    shift = torch.tensor([[math.log(2), 0.0, 0.0, 0.0], [0.0, math.log(2), math.log(2), 0.0]])
    ref = OLD + shift
    logp = make_logp((1.0, 1.0))
    loss, grad, stats = grad_of(lambda lp: loss_fn(lp, OLD, torch.zeros(2), MASK, cfg, ref_logp=ref), logp)
    close(loss, 0.1 * (1 - math.log(2)) * 2 / 3)
    close(grad, torch.tensor([[-0.1 / 6, 0.0, 0.0, 0.0], [0.0, -0.1 / 4, -0.1 / 4, 0.0]]))
    close(stats["kl_ref"], (1 - math.log(2)) * 3 / 5)  # the logged stat is the mean over policy tokens
    with pytest.raises(ValueError, match="needs ref_logp"):
        loss_fn(make_logp((1.0, 1.0)), OLD, torch.zeros(2), MASK, cfg)


def test_grpo_needs_ref_when_beta_positive():
    with pytest.raises(ValueError):
        grpo_policy_loss(make_logp((1.0, 1.0)), OLD, ADV, MASK, GRPOConfig(beta=0.001))


def test_entropy_stat_and_entropy_from_logits():
    # uniform logits over V = 4: H = ln 4 everywhere
    h = entropy_from_logits(torch.zeros(2, 4, 4))
    close(h, torch.full((2, 4), math.log(4)))
    ent = h.clone()
    ent[0, 2] = 100.0  # a retrieved token's entropy must not count
    _, stats = grpo_policy_loss(make_logp((1.0, 1.0)), OLD, ADV, MASK, GRPO_NOKL, entropy=ent)
    close(stats["entropy"], math.log(4))


# ----------------------------------------------------------------------------- GSPO sequence loss

# token log-ratios on the policy tokens: row 0 [0.1, −0.05, ·, 0.02] (mean 0.07/3),
# row 1 [·, 0.3, −0.1, ·] (mean 0.1)
LOG_RATIO = torch.tensor([[0.1, -0.05, 0.0, 0.02], [0.0, 0.3, -0.1, 0.0]])
S0, S1 = math.exp(0.07 / 3), math.exp(0.1)  # 1.0236076, 1.1051709


def gspo_logp() -> torch.Tensor:
    logp = (OLD + LOG_RATIO).clone()
    logp[0, 2] = float("nan")
    logp[1, 0] = float("-inf")
    return logp.requires_grad_(True)


def test_sequence_ratio_is_exp_of_mean_masked_log_ratio():
    log_s = sequence_log_ratio(gspo_logp(), old_with_garbage(), MASK)
    close(log_s.exp(), [S0, S1])


def test_gspo_gradient_closed_form_unclipped():
    # Wide clip (ε = 0.2) so nothing clips: L = −(1/2)(s_0·2 + s_1·(−1)), and on every policy
    # token of y_i, ∂L/∂logp_t = −(1/N)·s_i·A_i/|y_i|: row 0 −s_0·2/(2·3), row 1 s_1/(2·2)
    cfg = GSPOConfig(clip_eps_low=0.2, clip_eps_high=0.2)
    old = old_with_garbage()
    loss, grad, stats = grad_of(lambda lp: gspo_policy_loss(lp, old, ADV, MASK, cfg), gspo_logp())
    close(loss, -(2 * S0 - S1) / 2)
    close(grad, expected_grad(-S0 * 2 / (2 * 3), S1 / (2 * 2)))
    close(stats["clipfrac"], 0.0)
    close(stats["ratio_mean"], (S0 + S1) / 2)
    close(stats["ratio_max"], S1)


def test_gspo_default_clip():
    # ε_l = 3e-4, ε_h = 4e-4. Row 0: A = +2, s_0 = 1.0236 > 1.0004 -> clipped branch active:
    #   −2·1.0004, zero gradient. Row 1: A = −1, s_1 = 1.1052: min(−1.1052, −1.0004) = −1.1052
    #   is the unclipped branch -> +1.1052 with gradient −(1/N)·s_1·A_1/|y_1| = s_1/4.
    # L = (−2.0008 + 1.1051709)/2 = −0.4478146; clipfrac = 1 of 2 sequences
    loss, grad, stats = grad_of(lambda lp: gspo_policy_loss(lp, OLD, ADV, MASK, GSPOConfig()), gspo_logp())
    close(loss, (-2 * 1.0004 + S1) / 2)
    close(grad, expected_grad(0.0, S1 / 4))
    close(stats["clipfrac"], 0.5)


def test_gspo_ratio_one_value_and_grad():
    # s_i = 1 -> L = −(1/2)(2 − 1) = −0.5, grads −A_i/(N|y_i|), same as GRPO at ρ = 1
    logp = make_logp((1.0, 1.0))
    loss, grad, _ = grad_of(lambda lp: gspo_policy_loss(lp, OLD, ADV, MASK, GSPOConfig()), logp)
    close(loss, -0.5)
    close(grad, expected_grad(-1 / 3, 0.25))


# ----------------------------------------------------------------------------- HRPO


def test_hrpo_loss_and_gradient():
    # row 0 policy logp [−1, −2, ·, −3] mean −2; row 1 [·, −0.5, −1.5, ·] mean −1
    # A = [0.5, −2]
    # L = −(1/2)(0.5·(−2) + (−2)·(−1)) = −(1/2)(−1 + 2) = −0.5
    # ∂L/∂logp_t = −A_i/(N|y_i|): row 0 −0.5/6 = −1/12; row 1 2/4 = 0.5
    nan, ninf = float("nan"), float("-inf")
    logp = torch.tensor([[-1.0, -2.0, nan, -3.0], [ninf, -0.5, -1.5, nan]], requires_grad=True)
    adv = torch.tensor([0.5, -2.0])
    loss, grad, stats = grad_of(lambda lp: hrpo_policy_loss(lp, lp.detach(), adv, MASK, HRPOConfig()), logp)
    close(loss, -0.5)
    close(grad, expected_grad(-1 / 12, 0.5))
    close(stats["clipfrac"], 0.0)
    close(stats["ratio_max"], 1.0)


def test_hrpo_has_no_ratio_or_clip():
    # far off-policy (ρ = e^3): HRPO's loss ignores old_logp entirely
    logp = make_logp((1.0, 1.0))
    l_on, _ = hrpo_policy_loss(logp, OLD, ADV, MASK, HRPOConfig())
    l_off, stats = hrpo_policy_loss(logp, OLD - 3.0, ADV, MASK, HRPOConfig())
    close(l_on, l_off)
    close(stats["ratio_max"], math.exp(3.0), tol=1e-4)


# =============================================================================
# PPO: token rewards, masked GAE, losses
# =============================================================================

GARBAGE = 7.0  # garbage at masked positions: must be ignored


def test_token_rewards():
    # logp − ref = 0.5 on every token, β = 0.1 -> −0.05 per policy token; outcome on the last one.
    # row 0 mask [1,1,0,1,0]: last policy token t=3 -> [−0.05, −0.05, 0, −0.05 + 1, 0]
    # row 1 mask [0,1,1,0,0]: last t=2              -> [0, −0.05, −0.05 + 0.5, 0, 0]
    # row 2 has no policy token: nothing (its outcome 3 is dropped)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    logp = torch.full((3, 5), -1.0)
    ref = torch.full((3, 5), -1.5)
    r = token_rewards(torch.tensor([1.0, 0.5, 3.0]), logp, ref, mask, beta=0.1)
    close(r, [[-0.05, -0.05, 0, 0.95, 0], [0, -0.05, 0.45, 0, 0], [0, 0, 0, 0, 0]])


GAE_MASK = torch.tensor([[1, 1, 0, 1, 0]])
GAE_REWARDS = torch.tensor([[0.0, 0.0, GARBAGE, 1.0, GARBAGE]])
GAE_VALUES = torch.tensor([[0.5, 0.2, GARBAGE, 0.6, GARBAGE]])


def test_gae_gamma_lambda_one_skips_retrieved_tokens():
    # Policy subsequence t = 0, 1, 3: r = [0, 0, 1], V = [0.5, 0.2, 0.6]; after t=3 the next V is 0.
    # t=3: δ = 1 + 0 − 0.6 = 0.4                      A = 0.4
    # t=1: δ = 0 + V_3 − V_1 = 0.6 − 0.2 = 0.4        A = 0.4 + 0.4 = 0.8   (V_3, not the retrieved t=2)
    # t=0: δ = 0 + 0.2 − 0.5 = −0.3                   A = −0.3 + 0.8 = 0.5
    # (γ = λ = 1: A_t = Σ future r − V_t.) Returns A + V = [1, 1, ·, 1]
    adv, ret = gae(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=1.0, lam=1.0)
    close(adv, [[0.5, 0.8, 0.0, 0.4, 0.0]])
    close(ret, [[1.0, 1.0, 0.0, 1.0, 0.0]])


def test_gae_discounted():
    # γ = 0.9, λ = 0.8, γλ = 0.72
    # t=3: δ = 1 + 0.9·0 − 0.6 = 0.4                  A = 0.4
    # t=1: δ = 0 + 0.9·0.6 − 0.2 = 0.34               A = 0.34 + 0.72·0.4 = 0.628
    # t=0: δ = 0 + 0.9·0.2 − 0.5 = −0.32              A = −0.32 + 0.72·0.628 = 0.13216
    # returns = A + V = [0.63216, 0.828, ·, 1.0]
    adv, ret = gae(GAE_REWARDS, GAE_VALUES, GAE_MASK, gamma=0.9, lam=0.8)
    close(adv, [[0.13216, 0.628, 0.0, 0.4, 0.0]])
    close(ret, [[0.63216, 0.828, 0.0, 1.0, 0.0]])


def test_ppo_advantages_pipeline():
    cfg = PPOConfig(whiten_advantages=False, beta=0.0)
    adv, ret = ppo_advantages(torch.tensor([1.0]), torch.zeros(1, 5), None, GAE_VALUES, GAE_MASK, cfg)
    close(adv, [[0.5, 0.8, 0.0, 0.4, 0.0]])  # the outcome 1 lands on t=3, as in the γ=λ=1 case
    close(ret, [[1.0, 1.0, 0.0, 1.0, 0.0]])


def test_masked_whiten():
    # policy values 1, 2, 3, −1, 4: mean 1.8, unbiased var 14.8/4 = 3.7
    x = torch.tensor([[1.0, 2.0, GARBAGE, 3.0], [GARBAGE, -1.0, 4.0, GARBAGE]])
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 0]])
    w = masked_whiten(x, mask)
    std = 3.7 ** 0.5
    close(w, [[-0.8 / std, 0.2 / std, 0, 1.2 / std], [0, -2.8 / std, 2.2 / std, 0]], tol=1e-5)


def test_ppo_policy_loss_is_a_batch_token_mean():
    # ρ = 1; token advantages on the 5 policy tokens 1, 2, 3, −1, 4:
    # L = −(1 + 2 + 3 − 1 + 4)/5 = −1.8 (a per-sequence mean would give −1.75)
    # ∂L/∂logp_t = −A_t/5
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 0]])
    adv = torch.tensor([[1.0, 2.0, 99.0, 3.0], [99.0, -1.0, 4.0, 99.0]])
    logp = torch.full((2, 4), -1.0, requires_grad=True)
    loss, stats = ppo_policy_loss(logp, logp.detach(), adv, mask, PPOConfig())
    loss.backward()
    close(loss, -1.8)
    close(logp.grad, [[-0.2, -0.4, 0, -0.6], [0, 0.2, -0.8, 0]])
    assert {"clipfrac", "approx_kl", "ratio_mean", "ratio_max"} <= stats.keys()


@pytest.mark.parametrize(
    "ratios, want_loss, want_grad, want_clipfrac",
    [
        # Same batch as the GRPO tests (A = [+2, −1] on every token of a row), but one token
        # mean over the 5 policy tokens of the batch instead of per-sequence means.
        # inside the clip, ρ = (1.1, 0.9): (3·(−2.2) + 2·0.9)/5 = −0.96; grads −Aρ/5
        ((1.1, 0.9), -0.96, (-2.2 / 5, 0.9 / 5), 0.0),
        # active side, ρ = (1.5, 0.5): (3·(−2·1.2) + 2·0.8)/5 = −1.12; no gradient
        ((1.5, 0.5), -1.12, (0.0, 0.0), 1.0),
        # inactive side, ρ = (0.5, 1.5): (3·(−1.0) + 2·1.5)/5 = 0; grads −Aρ/5
        ((0.5, 1.5), 0.0, (-1.0 / 5, 1.5 / 5), 0.0),
    ],
)
def test_ppo_policy_loss_clip(ratios, want_loss, want_grad, want_clipfrac):
    loss, grad, stats = grad_of(lambda lp: ppo_policy_loss(lp, OLD, ADV, MASK, PPOConfig()), make_logp(ratios))
    close(loss, want_loss)
    close(grad, expected_grad(*want_grad))
    close(stats["clipfrac"], want_clipfrac)


def test_ppo_value_loss_clipping():
    # c = 0.5, V_old = 0 on the three policy tokens (the fourth is masked garbage):
    # t0: V=0.8, R=2: (0.8−2)² = 1.44; clipped V = 0.5: (0.5−2)² = 2.25 -> 2.25 (clip active, grad 0)
    # t1: V=0.3, R=1: inside the range, both 0.49 -> 0.49
    # t2: V=−2, R=−1: (−1)² = 1; clipped V = −0.5: 0.25 -> 1
    # L_V = ½·(2.25 + 0.49 + 1)/3 = 0.6233333; vf_clipfrac = 1/3
    # ∂/∂V: t0 0; t1 ½·2·(0.3−1)/3 = −0.2333333; t2 ½·2·(−2+1)/3 = −0.3333333
    v = torch.tensor([[0.8, 0.3, -2.0, GARBAGE]], requires_grad=True)
    loss, stats = ppo_value_loss(v, torch.zeros(1, 4), torch.tensor([[2.0, 1.0, -1.0, GARBAGE]]),
                                 torch.tensor([[1, 1, 1, 0]]), PPOConfig())
    loss.backward()
    close(loss, 0.5 * 3.74 / 3)
    close(stats["vf_clipfrac"], 1 / 3)
    close(v.grad, [[0.0, -0.7 / 3, -1 / 3, 0.0]])
    close(stats["vf_loss"], loss.detach())  # vf_coef = 1 by default
    loss2, _ = ppo_value_loss(v, torch.zeros(1, 4), torch.tensor([[2.0, 1.0, -1.0, GARBAGE]]),
                              torch.tensor([[1, 1, 1, 0]]), PPOConfig(vf_coef=2.0))
    close(loss2, 2 * 0.5 * 3.74 / 3)


# =============================================================================
# Tier 2: equivalences and the ALGOS table
# =============================================================================

def batch(seed: int, b: int = 6, t: int = 7):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(b, t, generator=g) * 3
    logp = (old + 0.3 * torch.randn(b, t, generator=g)).requires_grad_(True)
    ref = old + 0.2 * torch.randn(b, t, generator=g)
    mask = (torch.rand(b, t, generator=g) < 0.6).float()
    mask[:, 0] = 1.0
    return logp, old, ref, mask


def loss_and_grad(fn, logp, *args, **kw):
    lp = logp.detach().clone().requires_grad_(True)
    loss, _ = fn(lp, *args, **kw)
    loss.backward()
    return loss.detach(), lp.grad


def test_grpo_with_group_size_one_and_no_std_scaling_is_reinforce():
    # With G = 1 every prompt group is a singleton: it has no baseline (mean := 0, verl's
    # convention, the one behind Search-R1 App. H "GRPO with group size 1 reduces to REINFORCE").
    # Without std scaling A = r − 0 = r, i.e. REINFORCE's advantage, and the two losses are the
    # same function with the same ε = 0.2 and β = 0.001, so losses and gradients agree exactly.
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25, 0.0, 1.0])
    ids = [f"prompt-{i}" for i in range(6)]
    a_grpo = grpo_advantages(rewards, ids, GRPOConfig(scale_std=False))
    a_reinforce = reinforce_advantages(rewards, ids, ReinforceConfig())
    close(a_grpo, rewards)
    close(a_reinforce, rewards)
    # With std scaling the singleton is divided by (1 + δ): r/(1 + 1e-6), REINFORCE up to δ.
    close(grpo_advantages(rewards, ids, GRPOConfig()), rewards / (1 + 1e-6))

    logp, old, ref, mask = batch(0)
    grpo_cfg, reinforce_cfg = GRPOConfig(scale_std=False), ReinforceConfig()
    lg, gg = loss_and_grad(grpo_policy_loss, logp, old, a_grpo, mask, grpo_cfg, ref_logp=ref)
    lr, gr = loss_and_grad(ALGOS["reinforce"].policy_loss, logp, old, a_reinforce, mask, reinforce_cfg, ref_logp=ref)
    close(lg, lr, tol=0)
    close(gg, gr, tol=0)


def test_gspo_equals_grpo_with_one_policy_token_per_sequence():
    # |y_i| = 1 -> s_i = ρ_t of that token, and each sequence mean is that one token:
    # −(1/G) Σ_i min(s_i A_i, clip(s_i) A_i) = GRPO's loss with the same ε (and the same β·D_t).
    logp, old, ref, _ = batch(1)
    mask = torch.zeros_like(old)
    mask[torch.arange(6), torch.tensor([0, 3, 6, 2, 5, 1])] = 1.0
    adv = torch.tensor([1.0, -1.0, 0.5, -0.3, 2.0, -2.0])
    for eps, beta in [(0.2, 0.0), (0.2, 0.001), (3e-4, 0.0)]:
        kw = dict(clip_eps_low=eps, clip_eps_high=eps, beta=beta)
        lg, gg = loss_and_grad(grpo_policy_loss, logp, old, adv, mask, GRPOConfig(**kw), ref_logp=ref)
        ls, gs = loss_and_grad(gspo_policy_loss, logp, old, adv, mask, GSPOConfig(**kw), ref_logp=ref)
        close(lg, ls)
        close(gg, gs)


def test_dspo_nofilter_is_gspo_and_dspo_loss_is_gspo_loss():
    nofilter, gspo, dspo = ALGOS["dspo-nofilter"], ALGOS["gspo"], ALGOS["dspo"]
    assert nofilter.policy_loss is gspo.policy_loss and nofilter.advantages is gspo.advantages
    assert dspo.policy_loss is gspo_policy_loss and dspo.advantages is grpo_advantages
    assert nofilter.config_cls is gspo.config_cls and not nofilter.filter_groups and nofilter.sequence_level
    logp, old, _, mask = batch(2)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.3, 2.0, -2.0])
    l1, g1 = loss_and_grad(gspo_policy_loss, logp, old, adv, mask, GSPOConfig())
    l2, g2 = loss_and_grad(dspo.policy_loss, logp, old, adv, mask, DSPOConfig())
    close(l1, l2, tol=0)
    close(g1, g2, tol=0)


def test_dspo_token_is_grpo_loss_with_the_filter():
    spec = ALGOS["dspo-token"]
    assert spec.policy_loss is grpo_policy_loss and spec.filter_groups and not spec.sequence_level
    assert ALGOS["dspo"].filter_groups and ALGOS["dspo"].sequence_level
    assert spec.config_cls().beta == 0.0 and spec.config_cls().clip_eps_low == 0.2


def test_table_and_paper_defaults():
    assert set(ALGOS) == {"reinforce", "ppo", "grpo", "gspo", "dspo", "dspo-nofilter", "dspo-token", "hrpo"}
    for name, spec in ALGOS.items():
        assert isinstance(spec, AlgoSpec) and spec.name == name
        cfg = spec.config_cls()
        assert hasattr(cfg, "beta") and not hasattr(cfg, "lr") and not hasattr(cfg, "group_size")
        assert spec.group_size == (1 if name in ("ppo", "hrpo") else 5)
        assert (spec.advantages is None) == spec.needs_critic == (spec.value_loss is not None)
    g = GRPOConfig()
    assert (g.clip_eps_low, g.clip_eps_high, g.beta, g.delta) == (0.2, 0.2, 0.001, 1e-6)
    r = ReinforceConfig()
    assert (r.baseline, r.clip_eps_low, r.beta) == ("none", 0.2, 0.001)
    p = ALGOS["ppo"].config_cls()
    assert (p.gamma, p.lam, p.cliprange_value) == (1.0, 1.0, 0.5)
    assert not hasattr(p, "critic_lr") and not hasattr(p, "lr")  # optimizer settings are the trainer's
    assert (p.beta, p.clip_eps_low, p.clip_eps_high, p.whiten_advantages) == (0.001, 0.2, 0.2, False)
    s = GSPOConfig()
    assert (s.clip_eps_low, s.clip_eps_high) == (3e-4, 4e-4)
    d = DSPOConfig()
    assert d.reward == "subem" and d.target_groups > 0 and d.max_gen_batches > 0
    h = ALGOS["hrpo"]
    assert h.on_policy and h.group_by == "hop"
    assert h.config_cls().beta == 0.0 and h.group_size == 1
    assert {n for n, s in ALGOS.items() if s.needs_reference()} == {"reinforce", "ppo", "grpo"}
    assert not ALGOS["grpo"].needs_reference(GRPOConfig(beta=0.0))
    assert ALGOS["grpo"].group_size_min == 2 and ALGOS["reinforce"].group_size_min == 1


def test_every_policy_loss_runs_and_masks():
    # Every entry: finite loss, the documented stats, zero gradient off the policy tokens.
    logp, old, ref, mask = batch(3)
    for spec in ALGOS.values():
        cfg = spec.config_cls()
        adv = torch.randn(6, 7) if spec.needs_critic else torch.randn(6)
        lp = logp.detach().clone().requires_grad_(True)
        loss, stats = spec.policy_loss(lp, old, adv, mask, cfg, ref_logp=ref, entropy=torch.rand(6, 7))
        loss.backward()
        assert torch.isfinite(loss)
        assert torch.all(lp.grad[mask == 0] == 0)
        assert {"loss", "clipfrac", "approx_kl", "ratio_mean", "ratio_max"} <= stats.keys()
        assert {"kl_ref", "entropy"} <= stats.keys()
        assert all(v.dim() == 0 and not v.requires_grad for v in stats.values())
