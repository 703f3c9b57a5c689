"""One training step's update: one padded batch → old/ref logprobs and values → advantages →
K epochs of mini-batches with gradient accumulation → optimizer steps (``algos/``;
docs/methods.md §4).

The step's samples become one right-padded :class:`StepBatch` (``[N, L]`` inputs, ``[N, T]``
response frame; train/step_tensors.py) once; every forward reads an index slice of it cut to that slice's own
widths (so a micro-batch runs exactly the tensors it would if padded alone), and every
per-token result (old/ref logprobs, values, PPO's advantages and returns) is written back
into an ``[N, T]`` tensor, zero beyond each response.

Why old_logp is recomputed rather than taken from the sampler: HF/vLLM sampling numerics
differ from the training forward, so the ratio must compare two training forwards; the
sampler's logprobs only feed the ``logp_mismatch`` diagnostic.

Gradient accumulation reproduces the mini-batch loss exactly: sequence-averaged objectives
(GRPO family, GSPO, REINFORCE) weight each micro-batch by its share of sequences, the
token-averaged ones (PPO's policy and value losses) by its share of policy tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from zsearch_cli.algos import AlgoConfig, AlgoSpec
from zsearch_cli.train.logprobs import critic_forward, policy_forward
from zsearch_cli.train.policy import reference_mode
from zsearch_cli.train.step_tensors import (  # noqa: F401  (step_batch: importable from here, as before)
    MicroSettings, StepBatch, StepModels, micro_settings, plan_micro_batches, step_batch)

if TYPE_CHECKING:
    from zsearch_cli.train.config import TrainConfig


def fused_old_logp(cfg: TrainConfig, n: int, has_critic: bool) -> bool:
    """Whether π_old can be the update's own forward, detached (TRL with ``num_iterations == 1``):
    one epoch and one mini-batch make exactly one optimizer step, so every micro-batch's forward
    runs on the weights that scored the rollout. That saves the separate no-grad forward (~14%
    of a GRPO step). Not when something needs π_old *before* the update: PPO's critic and
    token advantages, the overlap (π_old is the sampler's), the rollout correction (its
    weights and rejected tokens enter the loss and its denominator)."""
    b = cfg.batch
    return (not has_critic and b.ppo_epochs == 1 and (b.mini_batch_size is None or b.mini_batch_size >= n)
            and not cfg.rollout_overlap and cfg.correction.rollout_is == "none" and cfg.correction.rollout_rs == "none")


@torch.no_grad()
def rollout_tensors(m: StepModels, batch: StepBatch, cfg: TrainConfig, version: int = 0) -> StepBatch:
    """Fill ``old_logp`` (the current policy, before the update), ``ref_logp`` (if there is a
    reference), ``values`` (if there is a critic), all [N, T], and ``logp_mismatch``.

    With ``--rollout-overlap`` the tokens were sampled by up to K older versions, so
    ``old_logp`` is the sampler's logprobs (π_old = the behaviour policy, the off-policy
    correction of the papers), and the mismatch is measured on the tokens that the current
    weights (``version``) sampled, the only ones where sampler and policy must agree.
    When :func:`fused_old_logp` holds, the policy's forward is left to :func:`optimize`."""
    n, width = batch.size, batch.tokens.mask.shape[1]

    def frame() -> Tensor:
        return torch.zeros((n, width), dtype=torch.float32, device=m.device)  # [N, T]

    batch.old_logp = frame()
    batch.ref_logp = frame() if m.reference is not None else None
    batch.values = frame() if m.critic is not None else None
    batch.fused = fused_old_logp(cfg, n, m.critic is not None)
    diff_sum, diff_n = 0.0, 0
    settings = micro_settings(cfg, m)
    micros = [] if batch.fused and batch.ref_logp is None else plan_micro_batches(m, settings, batch, range(n))
    for micro in micros:
        real = bool(micro)  # an empty micro-batch (DDP's equal count) runs on sample 0 for its collectives, discarded
        fb = batch.forward_batch(micro if real else [0], m.device, settings.layout)
        rows, t = torch.as_tensor(micro, dtype=torch.long, device=m.device), fb.mask.shape[1]
        inside = batch.within(micro, m.device) if real else None  # [b, t]
        if batch.ref_logp is not None:
            with reference_mode(m.accelerator.unwrap_model(m.reference)) as ref:
                ref_logp, _ = policy_forward(ref, fb, cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                             chunk=settings.chunk)
            if real:
                batch.ref_logp[rows, :t] = torch.where(inside, ref_logp.float(), 0.0)
        if batch.fused:
            continue
        logp, _ = policy_forward(m.policy, fb, cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                 chunk=settings.chunk)  # [b, t]
        values = critic_forward(m.critic, fb) if batch.values is not None else None
        if not real:
            continue
        batch.old_logp[rows, :t] = torch.where(inside, logp.float(), 0.0)
        diff = (logp - batch.rows(batch.sampler_logp, micro).to(logp.device)).abs()
        same = fb.mask
        if cfg.rollout_overlap:
            same = same & (batch.rows(batch.versions, micro).to(logp.device) == version)
        diff_sum += float(diff[same].sum())
        diff_n += int(same.sum())
        if values is not None:
            batch.values[rows, :t] = torch.where(inside, values.float(), 0.0)
    batch.logp_mismatch = diff_sum / diff_n if diff_n else None
    if cfg.rollout_overlap:
        batch.old_logp = batch.sampler_logp.to(m.device)  # 0 on observations and padding, as the frame
    return correct(batch, cfg, m.device)


