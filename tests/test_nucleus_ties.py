"""Issue 35.0: the trainer's nucleus is the sampler's when logits tie.

transformers' ``TopPLogitsWarper`` and vLLM's ``apply_top_k_top_p`` (its pytorch path) sort
the logits ascending with torch's default sort, drop the tokens whose cumulative mass is
``<= 1 - p`` and keep the last one; of several tokens tied at the boundary, those the sort puts
last are kept. The old ``models/nucleus.py`` sorted descending and kept while the mass ranked
above was ``< p``: the same set without ties, another one with them, so a sampled token the
sampler kept could fall outside the trainer's nucleus and get a logprob biased by a whole
tied token's mass. The vLLM side (its own function and the real engine) is in
tests/vllm/test_nucleus_ties.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import TopPLogitsWarper

from zsearch_cli.models import nucleus
from zsearch_cli.models.base import SamplingParams
from zsearch_cli.models.hf import pick_tokens
from zsearch_cli.models.nucleus import nucleus_mask
from zsearch_cli.train.logprobs import token_logprobs


def _hf_kept(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """transformers' nucleus: True where ``TopPLogitsWarper`` leaves the logit finite."""
    return TopPLogitsWarper(top_p)(None, logits.clone()) > float("-inf")


def test_two_tied_top_tokens_at_p_03_keep_token_1_by_hand():
    # logits [2, 2, 0, 0]: p = e²/(2e² + 2) = 0.4404 for tokens 0 and 1, 0.0596 for 2 and 3.
    # The samplers sort ascending: [0, 0, 2, 2] at indices [2, 3, 0, 1] (a 4-token row sorts
    # stably on the CPU), cumulative mass [0.0596, 0.1192, 0.5596, 1.0]. They drop every
    # token at <= 1 - 0.3 = 0.7, i.e. tokens 2, 3 and 0, and keep token 1 alone.
    # The old rule sorted descending ([0, 1, 2, 3]) and kept while the mass above was < 0.3:
    # token 0 alone (mass above 0), token 1 out (0.4404 above it).
    logits = torch.tensor([[2.0, 2.0, 0.0, 0.0]])
    assert nucleus_mask(logits, 0.3).tolist() == [[False, True, False, False]]
    assert _hf_kept(logits, 0.3).tolist() == [[False, True, False, False]]
    # The trainer's replay: token 1 is the whole nucleus, log 1 = 0 (the sampler's logprob).
    # Token 0 (never drawn by the samplers) is forced into the support: log(0.4404/0.8808).
    got = token_logprobs(logits[None], torch.tensor([[1]]), 1.0, top_p=0.3)
    assert got.item() == pytest.approx(0.0, abs=1e-6)  # the old rule gave log(1/2) = -0.693
    forced = token_logprobs(logits[None], torch.tensor([[0]]), 1.0, top_p=0.3)
    assert forced.item() == pytest.approx(math.log(0.5), abs=1e-6)
    # The HF backend's sampler draws from the same mask: token 1, logprob 0, whatever the draw.
    params = SamplingParams(max_new_tokens=1, temperature=1.0, top_p=0.3, seed=0)
    tokens, logprobs = pick_tokens(logits.expand(3, 4), params, torch.tensor([0.0, 0.5, 0.999]))
    assert tokens.tolist() == [1, 1, 1] and logprobs.tolist() == pytest.approx([0.0] * 3, abs=1e-6)


def _tied_bf16_logits(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """Random normal logits rounded to bf16 (8 significant bits), in fp32: ~30% of a
    1000-token row's values repeat, as with a bf16 model's logits."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g).bfloat16().float()


def _boundary_ties(logits: torch.Tensor, keep: torch.Tensor) -> int:
    """Rows whose boundary splits a group of equal logits (lowest kept == highest dropped)."""
    lowest_kept = logits.masked_fill(~keep, float("inf")).min(-1).values
    highest_dropped = logits.masked_fill(keep, float("-inf")).max(-1).values
    return int((lowest_kept == highest_dropped).sum())


@pytest.mark.parametrize("top_p", [0.1, 0.3, 0.5, 0.9, 0.95])
def test_nucleus_mask_is_transformers_top_p_on_tied_bf16_logits(top_p):
    logits = _tied_bf16_logits(64, 1000)  # [64, 1000]
    want = _hf_kept(logits, top_p)
    got = nucleus_mask(logits, top_p)
    assert torch.equal(got, want), f"{int((got != want).any(-1).sum())} of 64 rows keep another set"
    assert _boundary_ties(logits, want) >= 3  # not vacuous: the boundary splits ties
    # The one place the two samplers may differ without a tie: transformers compares with
    # fp32(1 - p), vLLM (and nucleus_mask) with 1 - fp32(p), a few ulps apart at 0.9 and 0.95.
    # No cumulative mass of these rows falls between the two, so the sets must be equal.
    cumulative = logits.sort(dim=-1).values.softmax(-1).cumsum(-1)
    hf_limit = torch.tensor(1 - top_p, dtype=torch.float32)
    ours = 1 - torch.tensor(top_p, dtype=torch.float32)
    lo, hi = min(hf_limit, ours), max(hf_limit, ours)
    assert not ((cumulative > lo) & (cumulative <= hi)).any()


def test_nucleus_mask_is_transformers_top_p_at_a_real_vocabulary_size():
    logits = _tied_bf16_logits(4, 151_936, seed=1) * 3  # Qwen2.5's vocabulary
    for top_p in (0.5, 0.9):
        assert torch.equal(nucleus_mask(logits, top_p), _hf_kept(logits, top_p))


def test_chunked_rows_and_shapes_give_the_same_mask(monkeypatch):
    logits = _tied_bf16_logits(64, 1000, seed=2)
    whole = nucleus_mask(logits, 0.9)
    monkeypatch.setattr(nucleus, "CHUNK_ROWS", 7)  # 10 chunks, the last one short
    assert torch.equal(nucleus_mask(logits, 0.9), whole)
    assert torch.equal(nucleus_mask(logits.view(8, 8, 1000), 0.9), whole.view(8, 8, 1000))
    assert torch.equal(nucleus_mask(logits.bfloat16(), 0.9), whole)  # upcast before the sort
