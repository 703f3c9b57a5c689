"""DSPO = the GSPO loss + dynamic outcome filtering (DSPO eq. 9–11; docs/methods.md §4.6).

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

from zsearch_cli.algos.common import GroupIds, group_index
from zsearch_cli.algos.grpo import GRPOConfig
from zsearch_cli.algos.gspo import GSPOConfig


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

