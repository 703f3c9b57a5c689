"""The chunked LM head (train/lm_head.py) against the whole-logits computation.

The reference is what ``train/logprobs.py``'s ``policy_forward`` does with the ``[M, V]``
logits (divide by T, replay the nucleus with the sampled token forced in, log-softmax, gather;
the entropy of the full tempered distribution), written out here in the logits' own dtype:
in float64 the two paths must agree to 1e-6 in the values and in every gradient. A last test
checks the same against ``policy_forward`` itself, in fp32. Models are tiny random Qwen2 and
Llama (smollm2's architecture) built from configs, so the whole file runs in seconds.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from helpers import TORCH_THREADS
from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.nucleus import nucleus_mask
from zsearch_cli.train.lm_head import OutputHead, chunked_logprobs, final_hidden, output_head

pytestmark = pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")  # peft, LoRA on a tied head

TOL = dict(atol=1e-6, rtol=0.0)
M_ROWS = 10  # not a multiple of 3, so chunk 3 leaves a short last chunk
CHUNKS = [1, 3, M_ROWS, M_ROWS + 7]
TEMPS = [0.7, 1.0]
TOP_PS = [1.0, 0.8]


@pytest.fixture(autouse=True)
def _threads():
    if torch.get_num_threads() != TORCH_THREADS:
        torch.set_num_threads(TORCH_THREADS)


def whole_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, top_p: float):
    """policy_forward's computation on [M, V] logits, kept in their dtype (float64 here)."""
    z = logits
    if temperature != 1.0:
        z = z / temperature
    full = z.log_softmax(-1)
    if top_p < 1.0:
        keep = nucleus_mask(z, top_p)
        keep.scatter_(-1, targets[:, None], True)
        logp = z.masked_fill(~keep, float("-inf")).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    else:
        logp = full.gather(-1, targets[:, None]).squeeze(-1)
    with torch.no_grad():
        lsm = full.detach()
        ent = -(lsm.exp() * lsm.clamp_min(torch.finfo(lsm.dtype).min)).sum(-1)
    return logp, ent


# ------------------------------------------------------------------------- analytic, by hand


