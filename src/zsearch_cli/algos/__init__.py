"""Policy-gradient objectives (docs/methods.md §4): pure functions on tensors, no models, no I/O.

``--algo NAME`` maps through the plain dict :data:`ALGOS` to an :class:`AlgoSpec`. One trainer
loop drives every entry the same way::

    spec = ALGOS[name]
    cfg = spec.config_cls(**overrides)                     # frozen dataclass, papers' defaults

    # rollout -> rewards [N] (one outcome per response), group_ids (N keys), mask [N, T]
    # (spec.group_by says what a key is: "prompt" = a string unique per prompt, "hop" = the
    # hop count; PPO ignores them), and, with no grad:
    #   old_logp [N, T]   from the rollout policy
    #   ref_logp [N, T]   from the frozen reference, if spec.needs_reference(cfg)
    #   values   [N, T]   from the critic, if spec.needs_critic
    if spec.filter_groups:                                 # DSPO: dynamic outcome filtering
        keep = filter_mixed_groups(rewards, group_ids)     # [N] bool; collect kept groups and
        ...                                                # resample while need_more(...)
    if spec.needs_critic:
        adv, returns = spec.token_advantages(rewards, old_logp, ref_logp, values, mask, cfg)  # [N, T] x2
    else:
        adv = spec.advantages(rewards, group_ids, cfg)     # [N]

    # optional rollout correction (docs/methods.md §4.8), rollout_logp [N, T] from the sampler:
    corr = rollout_correction(old_logp, rollout_logp, mask, cfg.correction)  # weights, keep, stats

    for minibatch in ...:                                  # spec.on_policy: exactly one update
        logp = gather_logprobs(model(...))                 # [B, T], with grad
        loss, stats = spec.policy_loss(logp, old_logp, adv, mask & corr.keep, cfg,
                                       ref_logp=ref_logp, entropy=entropy,   # entropy [B, T] optional
                                       weights=corr.weights)                 # optional, detached
        if spec.needs_critic:
            vloss, vstats = spec.value_loss(new_values, values, returns, mask, cfg)

Signatures (all tensors on one device; ``mask`` bool or float, nonzero = policy-sampled token,
0 = prompt/template/retrieved/padding; it is applied to the policy loss, the KL, the entropy
and the value loss):

- ``advantages(rewards [N], group_ids: Sequence[Hashable] | Tensor, cfg) -> Tensor [N]``
  (None for PPO);
- ``token_advantages(rewards [B], old_logp [B,T], ref_logp [B,T] | None, values [B,T],
  mask [B,T], cfg) -> (advantages [B,T], returns [B,T])`` (PPO only, else None);
- ``policy_loss(logp [B,T], old_logp [B,T], advantages [B] or [B,T], mask [B,T], cfg,
  ref_logp=None, entropy=None, *, weights=None) -> (loss 0-dim, stats)``; ``ref_logp`` is
  required when ``cfg.beta > 0`` and the KL is in the loss (all but PPO, whose KL is in the
  reward); ``weights`` [B,T] are detached IS weights on the policy-gradient term (not the KL),
  and ``cfg.loss_agg`` picks the reduction (docs/methods.md §4.8);
- ``value_loss(values [B,T], old_values [B,T], returns [B,T], mask [B,T], cfg) -> (loss, stats)``
  (PPO only, else None).

``stats`` is a dict of detached 0-dim tensors: ``loss``, ``pg_loss``, ``clipfrac`` (share of
policy tokens — of sequences for sequence-level algos — where the clipped branch is active),
``approx_kl`` (mean over policy tokens of (ρ−1) − log ρ, the k3 estimate of KL(π_old‖π_θ)),
``ratio_mean``, ``ratio_max`` (of ρ_t; of s_i for sequence-level algos, which add
``token_ratio_mean``/``token_ratio_max``), ``kl_ref`` (mean k3 D_t, when ``ref_logp`` is given),
``entropy`` (when ``entropy`` is given); PPO's value loss adds ``vf_loss``, ``vf_clipfrac``,
``vpred_mean``.

Entries: ``reinforce``, ``ppo``, ``grpo``, ``gspo``, ``dspo``, and DSPO's Table 1 ablations
``dspo-nofilter`` ("w/o dynamic filter", = GSPO) and ``dspo-token`` ("w/o sequence-level opt.",
DAPO-style token ratio + filter), and ``hrpo`` (Dr. Zero proposer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from zsearch_cli.algos.common import LOSS_AGG_MODES, aggregate, entropy_from_logits
from zsearch_cli.algos.correction import Correction, check_correction, rejection_bounds, rollout_correction
from zsearch_cli.algos.dspo import (
    DSPOConfig,
    DSPOTokenConfig,
    filter_mixed_groups,
    first_groups,
    need_more,
)
from zsearch_cli.algos.grpo import GRPOConfig, grpo_advantages, grpo_policy_loss
from zsearch_cli.algos.gspo import GSPOConfig, gspo_policy_loss
from zsearch_cli.algos.hrpo import HRPOConfig, hrpo_advantages, hrpo_policy_loss
from zsearch_cli.algos.ppo import PPOConfig, ppo_advantages, ppo_policy_loss, ppo_value_loss
from zsearch_cli.algos.reinforce import ReinforceConfig, reinforce_advantages

AlgoConfig = ReinforceConfig | PPOConfig | GRPOConfig | GSPOConfig | DSPOConfig | DSPOTokenConfig | HRPOConfig
"""Any entry's frozen config (``AlgoSpec.config_cls()``)."""


