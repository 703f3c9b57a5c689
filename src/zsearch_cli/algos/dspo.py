"""DSPO = the GSPO loss + dynamic outcome filtering (DSPO eq. 9–11; FORMULAS §4 "DSPO").

Filter (eq. 9): a prompt group is kept only when its rewards are not all equal; for the binary
subEM reward that is 0 < Σ_i 1[r_i = 1] < G. Sampling continues, one generation batch at a
time, until B valid groups are collected or ``max_gen_batches`` batches are spent; then the
trainer trains on what was collected (the first B groups if more came) and logs it.

Advantage (eq. 10), on the kept groups: A_i = (r_i − mean_g r)/(std_g r + δ), as GRPO.
Loss (eq. 11): L = −(1/G) Σ_i min(s_i A_i, clip(s_i, 1−ε_l, 1+ε_h) A_i), as GSPO.

The paper's Table 1 ablations, in ``ALGOS``:

- ``dspo-nofilter`` — "DSPO w/o dynamic filter", which the paper says "is equivalent to GSPO":
  the GSPO spec and config, no filter.
- ``dspo-token`` — "DSPO w/o sequence-level opt.", which "reverts to a strong token-level
  policy, DAPO": GRPO's token-ratio clipped loss (ε = 0.2) + this filter, with β = 0 like DSPO.
  Only the ratio level changes; DAPO's other pieces (clip-higher ε_h = 0.28, token-sum
  aggregation, overlong shaping) are not switched on — set ``clip_eps_high`` to get the first.

Filtering removes whole groups, so the advantages of kept samples are the same whether they
are computed before or after filtering.
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass

import torch
from torch import Tensor

from zsearch_cli.algos.common import GroupIds, bool_mask, group_index
from zsearch_cli.algos.grpo import GRPOConfig, grpo_advantages
from zsearch_cli.algos.gspo import GSPOConfig, gspo_policy_loss


@dataclass(frozen=True)
class FilterConfig:
    """Dynamic outcome filtering settings (DSPO §3.2.2, after DAPO's dynamic sampling)."""

    target_groups: int = 512
    """B, valid (mixed-reward) prompt groups to collect per training step (DSPO does not state
    it; the train batch of the verl search-r1-like example it adapts)."""
    max_gen_batches: int = 10
    """Generation batches that may be sampled per step before training on what was kept
    (DAPO's ``max_num_gen_batches``); <= 0 means no limit."""
    reward: str = "subem"
    """Outcome reward the filter judges (DSPO: binary subEM)."""


@dataclass(frozen=True)
class DSPOConfig(FilterConfig, GSPOConfig):
    """DSPO = GSPO hyper-parameters (sequence clip 3e-4/4e-4, β = 0) + filtering."""


@dataclass(frozen=True)
class DSPOTokenConfig(FilterConfig, GRPOConfig):
    """The "w/o sequence-level opt." ablation (DAPO-style): GRPO's token-level loss and ε = 0.2,
    plus filtering, without KL like DSPO."""

    beta: float = 0.0
    """β of the k3 KL term; 0, as DSPO (and DAPO) train without a reference."""


dspo_advantages = grpo_advantages
"""DSPO eq. 10 is GRPO's group z-score: see :func:`grpo.grpo_advantages`."""

dspo_policy_loss = gspo_policy_loss
"""DSPO eq. 11 is the GSPO loss: see :func:`gspo.gspo_policy_loss`."""


def filter_mixed_groups(rewards: Tensor, group_ids: GroupIds) -> Tensor:
    """DSPO eq. 9: keep [N] bool, True for samples whose group's rewards are not all equal
    (max_g r > min_g r; exact comparison). A singleton group is never mixed, so dropped."""
    r = rewards.detach().to(torch.float32).reshape(-1)
    if len(group_ids) != r.numel():
        raise ValueError(f"{r.numel()} rewards but {len(group_ids)} group ids")
    idx, k = group_index(group_ids, r.device)
    hi = torch.full((k,), float("-inf"), device=r.device).scatter_reduce(0, idx, r, "amax")
    lo = torch.full((k,), float("inf"), device=r.device).scatter_reduce(0, idx, r, "amin")
    return (hi > lo)[idx]


def need_more(kept_groups: int | Sized, target_groups: int, batches_used: int, max_gen_batches: int) -> bool:
    """Whether to sample another generation batch: fewer than B groups kept so far and the
    budget not spent (``max_gen_batches`` <= 0: unlimited). ``kept_groups`` is a count or a
    collection of the kept group ids."""
    n = kept_groups if isinstance(kept_groups, int) else len(kept_groups)
    if n >= target_groups:
        return False
    return max_gen_batches <= 0 or batches_used < max_gen_batches


def first_groups(group_ids: GroupIds, n_groups: int) -> Tensor:
    """[N] bool selecting the samples of the first ``n_groups`` distinct groups (in order of
    first appearance): trims an over-full collection to exactly B groups."""
    idx, _ = group_index(group_ids)
    return idx < n_groups


def filter_stats(keep: Tensor, group_ids: GroupIds, num_tokens: Tensor | None = None) -> dict[str, Tensor]:
    """What the filter did to one generation batch, for the log:

    ``kept_groups``, ``total_groups``, ``kept_frac`` (= kept/total groups), ``kept_samples``,
    and, with ``num_tokens`` [N] (tokens generated per sample), ``tokens_wasted`` = tokens of
    the dropped samples.
    """
    keep = bool_mask(keep).reshape(-1)
    idx, k = group_index(group_ids, keep.device)
    kept_per_group = torch.zeros(k, device=keep.device).index_add_(0, idx, keep.float())
    kept = (kept_per_group > 0).sum().float()
    stats = {
        "kept_groups": kept,
        "total_groups": torch.tensor(float(k)),
        "kept_frac": kept / max(k, 1),
        "kept_samples": keep.sum().float(),
    }
    if num_tokens is not None:
        stats["tokens_wasted"] = num_tokens.float().reshape(-1)[~keep].sum()
    return stats