def test_analytic_two_rows_three_tokens():
    """h = I (2 rows, d = 2), W = [[1, 0], [0, 1], [0, 0]] (V = 3): row 0's logits are [1, 0, 0],
    row 1's [0, 1, 0]. Targets: token 0 for row 0, token 2 for row 1. S = e + 2."""
    e = math.e
    s = e + 2
    h = torch.eye(2, dtype=torch.float64, requires_grad=True)
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    head = OutputHead(module=torch.nn.Identity(), weight=w, bias=None)
    y = torch.tensor([0, 2])

    # T = 1, top_p = 1. logp(row 0, token 0) = 1 − log S; logp(row 1, token 2) = 0 − log S.
    # Both rows' distributions are a permutation of [e, 1, 1] / S, so each entropy is
    # H = −Σ p log p = log S − (e·1 + 1·0 + 1·0)/S = log S − e/S.
    logp, ent = chunked_logprobs(head, h, y, 1.0, 1.0, entropy=True, chunk=1)
    torch.testing.assert_close(logp, torch.tensor([1 - math.log(s), -math.log(s)], dtype=torch.float64), **TOL)
    torch.testing.assert_close(ent, torch.full((2,), math.log(s) - e / s, dtype=torch.float64), **TOL)
    # loss = logp0 + logp1: ∂/∂z = onehot(y) − p, per row
    #   row 0: [1 − e/S, −1/S, −1/S] = [2/S, −1/S, −1/S]
    #   row 1: [−1/S, −e/S, 1 − 1/S] = [−1/S, −e/S, (e+1)/S]
    # grad_h = grad_z W (W picks the first two logits): row 0 [2/S, −1/S], row 1 [−1/S, −e/S]
    # grad_W = grad_zᵀ h (h = I, so row v of grad_W is [grad_z[0, v], grad_z[1, v]])
    logp.sum().backward()
    torch.testing.assert_close(h.grad, torch.tensor([[2 / s, -1 / s], [-1 / s, -e / s]], dtype=torch.float64), **TOL)
    torch.testing.assert_close(w.grad, torch.tensor([[2 / s, -1 / s], [-1 / s, -e / s], [-1 / s, (e + 1) / s]],
                                                    dtype=torch.float64), **TOL)

    # top_p = 0.5: row 0's probabilities are [e, 1, 1]/S = [0.576, 0.212, 0.212]; token 0 is
    # kept (mass before it 0), the others have 0.576 ≥ 0.5 before them: the nucleus is {0},
    # target 0 inside, so logp = 0 and its gradient 0. Row 1 ([1, e, 1]/S): the nucleus is {1},
    # the target 2 is forced in, so the support is {1, 2}: logp = 0 − log(e + 1) and
    # ∂/∂z = onehot(2) − p over {1, 2} = [0, −e/(e+1), e/(e+1)].
    # The entropy stays the full distribution's: log S − e/S for both rows.
    h.grad = w.grad = None
    logp, ent = chunked_logprobs(head, h, y, 1.0, 0.5, entropy=True, chunk=1)
    torch.testing.assert_close(logp, torch.tensor([0.0, -math.log(e + 1)], dtype=torch.float64), **TOL)
    torch.testing.assert_close(ent, torch.full((2,), math.log(s) - e / s, dtype=torch.float64), **TOL)
    logp.sum().backward()
    # grad_h row 1 = [0, −e/(e+1), e/(e+1)] W = [0, −e/(e+1)]; row 0 is 0
    torch.testing.assert_close(h.grad, torch.tensor([[0.0, 0.0], [0.0, -e / (e + 1)]], dtype=torch.float64), **TOL)

    # T = 2, top_p = 0.4, row 0 alone with target 1: the logits halve to [0.5, 0, 0],
    # probabilities [r, 1, 1]/(r + 2) with r = e^0.5, i.e. [0.452, 0.274, 0.274]: 0.452 ≥ 0.4,
    # so the nucleus is {0} (no tie decides it); target 1 is forced in, the support is {0, 1}:
    # logp = 0 − log(r + 1), and ∂logp/∂z = (onehot(1) − [r, 1, 0]/(r + 1)) / T
    # = [−r, r, 0] / (2(r + 1)); grad_h = that W = [−r, r] / (2(r + 1)).
    h.grad = w.grad = None
    r = math.exp(0.5)
    logp, _ = chunked_logprobs(head, h[:1], torch.tensor([1]), 2.0, 0.4, entropy=False, chunk=1)
    torch.testing.assert_close(logp, torch.tensor([-math.log(r + 1)], dtype=torch.float64), **TOL)
    logp.sum().backward()
    torch.testing.assert_close(h.grad[0], torch.tensor([-r, r], dtype=torch.float64) / (2 * (r + 1)), **TOL)
    torch.testing.assert_close(h.grad[1], torch.zeros(2, dtype=torch.float64), atol=0, rtol=0)


# ------------------------------------------------------------------- head level, every combination


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("top_p", TOP_PS)
@pytest.mark.parametrize("temperature", TEMPS)
def test_head_equals_whole(temperature, top_p, chunk, bias):
    g = torch.Generator().manual_seed(1)
    v, d = 37, 8
    h = (torch.randn(M_ROWS, d, generator=g, dtype=torch.float64) * 2).requires_grad_()
    w = torch.randn(v, d, generator=g, dtype=torch.float64).requires_grad_()
    b = torch.randn(v, generator=g, dtype=torch.float64).requires_grad_() if bias else None
    y = torch.randint(0, v, (M_ROWS,), generator=g)
    weights = torch.randn(M_ROWS, generator=g, dtype=torch.float64)  # a generic upstream gradient

    ref, ref_ent = whole_logprobs(F.linear(h, w, b), y, temperature, top_p)
    (ref * weights).sum().backward()
    ref_grads = [t.grad.clone() for t in (h, w, b) if t is not None]
    for t in (h, w, b):
        if t is not None:
            t.grad = None

    head = OutputHead(module=torch.nn.Identity(), weight=w, bias=b)
    logp, ent = chunked_logprobs(head, h, y, temperature, top_p, entropy=True, chunk=chunk)
    assert logp.dtype == torch.float64 and ent is not None and not ent.requires_grad
    torch.testing.assert_close(logp, ref, **TOL)
    torch.testing.assert_close(ent, ref_ent, **TOL)
    (logp * weights).sum().backward()
    for got, want in zip([t.grad for t in (h, w, b) if t is not None], ref_grads):
        torch.testing.assert_close(got, want, **TOL)


