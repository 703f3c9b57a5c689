"""From trajectories to per-token tensors: right-padded batches, response logprobs, values.

Layout: each row is ``prompt_ids + response_ids`` right-padded to the longest row, run in
one forward. Response token t of row i sits at position P_i + t and is predicted by the
logits at P_i + t − 1, so ``resp_pos[i, t] = P_i + t − 1``; everything is returned in the
response frame ``[B, T]`` (T = longest response), which is the frame ``algos/`` works in.
``mask`` there is the trajectory's loss mask (1 = sampled by the policy) and 0 on padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from zsearch_cli.models.nucleus import nucleus_mask


@dataclass
class Batch:
    input_ids: Tensor  # [B, L] long, right-padded
    attention_mask: Tensor  # [B, L] long
    resp_pos: Tensor  # [B, T] long: the logit position that predicts response token t
    targets: Tensor  # [B, T] long: the response token ids (pad where t >= R_i)
    mask: Tensor  # [B, T] bool: loss mask I_t (False on observations and padding)
    keep_from: int = 0
    """First position whose logits are needed (min_i P_i − 1): the LM head skips the prompts."""

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]


def pad_rows(rows: Sequence[Tensor], width: int, value: float = 0.0, dtype: torch.dtype | None = None) -> Tensor:
    """Stack 1-D tensors into [len(rows), width], right-padded with ``value``."""
    out = torch.full((len(rows), width), value, dtype=dtype or rows[0].dtype, device=rows[0].device)
    for i, r in enumerate(rows):
        out[i, : r.numel()] = r
    return out


class TokenSequence(Protocol):
    """What :func:`collate` reads: a :class:`~zsearch_cli.rollout.trajectory.Trajectory`, or
    any record with the same three token fields."""

    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    loss_mask: Sequence[int]


def collate(trajs: Sequence[TokenSequence], pad_id: int, device: torch.device | str) -> Batch:
    """Right-pad ``prompt_ids + response_ids`` of each trajectory (one forward per batch)."""
    seqs = [list(t.prompt_ids) + list(t.response_ids) for t in trajs]
    width = max(len(s) for s in seqs)
    t_max = max(1, max(len(t.response_ids) for t in trajs))
    b = len(trajs)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    resp_pos = torch.zeros((b, t_max), dtype=torch.long)
    targets = torch.full((b, t_max), pad_id, dtype=torch.long)
    mask = torch.zeros((b, t_max), dtype=torch.bool)
    for i, (t, seq) in enumerate(zip(trajs, seqs)):
        p, r = len(t.prompt_ids), len(t.response_ids)
        input_ids[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
        attention[i, : len(seq)] = 1
        resp_pos[i, :r] = torch.arange(p - 1, p - 1 + r)
        targets[i, :r] = torch.as_tensor(list(t.response_ids), dtype=torch.long)
        mask[i, :r] = torch.as_tensor(list(t.loss_mask), dtype=torch.bool)
    keep_from = max(0, min(len(t.prompt_ids) for t in trajs) - 1)
    return Batch(input_ids.to(device), attention.to(device), resp_pos.to(device), targets.to(device), mask.to(device),
                 keep_from)


def response_logits(model: Any, batch: Batch, only: Tensor | None = None) -> Tensor:
    """The logits that predict each response token: [B, T, V] (model dtype), or with ``only``
    ([B, T] bool) those of the selected positions alone, [M, V] in row-major order.

    The LM head runs only from ``keep_from`` on (``logits_to_keep``): prompt positions need no
    logits, and on a 49k-vocabulary model they are most of the head's time and memory."""
    width = batch.input_ids.shape[1]
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False,
                   logits_to_keep=width - batch.keep_from).logits  # [B, L - keep_from, V]
    pos = (batch.resp_pos - batch.keep_from).clamp_min(0)  # [B, T]
    rows = torch.arange(batch.size, device=logits.device)[:, None].expand_as(pos)  # [B, T]
    if only is not None:
        return logits[rows[only], pos[only]]  # [M, V]
    return logits[rows, pos]  # [B, T, V]; padding is masked


def token_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0, top_p: float = 1.0) -> Tensor:
    """log π(y_t) under the distribution the sampler draws from (as verl's actor, plus the
    nucleus): logits [B, T, V], targets [B, T] -> [B, T] float32.

    With ``top_p < 1`` the trainer replays the sampler's top-p filter on its own logits
    (:func:`zsearch_cli.models.nucleus.nucleus_mask`) and renormalises over the nucleus, as the
    sampler's logprobs are (vLLM's ``processed_logprobs``, the HF backend's): without it, a
    ratio between the sampler's logprob and the trainer's would carry a factor of 1/(nucleus
    mass) per token, a bias and not a policy change (docs/methods.md §4.1). The sampled token
    is always kept in the support: it was sampled, so it lay inside the sampler's nucleus, and
    a kernel-level rounding gap at the boundary must not give it probability 0 (−inf)."""
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    if top_p < 1.0:
        keep = nucleus_mask(z, top_p)  # [B, T, V], no grad: the support is not differentiated
        keep.scatter_(-1, targets[..., None], True)
        z = z.masked_fill(~keep, float("-inf"))
    return z.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)


def policy_forward(model: Any, batch: Batch, temperature: float, entropy: bool = False,
                   top_p: float = 1.0) -> tuple[Tensor, Tensor | None]:
    """(logp [B, T], entropy [B, T] or None), both 0 off the policy tokens (``batch.mask``).
    Gradient flows through logp when enabled; the entropy is a logged statistic of the
    tempered distribution over the whole vocabulary, computed without grad. ``top_p``: see
    :func:`token_logprobs`.

    Only the policy tokens' logits are normalised: every consumer masks by I_t, and in a
    search agent's response the retrieved passages are often most of the tokens, each a
    vocabulary-wide log-softmax (and its backward) that no objective reads. At top_p = 1 the
    entropy reuses the log-softmax the logprobs took."""
    sel = batch.mask  # [B, T] bool
    z = response_logits(model, batch, only=sel).float()  # [M, V]
    if temperature != 1.0:
        z = z / temperature
    targets = batch.targets[sel]  # [M]
    # the full log-softmax only where it is read: the logprobs at top_p = 1, the entropy always
    full = z.log_softmax(-1) if top_p >= 1.0 or entropy else None  # [M, V]
    if top_p < 1.0:
        picked = token_logprobs(z, targets, 1.0, top_p)  # [M]: the nucleus, already tempered
    else:
        picked = full.gather(-1, targets[:, None]).squeeze(-1)  # [M]
    logp = torch.zeros(sel.shape, dtype=picked.dtype, device=picked.device).masked_scatter(sel, picked)  # [B, T]
    ent = None
    if entropy:
        with torch.no_grad():
            assert full is not None
            lsm = full.detach()
            # H = -sum p log p; a token of probability 0 (a -inf logit) adds 0, not 0 * -inf
            h = -(lsm.exp() * lsm.clamp_min(torch.finfo(lsm.dtype).min)).sum(-1)  # [M]
            ent = torch.zeros(sel.shape, dtype=h.dtype, device=h.device).masked_scatter(sel, h)  # [B, T]
    return logp, ent


def critic_forward(critic: Any, batch: Batch) -> Tensor:
    """V at the position that predicts each response token (verl's alignment): [B, T]."""
    values = critic(batch.input_ids, batch.attention_mask)  # [B, L]
    rows = torch.arange(batch.size, device=values.device)[:, None]
    return values[rows, batch.resp_pos]
