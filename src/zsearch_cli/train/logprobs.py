"""From trajectories to per-token tensors: right-padded or packed batches, response logprobs, values.

Three layouts of the same samples, one forward each (docs/methods.md §8; :data:`LAYOUTS`):

- **Padded** (``masked``, or ``causal`` without the mask): each row is ``prompt_ids +
  response_ids`` right-padded to the longest row. Response token t of sample i sits at
  position P_i + t and is predicted by the logits at P_i + t − 1, so ``resp_pos[i, t] = P_i + t − 1``.
  Causal attention never reads a position to its right, so for right-padded rows the
  attention mask changes nothing a real token sees: ``causal`` drops it, which lets sdpa run
  its causal kernel instead of a masked one (25% of a forward's time on CPU, measured).
- **Packed**: the samples are concatenated into one row with ``position_ids`` restarting at 0
  at each sample and no attention mask; transformers reads the restarts as sample boundaries
  and confines attention to each sample (``masking_utils.find_packed_sequence_indices`` for
  sdpa/eager/flex, ``cu_seqlens`` for flash-attention's varlen kernels). Sample i starts at
  offset o_i, so ``resp_pos[i, t] = o_i + P_i + t − 1``.

Everything is returned in the response frame ``[B, T]`` (T = longest response), the frame
``algos/`` works in. ``mask`` there is the trajectory's loss mask (1 = sampled by the policy)
and 0 on padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from zsearch_cli.models.nucleus import nucleus_mask

PACKED, CAUSAL, MASKED = "packed", "causal", "masked"
LAYOUTS = (PACKED, CAUSAL, MASKED)
"""How a micro-batch's samples meet the model: one packed row; right-padded rows without an
attention mask (exact for causal attention); right-padded rows with their mask (any model)."""


@dataclass
class Batch:
    input_ids: Tensor  # [B, L] long, right-padded; packed: [1, S], the samples back to back
    attention_mask: Tensor | None  # [B, L] long; packed: None (position_ids mark the samples)
    resp_pos: Tensor  # [B, T] long: the position (in its row) of the logit that predicts response token t
    targets: Tensor  # [B, T] long: the response token ids (pad where t >= R_i)
    mask: Tensor  # [B, T] bool: loss mask I_t (False on observations and padding)
    keep_from: int = 0
    """First position whose logits are needed (min_i P_i − 1): the LM head skips the prompts."""
    position_ids: Tensor | None = None
    """Packed only: [1, S] long, 0, 1, ... restarting at each sample."""

    @property
    def size(self) -> int:
        """B, the samples (not the rows: a packed batch has one row)."""
        return self.resp_pos.shape[0]

    @property
    def packed(self) -> bool:
        return self.position_ids is not None

    def model_inputs(self) -> dict[str, Tensor | None]:
        """What the model is called with: the padded rows and their mask (None: causal attention
        alone), or the packed row and its restarting positions (and no mask, which is how
        transformers detects packing)."""
        if self.packed:
            return {"input_ids": self.input_ids, "position_ids": self.position_ids, "attention_mask": self.attention_mask}
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask}


def pack(seqs: Sequence[Tensor], prompt_lengths: Sequence[int], t_width: int, targets: Tensor, mask: Tensor) -> Batch:
    """Concatenate 1-D ``prompt + response`` id tensors into one packed row.

    ``targets``/``mask``: [B, t_width], the samples' response frame (as the padded layout's)."""
    lengths = [int(s.numel()) for s in seqs]
    device = seqs[0].device
    offsets = [0]
    for n in lengths[:-1]:
        offsets.append(offsets[-1] + n)
    input_ids = torch.cat(list(seqs))[None]  # [1, S]
    position_ids = torch.cat([torch.arange(n, device=device) for n in lengths])[None]  # [1, S]
    resp_pos = torch.zeros((len(seqs), t_width), dtype=torch.long, device=device)  # [B, T]
    for i, (o, p, n) in enumerate(zip(offsets, prompt_lengths, lengths)):
        r = n - p
        resp_pos[i, :r] = torch.arange(o + p - 1, o + p - 1 + r, device=device)
        resp_pos[i, r:] = o  # padding of the response frame: any valid position (masked)
    return Batch(input_ids, None, resp_pos, targets, mask, keep_from=0, position_ids=position_ids)


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


def at_least_fp32(x: Tensor) -> Tensor:
    """bf16/fp16 logits in fp32 for the softmax; fp32 and fp64 as they are (the fp64 tests
    compare paths to 1e-10, which an fp32 cast would hide)."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def response_logits(model: Any, batch: Batch, only: Tensor | None = None) -> Tensor:
    """The logits that predict each response token: [B, T, V] (model dtype), or with ``only``
    ([B, T] bool) those of the selected positions alone, [M, V] in row-major order.

    The LM head runs only from ``keep_from`` on (``logits_to_keep``): prompt positions need no
    logits, and on a 49k-vocabulary model they are most of the head's time and memory. Packed,
    it runs on the needed positions alone (``logits_to_keep`` as a tensor of positions)."""
    if batch.packed:
        keep = batch.resp_pos[only] if only is not None else batch.resp_pos.reshape(-1)  # [M] or [B*T]
        logits = model(**batch.model_inputs(), use_cache=False, logits_to_keep=keep).logits[0]  # [M or B*T, V]
        return logits if only is not None else logits.view(*batch.resp_pos.shape, -1)
    width = batch.input_ids.shape[1]
    logits = model(**batch.model_inputs(), use_cache=False,
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
    z = at_least_fp32(logits)
    if temperature != 1.0:
        z = z / temperature
    if top_p < 1.0:
        keep = nucleus_mask(z, top_p)  # [B, T, V], no grad: the support is not differentiated
        keep.scatter_(-1, targets[..., None], True)
        z = z.masked_fill(~keep, float("-inf"))
    return z.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)


