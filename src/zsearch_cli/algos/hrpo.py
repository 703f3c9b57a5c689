"""HRPO, hop-grouped relative policy optimization, for the Dr. Zero proposer (Dr. Zero eq. 2–3;
docs/methods.md §4.7).

One question per prompt; rewards are standardized within the batch's group I_h of questions
with the same hop count h:

    A_i = (r_i − mean_{j∈I_h} r_j)/(sqrt(var_{j∈I_h} r_j) + δ)

    L = −(1/N) Σ_h Σ_{i∈I_h} A_i · (1/Σ_t I_{i,t}) Σ_t I_{i,t} log π_θ(y_t)

Strictly on-policy (one update per rollout batch), no ratio, no clipping, β = 0. A singleton
hop group gets A = 0. var convention: **unbiased** (n−1), the same group statistics as GRPO
(verl's ``torch.std``), so a hop group of two or more is always defined.

Note: the paper's eq. 2 weights log π_θ(x_i, y_i | R), the *summed* sequence log-prob;
zsearch uses the per-token mean over the policy tokens (docs/methods.md §4.7).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from zsearch_cli.algos.common import (
    GroupIds,
    add_kl_penalty,
    aggregate,
    apply_weights,
    bool_mask,
    check_loss_agg,
    detach_stats,
    expand_advantages,
    group_normalize,
    masked_mean,
    policy_stats,
    token_log_ratio,
)


@dataclass(frozen=True)
class HRPOConfig:
    """HRPO hyper-parameters; defaults from Dr. Zero Table 5 (docs/methods.md §5.4, §6)."""

    beta: float = 0.0
    """β of an optional k3 KL term to the reference (Dr. Zero: 0)."""
    delta: float = 1e-6
    """δ in A = (r − mean_h)/(sqrt(var_h) + δ)."""
    loss_agg: str = "seq-mean-token-mean"
    """How the per-token terms are reduced to the loss (docs/methods.md §4.8): each question's
    token mean of log π_θ, then the mean. ``seq-mean-token-sum-norm`` with ``loss_agg_norm=1``
    gives Dr. Zero eq. 2's summed sequence log-prob."""
    loss_agg_norm: float | None = None
    """L, the constant of ``loss_agg="seq-mean-token-sum-norm"`` (Dr. GRPO); None = the batch's width T."""

    def __post_init__(self) -> None:
        check_loss_agg(self.loss_agg, self.loss_agg_norm)


def hrpo_advantages(rewards: Tensor, group_ids: GroupIds, cfg: HRPOConfig) -> Tensor:
    """A_i = (r_i − mean_h r)/(sqrt(var_h r) + δ) over the samples with the same hop count h
    (var unbiased); a singleton hop group gets A = 0.

    rewards [N], group_ids = the N hop counts -> advantages [N] float32.
    """
    return group_normalize(rewards, group_ids, cfg.delta, scale_std=True, singleton="zero")


def hrpo_policy_loss(
    logp: Tensor,
    old_logp: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    cfg: HRPOConfig,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    *,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """L = −(1/N) Σ_i A_i · (1/Σ_t I_{i,t}) Σ_t I_{i,t} log π_θ(y_t)  (+ β·k3 when β > 0).

    logp, mask: [B, T]; advantages: [B]. ``old_logp`` is not used by the loss (strictly
    on-policy); when given, the ratio stats report how far from on-policy the batch is
    (clipfrac is always 0).

    ``weights`` [B, T] (docs/methods.md §4.8): detached rollout-correction IS weights that
    multiply −A_i·log π_θ(y_t) (not the KL term); None = all 1. Reduction: ``cfg.loss_agg``.
    """
    m = bool_mask(mask)
    adv = expand_advantages(advantages, logp)  # [B, T]
    pg = apply_weights(-adv * logp.float(), weights, m)  # [B, T]
    pg_loss = aggregate(pg, m, cfg.loss_agg, cfg.loss_agg_norm)
    loss = add_kl_penalty(pg_loss, logp, ref_logp, m, cfg.beta, cfg.loss_agg, cfg.loss_agg_norm)
    with torch.no_grad():
        old = logp.detach() if old_logp is None else old_logp
        log_ratio = token_log_ratio(logp, old, m)  # [B, T]
        stats = policy_stats(log_ratio, torch.zeros_like(m), m, logp=logp, ref_logp=ref_logp, entropy=entropy)
        stats["seq_logp_mean"] = masked_mean(logp.float(), m, dim=-1).mean()
    stats.update(loss=loss, pg_loss=pg_loss)
    return loss, detach_stats(stats)
