"""The top-p (nucleus) support, one rule for the sampler and the trainer (docs/methods.md §4.1).

The rule is the samplers' own, operation for operation, so that equal logits give the same
set, ties at the boundary included. transformers' ``TopPLogitsWarper.__call__``
(``generation/logits_process.py``) and vLLM's ``apply_top_k_top_p_pytorch``
(``v1/sample/ops/topk_topp_sampler.py``, the path its CPU build runs) both:

1. sort the fp32 logits ascending, ``logits.sort(dim=-1, descending=False)`` (torch's default,
   ``stable=False``);
2. take ``cumsum(softmax(sorted))`` along that order;
3. drop every token whose cumulative mass is ``<= 1 − p``;
4. keep the last (largest) token whatever (``min_tokens_to_keep = 1``).

Tokens tied at the boundary are kept or dropped by their place in that sort, so the set depends
on how torch's sort orders equal values, and that is the device's: on CUDA a vocabulary of more
than 32 tokens is sorted stably (radix / merge sort), so the tied tokens of higher index come
later and are the ones kept; on the CPU an fp32 sort that is not asked to be stable is
x86-simd-sort's vectorised quicksort (AVX2 / AVX-512; ``std::sort`` elsewhere), whose order of
equal values is neither index order nor its reverse, but is a fixed function of the row's values
(and of the CPU capability torch dispatches to). So this module makes the very same call, never
``stable=True``: on the same device, equal rows give equal sets. The old rule (descending sort,
keep while the mass ranked above is ``< p``) is the same set in exact arithmetic without ties, but
kept the other tied tokens (``[2, 2, 0, 0]`` at p = 0.3: token 0, where the samplers keep token 1).

``1 − p`` is computed as vLLM computes it, in fp32 from p rounded to fp32 (its top-p is an fp32
tensor); transformers rounds ``1 − p`` computed in double, which differs by a few fp32 ulps at
some p (0.9, 0.95): a cumulative mass that falls exactly between the two is the one place the two
samplers can disagree without a tie.

The HF backend's sampler draws from this mask (``models/hf.py``) and the trainer replays it on
its own logits (:func:`zsearch_cli.train.logprobs.token_logprobs`), so that the behaviour and the
target logprobs of the importance ratio are taken over the same, renormalised distribution.
Not replayed: vLLM's Triton kernel (``apply_top_k_top_p_triton``, taken instead whenever Triton
is importable, i.e. on CUDA), which finds the boundary by a pivot search and keeps the tied
tokens of *lowest* index.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ROWS = 2048
"""Rows sorted at a time: a sort of [N, V] logits needs a copy of them and int64 indices
(12 bytes per entry); 2048 rows of a 152k vocabulary is ~3.7 GB at most, not N times that."""


@torch.no_grad()
def nucleus_mask(logits: Tensor, top_p: float) -> Tensor:
    """[..., V] logits (already divided by the temperature) -> [..., V] bool, True inside the
    nucleus: the smallest set of most likely tokens whose mass reaches ``top_p`` (≥ 1 token),
    ties at the boundary broken as the samplers break them (see the module docstring)."""
    shape = logits.shape
    flat = logits.detach().reshape(-1, shape[-1])  # [N, V]
    keep = torch.empty(flat.shape, dtype=torch.bool, device=flat.device)  # [N, V]
    # vLLM: `probs_sum <= 1 - p` with p an fp32 tensor, so 1 − fp32(p), in fp32
    limit = 1 - torch.tensor(top_p, dtype=torch.float32)  # 0-dim, fp32
    for start in range(0, flat.shape[0], CHUNK_ROWS):
        rows = flat[start : start + CHUNK_ROWS].float()  # [C, V]
        sorted_logits, order = rows.sort(dim=-1, descending=False)  # the samplers' call: not stable=True
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # [C, V], ascending
        dropped = cumulative <= limit
        dropped[:, -1] = False  # the most likely token stays
        keep[start : start + CHUNK_ROWS] = ~dropped.scatter(-1, order, dropped)
    return keep.reshape(shape)


def filter_top_p(logits: Tensor, top_p: float) -> Tensor:
    """``logits`` with every token outside the nucleus set to −inf (differentiable in the rest)."""
    return logits.masked_fill(~nucleus_mask(logits, top_p), float("-inf"))
