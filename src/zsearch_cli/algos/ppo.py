"""PPO with a learned critic and GAE (Search-R1 eq. 2; docs/methods.md §4.2).

Rewards per token (KL in the reward, β = 0.001, KL_t = logp_θ − logp_ref on the rollout
policy's log-probs):

    r_t = −β·KL_t on policy tokens,  plus the outcome reward on the last policy token

GAE over the **policy-token subsequence only** (retrieved tokens are skipped, not steps):

    δ_t = r_t + γ V_{t+1} − V_t,    A_t = Σ_l (γλ)^l δ_{t+l},     γ = λ = 1

where t, t+1, … index consecutive policy tokens: V_{t+1} is the value at the next mask-1
token, and 0 after the last one. Returns R_t = A_t + V_t.

Policy loss, normalized over the policy tokens of the whole batch, ε = 0.2:

    L = −(1/Σ_t I_t) Σ_t I_t · min(ρ_t A_t, clip(ρ_t, 1−ε, 1+ε) A_t)

Value loss, clipped (0.5) and masked (verl's form, with the usual ½):

    L_V = ½ (1/Σ_t I_t) Σ_t I_t · max((V_t − R_t)², (V_old,t + clip(V_t − V_old,t, −c, c) − R_t)²)

The critic model is the trainer's; this file is the maths only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from zsearch_cli.algos.common import (
    aggregate,
    apply_weights,
    bool_mask,
    check_loss_agg,
    clipped_surrogate,
    detach_stats,
    expand_advantages,
    masked_mean,
    masked_whiten,
    policy_stats,
    token_log_ratio,
)


@dataclass(frozen=True)
class PPOConfig:
    """PPO hyper-parameters; defaults from Search-R1 App. B.2 (docs/methods.md §4.2, §6)."""

    clip_eps_low: float = 0.2
    """ε on the low side of the token-ratio clip (Search-R1: 0.2)."""
    clip_eps_high: float = 0.2
    """ε on the high side of the token-ratio clip (Search-R1: 0.2)."""
    beta: float = 0.001
    """β of the per-token KL penalty in the reward, r_t = −β(logp − logp_ref) (Search-R1: 0.001)."""
    gamma: float = 1.0
    """γ, discount of GAE (Search-R1: 1)."""
    lam: float = 1.0
    """λ of GAE (Search-R1: 1)."""
    cliprange_value: float = 0.5
    """c, how far V may move from V_old before the value loss is clipped (Search-R1/verl: 0.5)."""
    vf_coef: float = 1.0
    """Multiplier of the value loss. The critic is a separate model with its own optimizer in
    Search-R1/verl, so 1 (the ½ of the squared error is inside the value loss)."""
    whiten_advantages: bool = False
    """Whiten the GAE advantages over the batch's policy tokens. Off: Search-R1 eq. 2 uses
    the raw GAE sum (docs/methods.md §4.2). True reproduces verl, which Search-R1 ran."""
    loss_agg: str = "token-mean"
    """How the per-token terms are reduced to the loss (docs/methods.md §4.8): one mean over the
    policy tokens of the whole batch (Search-R1 eq. 2). The value loss is always a token mean."""
    loss_agg_norm: float | None = None
    """L, the constant of ``loss_agg="seq-mean-token-sum-norm"`` (Dr. GRPO); None = the batch's width T."""

    def __post_init__(self) -> None:
        check_loss_agg(self.loss_agg, self.loss_agg_norm)


@torch.no_grad()
def token_rewards(outcome: Tensor, logp: Tensor, ref_logp: Tensor | None, mask: Tensor, beta: float) -> Tensor:
    """r_t = −β·(logp_t − logp_ref,t) on policy tokens, + outcome_i on row i's last policy token.

    outcome [B], logp/ref_logp/mask [B, T] -> [B, T] (0 off the policy tokens). ``logp`` is the
    rollout policy's (π_old). A row with no policy token gets nothing (its outcome is dropped).
    """
    m = bool_mask(mask)
    r = torch.zeros(m.shape, dtype=torch.float32, device=m.device)
    if beta > 0:
        if ref_logp is None:
            raise ValueError(f"beta={beta} > 0 needs ref_logp")
        kl = torch.where(m, logp.float() - ref_logp.float(), torch.zeros_like(r))  # [B, T]
        r = -beta * kl
    positions = torch.arange(m.shape[1], device=m.device).expand(m.shape)  # [B, T]
    last = torch.where(m, positions, torch.full_like(positions, -1)).amax(-1)  # [B], -1 if none
    rows = torch.nonzero(last >= 0).squeeze(-1)
    r[rows, last[rows]] += outcome.detach().float().reshape(-1)[rows]
    return r


