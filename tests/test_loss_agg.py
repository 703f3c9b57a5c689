"""Loss aggregation as its own choice (docs/methods.md §4.8): the three modes on hand tensors,
each config's paper default reproducing the loss exactly as it was written before the choice
existed, validation, and the micro-batch weights that make gradient accumulation exact."""

from __future__ import annotations

import pytest
import torch

from zsearch_cli.algos import ALGOS, LOSS_AGG_MODES, aggregate
from zsearch_cli.algos.dspo import DSPOConfig, DSPOTokenConfig
from zsearch_cli.algos.grpo import GRPOConfig, grpo_policy_loss
from zsearch_cli.algos.gspo import GSPOConfig, gspo_policy_loss
from zsearch_cli.algos.hrpo import HRPOConfig, hrpo_policy_loss
from zsearch_cli.algos.ppo import PPOConfig, ppo_policy_loss
from zsearch_cli.algos.reinforce import ReinforceConfig

NAN = float("nan")


def close(x, y, tol=1e-6):
    x, y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.float32)
    torch.testing.assert_close(x, y, atol=tol, rtol=0)


# x = [[1, 2, 3], [4, ·, ·]]: sequence 0 has 3 policy tokens, sequence 1 has 1 (NaN garbage off the mask)
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, NAN, NAN]])
M = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)


def test_three_modes_by_hand():
    close(aggregate(X, M, "token-mean"), 2.5)  # (1 + 2 + 3 + 4)/4
    close(aggregate(X, M, "seq-mean-token-mean"), 3.0)  # (6/3 + 4/1)/2 = (2 + 4)/2
    close(aggregate(X, M, "seq-mean-token-sum-norm"), 10 / 6)  # L = T = 3: (6/3 + 4/3)/2
    close(aggregate(X, M, "seq-mean-token-sum-norm", norm=4.0), 1.25)  # (6/4 + 4/4)/2
    assert set(LOSS_AGG_MODES) == {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"}
    with pytest.raises(ValueError):
        aggregate(X, M, "token-sum")


def test_a_row_without_policy_tokens_counts_in_the_sequence_means():
    # today's convention, kept: an empty row adds 0 but counts in 1/N
    x = torch.cat([X, torch.full((1, 3), NAN)])
    m = torch.cat([M, torch.zeros(1, 3, dtype=torch.bool)])
    close(aggregate(x, m, "token-mean"), 2.5)  # no token, no change
    close(aggregate(x, m, "seq-mean-token-mean"), 2.0)  # (2 + 4 + 0)/3
    close(aggregate(x, m, "seq-mean-token-sum-norm"), 10 / 9)  # (2 + 4/3 + 0)/3
    assert float(aggregate(x[2:], m[2:], "token-mean")) == 0.0


def test_grpo_three_modes_three_numbers():
    # ratio 1 (logp = old), A = [1, −2]: terms −A = [−1, −1, −1], [2, ·, ·]
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, NAN, NAN]])
    logp = torch.where(M, old, torch.tensor(7.0))
    adv = torch.tensor([1.0, -2.0])
    got = {mode: float(grpo_policy_loss(logp, old, adv, M, GRPOConfig(beta=0.0, loss_agg=mode))[0])
           for mode in LOSS_AGG_MODES}
    assert got["seq-mean-token-mean"] == pytest.approx(0.5)  # (−1 + 2)/2
    assert got["token-mean"] == pytest.approx(-0.25)  # (−3 + 2)/4
    assert got["seq-mean-token-sum-norm"] == pytest.approx(-1 / 6)  # (−3/3 + 2/3)/2
    sum_norm_l1 = grpo_policy_loss(logp, old, adv, M, GRPOConfig(beta=0.0, loss_agg="seq-mean-token-sum-norm",
                                                                 loss_agg_norm=1.0))[0]
    close(sum_norm_l1, -0.5)  # (−3 + 2)/2