def policy_forward(model: Any, batch: Batch, temperature: float, entropy: bool = False,
                   top_p: float = 1.0, chunk: int | None = 0) -> tuple[Tensor, Tensor | None]:
    """(logp [B, T], entropy [B, T] or None), both 0 off the policy tokens (``batch.mask``).
    Gradient flows through logp when enabled; the entropy is a logged statistic of the
    tempered distribution over the whole vocabulary, computed without grad. ``top_p``: see
    :func:`token_logprobs`.

    Only the policy tokens' logits are normalised: every consumer masks by I_t, and in a
    search agent's response the retrieved passages are often most of the tokens, each a
    vocabulary-wide log-softmax (and its backward) that no objective reads. At top_p = 1 the
    entropy reuses the log-softmax the logprobs took.

    ``chunk`` (``--logits-chunk``): 0 runs the whole head; otherwise the LM head runs on the
    policy positions' final hidden states ``chunk`` rows at a time (None: train/lm_head.py's
    default), recomputed in the backward pass, so no ``[M, V]`` tensor exists whole; the same
    numbers (docs/methods.md §8)."""
    sel = batch.mask  # [B, T] bool
    if chunk != 0:
        return _chunked_policy_forward(model, batch, temperature, entropy, top_p, chunk)
    z = at_least_fp32(response_logits(model, batch, only=sel))  # [M, V]
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


def _chunked_policy_forward(model: Any, batch: Batch, temperature: float, entropy: bool, top_p: float,
                            chunk: int | None) -> tuple[Tensor, Tensor | None]:
    """:func:`policy_forward` through the chunked head: the final hidden states of the policy
    positions (``[M, d]``) in, ``(logp, entropy)`` in the response frame out."""
    from zsearch_cli.train.lm_head import chunked_logprobs, final_hidden

    sel = batch.mask  # [B, T] bool
    if batch.packed:  # the head's input at exactly the policy positions: [1, M, d]
        hidden = final_hidden(model, batch.input_ids, batch.attention_mask, logits_to_keep=batch.resp_pos[sel],
                              position_ids=batch.position_ids)[0]  # [M, d]
    else:
        width = batch.input_ids.shape[1]
        states = final_hidden(model, batch.input_ids, batch.attention_mask, width - batch.keep_from)  # [B, L - k, d]
        pos = (batch.resp_pos - batch.keep_from).clamp_min(0)  # [B, T]
        rows = torch.arange(batch.size, device=pos.device)[:, None].expand_as(pos)  # [B, T]
        hidden = states[rows[sel], pos[sel]]  # [M, d]
    picked, h = chunked_logprobs(model, hidden, batch.targets[sel], temperature, top_p, entropy, chunk)  # [M] x2
    logp = torch.zeros(sel.shape, dtype=picked.dtype, device=picked.device).masked_scatter(sel, picked)  # [B, T]
    ent = None if h is None else torch.zeros(sel.shape, dtype=h.dtype, device=h.device).masked_scatter(sel, h)
    return logp, ent


def critic_forward(critic: Any, batch: Batch) -> Tensor:
    """V at the position that predicts each response token (verl's alignment): [B, T]."""
    if batch.packed:
        values = critic(batch.input_ids, None, position_ids=batch.position_ids)  # [1, S]
        return values[0, batch.resp_pos]
    values = critic(batch.input_ids, batch.attention_mask)  # [B, L]
    rows = torch.arange(batch.size, device=values.device)[:, None]
    return values[rows, batch.resp_pos]


