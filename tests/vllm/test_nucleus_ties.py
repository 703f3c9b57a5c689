"""Issue 35.0: the trainer's nucleus is the sampler's when logits tie, on the real vLLM CPU build.

vLLM's sampler (``TopKTopPSampler.forward_cpu`` on the CPU, ``forward_native`` on CUDA when
processed logprobs are asked for, as zsearch does) filters with ``apply_top_k_top_p``, which
runs ``apply_top_k_top_p_pytorch`` when Triton is not importable (this CPU build) and the Triton
kernel otherwise. The pytorch path sorts ascending with torch's default, unstable, sort, drops
the tokens whose cumulative mass is ``<= 1 - p`` and keeps the last: which of several tied
tokens stay is decided by that sort's order of equal values. ``models/nucleus.py`` makes the
same call, so the kept set is the same, ties included; the old rule (descending sort, mass
above ``< p``) kept other tied tokens, and a sampled token outside its set got the wrong logprob.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zsearch_cli.models.base import SamplingParams
from zsearch_cli.models.nucleus import nucleus_mask
from zsearch_cli.train.logprobs import token_logprobs

TIED = list(range(20, 20 + 13 * 40, 13))
"""40 token ids, spread over the vocabulary, whose next-token logits are planted equal (5.0)."""
TOP_P = 0.3
"""Inside the tied group: 14 of the 40 tied tokens make up the nucleus, the other 26 are out."""


def test_vllm_top_p_is_the_pytorch_sort_rule_on_this_build():
    # Which implementation the engine runs: no Triton on the CPU build, so the pytorch one.
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    assert current_platform.is_cpu() and not HAS_TRITON


@pytest.mark.parametrize("top_p", [0.1, 0.3, 0.5, 0.9, 0.95])
def test_nucleus_mask_is_vllm_apply_top_k_top_p_on_tied_bf16_logits(top_p):
    # vLLM's own function on random logits rounded to bf16 (so ~30% of the values of a row
    # repeat): the kept sets are identical, row for row.
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=g).bfloat16().float()  # [64, 1000]
    p = torch.full((64,), top_p, dtype=torch.float32)  # vLLM's top-p is an fp32 tensor
    want = apply_top_k_top_p(logits.clone(), None, p) > float("-inf")  # [64, 1000]
    got = nucleus_mask(logits, top_p)
    assert torch.equal(got, want), f"{int((got != want).any(-1).sum())} of 64 rows keep another set"
    # Not vacuous: rows where the boundary splits a group of equal logits.
    lowest_kept = logits.masked_fill(~want, float("inf")).min(-1).values
    highest_dropped = logits.masked_fill(want, float("-inf")).max(-1).values
    assert (lowest_kept == highest_dropped).sum() >= 3


@pytest.fixture(scope="module")
def tied_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 whose next-token logits are the same at every position and tie exactly:
    the layers' output projections are zero, so the residual stream is the token embedding;
    every embedding is e_0, so the final hidden state is RMSNorm(e_0) = h0·e_0 (h0 ≈ 8); the
    untied LM head has W[v, 0] = 5/8 for the :data:`TIED` tokens and 0 elsewhere, so their
    logits are the one product fl(5/8 · h0) (≈ 5.0) and all the others are exactly 0."""
    from transformers import AutoConfig, Qwen2ForCausalLM

    from zsearch_cli.models.tiny import VLLM_CPU_HEADS, make_tiny_model

    out = make_tiny_model(tmp_path_factory.mktemp("vllm_tied"), seed=0, **VLLM_CPU_HEADS)
    config = AutoConfig.from_pretrained(out)
    config.tie_word_embeddings = False
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        model.lm_head.weight.zero_()
        model.lm_head.weight[TIED, 0] = 5.0 / 8
    model.save_pretrained(out)
    return out


def test_vllm_processed_logprobs_equal_the_trainer_replay_at_a_planted_tie(tied_model_dir, monkeypatch):
    from transformers import Qwen2ForCausalLM

    from zsearch_cli.models.vllm import VLLMBackend

    prompts = [[5, 17, 33, 8], [9, 40, 12], [100, 200, 300, 400, 500], [7]]
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=TOP_P, seed=11)
    from vllm.v1.sample.ops import topk_topp_sampler

    # as on CUDA, where Triton is installed: the engine must switch its sampler to the sort path
    # the trainer replays (models/vllm.py, use_replayable_nucleus), or it would call the kernel
    monkeypatch.setattr(topk_topp_sampler, "HAS_TRITON", True)
    engine = VLLMBackend(str(tied_model_dir), seed=0, max_model_len=256)
    assert topk_topp_sampler.HAS_TRITON is False
    try:
        outs = engine.generate(prompts, params)
    finally:
        engine.close()
    model = Qwen2ForCausalLM.from_pretrained(tied_model_dir, dtype=torch.float32)
    sampled = set()
    for prompt, out in zip(prompts, outs):
        assert len(out.token_ids) == params.max_new_tokens
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1].float()  # [16, V]
        # The plant: the 40 tokens tie exactly at every position and the boundary splits them.
        assert (logits[:, TIED] == logits[:1, TIED[:1]]).all()
        keep = nucleus_mask(logits, TOP_P)  # [16, V]
        assert (keep[:, TIED].sum(-1) == 14).all() and keep.sum(-1).eq(14).all()
        targets = torch.tensor(out.token_ids)
        replay = token_logprobs(logits[None], targets[None], 1.0, TOP_P)[0]  # [16]
        # vLLM's processed logprob of each sampled token: log(1/14) inside its nucleus. The
        # trainer's replay is the same when its nucleus holds the token; outside it, the token
        # is added to the support and gets log(1/15).
        assert out.logprobs == pytest.approx(replay.tolist(), abs=1e-5)
        assert keep.gather(-1, targets[:, None]).all()
        sampled |= set(out.token_ids)
    # Not vacuous: many of the 14 kept tokens were drawn (a rule that kept 14 others of the
    # 40 would miss most of them).
    assert sampled <= set(TIED) and len(sampled) >= 8