@dataclass(frozen=True)
class AlgoSpec:
    """Everything the trainer needs to know about one ``--algo`` entry."""

    name: str
    """The ``--algo`` value."""
    config_cls: type
    """Frozen config dataclass of the loss; ``config_cls()`` holds the paper defaults. Every
    one has ``beta``. The learning rate and G are the trainer's and the rollout's
    (``TrainConfig.lr``, :attr:`group_size`), not the loss's."""
    policy_loss: Callable[..., tuple[Any, dict[str, Any]]]
    """(logp, old_logp, advantages, mask, cfg, ref_logp=None, entropy=None, *, weights=None) -> (loss, stats)."""
    advantages: Callable[..., Any] | None
    """(rewards [N], group_ids, cfg) -> [N]; None when ``needs_critic``."""
    token_advantages: Callable[..., Any] | None = None
    """(rewards [B], old_logp, ref_logp, values, mask, cfg) -> (adv [B,T], returns [B,T]); PPO only."""
    value_loss: Callable[..., tuple[Any, dict[str, Any]]] | None = None
    """(values, old_values, returns, mask, cfg) -> (loss, stats); PPO only."""
    needs_critic: bool = False
    """A critic must produce values [B, T] (PPO)."""
    sequence_level: bool = False
    """The importance ratio is per sequence (GSPO/DSPO), not per token."""
    filter_groups: bool = False
    """DSPO dynamic filtering: train only on mixed-reward groups, resampling up to the budget."""
    group_size: int = 5
    """G, responses sampled per prompt when ``--group-size`` is unset: 5 (Search-R1's GRPO,
    ZeroSearch's REINFORCE; DSPO states none), 1 for PPO (Search-R1) and HRPO (Dr. Zero: one
    question per prompt, the baseline comes from the hop group)."""
    group_size_min: int = 1
    """Smallest sensible ``cfg.group_size`` (group baselines need G >= 2)."""
    group_by: Literal["prompt", "hop", "none"] = "prompt"
    """What ``group_ids`` must hold: a per-prompt unique string, the hop count, or nothing used."""
    batch_reward: str | None = None
    """Why this entry needs a stage's batch reward (which supplies its rewards and its group
    keys when they are not prompts), and which stage has one; None = any reward works."""
    on_policy: bool = False
    """Exactly one gradient update per rollout batch (HRPO: no ratio, no clipping)."""
    reward: str = "em"
    """The outcome metric of the paper that runs this algorithm, used when the user sets no
    ``--reward``: EM for Search-R1's PPO/GRPO, F1 for ZeroSearch's REINFORCE, subEM for DSPO
    and the GSPO/DAPO variants it is compared with (DSPO Table 1)."""

    def needs_reference(self, cfg: Any = None) -> bool:
        """A frozen reference's ``ref_logp`` is needed: β > 0 (for ``cfg``, else the defaults)."""
        cfg = self.config_cls() if cfg is None else cfg
        return cfg.beta > 0