def test_bf16_head_upcasts_per_chunk():
    """A bf16 head: the chunk's logits come out in bf16 (as lm_head gives them) and are
    normalised in fp32, like policy_forward's ``.float()``; logp is fp32."""
    g = torch.Generator().manual_seed(2)
    h = torch.randn(M_ROWS, 16, generator=g).bfloat16().requires_grad_()
    w = torch.randn(50, 16, generator=g).bfloat16().requires_grad_()
    y = torch.randint(0, 50, (M_ROWS,), generator=g)
    ref = F.linear(h, w).float().log_softmax(-1).gather(-1, y[:, None]).squeeze(-1)
    ref.sum().backward()
    gh, gw = h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    logp, _ = chunked_logprobs(OutputHead(torch.nn.Identity(), w, None), h, y, chunk=3)
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, ref, atol=1e-5, rtol=0)
    logp.sum().backward()
    assert h.grad.dtype == w.grad.dtype == torch.bfloat16
    torch.testing.assert_close(h.grad.float(), gh.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(w.grad.float(), gw.float(), atol=2e-2, rtol=2e-2)


# ---------------------------------------------------------------------------- real models


def tiny(arch: str, tied: bool, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    config = config_cls(vocab_size=53, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                        tie_word_embeddings=tied, initializer_range=0.2, bos_token_id=None, eos_token_id=1,
                        pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    return model.double().train()


def with_lora(model, where: str):
    from peft import LoraConfig, get_peft_model

    if where == "qkvo":
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0,
                         init_lora_weights=False)
    elif where == "lm_head":
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"], lora_dropout=0.0,
                         init_lora_weights=False)
    elif where == "save":
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["v_proj"], modules_to_save=["lm_head"], lora_dropout=0.0,
                         init_lora_weights=False)
    else:
        raise AssertionError(where)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        peft = get_peft_model(model, cfg)
    if where == "save":  # move the trained copy off the original, so using the wrong one shows
        with torch.no_grad():
            peft.base_model.model.lm_head.modules_to_save["default"].weight.add_(0.3)
    return peft.double()