def test_the_kl_term_follows_the_aggregation():
    # logp = old (ratio 1, A = 0): the loss is β·agg(D_t), D = k3 to the reference
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, NAN, NAN]])
    logp = torch.where(M, old, torch.tensor(7.0))
    d = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.0, 0.0]])
    # choose ref so that D_t = e^u − u − 1 with u = ref − logp; solve numerically by Newton on u > 0
    u = torch.full_like(d, 0.5)
    for _ in range(50):
        u = u - (u.exp() - u - 1 - d) / (u.exp() - 1)
    ref = torch.where(M, logp + u, torch.tensor(NAN))
    for mode, want in [("token-mean", 1.0 / 4), ("seq-mean-token-mean", (0.6 / 3 + 0.4) / 2),
                       ("seq-mean-token-sum-norm", (0.6 / 3 + 0.4 / 3) / 2)]:
        loss = grpo_policy_loss(logp, old, torch.zeros(2), M, GRPOConfig(beta=1.0, loss_agg=mode), ref_logp=ref)[0]
        close(loss, want, tol=1e-5)


# ------------------------------------------------------------------ defaults reproduce the old loss


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(5, 7, generator=g) > 0.3
    mask[:, 0] = True
    mask[4] = False  # one row with no policy token
    old = -torch.rand(5, 7, generator=g) * 3
    logp = old + 0.3 * torch.randn(5, 7, generator=g)
    ref = old + 0.2 * torch.randn(5, 7, generator=g)
    return logp, old, ref, mask


def old_seq_mean_token_mean(x, m):
    """The formula as written before loss_agg existed: masked_mean(x, m, dim=-1).mean()."""
    x = torch.where(m, x, torch.zeros((), dtype=x.dtype))
    return (x.sum(-1) / m.sum(-1).clamp_min(1)).mean()


def old_token_mean(x, m):
    x = torch.where(m, x, torch.zeros((), dtype=x.dtype))
    return x.sum() / m.sum().clamp_min(1)


def old_k3(logp, ref, m):
    diff = torch.where(m, ref.float() - logp.float(), torch.zeros(()))
    return torch.exp(diff) - diff - 1.0


def old_surrogate(ratio, adv, lo, hi):
    return torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - lo, 1.0 + hi))


def test_default_configs_name_the_papers_aggregation():
    want = {"reinforce": "seq-mean-token-mean", "ppo": "token-mean", "grpo": "seq-mean-token-mean",
            "gspo": "seq-mean-token-mean", "dspo": "seq-mean-token-mean", "dspo-nofilter": "seq-mean-token-mean",
            "dspo-token": "seq-mean-token-mean", "hrpo": "seq-mean-token-mean"}
    for name, spec in ALGOS.items():
        cfg = spec.config_cls()
        assert (cfg.loss_agg, cfg.loss_agg_norm) == (want[name], None), name


@pytest.mark.parametrize("cfg", [GRPOConfig(), ReinforceConfig(), DSPOTokenConfig()])
def test_grpo_family_default_is_the_old_formula(cfg):
    logp, old, ref, m = batch()
    adv = torch.randn(5)
    loss, _ = grpo_policy_loss(logp, old, adv, m, cfg, ref_logp=ref)
    log_ratio = torch.where(m, logp - old, torch.zeros(()))
    pg = old_surrogate(log_ratio.exp(), adv[:, None].expand(5, 7), cfg.clip_eps_low, cfg.clip_eps_high)
    want = old_seq_mean_token_mean(pg, m)
    if cfg.beta > 0:
        want = want + cfg.beta * old_seq_mean_token_mean(old_k3(logp, ref, m), m)
    assert torch.equal(loss, want)