ALGOS: dict[str, AlgoSpec] = {
    "reinforce": AlgoSpec(
        name="reinforce", config_cls=ReinforceConfig,
        policy_loss=grpo_policy_loss, advantages=reinforce_advantages, reward="f1",  # GRPO's clipped loss
    ),
    "ppo": AlgoSpec(
        name="ppo", config_cls=PPOConfig,
        policy_loss=ppo_policy_loss, advantages=None, token_advantages=ppo_advantages, value_loss=ppo_value_loss,
        needs_critic=True, group_by="none", group_size=1,
    ),
    "grpo": AlgoSpec(
        name="grpo", config_cls=GRPOConfig,
        policy_loss=grpo_policy_loss, advantages=grpo_advantages,
        group_size_min=2,
    ),
    "gspo": AlgoSpec(
        name="gspo", config_cls=GSPOConfig,
        policy_loss=gspo_policy_loss, advantages=grpo_advantages,  # GRPO's group z-score (DSPO eq. 10)
        sequence_level=True, group_size_min=2, reward="subem",
    ),
    "dspo": AlgoSpec(
        name="dspo", config_cls=DSPOConfig,
        policy_loss=gspo_policy_loss, advantages=grpo_advantages,  # DSPO eq. 11 = GSPO loss, eq. 10 = GRPO z-score
        sequence_level=True, filter_groups=True, group_size_min=2, reward="subem",
    ),
    # DSPO Table 1 "w/o dyn. filter" (text: "DSPO w/o dynamic filter, which is equivalent to GSPO").
    "dspo-nofilter": AlgoSpec(
        name="dspo-nofilter", config_cls=GSPOConfig,
        policy_loss=gspo_policy_loss, advantages=grpo_advantages,
        sequence_level=True, group_size_min=2, reward="subem",
    ),
    # DSPO Table 1 "w/o seq-lvl opt." (text: "DSPO w/o sequence-level opt., which reverts to a
    # strong token-level policy, DAPO"): token ratio + the filter.
    "dspo-token": AlgoSpec(
        name="dspo-token", config_cls=DSPOTokenConfig,
        policy_loss=grpo_policy_loss, advantages=grpo_advantages,
        filter_groups=True, group_size_min=2, reward="subem",
    ),
    "hrpo": AlgoSpec(
        name="hrpo", config_cls=HRPOConfig,
        policy_loss=hrpo_policy_loss, advantages=hrpo_advantages,
        group_by="hop", on_policy=True, group_size=1,
        batch_reward=("hrpo trains the Dr. Zero proposer: its reward needs the frozen solver and its groups are "
                      "hop counts, which only the proposer's batch reward supplies; use `zsearch propose` "
                      "(or the `zsearch drzero` loop)"),
    ),
}

__all__ = [
    "ALGOS",
    "AlgoConfig",
    "AlgoSpec",
    "Correction",
    "DSPOConfig",
    "DSPOTokenConfig",
    "GRPOConfig",
    "GSPOConfig",
    "HRPOConfig",
    "LOSS_AGG_MODES",
    "PPOConfig",
    "ReinforceConfig",
    "aggregate",
    "check_correction",
    "entropy_from_logits",
    "filter_mixed_groups",
    "first_groups",
    "need_more",
    "rejection_bounds",
    "rollout_correction",
]
