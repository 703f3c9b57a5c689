"""GRPO (Search-R1 eq. 3; docs/methods.md §4.3).

Advantage, over the G responses to one prompt:

    A_i = (r_i − mean_g r)/(std_g r + δ),                      δ = 1e-6, G = 5

Loss, with ρ_t = exp(logp_θ − logp_old) and the k3 D_t of :func:`common.k3_kl`:

    L = −(1/G) Σ_i (1/Σ_t I_{i,t}) Σ_t I_{i,t} [min(ρ_t A_i, clip(ρ_t, 1−ε, 1+ε) A_i) − β·D_t]

over a batch of several prompts that is the mean over all N sequences of each sequence's
masked token mean. ε = 0.2, β = 0.001.

std convention: **unbiased** (n−1), as ``torch.std`` in verl's GRPO advantage that Search-R1
ran. A prompt group of size 1 has no baseline: mean := 0 and std := 1 (verl's convention), so
A = r/(1+δ), or exactly r with ``scale_std=False``; this is why "GRPO with G = 1 reduces to
REINFORCE" (Search-R1 App. H; docs/methods.md §4.3). ``scale_std=False`` gives Dr. GRPO's
A_i = r_i − mean_g r.

The group id must be unique per prompt (a string such as the prompt's uid), never an index
that restarts per data source.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from zsearch_cli.algos.common import (
    GroupIds,
    add_kl_penalty,
    aggregate,
    apply_weights,
    check_loss_agg,
    clipped_surrogate,
    detach_stats,
    expand_advantages,
    group_normalize,
    policy_stats,
    token_log_ratio,
)


@dataclass(frozen=True)
class GRPOConfig:
    """GRPO hyper-parameters; defaults from Search-R1 App. B.2 (docs/methods.md §6)."""

    clip_eps_low: float = 0.2
    """ε on the low side: ρ is clipped at 1 − ε_low (Search-R1: 0.2)."""
    clip_eps_high: float = 0.2
    """ε on the high side: ρ is clipped at 1 + ε_high (Search-R1: 0.2; DAPO's clip-higher uses 0.28)."""
    beta: float = 0.001
    """β, weight of the k3 KL to the frozen reference inside the loss (Search-R1: 0.001); 0 = no reference."""
    delta: float = 1e-6
    """δ in A = (r − mean)/(std + δ)."""
    scale_std: bool = True
    """Divide by (std_g + δ); False gives Dr. GRPO's A = r − mean_g."""
    loss_agg: str = "seq-mean-token-mean"
    """How the per-token terms are reduced to the loss (docs/methods.md §4.8): each sequence's
    token mean, then the mean over sequences (Search-R1 eq. 3)."""
    loss_agg_norm: float | None = None
    """L, the constant of ``loss_agg="seq-mean-token-sum-norm"`` (Dr. GRPO); None = the batch's width T."""

    def __post_init__(self) -> None:
        check_loss_agg(self.loss_agg, self.loss_agg_norm)


def grpo_advantages(rewards: Tensor, group_ids: GroupIds, cfg: GRPOConfig) -> Tensor:
    """A_i = (r_i − mean_g r)/(std_g r + δ), std unbiased; singleton group: mean 0, std 1.

    rewards [N], group_ids N keys (unique per prompt) -> advantages [N] float32.
    """
    return group_normalize(rewards, group_ids, cfg.delta, cfg.scale_std, singleton="no_baseline")


def grpo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: GRPOConfig,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    *,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """L = −(1/G) Σ_i (1/Σ_t I_{i,t}) Σ_t I_{i,t} [min(ρ_t A_i, clip(ρ_t, 1−ε_low, 1+ε_high) A_i) − β·D_t].

    logp, old_logp, ref_logp, entropy, mask: [B, T]; advantages: [B] (or [B, T]).
    ``ref_logp`` is required when β > 0; with β = 0 it only feeds the ``kl_ref`` stat.
    Also used, unchanged, by REINFORCE and by the DSPO token-level ablation.

    ``weights`` [B, T] (docs/methods.md §4.8): detached rollout-correction IS weights w_t that
    multiply each token's clipped term, not the KL term: ℓ_t -> w_t·ℓ_t; None = all 1. Pass
    ``mask & keep`` as ``mask`` so rejected tokens leave the denominator. The reduction is
    ``cfg.loss_agg`` (default: the per-sequence token mean above).
    """
    log_ratio = token_log_ratio(logp, old_logp, mask)  # [B, T]
    adv = expand_advantages(advantages, log_ratio)  # [B, T]
    pg, clipped = clipped_surrogate(log_ratio.exp(), adv, cfg.clip_eps_low, cfg.clip_eps_high)  # [B, T]
    pg = apply_weights(pg, weights, mask)  # [B, T]
    pg_loss = aggregate(pg, mask, cfg.loss_agg, cfg.loss_agg_norm)
    loss = add_kl_penalty(pg_loss, logp, ref_logp, mask, cfg.beta, cfg.loss_agg, cfg.loss_agg_norm)
    stats = policy_stats(log_ratio, clipped, mask, logp=logp, ref_logp=ref_logp, entropy=entropy)
    stats.update(loss=loss, pg_loss=pg_loss)
    return loss, detach_stats(stats)