def inputs(vocab: int):
    """3 right-padded rows of width 9; logits needed from position 2 on; 10 policy positions."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, vocab, (3, 9), generator=g)
    att = torch.ones(3, 9, dtype=torch.long)
    att[1, 7:] = 0
    att[2, 5:] = 0
    ids[att == 0] = 0
    keep_from = 2
    sel = torch.zeros(3, 9 - keep_from, dtype=torch.bool)  # positions keep_from.. of each row
    sel[0, [0, 2, 3, 5, 6]] = True
    sel[1, [1, 2, 4]] = True
    sel[2, [0, 2]] = True
    assert int(sel.sum()) == M_ROWS
    targets = torch.randint(0, vocab, (M_ROWS,), generator=g)
    return ids, att, keep_from, sel, targets


def grads_of(model, fn):
    model.zero_grad(set_to_none=True)
    out = fn()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def compare_model(model, temperature, top_p, chunk, vocab=53):
    ids, att, keep_from, sel, y = inputs(vocab)
    keep = ids.shape[1] - keep_from
    weights = torch.linspace(-1.0, 2.0, M_ROWS, dtype=torch.float64)

    def whole():
        logits = model(input_ids=ids, attention_mask=att, use_cache=False, logits_to_keep=keep).logits
        assert logits.shape[1] == keep
        logp, ent = whole_logprobs(logits[sel], y, temperature, top_p)
        (logp * weights).sum().backward()
        return logp.detach(), ent

    def chunked():
        hid = final_hidden(model, ids, att, keep)  # [B, keep, d]
        assert hid.shape[1] == keep
        logp, ent = chunked_logprobs(model, hid[sel], y, temperature, top_p, entropy=True, chunk=chunk)
        (logp * weights).sum().backward()
        return logp.detach(), ent

    (ref, ref_ent), ref_grads = grads_of(model, whole)
    (got, got_ent), got_grads = grads_of(model, chunked)
    torch.testing.assert_close(got, ref, **TOL)
    torch.testing.assert_close(got_ent, ref_ent, **TOL)
    assert ref_grads and got_grads.keys() == ref_grads.keys()
    for name, want in ref_grads.items():
        torch.testing.assert_close(got_grads[name], want, **TOL, msg=lambda m, n=name: f"{n}: {m}")
    return ref_grads


MODEL_CASES = [(0.7, 0.8, c) for c in CHUNKS] + [(t, p, 3) for t in TEMPS for p in TOP_PS if (t, p) != (0.7, 0.8)]
"""Every chunk size at T = 0.7, top_p = 0.8, and every (T, top_p) at chunk 3 (the head-level
test crosses them all)."""


@pytest.mark.parametrize("temperature,top_p,chunk", MODEL_CASES)
@pytest.mark.parametrize("arch,tied", [("qwen2", True), ("qwen2", False), ("llama", True), ("llama", False)])
def test_model_equals_whole(arch, tied, temperature, top_p, chunk):
    model = tiny(arch, tied)
    head = output_head(model)
    assert (head.weight is model.get_input_embeddings().weight) == tied
    grads = compare_model(model, temperature, top_p, chunk)
    assert ("lm_head.weight" in grads) != tied  # tied: the one matrix gets both uses' gradient


@pytest.mark.parametrize("temperature,top_p,chunk", [(0.7, 0.8, 1), (0.7, 0.8, 3), (1.0, 1.0, M_ROWS + 7),
                                                     (0.7, 1.0, 3)])
@pytest.mark.parametrize("where,arch,tied", [("qkvo", "qwen2", True), ("lm_head", "qwen2", False),
                                             ("lm_head", "llama", True), ("save", "llama", False)])
def test_lora_equals_whole(where, arch, tied, temperature, top_p, chunk):
    model = with_lora(tiny(arch, tied), where)
    head = output_head(model)
    assert len(head.loras) == (1 if where == "lm_head" else 0)
    grads = compare_model(model, temperature, top_p, chunk)
    if where == "lm_head":
        assert any("lm_head.lora_A" in n for n in grads) and any("lm_head.lora_B" in n for n in grads)
    if where == "save":
        assert any("lm_head.modules_to_save" in n for n in grads)


def test_lora_head_disabled_adapter_is_the_base():
    """The reference of a LoRA policy is the base with the adapter off: output_head follows."""
    model = with_lora(tiny("qwen2", False), "lm_head")
    model.base_model.model.lm_head.base_layer.weight.requires_grad_(True)  # something to differentiate
    with model.disable_adapter():
        assert output_head(model).loras == ()
        compare_model(model, 1.0, 1.0, 3)
    assert len(output_head(model).loras) == 1


def test_ddp_wrapped(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        plain = tiny("qwen2", True)
        ddp = DDP(tiny("qwen2", True))
        assert output_head(ddp).weight is ddp.module.model.embed_tokens.weight
        want = compare_model(plain, 0.7, 0.8, 3)
        got = compare_model(ddp, 0.7, 0.8, 3)  # whole vs chunked through DDP's own forward
        for name, g in want.items():
            torch.testing.assert_close(got["module." + name], g, **TOL)
    finally:
        dist.destroy_process_group()


def test_final_hidden_is_the_head_input_and_skips_the_head():
    model = tiny("llama", True)
    ids, att, keep_from, _, _ = inputs(53)
    calls = []
    handle = model.lm_head.register_forward_hook(lambda _m, _a, out: calls.append(out.shape))
    try:
        hid = final_hidden(model, ids, att, ids.shape[1] - keep_from)
    finally:
        handle.remove()
    assert calls == [torch.Size([3, 0, 53])]  # the head ran on zero rows
    base = model.model(input_ids=ids, attention_mask=att).last_hidden_state
    torch.testing.assert_close(hid, base[:, keep_from:], atol=0, rtol=0)
    assert not model.lm_head._forward_pre_hooks  # the hook is gone


# ------------------------------------------------------------------------------ refusals


def test_refuses_post_head_transforms():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    with pytest.raises(ZsearchError, match="final_logit_softcapping") as err:
        output_head(Gemma2ForCausalLM(config))
    assert "\n" not in str(err.value)
    model = tiny("llama", False)
    model.config.logit_scale = 0.0625  # Cohere's
    with pytest.raises(ZsearchError, match="logit_scale"):
        output_head(model)
    model.config.logit_scale = 1.0
    model.config.logits_scaling = 8.0  # Granite's
    with pytest.raises(ZsearchError, match="logits_scaling"):
        output_head(model)


def test_refuses_unsupported_heads():
    from peft import LoraConfig, get_peft_model

    class Custom(torch.nn.Linear):
        pass

    model = tiny("llama", False)
    model.lm_head = Custom(16, 53, bias=False)
    with pytest.raises(ZsearchError, match="Custom, not a torch.nn.Linear"):
        output_head(model)
    dora = get_peft_model(tiny("llama", False), LoraConfig(r=2, target_modules=["lm_head"], use_dora=True))
    with pytest.raises(ZsearchError, match="LoRA variant"):
        output_head(dora)
    model = tiny("llama", False)
    model.lm_head.weight = torch.nn.Parameter(torch.empty(0))  # what ZeRO-3 leaves outside the forward
    with pytest.raises(ZsearchError, match="not a whole"):
        output_head(model)
    with pytest.raises(ZsearchError, match="get_output_embeddings"):
        output_head(torch.nn.Linear(2, 2))


def test_bias_head_on_a_model():
    """A head with a bias (Phi-style), through a real model."""
    model = tiny("llama", False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        model.lm_head = torch.nn.Linear(16, 53, bias=True).double()
    assert output_head(model).bias is model.lm_head.bias
    grads = compare_model(model, 0.7, 0.8, 3)
    assert "lm_head.bias" in grads


# ----------------------------------------------------------------------- against policy_forward


def test_matches_policy_forward_fp32():
    """The integration policy_forward will use, against policy_forward itself (fp32 model)."""
    from zsearch_cli.train.logprobs import collate, policy_forward

    model = tiny("qwen2", True).float()
    g = torch.Generator().manual_seed(6)
    trajs = []
    for p, r in [(4, 5), (3, 6), (6, 2)]:
        resp = torch.randint(2, 53, (r,), generator=g).tolist()
        mask = [1] * r
        mask[1] = 0  # an observation token inside the response
        trajs.append(SimpleNamespace(prompt_ids=torch.randint(2, 53, (p,), generator=g).tolist(),
                                     response_ids=resp, loss_mask=mask))
    batch = collate(trajs, pad_id=0, device="cpu")
    sel = batch.mask
    for temperature, top_p in [(1.0, 1.0), (0.7, 0.8)]:
        model.zero_grad(set_to_none=True)
        ref, ref_ent = policy_forward(model, batch, temperature, entropy=True, top_p=top_p)
        ref[sel].sum().backward()
        ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        # --- the integration: hidden states at the policy positions, then the chunked head
        width = batch.input_ids.shape[1]
        hid = final_hidden(model, batch.input_ids, batch.attention_mask, width - batch.keep_from)
        pos = (batch.resp_pos - batch.keep_from).clamp_min(0)
        rows = torch.arange(batch.size)[:, None].expand_as(pos)
        logp, ent = chunked_logprobs(model, hid[rows[sel], pos[sel]], batch.targets[sel], temperature, top_p,
                                     entropy=True, chunk=4)
        torch.testing.assert_close(logp, ref[sel], atol=1e-5, rtol=0)
        torch.testing.assert_close(ent, ref_ent[sel], atol=1e-5, rtol=0)
        logp.sum().backward()
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, ref_grads[n], atol=1e-5, rtol=1e-4)


# -------------------------------------------------------------------------------- memory


def test_saves_no_m_by_v_tensor():
    """Qwen2.5's vocabulary, M = 512 policy rows: the chunked path saves h, W, targets and a
    per-row log-normaliser for backward, nothing with V × M (or even V × C) elements; the whole
    path (checked at M = 256, to keep this fast) saves [M, V] tensors."""
    v, d, m, chunk = 151936, 64, 512, 128
    g = torch.Generator().manual_seed(7)
    w = (torch.randn(v, d, generator=g) * 0.05).requires_grad_()
    h = torch.randn(m, d, generator=g).requires_grad_()
    y = torch.randint(0, v, (m,), generator=g)

    def saved_numels(fn):
        seen: list[int] = []

        def pack(t):
            seen.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = fn()
        return out, seen

    (logp, _), seen = saved_numels(lambda: chunked_logprobs(OutputHead(torch.nn.Identity(), w, None), h, y,
                                                            chunk=chunk))
    assert logp.requires_grad and torch.isfinite(logp).all()
    assert max(seen) == v * d and sorted(seen) == sorted([m, m, m * d, v * d])  # targets, lse, h, W
    assert all(n < chunk * v for n in seen)

    hs = h[:256]
    _, seen_whole = saved_numels(lambda: whole_logprobs(F.linear(hs, w), y[:256], 1.0, 1.0))
    assert max(seen_whole) >= 256 * v  # the test does see an [M, V] save when there is one


PEAK_SCRIPT = textwrap.dedent("""
    import torch
    import torch.nn.functional as F
    from zsearch_cli.train.lm_head import OutputHead, chunked_logprobs
    torch.set_num_threads(1)
    v, d, m, chunk = 151936, 64, 256, 32
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(v, d, generator=g) * 0.05).requires_grad_()
    h = torch.randn(m, d, generator=g).requires_grad_()
    y = torch.randint(0, v, (m,), generator=g)

    def peak():  # this process's peak resident set (VmHWM: getrusage's maxrss survives exec)
        status = open("/proc/self/status").read()
        return int(status.split("VmHWM:")[1].split()[0]) * 1024

    # both paths once on a few rows first: the libraries' one-time set-up (thread pools, kernel
    # caches) is not either path's peak, and under load it landed in the first one measured
    small = OutputHead(torch.nn.Identity(), w[:1000].detach().clone().requires_grad_(), None)
    chunked_logprobs(small, h[:4], y[:4] % 1000, entropy=True, chunk=2)[0].sum().backward()
    F.linear(h[:4], w[:1000]).float().log_softmax(-1)[:, 0].sum().backward()
    w.grad = h.grad = None
    base = peak()
    logp, ent = chunked_logprobs(OutputHead(torch.nn.Identity(), w, None), h, y, entropy=True, chunk=chunk)
    logp.sum().backward()
    chunked = peak() - base
    del logp, ent
    w.grad = h.grad = None
    z = F.linear(h, w).float().log_softmax(-1)  # policy_forward's path
    lp = z.gather(-1, y[:, None]).squeeze(-1)
    ent = -(z.exp() * z).sum(-1).detach()
    lp.sum().backward()
    whole = peak() - base
    print(chunked, whole)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_memory_whole_vs_chunked():
    """Peak resident memory (VmHWM, in a fresh process) of one forward + backward at
    V = 151,936, d = 64, M = 256: the whole path holds several [M, V] fp32 tensors (156 MB
    each); the chunked path (C = 32) a few [C, V] ones (19 MB each) and W's gradient (39 MB).
    Chunked runs first, so the whole path's peak is not hidden by it."""
    # every large block by mmap, returned on free: glibc's adaptive threshold otherwise keeps freed
    # blocks on its heap, and the resident peak then depends on the allocation history
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, "-c", PEAK_SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    chunked, whole = map(int, out.stdout.split())
    mv = 256 * 151936 * 4
    cv = 32 * 151936 * 4
    assert whole >= 2 * mv, (chunked, whole)
    assert chunked <= 8 * cv + 3 * 151936 * 64 * 4, (chunked, whole)  # a few [C, V] + W's gradient
    assert chunked * 3 < whole, (chunked, whole)
