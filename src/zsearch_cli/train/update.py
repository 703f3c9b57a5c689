"""One training step's update: old/ref logprobs and values → advantages → K epochs of
mini-batches with gradient accumulation → optimizer steps (``algos/``; docs/methods.md §4).

Why old_logp is recomputed rather than taken from the sampler: HF/vLLM sampling numerics
differ from the training forward, so the ratio must compare two training forwards; the
sampler's logprobs only feed the ``logp_mismatch`` diagnostic.

Gradient accumulation reproduces the mini-batch loss exactly: sequence-averaged objectives
(GRPO family, GSPO, REINFORCE) weight each micro-batch by its share of sequences, the
token-averaged ones (PPO's policy and value losses) by its share of policy tokens.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from zsearch_cli.errors import ZsearchError
from zsearch_cli.train.logprobs import collate, critic_forward, pad_rows, policy_forward, split_rows
from zsearch_cli.train.models import reference_mode


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


def _chunks(idx: list[int], size: int) -> list[list[int]]:
    return [idx[i : i + size] for i in range(0, len(idx), size)]


@torch.no_grad()
def rollout_tensors(m: StepModels, trajs: list[dict[str, Any]], cfg: Any) -> dict[str, Any]:
    """Per-sample 1-D tensors over each response: ``old_logp`` (current policy, before the
    update), ``ref_logp`` (if there is a reference), ``values`` (if there is a critic), and
    the mean |sampler − recomputed| logprob over policy tokens (``logp_mismatch``)."""
    out: dict[str, Any] = {"old_logp": [], "ref_logp": [] if m.reference is not None else None,
                           "values": [] if m.critic is not None else None}
    diff_sum, diff_n = 0.0, 0
    for micro in _chunks(list(range(len(trajs))), cfg.micro_batch_size):
        part = [trajs[i] for i in micro]
        batch = collate(part, m.pad_id, m.device)
        lengths = [len(t["response_ids"]) for t in part]
        logp, _ = policy_forward(m.policy, batch, cfg.temperature)
        out["old_logp"] += split_rows(logp, lengths)
        sampler = pad_rows([torch.as_tensor(t["logprobs"], dtype=torch.float32) for t in part], batch.mask.shape[1])
        diff = (logp - sampler.to(logp.device)).abs()
        diff_sum += float(diff[batch.mask].sum())
        diff_n += int(batch.mask.sum())
        if m.reference is not None:
            with reference_mode(m.accelerator.unwrap_model(m.reference)) as ref:
                ref_logp, _ = policy_forward(ref, batch, cfg.temperature)
            out["ref_logp"] += split_rows(ref_logp, lengths)
        if m.critic is not None:
            out["values"] += split_rows(critic_forward(m.critic, batch), lengths)
    out["logp_mismatch"] = diff_sum / max(diff_n, 1)
    return out


def _padded(rows: list[Tensor], width: int) -> Tensor:
    return pad_rows(rows, width, 0.0, torch.float32)


def advantages(spec: Any, acfg: Any, trajs: list[dict[str, Any]], rt: dict[str, Any],
               accelerator: Any = None) -> dict[str, Any]:
    """Add ``adv`` (per sample: 0-dim for sequence algos, [R_i] for PPO) and ``returns``.

    With ``accelerator`` over several processes, hop groups (HRPO) span the whole batch:
    each process holds only its slice of the prompts, and a per-slice hop group would be a
    different (smaller, more often singleton) baseline than the paper's batch-wide I_h.
    Prompt groups need no gathering: all G samples of a prompt are on one process."""
    rewards = torch.tensor([t["reward"] for t in trajs], dtype=torch.float32)
    if spec.needs_critic:
        lengths = [len(t["response_ids"]) for t in trajs]
        width = max(1, max(lengths))
        mask = pad_rows([torch.as_tensor(t["loss_mask"], dtype=torch.bool) for t in trajs], width, False, torch.bool)
        old = _padded(rt["old_logp"], width)
        ref = _padded(rt["ref_logp"], width) if rt["ref_logp"] is not None else None
        values = _padded(rt["values"], width)
        adv, ret = spec.token_advantages(rewards.to(old.device), old, ref, values, mask.to(old.device), acfg)
        rt["adv"], rt["returns"] = split_rows(adv, lengths), split_rows(ret, lengths)
    else:
        group_ids = _group_keys(spec, trajs)
        if spec.group_by == "hop" and accelerator is not None and accelerator.num_processes > 1:
            adv = _batch_wide(spec, acfg, rewards, group_ids, accelerator)  # multi-process: unverified on GPUs
        else:
            adv = spec.advantages(rewards, group_ids, acfg)  # [N]
        rt["adv"], rt["returns"] = list(adv.unbind(0)), None
    return rt


def _batch_wide(spec: Any, acfg: Any, rewards: Tensor, group_ids: list[Any], accelerator: Any) -> Tensor:
    """Advantages over every process's samples (gathered in rank order); this process's slice."""
    from accelerate.utils import gather_object

    parts = gather_object([(rewards.tolist(), list(group_ids))])  # one (rewards, keys) per process
    start = sum(len(r) for r, _ in parts[: accelerator.process_index])
    all_rewards = torch.tensor([x for r, _ in parts for x in r], dtype=torch.float32)
    adv = spec.advantages(all_rewards, [k for _, ks in parts for k in ks], acfg)
    return adv[start : start + len(group_ids)]


def _group_keys(spec: Any, trajs: list[dict[str, Any]]) -> list[Any]:
    """What the algorithm groups by: the per-prompt group id, or (HRPO, ``group_by ==
    "hop"``) the hop count the stage's batch reward wrote to ``t["hops"]`` — HRPO has one
    sample per prompt, so its baseline comes from the batch's questions with the same h."""
    if spec.group_by != "hop":
        return [t["group_id"] for t in trajs]
    if any(t.get("hops") is None for t in trajs):
        raise ZsearchError(f"--algo {spec.name} groups by hop count, but the reward set no 'hops' on the "
                           "trajectories (it needs the proposer reward of `zsearch propose`)")
    return [int(t["hops"]) for t in trajs]