@pytest.mark.parametrize("cfg", [GSPOConfig(), GSPOConfig(beta=0.01), DSPOConfig()])
def test_gspo_default_is_the_old_formula(cfg):
    logp, old, ref, m = batch(1)
    adv = torch.randn(5)
    loss, _ = gspo_policy_loss(logp, old, adv, m, cfg, ref_logp=ref)
    log_ratio = torch.where(m, logp - old, torch.zeros(()))
    log_s = torch.where(m, log_ratio, torch.zeros(())).sum(-1) / m.sum(-1).clamp_min(1)  # [B]
    log_s_tok = torch.where(m, log_s[:, None] + (logp - logp), torch.zeros(()))
    pg = old_surrogate(log_s_tok.exp(), adv[:, None].expand(5, 7), cfg.clip_eps_low, cfg.clip_eps_high)
    want = old_seq_mean_token_mean(pg, m)
    if cfg.beta > 0:
        want = want + cfg.beta * old_seq_mean_token_mean(old_k3(logp, ref, m), m)
    assert torch.equal(loss, want)


def test_ppo_default_is_the_old_token_mean():
    logp, old, _, m = batch(2)
    adv = torch.randn(5, 7)
    loss, _ = ppo_policy_loss(logp, old, adv, m, PPOConfig())
    log_ratio = torch.where(m, logp - old, torch.zeros(()))
    assert torch.equal(loss, old_token_mean(old_surrogate(log_ratio.exp(), adv, 0.2, 0.2), m))


def test_hrpo_default_is_the_old_formula_and_sum_norm_one_is_dr_zero_eq2():
    logp, old, _, m = batch(3)
    adv = torch.randn(5)
    loss, _ = hrpo_policy_loss(logp, old, adv, m, HRPOConfig())
    assert torch.equal(loss, old_seq_mean_token_mean(-adv[:, None] * logp, m))
    # Dr. Zero eq. 2: −(1/N) Σ_i A_i Σ_t log π_θ(y_t), the summed sequence log-prob
    summed, _ = hrpo_policy_loss(logp, old, adv, m, HRPOConfig(loss_agg="seq-mean-token-sum-norm", loss_agg_norm=1))
    close(summed, -(adv * torch.where(m, logp, torch.zeros(())).sum(-1)).mean(), tol=1e-5)


# ------------------------------------------------------------------ validation


def test_config_validation():
    for cls in (GRPOConfig, ReinforceConfig, PPOConfig, HRPOConfig, DSPOTokenConfig, GSPOConfig, DSPOConfig):
        for kw in (dict(loss_agg="token-sum"), dict(loss_agg_norm=0.0), dict(loss_agg_norm=-2),
                   dict(loss_agg_norm=True), dict(loss_agg="seq-mean-token-mean", loss_agg_norm=512)):
            with pytest.raises(ValueError) as err:
                cls(**kw)
            assert "\n" not in str(err.value)
    for cls in (GRPOConfig, PPOConfig, HRPOConfig):
        for mode in LOSS_AGG_MODES:
            cls(loss_agg=mode)
        cls(loss_agg="seq-mean-token-sum-norm", loss_agg_norm=512)
    # a sequence-level ratio is already length-normalised: no token-sum-norm for GSPO/DSPO
    for cls in (GSPOConfig, DSPOConfig):
        cls(loss_agg="token-mean")
        with pytest.raises(ValueError, match="sequence-level"):
            cls(loss_agg="seq-mean-token-sum-norm")


# ------------------------------------------------------------------ gradient accumulation


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_weights_reproduce_the_mini_batch(mode):
    # token-mean: weight a micro-batch by its share of (kept) policy tokens; the sequence modes
    # by its share of rows (every row, empty ones included), with the same L in every micro-batch
    logp, old, _, m = batch(4)
    x = (logp - old) ** 2
    full = aggregate(x, m, mode)
    parts = [slice(0, 2), slice(2, 5)]
    total = torch.zeros(())
    for p in parts:
        share = m[p].sum() / m.sum() if mode == "token-mean" else torch.tensor((p.stop - p.start) / 5)
        total = total + share * aggregate(x[p], m[p], mode)
    close(total, full)