def _fused_mismatch(batch: StepBatch) -> float | None:
    """``logp_mismatch`` once :func:`optimize` filled ``old_logp`` on the fused path."""
    assert batch.old_logp is not None
    mask = batch.tokens.mask.to(batch.old_logp.device)
    diff = (batch.old_logp - batch.sampler_logp.to(batch.old_logp.device)).abs()
    return float(diff[mask].mean()) if mask.any() else None


def correct(batch: StepBatch, cfg: TrainConfig, device: Any) -> StepBatch:
    """Fill ``loss_mask``, ``weights`` and ``correction``: --mask-truncated drops the truncated
    samples' tokens from the loss (they keep their reward in the group baseline, computed
    before, over every sample), then the rollout correction weights and rejects tokens by
    π_old/π_rollout (algos/correction.py; docs/methods.md §4.8)."""
    from zsearch_cli.algos.correction import rollout_correction

    assert batch.old_logp is not None and batch.truncated is not None
    mask = batch.tokens.mask.to(device)  # [N, T]
    if cfg.loss.mask_truncated:
        mask = mask & ~batch.truncated.to(device)[:, None]
    if batch.fused and batch.loss_mask is None:  # nothing to weight or reject: the stats come after the update
        batch.loss_mask, batch.weights = mask, torch.ones_like(batch.old_logp)
        return batch
    corr = rollout_correction(batch.old_logp, batch.sampler_logp.to(device), mask, cfg.correction)
    batch.loss_mask, batch.weights = corr.keep, corr.weights
    batch.correction = None if cfg.rollout_overlap else {
        f"offpolicy/{'capped_frac' if k == 'truncated_frac' else k}": float(v) for k, v in corr.stats.items()}
    return batch


def advantages(spec: AlgoSpec, acfg: AlgoConfig, batch: StepBatch, accelerator: Any = None) -> StepBatch:
    """Fill ``advantages`` ([N] for sequence algos, [N, T] for PPO) and, for PPO, ``returns``.

    With ``accelerator`` over several processes, groups that are not prompts (HRPO's hop
    counts) span the whole batch: each process holds only its slice of the prompts, and a
    per-slice hop group would be a different (smaller, more often singleton) baseline than
    the paper's batch-wide I_h. Prompt groups need no gathering: all G samples of a prompt
    are on one process."""
    rewards = batch.rewards
    if spec.needs_critic:
        assert batch.old_logp is not None and batch.values is not None
        device = batch.old_logp.device
        everything = list(range(batch.size))
        adv, ret = spec.token_advantages(rewards.to(device), batch.old_logp, batch.ref_logp, batch.values,
                                         batch.tokens.mask.to(device), acfg)  # [N, T] x2
        inside = batch.within(everything, device)
        batch.advantages = torch.where(inside, adv, 0.0)
        batch.returns = torch.where(inside, ret, 0.0)
    elif spec.group_by != "prompt" and accelerator is not None and accelerator.num_processes > 1:
        batch.advantages = _batch_wide(spec, acfg, rewards, batch.group_keys, accelerator)  # multi-process: unverified on GPUs
    else:
        batch.advantages = spec.advantages(rewards, batch.group_keys, acfg)  # [N]
    return batch


def sample_advantages(batch: StepBatch) -> list[float]:
    """One number per sample for the saved rollouts: A_i, or PPO's mean A_t over its policy tokens."""
    assert batch.advantages is not None
    if batch.advantages.dim() == 1:
        return [float(a) for a in batch.advantages]
    mask = batch.tokens.mask.to(batch.advantages.device)
    sums = (batch.advantages.float() * mask).sum(dim=1)
    return [float(s) / max(int(c), 1) for s, c in zip(sums, mask.sum(dim=1))]