def _accumulate(total: dict[str, float], stats: dict[str, Tensor], weight: float) -> None:
    for k, v in stats.items():
        total[k] = total.get(k, 0.0) + weight * float(v)


def optimize(m: StepModels, spec: Any, acfg: Any, cfg: Any, trajs: list[dict[str, Any]],
             rt: dict[str, Any], step: int) -> dict[str, float]:
    """K epochs over seeded mini-batch orders; returns the stats averaged over optimizer steps."""
    n = len(trajs)
    mini = cfg.mini_batch_size or n
    token_level = spec.needs_critic  # PPO's losses are means over the batch's policy tokens
    tokens = [int(sum(t["loss_mask"])) for t in trajs]
    clip = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
    sums: dict[str, float] = {}
    updates = 0
    for epoch in range(cfg.ppo_epochs):
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 101 + epoch)
        order = torch.randperm(n, generator=gen).tolist() if cfg.ppo_epochs > 1 or mini < n else list(range(n))
        for mb in _chunks(order, mini):
            m.optimizer.zero_grad(set_to_none=True)
            if m.critic_optimizer is not None:
                m.critic_optimizer.zero_grad(set_to_none=True)
            denom = _token_denominator(m.accelerator, sum(tokens[i] for i in mb)) if token_level else len(mb)
            stats: dict[str, float] = {}
            micros = _chunks(mb, cfg.micro_batch_size)
            for j, micro in enumerate(micros):
                weight = (sum(tokens[i] for i in micro) if token_level else len(micro)) / denom
                _micro_step(m, spec, acfg, cfg, trajs, rt, micro, weight, stats, last=j == len(micros) - 1)
            # The parameter lists are taken after the backward, not once per step: FSDP2 swaps
            # unsharded tensors in and out around forwards, so an earlier list can be stale.
            grad_norm = m.accelerator.clip_grad_norm_(_trainable(m.policy), clip)
            stats["grad_norm"] = float(grad_norm)
            m.optimizer.step()
            if m.critic is not None:
                stats["critic_grad_norm"] = float(m.accelerator.clip_grad_norm_(_trainable(m.critic), clip))
                m.critic_optimizer.step()
            _accumulate(sums, {k: torch.tensor(v) for k, v in stats.items()}, 1.0)
            updates += 1
    m.optimizer.zero_grad(set_to_none=True)
    return {k: v / max(updates, 1) for k, v in sums.items()}


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


def _micro_step(m: StepModels, spec: Any, acfg: Any, cfg: Any, trajs: list[dict[str, Any]], rt: dict[str, Any],
                micro: list[int], weight: float, stats: dict[str, float], last: bool) -> None:
    """Forward + backward of one micro-batch, its loss scaled by ``weight``."""
    part = [trajs[i] for i in micro]
    batch = collate(part, m.pad_id, m.device)
    width = batch.mask.shape[1]
    old = _padded([rt["old_logp"][i] for i in micro], width)
    ref = _padded([rt["ref_logp"][i] for i in micro], width) if rt["ref_logp"] is not None else None
    if spec.needs_critic:
        adv = _padded([rt["adv"][i] for i in micro], width)  # [b, T]
    else:
        adv = torch.stack([rt["adv"][i] for i in micro])  # [b]
    sync = contextlib.nullcontext() if last else m.accelerator.no_sync(m.policy)
    with sync:
        logp, entropy = policy_forward(m.policy, batch, cfg.temperature, entropy=True)
        loss, pstats = spec.policy_loss(logp, old.to(logp.device), adv.to(logp.device), batch.mask, acfg,
                                        ref_logp=None if ref is None else ref.to(logp.device), entropy=entropy)
        m.accelerator.backward(loss * weight)
    _accumulate(stats, pstats, weight)
    if m.critic is not None:
        old_v = _padded([rt["values"][i] for i in micro], width)
        returns = _padded([rt["returns"][i] for i in micro], width)
        csync = contextlib.nullcontext() if last else m.accelerator.no_sync(m.critic)
        with csync:
            values = critic_forward(m.critic, batch)
            vloss, vstats = spec.value_loss(values, old_v.to(values.device), returns.to(values.device), batch.mask, acfg)
            m.accelerator.backward(vloss * weight)
        _accumulate(stats, vstats, weight)
