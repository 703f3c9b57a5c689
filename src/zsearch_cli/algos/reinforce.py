"""REINFORCE, ZeroSearch's default (ZeroSearch §3.6; docs/methods.md §4.4).

    A_i = r_i                                   (no baseline, the default)
    A_i = r_i − (1/(G−1)) Σ_{j≠i} r_j           (optional RLOO baseline, within the prompt group)

"through the same clipped loss" as GRPO, so ``ALGOS["reinforce"]`` uses :func:`grpo.grpo_policy_loss`:

    L = −(1/N) Σ_i (1/Σ_t I_{i,t}) Σ_t I_{i,t} [min(ρ_t A_i, clip(ρ_t, 1−ε, 1+ε) A_i) − β·D_t]

with ε = 0.2 and β = 0.001 (ZeroSearch App. F; docs/methods.md §6). A singleton group has no
leave-one-out baseline and keeps A = r. GRPO with G = 1 and ``scale_std=False`` gives the
same advantages, hence the same loss
(tests/test_algos.py::test_grpo_with_group_size_one_and_no_std_scaling_is_reinforce).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from zsearch_cli.algos.common import GroupIds, check_loss_agg, group_moments


@dataclass(frozen=True)
class ReinforceConfig:
    """REINFORCE hyper-parameters; defaults from ZeroSearch App. F (docs/methods.md §6)."""

    baseline: Literal["none", "rloo"] = "none"
    """"none": A = r (ZeroSearch). "rloo": A_i = r_i − mean_{j≠i} r_j within the prompt group."""
    clip_eps_low: float = 0.2
    """ε on the low side of the ratio clip (ZeroSearch: 0.2)."""
    clip_eps_high: float = 0.2
    """ε on the high side of the ratio clip (ZeroSearch: 0.2)."""
    beta: float = 0.001
    """β, weight of the k3 KL to the frozen reference inside the loss (ZeroSearch: 0.001)."""
    loss_agg: str = "seq-mean-token-mean"
    """How the per-token terms are reduced to the loss (docs/methods.md §4.8): GRPO's clipped loss,
    each sequence's token mean, then the mean over sequences."""
    loss_agg_norm: float | None = None
    """L, the constant of ``loss_agg="seq-mean-token-sum-norm"`` (Dr. GRPO); None = the batch's width T."""

    def __post_init__(self) -> None:
        check_loss_agg(self.loss_agg, self.loss_agg_norm)


def reinforce_advantages(rewards: Tensor, group_ids: GroupIds, cfg: ReinforceConfig) -> Tensor:
    """A_i = r_i, or with ``baseline="rloo"`` A_i = r_i − mean_{j≠i, j∈g} r_j.

    RLOO in closed form: mean_{j≠i} r_j = (n·mean_g − r_i)/(n − 1), n = |g| ≥ 2; a
    singleton group keeps A = r. rewards [N], group_ids N keys -> advantages [N] float32.
    """
    r = rewards.detach().to(torch.float32).reshape(-1)
    if cfg.baseline == "none":
        return r.clone()
    if cfg.baseline != "rloo":
        raise ValueError(f"baseline must be 'none' or 'rloo', not {cfg.baseline!r}")
    mean, _, count = group_moments(r, group_ids)
    loo_mean = (count * mean - r) / (count - 1).clamp_min(1)
    return torch.where(count > 1, r - loo_mean, r)