PROBE_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4, torch.bfloat16: 0.1, torch.float16: 0.05}
"""|Δ logprob| allowed between a layout and separate forwards, per dtype: the kernels' rounding
on other shapes (eager attention takes its softmax in fp32 even in an fp64 model: 1e-8 apart,
measured). A leak across samples moves the probe's second sample by nats, not by these."""

VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "kernels-community/flash-attn",
                    "kernels-community/flash-attn3", "kernels-community/vllm-flash-attn3")
"""Attention implementations whose packed forward computes each sample's own attention only
(``cu_seqlens``). sdpa and eager compute a packed row's whole L × L attention and mask the
cross-sample blocks: exact, but for search-agent lengths (thousands of tokens a sample) that is
more work than the padding it removes (n samples of similar length packed cost about n× their
attention alone; on CPU a packed update of smollm2 took 1.45× the padded one, measured)."""


@torch.no_grad()
def layout_probe(model: Any, vocab_size: int, device: Any, layout: str) -> float:
    """max |Δ logprob| between two samples run in ``layout`` (packed into one row, or right-
    padded rows without a mask) and the same samples run alone.

    Packing is exact only where the model's attention honours the restarting ``position_ids``
    (transformers' mask utilities and flash-attention's varlen path do; a model with its own
    attention code may attend across samples); dropping the mask of right-padded rows only where
    attention is causal. The first sample is long (32 tokens) and the second short (4), so a
    leak dominates the second sample's attention (packed), or the padding dominates it (causal)."""
    gen = torch.Generator().manual_seed(0)
    first = torch.randint(0, vocab_size, (32,), generator=gen).to(device)
    second = torch.randint(0, vocab_size, (4,), generator=gen).to(device)
    alone = []
    for seq in (first, second):
        logits = model(input_ids=seq[None], use_cache=False).logits[0]  # [n, V]
        alone.append(at_least_fp32(logits).log_softmax(-1))
    if layout == PACKED:
        both = torch.cat([first, second])[None]  # [1, 36]
        positions = torch.cat([torch.arange(32), torch.arange(4)]).to(device)[None]
        out = at_least_fp32(model(input_ids=both, position_ids=positions, attention_mask=None,
                                  use_cache=False).logits[0]).log_softmax(-1)  # [36, V]
        got = (out[:32], out[32:])
    else:  # causal: the short sample right-padded with other ids (a leak would read them)
        padding = torch.randint(0, vocab_size, (28,), generator=gen).to(device)
        rows = torch.stack([first, torch.cat([second, padding])])  # [2, 32]
        out = at_least_fp32(model(input_ids=rows, attention_mask=None, use_cache=False).logits).log_softmax(-1)
        got = (out[0], out[1, :4])
    return max(float((g - a).abs().max()) for g, a in zip(got, alone))


def resolve_layout(choice: str, model: Any, vocab_size: int, device: Any, dtype: torch.dtype,
                   attention: str | None) -> tuple[str, str]:
    """``--pack auto|on|off`` -> (a :data:`LAYOUTS` entry, one line saying why).

    ``on`` packs, and refuses a model where the probe shows packing inexact (ZsearchError).
    ``auto`` packs where the model's ``attention`` implementation is a varlen kernel
    (:data:`VARLEN_ATTENTION`) and the probe shows it exact. Otherwise the rows are right-padded,
    without the attention mask where the probe shows attention causal (``causal``), with it
    where not (``masked``)."""
    from zsearch_cli.errors import ZsearchError

    tolerance = PROBE_TOLERANCE.get(dtype, 1e-4)
    if choice == "on" or (choice == "auto" and attention in VARLEN_ATTENTION):
        gap = layout_probe(model, vocab_size, device, PACKED)
        if gap <= tolerance:
            return PACKED, f"packing on: packed = separate forwards within {gap:.1e} (<= {tolerance:g} for {dtype})"
        line = (f"packing would change the logprobs by {gap:.2e} (> {tolerance:g} for {dtype}): this model's "
                "attention does not confine itself to each packed sample")
        if choice == "on":
            raise ZsearchError(f"--pack on: {line}; use --pack off (or auto)")
        why = f"packing off (--pack auto): {line}"
    elif choice == "auto":
        why = (f"packing off (--pack auto): {attention or 'this'} attention computes a packed row's whole "
               "L x L attention (only flash-attention's varlen kernels skip the other samples)")
    else:
        why = "packing off (--pack off)"
    gap = layout_probe(model, vocab_size, device, CAUSAL)
    if gap <= tolerance:
        return CAUSAL, f"{why}; right-padded rows, causal attention without a mask (= separate forwards within {gap:.1e})"
    return MASKED, f"{why}; right-padded rows with their attention mask (attention is not causal: {gap:.2e})"
