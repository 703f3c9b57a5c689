"""Pieces shared by every objective (docs/methods.md §4), written once.

Conventions, used by every file in ``algos/``:

- ``logp``, ``old_logp``, ``ref_logp`` are per-token log-probabilities of the *response*
  tokens, already gathered: ``[B, T]``. ``logp`` carries the gradient; the other two are
  constants.
- ``mask`` is ``[B, T]``, bool or float: nonzero (I_t = 1) for tokens the policy sampled, zero
  for padding and for retrieved/tool tokens. Every token-level quantity is masked *before* any
  non-linearity (``torch.where``, not a multiply), so a retrieved or padded position gets an
  exactly-zero gradient even when the caller left garbage (``-inf``, NaN) there.
- A row with no policy token at all (Σ_t I_t = 0) contributes 0 to every per-sequence mean
  but still counts in the 1/N (1/G) of the batch mean, as the formulas are written.
- Maths is done in float32 whatever the input dtype.
- ``stats`` values are detached 0-dim tensors (no host sync inside the loss); ``float()`` them
  when logging.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from zsearch_cli.config.fields import choices_of
from zsearch_cli.config.parts import LossOptions

GroupIds = Sequence[Hashable] | Tensor
"""One key per sample: the prompt's unique id (GRPO family) or the hop count (HRPO)."""


# ----------------------------------------------------------------------------- masking


def bool_mask(mask: Tensor) -> Tensor:
    """``mask`` as bool: I_t = 1 wherever the input is nonzero."""
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ_t I_t x_t (over ``dim``, or everything); masked positions never touch the result."""
    x = torch.where(bool_mask(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """(1/Σ_t I_t) Σ_t I_t x_t over ``dim`` (or everything); 0 where Σ_t I_t = 0."""
    count = bool_mask(mask).sum() if dim is None else bool_mask(mask).sum(dim)
    return masked_sum(x, mask, dim) / count.clamp_min(1)


def seq_mean_token_mean(x: Tensor, mask: Tensor) -> Tensor:
    """(1/N) Σ_i (1/Σ_t I_{i,t}) Σ_t I_{i,t} x_{i,t}: each sequence's token mean, then the
    mean over sequences (the GRPO/GSPO/HRPO aggregation). x, mask: [B, T] -> scalar."""
    return masked_mean(x, mask, dim=-1).mean()


LOSS_AGG_MODES = choices_of(LossOptions, "loss_agg")  # declared once, on the --loss-agg option
"""Loss aggregations (verl's ``loss_agg_mode`` names; docs/methods.md §4.8)."""


def aggregate(per_token: Tensor, mask: Tensor, mode: str, norm: float | None = None) -> Tensor:
    """Reduce a per-token loss to a scalar (docs/methods.md §4.8). per_token, mask: [B, T] -> 0-dim.

    - ``"token-mean"``: (1/Σ_{i,t} I_{i,t}) Σ_{i,t} I_{i,t} x_{i,t}, one mean over every policy
      token of the batch (PPO, DAPO); 0 when there is none.
    - ``"seq-mean-token-mean"``: (1/N) Σ_i (1/Σ_t I_{i,t}) Σ_t I_{i,t} x_{i,t}, exactly
      :func:`seq_mean_token_mean` (GRPO, GSPO, HRPO). N counts **every** row: a row with no
      policy token (all masked, or all rejected by the rollout correction) adds 0 to the sum
      but still counts in 1/N, as today (verl instead drops such rows from N).
    - ``"seq-mean-token-sum-norm"``: (1/N) Σ_i (1/L) Σ_t I_{i,t} x_{i,t} (Dr. GRPO, Listing 1's
      MAX_TOKENS): no per-sequence length normalisation; L = ``norm``, or T (``x.shape[-1]``)
      when None. N counts every row, as above.
    """
    if mode == "seq-mean-token-mean":
        return seq_mean_token_mean(per_token, mask)
    if mode == "token-mean":
        return masked_mean(per_token, mask)
    if mode == "seq-mean-token-sum-norm":
        length = float(per_token.shape[-1] if norm is None else norm)
        return (masked_sum(per_token, mask, dim=-1) / length).mean()
    raise ValueError(f"loss_agg must be one of {', '.join(LOSS_AGG_MODES)}, not {mode!r}")


def check_loss_agg(mode: str, norm: float | None, allowed: tuple[str, ...] = LOSS_AGG_MODES, algo: str = "") -> None:
    """Raise ValueError (one line) unless ``mode`` is in ``allowed`` and ``norm`` is None or > 0."""
    if mode not in allowed:
        why = f" ({algo})" if algo else ""
        raise ValueError(f"loss_agg must be one of {', '.join(allowed)}{why}, not {mode!r}")
    if norm is None:
        return
    if isinstance(norm, bool) or not isinstance(norm, (int, float)) or not 0 < norm < float("inf"):
        raise ValueError(f"loss_agg_norm must be a positive number or None, not {norm!r}")
    if mode != "seq-mean-token-sum-norm":
        raise ValueError(f"loss_agg_norm is only used by loss_agg='seq-mean-token-sum-norm', not {mode!r}")


def apply_weights(per_token: Tensor, weights: Tensor | None, mask: Tensor) -> Tensor:
    """x_t · sg[w_t] on policy tokens (docs/methods.md §4.8); ``weights`` None returns ``x`` itself.

    per_token, weights, mask: [B, T]. The weights are detached (constants of the loss) and
    replaced by 1 off the policy tokens, so garbage there cannot reach the gradient.
    """
    if weights is None:
        return per_token
    if weights.shape != per_token.shape:
        raise ValueError(f"weights have shape {tuple(weights.shape)}, expected {tuple(per_token.shape)}")
    w = weights.detach().to(torch.float32)
    w = torch.where(bool_mask(mask), w, torch.ones_like(w))  # [B, T]
    return per_token * w


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x − mean)/sqrt(var + eps) over the policy tokens of the whole batch, 0 elsewhere.

    Variance is unbiased (Bessel), as verl's ``masked_whiten`` which Search-R1 uses for PPO.
    """
    m = bool_mask(mask)
    mean = masked_mean(x, m)
    n = m.sum()
    var = masked_sum((x - mean) ** 2, m) / (n - 1).clamp_min(1)
    return torch.where(m, (x - mean) * torch.rsqrt(var + eps), torch.zeros_like(x))


def expand_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Sequence advantages [B] -> [B, T] (every token of y_i shares A_i); [B, T] passes
    through. Always detached: advantages are constants of the loss."""
    adv = advantages.detach().to(torch.float32)
    if adv.dim() == 1:
        adv = adv[:, None].expand(like.shape)
    if adv.shape != like.shape:
        raise ValueError(f"advantages have shape {tuple(advantages.shape)}, expected [B] or {tuple(like.shape)}")
    return adv


