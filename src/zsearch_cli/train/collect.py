"""Rollout → reward → (DSPO) filter: what one training step trains on.

Without filtering this is one generation batch of B prompts × G samples. With DSPO's dynamic
outcome filtering (DSPO eq. 9) generation batches are drawn until B mixed-reward groups are
kept or ``max_gen_batches`` is spent; the step then trains on what it has and says so.
Every generated trajectory is returned (``kept`` says which are trained on), so metrics
describe the policy, not the filter's survivors.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from zsearch_cli.rewards import extract_answer, outcome_reward, policy_turns, score_answer
from zsearch_cli.rollout.engine import RolloutEngine
from zsearch_cli.train.data import TrainData

RewardFn = Callable[[dict[str, Any]], float]
"""Optional override of the training reward, one trajectory at a time (e.g. a stage with its
own reward); the default is the run's ``--reward`` metric plus ``--format-bonus``."""

BatchRewardFn = Callable[[list[dict[str, Any]]], "dict[str, float] | None"]
"""Optional reward over a whole generation batch, called once per batch after the
per-trajectory scoring: it sets ``t["reward"]`` (and any extra columns, e.g. HRPO's
``t["hops"]``) on every trajectory and may return per-batch metrics for the step's log.
Why a batch: Dr. Zero's proposer reward runs the solver n times on every proposed question,
and those solver rollouts should be one batched generation, not one per trajectory."""


@dataclass
class Collected:
    trajs: list[dict[str, Any]]
    """Every trajectory generated this step, with reward/em/f1/subem/step/gen_batch/kept."""
    gen_batches: int = 1
    kept_groups: int | None = None
    """DSPO: mixed groups trained on (None when the algorithm does not filter)."""
    total_groups: int = 0
    tokens_wasted: float | None = None
    """DSPO: sampled (mask-1) tokens of the samples not trained on."""
    time_rollout: float = 0.0
    time_reward: float = 0.0
    notes: list[str] = field(default_factory=list)
    """Human-readable remarks for the log (e.g. the filter ran out of budget)."""
    reward_metrics: dict[str, float] = field(default_factory=dict)
    """What a batch reward returned, averaged over generation batches (weighted by size)."""

    @property
    def train(self) -> list[dict[str, Any]]:
        return [t for t in self.trajs if t["kept"]]


def score(trajs: list[dict[str, Any]], metric: str, protocol: str, format_bonus: float,
          reward_fn: RewardFn | None = None) -> None:
    """Add ``em``/``f1``/``subem`` (of the last ``<answer>`` in the response) and ``reward``."""
    for t in trajs:
        turns = policy_turns(t)  # the model's own text: the engine's observation spans left out
        t.update(score_answer(extract_answer(turns), t["golden_answers"]))
        if reward_fn is not None:
            t["reward"] = float(reward_fn(t))
        else:
            t["reward"] = outcome_reward(turns, t["golden_answers"], metric, protocol, format_bonus)


def collect(
    engine: RolloutEngine,
    data: TrainData,
    spec: Any,
    acfg: Any,
    step: int,
    *,
    group_size: int,
    metric: str,
    protocol: str,
    format_bonus: float = 0.0,
    reward_fn: RewardFn | None = None,
    shard: tuple[int, int] = (0, 1),
    batch_reward_fn: BatchRewardFn | None = None,
    all_counts: Callable[[int], list[int]] | None = None,
) -> Collected:
    """Generate, score and (DSPO) filter the step's batch. ``shard`` = (rank, world): each
    process rolls out its slice of every batch; the filter target is split the same way.

    ``all_counts(n)`` returns every process's n (a collective; None with one process). The
    filter's decisions are taken on them so that all processes agree: another generation
    batch while *any* process lacks its share of mixed groups, then every process trains on
    the same number of groups (the smallest share). Why: processes that trained on different
    numbers of samples would run different numbers of backward passes and hang DDP's
    gradient all-reduce, and ones that drew different numbers of batches would fall out of
    step with the data order."""
    from zsearch_cli.algos import filter_mixed_groups, first_groups, need_more

    rank, world = shard
    budget = acfg.max_gen_batches if spec.filter_groups else 1
    target = -(-data.batch_size // world)  # groups this process must keep
    out = Collected(trajs=[])
    kept_groups: list[str] = []
    weights: dict[str, float] = {}  # batch-reward metrics: trajectories behind each sum
    gen = 0
    while True:
        rows = data.next_batch()[rank::world]
        t0 = time.perf_counter()
        # One distinct sampling step per generation batch: seeds differ, groups stay unique.
        trajs = engine.rollout(rows, group_size=group_size, step=step * budget + gen)
        t1 = time.perf_counter()
        for t in trajs:
            t.update(step=step, gen_batch=gen, group_id=f"{step}/{gen}:{t['row_id']}", kept=True)
        score(trajs, metric, protocol, format_bonus, reward_fn)
        if batch_reward_fn is not None:
            _merge_metrics(out.reward_metrics, weights, batch_reward_fn(trajs), len(trajs))
        out.time_rollout += t1 - t0
        out.time_reward += time.perf_counter() - t1
        out.trajs += trajs
        out.total_groups += len(rows)
        gen += 1
        if not spec.filter_groups:
            break
        rewards = torch.tensor([t["reward"] for t in trajs])
        keep = filter_mixed_groups(rewards, [t["group_id"] for t in trajs]).tolist()
        for t, k in zip(trajs, keep):
            t["kept"] = bool(k)
            if k and t["group_id"] not in kept_groups:
                kept_groups.append(t["group_id"])
        counts = all_counts(len(kept_groups)) if all_counts is not None else [len(kept_groups)]
        if not need_more(min(counts), target, gen, budget):
            break
    out.gen_batches = gen
    out.reward_metrics = {k: v / weights[k] for k, v in out.reward_metrics.items()}
    if spec.filter_groups:
        kept = [t for t in out.trajs if t["kept"]]
        share = min(target, *counts)  # the same number of groups on every process
        if len(kept_groups) > share:  # an over-full last batch: train on exactly the share
            for t, k in zip(kept, first_groups([t["group_id"] for t in kept], share).tolist()):
                t["kept"] = bool(k)
            kept_groups = kept_groups[:share]
        out.kept_groups = len(kept_groups)
        out.tokens_wasted = float(sum(t["policy_tokens"] for t in out.trajs if not t["kept"]))
        if len(kept_groups) < target:
            out.notes.append(
                f"step {step}: DSPO filter kept {len(kept_groups)}/{target} mixed groups after "
                f"{gen}/{budget} generation batches (--max-gen-batches spent); training on what was kept"
                + (" — nothing, so no update this step" if not kept_groups else "")
            )
    return out


def _merge_metrics(sums: dict[str, float], weights: dict[str, float], metrics: dict[str, float] | None,
                   weight: int) -> None:
    """Accumulate a batch reward's metrics as size-weighted sums (divided at the end); a
    None value (nothing to measure in that batch) carries no weight."""
    for key, value in (metrics or {}).items():
        if value is not None and weight > 0:
            sums[key] = sums.get(key, 0.0) + float(value) * weight
            weights[key] = weights.get(key, 0.0) + weight
