"""One step's batch as the update sees it: the models it touches (:class:`StepModels`), the
samples as padded tensors (:class:`StepBatch`, built once by :func:`step_batch`), and how its
micro-batches are cut and laid out (:class:`MicroSettings`, :func:`plan_micro_batches`).
:mod:`zsearch_cli.train.update` runs the passes over it (docs/methods.md §4, §8).

Every forward reads an index slice of the batch cut to that slice's own widths, so a
micro-batch runs exactly the tensors it would if padded alone.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from zsearch_cli.train import microbatch
from zsearch_cli.train.logprobs import CAUSAL, MASKED, PACKED, Batch, collate, pack, pad_rows

if TYPE_CHECKING:
    from zsearch_cli.train.step_samples import Sample
    from zsearch_cli.train.config import TrainConfig


@dataclass
class StepModels:
    """What an update touches; ``policy``/``critic`` are as prepared by accelerate."""

    policy: Any
    reference: Any | None
    critic: Any | None
    optimizer: Any
    critic_optimizer: Any | None
    accelerator: Any
    pad_id: int
    device: Any
    layout: str = MASKED
    """How micro-batches meet the model (``--pack``, resolved for this model:
    train/logprobs.py's ``resolve_layout``)."""


@dataclass
class StepBatch:
    """The samples one step trains on, as padded tensors (N samples, L = longest prompt +
    response, T = longest response). Built by :func:`step_batch`; :func:`rollout_tensors`
    and :func:`advantages` fill the rest."""

    tokens: Batch
    """input_ids/attention_mask [N, L], resp_pos/targets/mask [N, T], on the CPU."""
    prompt_lengths: Tensor  # [N] long
    response_lengths: Tensor  # [N] long
    sampler_logp: Tensor  # [N, T] float32: the sampler's logprobs (0 on observations and padding)
    versions: Tensor  # [N, T] long: the policy version that sampled each token (-1 on observations and padding)
    rewards: Tensor  # [N] float32
    group_keys: list[Hashable]
    """What the advantage baseline groups by (a prompt's group id, or a batch reward's key)."""
    old_logp: Tensor | None = None  # [N, T] float32, the policy before the update
    ref_logp: Tensor | None = None  # [N, T] float32, the frozen reference (β > 0)
    values: Tensor | None = None  # [N, T] float32, the critic (PPO)
    advantages: Tensor | None = None  # [N] (sequence algos) or [N, T] (PPO)
    returns: Tensor | None = None  # [N, T] (PPO)
    logp_mismatch: float | None = None
    """Mean |sampler − recomputed| logprob over the policy tokens (with --rollout-overlap:
    over those the current weights sampled; None when there are none)."""
    truncated: Tensor | None = None  # [N] bool: a length budget ended the sample (Trajectory.truncated)
    loss_mask: Tensor | None = None
    """[N, T] bool: the tokens the policy loss trains on: the policy tokens, less the truncated
    samples' under --mask-truncated and the tokens the rollout correction rejected; also the
    loss's denominator (docs/methods.md §4.8)."""
    weights: Tensor | None = None  # [N, T] float32: the rollout correction's IS weights (1 = none)
    fused: bool = False
    """π_old is taken from the update's own forward (:func:`fused_old_logp`): ``old_logp`` is
    filled micro-batch by micro-batch during :func:`optimize`, and the diagnostics after it."""
    correction: dict[str, float] | None = None
    """``offpolicy/…`` diagnostics of the rollout correction (None under --rollout-overlap,
    where π_old is the sampler's and there is nothing to measure)."""

    @property
    def size(self) -> int:
        return int(self.prompt_lengths.numel())

    @property
    def policy_tokens(self) -> list[int]:
        """Policy-sampled tokens per sample."""
        return self.tokens.mask.sum(dim=1).tolist()

    def width(self, idx: Sequence[int]) -> int:
        """T of a micro-batch: its longest response (at least 1, as :func:`collate`)."""
        return max(1, int(self.response_lengths[list(idx)].max()))

    @property
    def lengths(self) -> list[int]:
        """Prompt + response tokens per sample."""
        return (self.prompt_lengths + self.response_lengths).tolist()

    def forward_batch(self, idx: Sequence[int], device: Any, layout: str = MASKED) -> Batch:
        """Rows ``idx`` cut to their own widths, on ``device``: the tensors :func:`collate`
        gives for those samples alone (``causal``: without the attention mask); ``packed``: the
        same samples as one packed row (train/logprobs.py), with the same response frame."""
        rows = torch.as_tensor(list(idx), dtype=torch.long)
        t = self.width(idx)
        b = self.tokens
        targets, mask = b.targets[rows, :t].to(device), b.mask[rows, :t].to(device)
        if layout == PACKED:
            ends = (self.prompt_lengths[rows] + self.response_lengths[rows]).tolist()
            seqs = [b.input_ids[i, :n].to(device) for i, n in zip(rows.tolist(), ends)]
            return pack(seqs, self.prompt_lengths[rows].tolist(), t, targets, mask)
        length = int((self.prompt_lengths[rows] + self.response_lengths[rows]).max())
        attention = None if layout == CAUSAL else b.attention_mask[rows, :length].to(device)
        return Batch(b.input_ids[rows, :length].to(device), attention,
                     b.resp_pos[rows, :t].to(device), targets, mask,
                     keep_from=max(0, int(self.prompt_lengths[rows].min()) - 1))

    def rows(self, x: Tensor, idx: Sequence[int]) -> Tensor:
        """Rows ``idx`` of an [N, T] tensor cut to the micro-batch width: [b, t]."""
        return x[torch.as_tensor(list(idx), dtype=torch.long, device=x.device), : self.width(idx)]

    def within(self, idx: Sequence[int], device: Any) -> Tensor:
        """[b, t] bool: position t is inside sample i's response (padding beyond it)."""
        t = self.width(idx)
        lengths = self.response_lengths[list(idx)].to(device)
        return torch.arange(t, device=device)[None, :] < lengths[:, None]


@dataclass(frozen=True)
class MicroSettings:
    """How micro-batches are cut and laid out (train/microbatch.py)."""

    rows: int  # --micro-batch-size
    tokens: int | None  # --micro-batch-tokens (None: by rows)
    layout: str  # --pack, resolved: train/logprobs.py's LAYOUTS
    chunk: int | None = None  # --logits-chunk: LM-head rows at a time (None: train/lm_head.py's default; 0: whole)

    @property
    def packed(self) -> bool:
        """One packed row per micro-batch (a micro-batch then costs its tokens, not rows x longest)."""
        return self.layout == PACKED


def micro_settings(cfg: TrainConfig, m: StepModels) -> MicroSettings:
    from zsearch_cli.train.distributed import distribution

    b = cfg.batch
    chunk = b.logits_chunk
    if chunk is None and m.accelerator is not None and distribution(m.accelerator) != "replicated":
        chunk = 0  # FSDP/ZeRO-3 shard the head's weight outside its forward: the chunked head cannot read it
    return MicroSettings(b.micro_batch_size, b.micro_batch_tokens, m.layout, chunk)


def plan_micro_batches(m: StepModels, settings: MicroSettings, batch: StepBatch, idx: Sequence[int]) -> list[list[int]]:
    """The micro-batches of the samples ``idx``, the same count on every process (empty ones
    run for the collectives only: :data:`microbatch.PAD_MICRO`)."""
    lengths = batch.lengths
    micros = microbatch.plan(idx, lengths, settings.rows, settings.tokens, settings.packed)
    if m.accelerator is not None and m.accelerator.num_processes > 1:
        counts = m.accelerator.gather(torch.tensor([len(micros)], device=m.device))
        micros = microbatch.equalize(micros, int(counts.max()), lengths, settings.packed)
    return micros


def step_batch(samples: Sequence[Sample], pad_id: int) -> StepBatch:
    """Pad the samples' ids, masks and sampler logprobs once (CPU); rewards and group keys."""
    trajs = [s.trajectory for s in samples]
    tokens = collate(trajs, pad_id, "cpu")
    width = tokens.mask.shape[1]
    sampler = pad_rows([torch.as_tensor(t.logprobs, dtype=torch.float32) for t in trajs], width)
    versions = pad_rows([torch.as_tensor(t.policy_version, dtype=torch.long) for t in trajs], width, value=-1)
    return StepBatch(
        tokens=tokens,
        prompt_lengths=torch.tensor([len(t.prompt_ids) for t in trajs], dtype=torch.long),
        response_lengths=torch.tensor([len(t.response_ids) for t in trajs], dtype=torch.long),
        sampler_logp=sampler,
        versions=versions,
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
        group_keys=[s.group_key for s in samples],
        truncated=torch.tensor([t.truncated for t in trajs], dtype=torch.bool),
    )