# ----------------------------------------------------------------------------- ratios and KL


def token_log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """log ρ_t = logp_θ − logp_old on policy tokens, 0 elsewhere. [B, T] -> [B, T].

    ρ_t = exp(log ρ_t) = π_θ(y_t|·)/π_old(y_t|·) (docs/methods.md §4.1). No clamp: the
    equations are implemented as written.
    """
    diff = logp.float() - old_logp.float().detach()
    return torch.where(bool_mask(mask), diff, torch.zeros_like(diff))


def clipped_surrogate(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """Per-element PPO surrogate, as a loss: −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A).

    Returns ``(loss_t, clipped_t)``; ``clipped_t`` is True where the clipped branch is the
    active (strictly smaller) one, i.e. where the gradient is zero (verl's ``pg_clipfrac``).
    """
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


def k3_kl(logp: Tensor, ref_logp: Tensor, mask: Tensor) -> Tensor:
    """k3 estimator of KL(π_θ || π_ref) per token (docs/methods.md §4.1; Search-R1 eq. 3):

        D_t = e^{(logp_ref − logp_θ)} − (logp_ref − logp_θ) − 1,

    on policy tokens, 0 elsewhere. [B, T] -> [B, T]. D_t ≥ 0, and 0 iff logp_ref = logp_θ.
    """
    diff = ref_logp.float().detach() - logp.float()
    diff = torch.where(bool_mask(mask), diff, torch.zeros_like(diff))
    return torch.exp(diff) - diff - 1.0


def add_kl_penalty(
    pg_loss: Tensor, logp: Tensor, ref_logp: Tensor | None, mask: Tensor, beta: float,
    mode: str = "seq-mean-token-mean", norm: float | None = None,
) -> Tensor:
    """pg_loss + β·(1/N) Σ_i (1/Σ_t I_{i,t}) Σ_t I_{i,t} D_t, the k3 KL term of the GRPO loss
    (Search-R1 eq. 3; docs/methods.md §4.1); with β = 0, ``pg_loss`` itself (no reference needed).

    The KL enters inside the same per-sequence token mean as the surrogate (GRPO, GSPO with
    β > 0, HRPO with β > 0); splitting the sum is exact. logp, ref_logp, mask: [B, T].
    ``mode``/``norm``: the loss's aggregation (:func:`aggregate`, docs/methods.md §4.8), so the
    KL is always reduced like the surrogate; it is never multiplied by rollout IS weights.
    """
    if beta <= 0:
        return pg_loss
    if ref_logp is None:
        raise ValueError(f"beta={beta} > 0 needs ref_logp")
    return pg_loss + beta * aggregate(k3_kl(logp, ref_logp, mask), mask, mode, norm)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H_t = logsumexp(z) − Σ_v softmax(z)_v z_v. logits [B, T, V] -> entropy [B, T].

    Feed the result (masked by I_t inside the loss) as a policy loss's ``entropy=``.
    """
    logits = logits.float()
    p = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (p * logits).sum(-1)


# ----------------------------------------------------------------------------- groups


def group_index(group_ids: GroupIds, device: torch.device | str | None = None) -> tuple[Tensor, int]:
    """Map keys to 0..K-1 in order of first appearance. -> (index [N] long, K)."""
    keys = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    first: dict[Hashable, int] = {}
    index = [first.setdefault(k, len(first)) for k in keys]
    return torch.tensor(index, dtype=torch.long, device=device), len(first)


def group_moments(rewards: Tensor, group_ids: GroupIds) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample (mean_g, var_g, |g|) of its group's rewards, each [N].

    var_g is the **unbiased** (Bessel, n−1) variance, i.e. ``torch.std(...)**2``: that is what
    verl's GRPO advantage (used by Search-R1, DSPO and Dr. Zero) computes. A singleton group's
    var is reported as 0; callers decide what a singleton means.
    """
    r = rewards.detach().to(torch.float32).reshape(-1)
    if len(group_ids) != r.numel():
        raise ValueError(f"{r.numel()} rewards but {len(group_ids)} group ids")
    idx, k = group_index(group_ids, r.device)
    count = torch.zeros(k, device=r.device).index_add_(0, idx, torch.ones_like(r))
    mean = torch.zeros(k, device=r.device).index_add_(0, idx, r) / count
    dev2 = (r - mean[idx]) ** 2
    var = torch.zeros(k, device=r.device).index_add_(0, idx, dev2) / (count - 1).clamp_min(1)
    return mean[idx], var[idx], count[idx]


def group_normalize(
    rewards: Tensor, group_ids: GroupIds, delta: float, scale_std: bool = True, singleton: str = "no_baseline"
) -> Tensor:
    """A_i = (r_i − mean_g r)/(std_g r + δ) (or r_i − mean_g r when ``scale_std`` is False).

    std_g = sqrt(unbiased var_g), see :func:`group_moments`. A group of one has no baseline
    (its unbiased std is 0/0), so ``singleton`` says what it gets:

    - ``"no_baseline"``: mean := 0, std := 1, i.e. A = r/(1+δ) (A = r without scaling). This
      is verl's convention and makes GRPO with G = 1 exactly REINFORCE (Search-R1 App. H).
    - ``"zero"``: A = 0 (HRPO, docs/methods.md §4.7; Dr. Zero eq. 3).
    """
    r = rewards.detach().to(torch.float32).reshape(-1)
    mean, var, count = group_moments(r, group_ids)
    single = count == 1
    if singleton == "zero":
        adv = r - mean
        if scale_std:
            adv = adv / (var.sqrt() + delta)
        return torch.where(single, torch.zeros_like(adv), adv)
    if singleton != "no_baseline":
        raise ValueError(f"singleton must be 'no_baseline' or 'zero', not {singleton!r}")
    adv = r - torch.where(single, torch.zeros_like(mean), mean)
    if scale_std:
        adv = adv / (torch.where(single, torch.ones_like(var), var.sqrt()) + delta)
    return adv


# ----------------------------------------------------------------------------- stats


@torch.no_grad()
def policy_stats(
    log_ratio: Tensor,
    clipped: Tensor,
    mask: Tensor,
    *,
    logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
) -> dict[str, Tensor]:
    """The stats every policy loss returns, over the policy tokens of the batch:

    - ``clipfrac``: fraction of policy tokens whose clipped branch is active (zero gradient);
    - ``approx_kl``: mean of (ρ_t − 1) − log ρ_t, the k3 estimate of KL(π_old || π_θ)
      (cleanrl's ``approx_kl``; ≥ 0);
    - ``ratio_mean`` / ``ratio_max``: mean and max of ρ_t;
    - ``kl_ref``: mean k3 D_t against the reference, when ``ref_logp`` is given;
    - ``entropy``: mean H_t, when ``entropy`` is given.
    """
    m = bool_mask(mask)
    ratio = torch.exp(log_ratio)
    stats = {
        "clipfrac": masked_mean(clipped.float(), m),
        "approx_kl": masked_mean((ratio - 1.0) - log_ratio, m),
        "ratio_mean": masked_mean(ratio, m),
        "ratio_max": masked_max(ratio, m),
    }
    if ref_logp is not None and logp is not None:
        stats["kl_ref"] = masked_mean(k3_kl(logp, ref_logp, m), m)
    if entropy is not None:
        stats["entropy"] = masked_mean(entropy.float(), m)
    return stats


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """max_t {x_t : I_t = 1}; 0 when there is no policy token."""
    v = torch.where(bool_mask(mask), x, torch.full_like(x, float("-inf"))).amax()
    return torch.where(torch.isneginf(v), torch.zeros_like(v), v)


def detach_stats(stats: dict[str, Tensor]) -> dict[str, Tensor]:
    """Every value as a detached 0-dim tensor."""
    return {k: v.detach() for k, v in stats.items()}
