"""Rollout → reward → (DSPO) filter: what one training step trains on.

Without filtering this is one generation batch of B prompts × G samples. With DSPO's dynamic
outcome filtering (DSPO eq. 9) generation batches are drawn until B mixed-reward groups are
kept or ``max_gen_batches`` is spent; the step then trains on what it has and says so.
Every generated trajectory is returned (``kept`` says which are trained on), so metrics
describe the policy, not the filter's survivors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from zsearch_cli.algos import AlgoConfig, AlgoSpec
from zsearch_cli.rewards import score_answer, trajectory_reward
from zsearch_cli.rollout.engine import RolloutEngine
from zsearch_cli.rollout.trajectory import Trajectory
from zsearch_cli.train.sampler import PromptSampler

RewardFn = Callable[[Trajectory], float]
"""Optional override of the training reward, one trajectory at a time (e.g. a stage with its
own reward); the default is the run's ``--reward`` metric plus ``--format-bonus``."""


@dataclass
class BatchRewards:
    """What a :data:`BatchRewardFn` returns for one generation batch (aligned with its trajectories)."""

    rewards: list[float]
    """The training reward of each trajectory."""
    group_keys: list[Hashable] | None = None
    """What the advantages group by (HRPO: the hop count); None = the per-prompt group ids."""
    metrics: dict[str, float | None] = field(default_factory=dict)
    """Per-batch metrics for the step's log, named with their namespace (``proposer/…``)."""
    columns: list[dict[str, Any]] | None = None
    """Per-trajectory columns for the saved rollouts; each must be a column of ROLLOUT."""


BatchRewardFn = Callable[[list[Trajectory], int], BatchRewards]
"""Optional reward over a whole generation batch ``(trajectories, step)``, called once per
batch after the per-trajectory scoring. Why a batch: Dr. Zero's proposer reward runs the
solver n times on every proposed question, and those solver rollouts should be one batched
generation, not one per trajectory."""


@dataclass
class Sample:
    """One trajectory as training sees it: the engine's record plus what training adds."""

    trajectory: Trajectory
    step: int
    """The training step that sampled it (1-based, as the console, metrics and checkpoints count)."""
    gen_batch: int
    """Generation batch within the step (DSPO may draw several)."""
    group_key: Hashable
    """What the advantage baseline groups by: the prompt's group id, or a batch reward's key."""
    reward: float = 0.0
    em: float = 0.0
    f1: float = 0.0
    subem: float = 0.0
    kept: bool = True
    """Trained on (DSPO's filter drops uniform-reward groups)."""
    advantage: float | None = None
    """A_i (PPO: the mean of A_t over the policy tokens); None when not trained on."""
    columns: dict[str, Any] = field(default_factory=dict)
    """A batch reward's per-trajectory columns (the proposer's k, hops, question, …)."""

    def to_row(self) -> dict[str, Any]:
        """The ROLLOUT row."""
        return {**self.trajectory.to_row(), "step": self.step, "gen_batch": self.gen_batch, "reward": self.reward,
                "em": self.em, "f1": self.f1, "subem": self.subem, "kept": self.kept,
                "advantage": self.advantage if self.kept else None, **self.columns}


@dataclass
class StepSamples:
    samples: list[Sample]
    """Every trajectory generated this step, scored; ``kept`` says which are trained on."""
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
    def train(self) -> list[Sample]:
        return [s for s in self.samples if s.kept]


def score(samples: list[Sample], metric: str, protocol: str, format_bonus: float,
          reward_fn: RewardFn | None = None) -> None:
    """Set ``em``/``f1``/``subem`` of the answer the engine parsed, and ``reward``."""
    for s in samples:
        t = s.trajectory
        scores = score_answer(t.prediction, t.golden_answers)
        s.em, s.f1, s.subem = scores["em"], scores["f1"], scores["subem"]
        if reward_fn is not None:
            s.reward = float(reward_fn(t))
        else:
            s.reward = trajectory_reward(t.prediction, t.policy_texts, t.golden_answers, metric, protocol,
                                         format_bonus)


def _apply_batch_rewards(samples: list[Sample], result: BatchRewards) -> None:
    n = len(samples)
    if len(result.rewards) != n or (result.group_keys is not None and len(result.group_keys) != n) \
            or (result.columns is not None and len(result.columns) != n):
        raise ValueError(f"a batch reward must return one reward (and group key, and column set) per "
                         f"trajectory: {n} trajectories, {len(result.rewards)} rewards")
    for i, s in enumerate(samples):
        s.reward = float(result.rewards[i])
        if result.group_keys is not None:
            s.group_key = result.group_keys[i]
        if result.columns is not None:
            s.columns = dict(result.columns[i])


def sample_step(
    engine: RolloutEngine,
    data: PromptSampler,
    spec: AlgoSpec,
    acfg: AlgoConfig,
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
) -> StepSamples:
    """Generate, score and (DSPO) filter the batch of ``step`` (1-based; generation batch g
    samples with the engine step (step − 1)·budget + g, so every batch has its own seeds and
    group ids). ``shard`` = (rank, world): each process rolls out its slice of every batch;
    the filter target is split the same way.

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
    out = StepSamples(samples=[])
    kept_groups: list[Hashable] = []
    weights: dict[str, float] = {}  # batch-reward metrics: trajectories behind each sum
    gen = 0
    while True:
        rows = data.next_batch()[rank::world]
        t0 = time.perf_counter()
        # One distinct sampling step per generation batch: seeds differ, groups stay unique.
        trajs = engine.rollout(rows, group_size=group_size, step=(step - 1) * budget + gen)
        t1 = time.perf_counter()
        samples = [Sample(t, step=step, gen_batch=gen, group_key=t.group_id) for t in trajs]
        score(samples, metric, protocol, format_bonus, reward_fn)
        if batch_reward_fn is not None:
            result = batch_reward_fn(trajs, step)
            _apply_batch_rewards(samples, result)
            _merge_metrics(out.reward_metrics, weights, result.metrics, len(trajs))
        out.time_rollout += t1 - t0
        out.time_reward += time.perf_counter() - t1
        out.samples += samples
        out.total_groups += len(rows)
        gen += 1
        if not spec.filter_groups:
            break
        rewards = torch.tensor([s.reward for s in samples])
        keep = filter_mixed_groups(rewards, [s.trajectory.group_id for s in samples]).tolist()
        for s, k in zip(samples, keep):
            s.kept = bool(k)
            if k and s.trajectory.group_id not in kept_groups:
                kept_groups.append(s.trajectory.group_id)
        counts = all_counts(len(kept_groups)) if all_counts is not None else [len(kept_groups)]
        if not need_more(min(counts), target, gen, budget):
            break
    out.gen_batches = gen
    out.reward_metrics = {k: v / weights[k] for k, v in out.reward_metrics.items()}
    if spec.filter_groups:
        kept = out.train
        share = min(target, *counts)  # the same number of groups on every process
        if len(kept_groups) > share:  # an over-full last batch: train on exactly the share
            for s, k in zip(kept, first_groups([s.trajectory.group_id for s in kept], share).tolist()):
                s.kept = bool(k)
            kept_groups = kept_groups[:share]
        out.kept_groups = len(kept_groups)
        out.tokens_wasted = float(sum(s.trajectory.policy_tokens for s in out.samples if not s.kept))
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
