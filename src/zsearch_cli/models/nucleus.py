"""The top-p (nucleus) support, one rule for the sampler and the trainer (docs/methods.md §4.1).

A token is kept when the probability mass of the tokens ranked above it is below ``top_p``
(so the most likely token is always kept): the HF backend's sampler draws from it, vLLM's
``apply_top_k_top_p`` keeps the same set (it drops the ascending-sorted tokens whose
cumulative mass is at most 1 − p), and the trainer replays it on its own logits
(:func:`zsearch_cli.train.logprobs.token_logprobs`), so that the behaviour and the target
logprobs of the importance ratio are taken over the same, renormalised distribution.
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
    nucleus: the smallest set of most likely tokens whose mass reaches ``top_p`` (≥ 1 token)."""
    shape = logits.shape
    flat = logits.detach().reshape(-1, shape[-1])  # [N, V]
    keep = torch.empty(flat.shape, dtype=torch.bool, device=flat.device)  # [N, V]
    for start in range(0, flat.shape[0], CHUNK_ROWS):
        rows = flat[start : start + CHUNK_ROWS].float()
        sorted_logits, order = rows.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
        kept_sorted = mass_before < top_p
        kept_sorted[:, 0] = True
        keep[start : start + CHUNK_ROWS] = torch.zeros_like(kept_sorted).scatter(-1, order, kept_sorted)
    return keep.reshape(shape)


def filter_top_p(logits: Tensor, top_p: float) -> Tensor:
    """``logits`` with every token outside the nucleus set to −inf (differentiable in the rest)."""
    return logits.masked_fill(~nucleus_mask(logits, top_p), float("-inf"))