@torch.no_grad()
def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """GAE over each row's policy-token subsequence. -> (advantages [B, T], returns [B, T]).

    Walking backwards, mask-0 positions are skipped (they carry neither reward nor value and
    do not advance the discount); V_{t+1} is the value at the next policy token and 0 after
    the last. Outputs are 0 off the policy tokens. R_t = A_t + V_t.
    """
    m = bool_mask(mask)
    r = token_rewards.float()
    v = values.detach().float()
    adv = torch.zeros_like(r)
    next_value = torch.zeros(r.shape[0], device=r.device)  # [B]
    next_adv = torch.zeros(r.shape[0], device=r.device)  # [B]
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lam * next_adv
        on = m[:, t]
        adv[:, t] = torch.where(on, a, torch.zeros_like(a))
        next_value = torch.where(on, v[:, t], next_value)
        next_adv = torch.where(on, a, next_adv)
    returns = torch.where(m, adv + v, torch.zeros_like(adv))
    return adv, returns


@torch.no_grad()
def ppo_advantages(
    outcome: Tensor, old_logp: Tensor, ref_logp: Tensor | None, values: Tensor, mask: Tensor, cfg: PPOConfig
) -> tuple[Tensor, Tensor]:
    """token_rewards → gae → (optional) masked whitening. -> (advantages [B, T], returns [B, T]).

    outcome [B]; old_logp, ref_logp, values (the critic's V on the rollout), mask: [B, T].
    Returns are computed from the un-whitened advantages.
    """
    r = token_rewards(outcome, old_logp, ref_logp, mask, cfg.beta)
    adv, returns = gae(r, values, mask, cfg.gamma, cfg.lam)
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, mask)
    return adv, returns


def ppo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: PPOConfig,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    *,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """L = −(1/Σ_t I_t) Σ_t I_t · min(ρ_t A_t, clip(ρ_t, 1−ε, 1+ε) A_t), over the whole batch.

    logp, old_logp, advantages, mask, ref_logp, entropy: [B, T]. The KL is in the reward
    (:func:`token_rewards`), so ``ref_logp`` only feeds the ``kl_ref`` stat here.

    ``weights`` [B, T] (docs/methods.md §4.8): detached rollout-correction IS weights that
    multiply each token's clipped term; None = all 1. The reduction is ``cfg.loss_agg``
    (default ``token-mean``, the formula above); pass ``mask & keep`` to drop rejected tokens.
    """
    m = bool_mask(mask)
    log_ratio = token_log_ratio(logp, old_logp, m)  # [B, T]
    adv = expand_advantages(advantages, log_ratio)  # [B, T]
    pg, clipped = clipped_surrogate(log_ratio.exp(), adv, cfg.clip_eps_low, cfg.clip_eps_high)  # [B, T]
    pg = apply_weights(pg, weights, m)  # [B, T]
    loss = aggregate(pg, m, cfg.loss_agg, cfg.loss_agg_norm)
    stats = policy_stats(log_ratio, clipped, m, logp=logp, ref_logp=ref_logp, entropy=entropy)
    stats.update(loss=loss, pg_loss=loss)
    return loss, detach_stats(stats)


def ppo_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, cfg: PPOConfig
) -> tuple[Tensor, dict[str, Tensor]]:
    """vf_coef · ½ (1/Σ_t I_t) Σ_t I_t max((V − R)², (V_old + clip(V − V_old, −c, c) − R)²).

    values (the critic's current output, with grad), old_values (the critic on the rollout),
    returns, mask: [B, T]. Stats: ``vf_loss`` (before vf_coef), ``vf_clipfrac`` (share of
    policy tokens where the clipped term is the larger one), ``vpred_mean``.
    """
    m = bool_mask(mask)
    v = torch.where(m, values.float(), torch.zeros_like(values, dtype=torch.float32))
    v_old = torch.where(m, old_values.detach().float(), torch.zeros_like(v))
    ret = torch.where(m, returns.detach().float(), torch.zeros_like(v))
    c = cfg.cliprange_value
    v_clipped = v_old + torch.clamp(v - v_old, -c, c)
    unclipped = (v - ret) ** 2
    clipped = (v_clipped - ret) ** 2
    vf_loss = 0.5 * masked_mean(torch.maximum(unclipped, clipped), m)
    loss = cfg.vf_coef * vf_loss
    with torch.no_grad():
        stats = {
            "vf_loss": vf_loss,
            "vf_clipfrac": masked_mean((clipped > unclipped).float(), m),
            "vpred_mean": masked_mean(v, m),
        }
    return loss, detach_stats(stats)