def _batch_wide(spec: AlgoSpec, acfg: AlgoConfig, rewards: Tensor, group_keys: list[Hashable],
                accelerator: Any) -> Tensor:
    """Advantages over every process's samples (gathered in rank order); this process's slice."""
    from accelerate.utils import gather_object

    parts = gather_object([(rewards.tolist(), list(group_keys))])  # one (rewards, keys) per process
    start = sum(len(r) for r, _ in parts[: accelerator.process_index])
    all_rewards = torch.tensor([x for r, _ in parts for x in r], dtype=torch.float32)
    adv = spec.advantages(all_rewards, [k for _, ks in parts for k in ks], acfg)
    return adv[start : start + len(group_keys)]


def _accumulate(total: dict[str, float], stats: dict[str, Any], weight: float, prefix: str = "") -> None:
    for k, v in stats.items():
        total[prefix + k] = total.get(prefix + k, 0.0) + weight * float(v)


def optimize(m: StepModels, spec: AlgoSpec, acfg: AlgoConfig, cfg: TrainConfig, batch: StepBatch,
             done: int) -> dict[str, float]:
    """K epochs over seeded mini-batch orders; returns every statistic the losses return,
    averaged over optimizer steps: ``actor/<stat>`` of the policy loss and ``critic/<stat>``
    of the value loss, with ``actor/grad_norm`` and ``critic/grad_norm``. ``done``: the
    training steps before this one, which seeds the mini-batch order."""
    n = batch.size
    mini = cfg.batch.mini_batch_size or n
    assert batch.loss_mask is not None
    # A micro-batch's loss is weighted by its share of what the mini-batch loss averages over:
    # trained tokens for a token mean (the actor's --loss-agg token-mean; PPO's value loss, over
    # the policy tokens), sequences for the per-sequence means (every row counts in 1/N).
    token_level = getattr(acfg, "loss_agg", "seq-mean-token-mean") == "token-mean"
    tokens = batch.loss_mask.sum(dim=1).tolist()
    critic_tokens = batch.policy_tokens
    if getattr(acfg, "loss_agg", None) == "seq-mean-token-sum-norm" and acfg.loss_agg_norm is None:
        # Dr. GRPO's constant: one number for every micro-batch, step and process (the response
        # budget), never a micro-batch's own width; --algo-arg loss_agg_norm=N sets another.
        acfg = dataclasses.replace(acfg, loss_agg_norm=float(cfg.rollout.max_context_tokens))
    clip = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else float("inf")
    settings = micro_settings(cfg, m)
    sums: dict[str, float] = {}
    updates = 0
    epochs = cfg.batch.ppo_epochs
    for epoch in range(epochs):
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + done * 101 + epoch)
        order = torch.randperm(n, generator=gen).tolist() if epochs > 1 or mini < n else list(range(n))
        for mb in [order[i : i + mini] for i in range(0, n, mini)]:
            m.optimizer.zero_grad(set_to_none=True)
            if m.critic_optimizer is not None:
                m.critic_optimizer.zero_grad(set_to_none=True)
            denom = _token_denominator(m.accelerator, sum(tokens[i] for i in mb)) if token_level else len(mb)
            critic_denom = (_token_denominator(m.accelerator, sum(critic_tokens[i] for i in mb))
                            if m.critic is not None else 1.0)
            stats: dict[str, float] = {}
            micros = plan_micro_batches(m, settings, batch, mb)
            for j, micro in enumerate(micros):
                weight = (sum(tokens[i] for i in micro) if token_level else len(micro)) / denom
                critic_weight = sum(critic_tokens[i] for i in micro) / critic_denom
                _micro_step(m, spec, acfg, cfg, batch, micro or mb[:1], (weight, critic_weight), stats,
                            last=j == len(micros) - 1, settings=settings, pad=not micro)
            # The parameter lists are taken after the backward, not once per step: FSDP2 swaps
            # unsharded tensors in and out around forwards, so an earlier list can be stale.
            grad_norm = m.accelerator.clip_grad_norm_(_trainable(m.policy), clip)
            stats["actor/grad_norm"] = float(grad_norm)
            m.optimizer.step()
            if m.critic is not None:
                stats["critic/grad_norm"] = float(m.accelerator.clip_grad_norm_(_trainable(m.critic), clip))
                m.critic_optimizer.step()
            _accumulate(sums, stats, 1.0)
            updates += 1
    m.optimizer.zero_grad(set_to_none=True)
    if batch.fused:  # old_logp is now filled: the diagnostics, as the separate forward would give them
        batch.logp_mismatch = _fused_mismatch(batch)
        correct(batch, cfg, batch.old_logp.device)
    return {**{k: v / max(updates, 1) for k, v in sums.items()}, **(batch.correction or {})}


