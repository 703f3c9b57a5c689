"""GSPO: the sequence-level ratio used by DSPO (DSPO eq. 6; docs/methods.md §4.5).

    s_i = exp( (1/|y_i|) Σ_t I_{i,t} (logp_θ(y_t) − logp_old(y_t)) ),      |y_i| = Σ_t I_{i,t}

    L = −(1/G) Σ_i min(s_i A_i, clip(s_i, 1−ε_l, 1+ε_h) A_i),             ε_l = 3e-4, ε_h = 4e-4

with A_i as GRPO (:func:`grpo.grpo_advantages`). The per-token gradient uses the stop-gradient
form (sg = ``.detach()``):

    log s_{i,t} = sg[log s_i] + logp_θ(y_t) − sg[logp_θ(y_t)]

so s_{i,t} has the value s_i and ∇ s_{i,t} = s_i ∇logp_θ(y_t). The loss averages the
per-token surrogate over each sequence's policy tokens, then over sequences, which equals L
and gives ∂L/∂logp_θ(y_t) = −(1/N)·s_i·A_i/|y_i| on each policy token when not clipped (DSPO
eq. 8), and 0 when the clip is active. DSPO eq. 11 has no KL term (β = 0 default); with
β > 0 the GRPO k3 term −β·D_t is added inside the same token mean (docs/methods.md §4.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from zsearch_cli.algos.common import (
    add_kl_penalty,
    aggregate,
    apply_weights,
    bool_mask,
    check_loss_agg,
    clipped_surrogate,
    detach_stats,
    expand_advantages,
    masked_mean,
    policy_stats,
    token_log_ratio,
)

GSPO_LOSS_AGG = ("seq-mean-token-mean", "token-mean")
"""Aggregations a sequence-level loss accepts (docs/methods.md §4.8): ``seq-mean-token-sum-norm``
would weight each sequence's term by |y_i|/L on top of a ratio that is already length-normalised."""


@dataclass(frozen=True)
class GSPOConfig:
    """GSPO hyper-parameters. Clip ranges from verl/TRL's GSPO recipes; the DSPO
    paper states no lr or G, so those (TrainConfig's lr, AlgoSpec.group_size) follow Search-R1 (docs/methods.md §4.5, §6)."""

    clip_eps_low: float = 3e-4
    """ε_l: the sequence ratio s_i is clipped at 1 − ε_l (verl/TRL: 3e-4)."""
    clip_eps_high: float = 4e-4
    """ε_h: the sequence ratio s_i is clipped at 1 + ε_h (verl/TRL: 4e-4)."""
    beta: float = 0.0
    """β of an optional k3 KL term to the reference; 0 as DSPO eq. 11 (docs/methods.md §4.5)."""
    delta: float = 1e-6
    """δ in the GRPO advantage A = (r − mean)/(std + δ) (DSPO eq. 10)."""
    scale_std: bool = True
    """Divide the advantage by (std_g + δ) (DSPO eq. 10); False gives r − mean_g."""
    loss_agg: str = "seq-mean-token-mean"
    """How the per-token terms are reduced to the loss (docs/methods.md §4.8): each sequence's token
    mean (= its sequence term), then the mean over sequences (DSPO eq. 11). ``token-mean`` is
    allowed (length-weighted sequences); ``seq-mean-token-sum-norm`` is refused."""
    loss_agg_norm: float | None = None
    """L, the constant of ``loss_agg="seq-mean-token-sum-norm"`` (Dr. GRPO); None = the batch's width T."""

    def __post_init__(self) -> None:
        check_loss_agg(self.loss_agg, self.loss_agg_norm, GSPO_LOSS_AGG, "a sequence-level loss")


def sequence_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """log s_i = (1/|y_i|) Σ_t I_{i,t} (logp_θ − logp_old); 0 for a row with no policy token.

    [B, T] -> [B]. s_i = exp(log s_i) is the geometric mean of the token ratios (DSPO eq. 6).
    """
    return masked_mean(token_log_ratio(logp, old_logp, mask), mask, dim=-1)


def gspo_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: GSPOConfig,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    *,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """L = −(1/G) Σ_i min(s_i A_i, clip(s_i, 1−ε_l, 1+ε_h) A_i), via log s_{i,t} = sg[log s_i] + logp_t − sg[logp_t].

    logp, old_logp, ref_logp, entropy, mask: [B, T]; advantages: [B].
    Stats: ``clipfrac``, ``ratio_mean``, ``ratio_max`` are over **sequences** (of s_i, for
    rows with at least one policy token), since s_i is what is clipped; ``approx_kl``,
    ``kl_ref``, ``entropy`` are over policy tokens as everywhere; ``token_ratio_mean`` and
    ``token_ratio_max`` are the token ρ_t.

    ``weights`` [B, T] (docs/methods.md §4.8): detached rollout-correction IS weights, applied
    as in verl's GSPO: each token's term ℓ_{i,t} (value ℓ_i, gradient through logp_t) becomes
    w_{i,t}·ℓ_{i,t} before ``cfg.loss_agg``. Under the default per-sequence token mean the
    value is ℓ_i·mean_t(w_{i,t}), i.e. the sequence's weight is the mean of its token weights
    (exactly w_i with sequence-level IS weights), and each token's gradient carries its own
    w_{i,t}. Not the KL term. Pass ``mask & keep``: s_i is then over the kept tokens.
    """
    m = bool_mask(mask)
    log_s = sequence_log_ratio(logp, old_logp, m)  # [B]
    logp32 = logp.float()
    log_s_tok = log_s.detach()[:, None] + (logp32 - logp32.detach())  # [B, T], value log s_i, grad ∇logp_t
    log_s_tok = torch.where(m, log_s_tok, torch.zeros_like(log_s_tok))
    adv = expand_advantages(advantages, log_s_tok)  # [B, T]
    pg, clipped = clipped_surrogate(log_s_tok.exp(), adv, cfg.clip_eps_low, cfg.clip_eps_high)  # [B, T]
    pg = apply_weights(pg, weights, m)  # [B, T]
    pg_loss = aggregate(pg, m, cfg.loss_agg, cfg.loss_agg_norm)
    loss = add_kl_penalty(pg_loss, logp, ref_logp, m, cfg.beta, cfg.loss_agg, cfg.loss_agg_norm)

    with torch.no_grad():
        log_ratio = token_log_ratio(logp, old_logp, m)  # [B, T]
        tok = policy_stats(log_ratio, clipped, m, logp=logp, ref_logp=ref_logp, entropy=entropy)
        has = m.any(-1, keepdim=True)  # [B, 1]: rows that count as sequences
        seq_clipped = clipped.any(-1, keepdim=True)  # [B, 1]: the flag is the same on every token of y_i
        seq = policy_stats(log_s[:, None], seq_clipped, has)
    stats = {
        "clipfrac": seq["clipfrac"],
        "approx_kl": tok["approx_kl"],
        "ratio_mean": seq["ratio_mean"],
        "ratio_max": seq["ratio_max"],
        "token_ratio_mean": tok["ratio_mean"],
        "token_ratio_max": tok["ratio_max"],
        "loss": loss,
        "pg_loss": pg_loss,
    }
    stats.update({k: tok[k] for k in ("kl_ref", "entropy") if k in tok})
    return loss, detach_stats(stats)
