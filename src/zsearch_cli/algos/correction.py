"""Rollout correction: importance weights and rejection between the sampler and the trainer
(docs/methods.md §4.8). Pure tensor maths, no models, no I/O.

The sampler (vLLM, HF generate) and the training forward give different probabilities to
the same tokens. With π_rollout the sampler's distribution and π_old the trainer's
recomputed one, per policy token

    log ρ_t = logp_old,t − logp_rollout,t,        ρ_t = π_old(y_t | ·) / π_rollout(y_t | ·)

Importance sampling, truncated (TIS; verl ``rollout_is``, slime ``--use-tis``), weight C:

    token:     w_t = min(ρ_t, C)
    sequence:  w_i = min(Π_t ρ_t, C) = min(exp(Σ_t I_t log ρ_t), C), on every token of y_i

The sequence weight is the **product** of the token ratios (verl's ``"sequence"``), not their
geometric mean; the geometric mean is offered for rejection only (below).

Rejection (masked IS: slime's MIS, IcePop, verl ``rollout_rs``) with bounds [low, high]:

    token:      drop token t        if ρ_t ∉ [low, high]                       (IcePop)
    sequence:   drop every token of y_i if Π_t ρ_t ∉ [low, high]
    geometric:  drop every token of y_i if exp((1/|y_i|) Σ_t I_t log ρ_t) ∉ [low, high]

A dropped token leaves ``keep``; the caller passes ``mask & keep`` to the policy loss, so it
leaves the loss's denominator too, not only its numerator (slime PR #657 fixed a version
where rejected tokens had weight 0 but still counted). The weights multiply the policy
gradient term of each kept token (``weights=`` of every policy loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from zsearch_cli.algos.common import bool_mask, masked_max, masked_mean, masked_sum
from zsearch_cli.config.fields import check_options
from zsearch_cli.config.parts import CorrectionOptions
from zsearch_cli.errors import ZsearchError

RS_DEFAULT_HIGH = {"token": 2.0, "sequence": 2.0, "geometric": 1.001}
"""Upper rejection bound when ``rollout_rs_high`` is None (verl's presets: 2.0 for token and
sequence ratios, 1.001 for the geometric mean, which is close to 1 for any long sequence); the
lower bound defaults to 1/high (verl's ``rollout_rs_threshold_lower``), so token rejection
keeps [0.5, 2.0], IcePop's two-sided band."""

LOG_SAFETY = 20.0
"""Exponents of sequence products are clamped to ≤ 20 in the diagnostics (e^40 ≈ 2.4e17 for
the square), verl's safety bound, so a long mismatched sequence gives a large finite χ², not inf."""


def rejection_bounds(cfg: CorrectionOptions) -> tuple[float, float]:
    """(low, high) of the rejection band after defaults; (0, inf) when ``rollout_rs`` is none."""
    if cfg.rollout_rs == "none":
        return 0.0, math.inf
    high = RS_DEFAULT_HIGH[cfg.rollout_rs] if cfg.rollout_rs_high is None else float(cfg.rollout_rs_high)
    low = 1.0 / high if cfg.rollout_rs_low is None else float(cfg.rollout_rs_low)
    return low, high


def check_correction(cfg: CorrectionOptions) -> None:
    """Refuse, in one line, settings the correction cannot run: each value as its option
    declares it (modes, the cap >= 1, positive bounds), then the rules between them."""
    check_options(cfg)
    if cfg.rollout_rs == "none":
        if cfg.rollout_rs_low is not None or cfg.rollout_rs_high is not None:
            raise ZsearchError("--rollout-rs-low/--rollout-rs-high are set but --rollout-rs is none; "
                               "set --rollout-rs to token, sequence or geometric")
        return
    low, high = rejection_bounds(cfg)
    if not low <= 1.0 <= high:
        raise ZsearchError(f"--rollout-rs bounds [{low}, {high}] must contain 1 (else on-policy tokens are rejected)")


@dataclass(frozen=True)
class Correction:
    """What :func:`rollout_correction` returns."""

    weights: Tensor
    """[B, T] float32, detached: the TIS weights on policy tokens, 1 elsewhere (all 1 for rollout_is none)."""
    keep: Tensor
    """[B, T] bool: ``mask`` and not rejected. Pass it (as the mask) to the policy loss."""
    stats: dict[str, Tensor] = field(default_factory=dict)
    """Detached 0-dim diagnostics, see :func:`rollout_correction`."""

    @property
    def kept_rows(self) -> Tensor:
        """[B] bool: rows with at least one kept token (a row rejected whole is False)."""
        return self.keep.any(-1)


@torch.no_grad()
def rollout_correction(old_logp: Tensor, rollout_logp: Tensor, mask: Tensor, cfg: CorrectionOptions) -> Correction:
    """TIS weights, rejection and mismatch diagnostics (docs/methods.md §4.8). ``cfg``: the
    run's correction part, checked once by :func:`check_correction`.

    old_logp (the trainer's π_old), rollout_logp (the sampler's), mask: [B, T]. Off the policy
    tokens the inputs may hold anything (NaN, −inf): they are masked before any maths.

    Stats (detached 0-dim tensors, always returned, also with both modes "none"):

    - over the ``mask`` tokens, before rejection, with ρ_t = π_old/π_rollout:
      ``k3_kl`` = mean_t(ρ_t − 1 − log ρ_t), the k3 estimate of KL(π_rollout‖π_old) from the
      rollout's own samples; ``chi2_token`` = mean_t(ρ_t²) − 1; ``chi2_seq`` = mean over rows
      with a policy token of (Π_t ρ_t)² − 1, computed as exp(2·min(Σ_t log ρ_t, 20)) − 1 (the
      token exponents in k3/χ² are clamped at ±20 likewise, so the stats stay finite);
      ``rejected_frac`` = share of mask tokens rejected; ``rejected_seq_frac`` = share of rows
      with a policy token that lost all of them;
    - over the kept tokens: ``weight_mean``, ``weight_max`` of the weights; ``truncated_frac``
      = share whose weight was capped at C (0 for rollout_is none).

    An all-masked batch gives 0 for every stat.
    """
    m = bool_mask(mask)  # [B, T]
    zero = torch.zeros((), dtype=torch.float32, device=m.device)
    diff = old_logp.float() - rollout_logp.float()
    log_rho = torch.where(m, diff, torch.zeros_like(diff))  # [B, T], log ρ_t, 0 off policy tokens
    rho = torch.exp(log_rho)  # [B, T]
    seq_log = masked_sum(log_rho, m, dim=-1)  # [B], log Π_t ρ_t
    has = m.any(-1)  # [B], rows with a policy token

    # ---- truncated IS weights
    ones = torch.ones_like(log_rho)
    if cfg.rollout_is == "token":
        raw = rho  # [B, T]
    elif cfg.rollout_is == "sequence":
        raw = torch.exp(seq_log.clamp(max=80.0))[:, None].expand_as(log_rho)  # [B, T]; e^80 is finite in fp32
    else:
        raw = ones
    truncated = m & (raw > cfg.rollout_is_cap)  # [B, T]
    weights = torch.where(m, raw.clamp(max=cfg.rollout_is_cap), ones)  # [B, T]

    # ---- rejection
    low, high = rejection_bounds(cfg)
    if cfg.rollout_rs == "token":
        out = (rho < low) | (rho > high)  # [B, T]
    elif cfg.rollout_rs in ("sequence", "geometric"):
        stat = seq_log if cfg.rollout_rs == "sequence" else masked_mean(log_rho, m, dim=-1)  # [B]
        out = ((stat < math.log(low)) | (stat > math.log(high)))[:, None].expand_as(m)  # [B, T]
    else:
        out = torch.zeros_like(m)
    rejected = m & out  # [B, T]
    keep = m & ~rejected  # [B, T]

    # ---- diagnostics
    lr = log_rho.clamp(-LOG_SAFETY, LOG_SAFETY)  # [B, T]
    any_tok = m.any()
    chi2_seq = masked_mean(torch.exp(2.0 * seq_log.clamp(max=LOG_SAFETY)), has) - 1.0
    stats = {
        "k3_kl": masked_mean(torch.exp(lr) - 1.0 - lr, m),
        "chi2_token": torch.where(any_tok, masked_mean(torch.exp(2.0 * lr), m) - 1.0, zero),
        "chi2_seq": torch.where(any_tok, chi2_seq, zero),
        "weight_mean": masked_mean(weights, keep),
        "weight_max": masked_max(weights, keep),
        "truncated_frac": masked_mean(truncated.float(), keep),
        "rejected_frac": masked_mean(rejected.float(), m),
        "rejected_seq_frac": masked_mean((has & ~keep.any(-1)).float(), has),
    }
    return Correction(weights=weights.detach(), keep=keep, stats={k: v.detach() for k, v in stats.items()})