def _token_denominator(accelerator: Any, local_tokens: int) -> float:
    """PPO's token mean over the whole mini-batch, as one process would take it.

    DDP averages the processes' gradients, so each process divides its token sum by the
    mean token count per process (all processes' tokens / world) rather than by its own
    count: then the average of the processes' gradients is the all-token mean. Dividing by
    the local count instead weights a process with fewer policy tokens more."""
    world = accelerator.num_processes
    if world == 1:
        return float(max(1, local_tokens))
    total = accelerator.reduce(torch.tensor([float(local_tokens)], device=accelerator.device), reduction="sum")
    return max(1.0, float(total.item()) / world)


def _trainable(model: Any) -> list[Any]:
    return [p for p in model.parameters() if p.requires_grad]


def _micro_step(m: StepModels, spec: AlgoSpec, acfg: AlgoConfig, cfg: TrainConfig, batch: StepBatch,
                micro: list[int], weights: tuple[float, float], stats: dict[str, float], last: bool,
                settings: MicroSettings, pad: bool = False) -> None:
    """Forward + backward of one micro-batch (an index slice of the step's batch), the policy
    loss scaled by ``weights[0]``, the value loss by ``weights[1]``. ``pad``: an empty
    micro-batch of DDP's equal count, run on ``micro`` with weight 0 for its collectives."""
    assert batch.old_logp is not None and batch.advantages is not None
    assert batch.loss_mask is not None and batch.weights is not None
    weight, critic_weight = (0.0, 0.0) if pad else weights
    fb = batch.forward_batch(micro, m.device, settings.layout)
    loss_mask = batch.rows(batch.loss_mask, micro).to(m.device)  # [b, t]
    is_weights = batch.rows(batch.weights, micro).to(m.device)  # [b, t]
    old = batch.rows(batch.old_logp, micro)  # [b, t]
    ref = batch.rows(batch.ref_logp, micro) if batch.ref_logp is not None else None  # [b, t]
    if spec.needs_critic:
        adv = batch.rows(batch.advantages, micro)  # [b, t]
    else:
        adv = batch.advantages[torch.as_tensor(micro, dtype=torch.long, device=batch.advantages.device)]  # [b]
    sync = contextlib.nullcontext() if last else m.accelerator.no_sync(m.policy)
    with sync:
        logp, entropy = policy_forward(m.policy, fb, cfg.rollout.temperature, entropy=True, top_p=cfg.rollout.top_p,
                                       chunk=settings.chunk)
        if batch.fused and not pad:  # π_old is this very forward (one optimizer step): detached, ratio 1
            old = logp.detach().float()
            rows = torch.as_tensor(micro, dtype=torch.long, device=batch.old_logp.device)
            batch.old_logp[rows, : old.shape[1]] = torch.where(batch.within(micro, old.device), old, 0.0)
        loss, pstats = spec.policy_loss(logp, old.to(logp.device), adv.to(logp.device), loss_mask, acfg,
                                        ref_logp=None if ref is None else ref.to(logp.device), entropy=entropy,
                                        weights=is_weights)
        m.accelerator.backward(loss * weight)
    if pad:  # its collectives are done; its statistics are not the batch's
        if m.critic is not None:
            with contextlib.nullcontext() if last else m.accelerator.no_sync(m.critic):
                m.accelerator.backward(critic_forward(m.critic, fb).sum() * 0.0)
        return
    _accumulate(stats, pstats, weight, prefix="actor/")
    if m.critic is not None:
        assert batch.values is not None and batch.returns is not None
        old_v, returns = batch.rows(batch.values, micro), batch.rows(batch.returns, micro)  # [b, t] x2
        csync = contextlib.nullcontext() if last else m.accelerator.no_sync(m.critic)
        with csync:
            values = critic_forward(m.critic, fb)
            vloss, vstats = spec.value_loss(values, old_v.to(values.device), returns.to(values.device), fb.mask, acfg)
            m.accelerator.backward(vloss * critic_weight)
        _accumulate(stats, vstats, critic_weight, prefix="critic/")
