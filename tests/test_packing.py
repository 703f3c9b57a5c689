"""Token-budget micro-batches and padding-free packing (issue 35; train/microbatch.py,
train/logprobs.py): the grouping rules by hand, then packed = padded for logprobs, entropy,
values, the loss and every gradient, in fp64 on tiny models (Qwen2 and Llama, full and LoRA)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from zsearch_cli.train import microbatch
from zsearch_cli.train.logprobs import collate, critic_forward, pack, policy_forward

from helpers import make_trajectory

# ------------------------------------------------------------------ the grouping rules, by hand


def test_a_token_budget_groups_longest_first_and_a_long_sample_goes_alone():
    lengths = [9, 2, 5, 4, 12]  # sample i has lengths[i] tokens
    # Budget 10, packed (a bin costs the sum), first-fit in the order 12, 9, 5, 4, 2:
    # 12 > 10 goes alone; 9 opens a bin; 5 (9+5 = 14) opens one; 4 joins 5 (9); 2 fits none
    # (12+2, 9+2, 9+2 are all > 10) and opens one.
    assert microbatch.plan(range(5), lengths, rows=8, tokens=10, packed=True) == [[4], [0], [2, 3], [1]]
    # Packed at 15: 5 joins 9 (14); 4 fits neither 12 (16) nor 14 (18); 2 joins 12 (14).
    assert microbatch.plan(range(5), lengths, rows=8, tokens=15, packed=True) == [[1, 4], [0, 2], [3]]
    # --micro-batch-size is not read under a budget: rows=1 gives the same bins
    assert microbatch.plan(range(5), lengths, rows=1, tokens=15, packed=True) == [[1, 4], [0, 2], [3]]


def test_a_padded_budget_counts_rows_times_the_longest_and_caps_the_padding():
    lengths = [100, 98, 60, 57, 40]
    # Budget 300, right-padded (a bin costs rows x its longest), first-fit in the order 100, 98,
    # 60, 57, 40: 98 joins 100 (cost 200, padding 2 <= 5% of 200); 60 would fit the budget
    # (3 x 100 = 300) but pad 300 - 258 = 42 > 15, so it opens a bin; 57 joins 60 (cost 120,
    # padding 3 <= 6); 40 pads either bin too much (45 > 15 with 100/98; 180 - 157 = 23 > 9 with
    # 60/57) and goes alone.
    assert microbatch.plan(range(5), lengths, rows=8, tokens=300, packed=False) == [[0, 1], [2, 3], [4]]
    assert microbatch.PADDING_LIMIT == 0.05
    # The budget alone (no cap) would have put 60 with 100 and 98, then 40 with 57:
    # [[0, 1, 2], [3, 4]]. A sample longer than the budget still goes alone:
    assert microbatch.plan(range(3), [400, 100, 99], rows=8, tokens=300, packed=False) == [[0], [1, 2]]


def test_without_a_budget_micro_batches_are_rows_longest_first():
    # equal lengths keep the mini-batch's order (a stable sort)
    assert microbatch.plan([5, 3, 1, 0, 2], [1] * 6, rows=2, tokens=None, packed=True) == [[5, 3], [1, 0], [2]]
    # samples 1 and 3 (9 tokens) share a micro-batch, then 2 (5) and 0 (3): 18 + 10 token slots,
    # against 2 x 9 + 2 x 9 = 36 in arrival order
    assert microbatch.plan(range(4), [3, 9, 5, 9], rows=2, tokens=None, packed=False) == [[1, 3], [2, 0]]


def test_equalize_splits_the_costliest_then_pads():
    lengths = [8, 1, 7, 2, 3]
    # One micro-batch of all five, brought to 3. First split, longest first onto the lighter
    # half (ties: the first): 8 -> A; 7 -> B; 3 -> B (7 < 8, B = 10); 2 -> A (8 < 10, A = 10);
    # 1 -> A (tie). A = [0, 1, 3] (11 tokens), B = [2, 4] (10). Then the costlier, A: 8 | 2, 1.
    assert microbatch.equalize([[0, 1, 2, 3, 4]], 3, lengths, packed=True) == [[2, 4], [0], [1, 3]]
    # nothing left to split: empty micro-batches pad the count
    assert microbatch.equalize([[0], [1]], 4, lengths, packed=True) == [[0], [1], [], []]
    with pytest.raises(ValueError):
        microbatch.equalize([[0], [1]], 1, lengths, packed=True)


def test_cost_is_what_the_forward_computes():
    assert microbatch.cost([0, 1], [10, 3], packed=True) == 13
    assert microbatch.cost([0, 1], [10, 3], packed=False) == 20
    assert microbatch.cost([], [10], packed=False) == 0


# ------------------------------------------------------------------ packed = padded, fp64

def _trajs(vocab: int, n: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        p, r = 3 + (2 * i) % 5, 4 + (3 * i) % 7
        mask = [1] * r
        mask[r // 2] = 0  # an observation token in the middle
        out.append(make_trajectory(f"q{i}#0", prompt_ids=torch.randint(3, vocab, (p,), generator=gen).tolist(),
                                   response_ids=torch.randint(3, vocab, (r,), generator=gen).tolist(), loss_mask=mask))
    return out


def _packed_like(padded, trajs):
    seqs = [torch.tensor(list(t.prompt_ids) + list(t.response_ids)) for t in trajs]
    return pack(seqs, [len(t.prompt_ids) for t in trajs], padded.targets.shape[1], padded.targets, padded.mask)


def _model(arch: str, attn: str, lora: bool):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    kw = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, attn_implementation=attn)
    model = (Qwen2ForCausalLM(Qwen2Config(**kw)) if arch == "qwen2" else
             LlamaForCausalLM(LlamaConfig(**kw, tie_word_embeddings=True))).double()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                                 lora_dropout=0.0, init_lora_weights=False))
    return model


@pytest.mark.parametrize("arch, attn, lora", [("qwen2", "sdpa", False), ("qwen2", "eager", False),
                                              ("llama", "sdpa", False), ("qwen2", "sdpa", True)])
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_packed_and_chunked_logprobs_entropy_and_gradients_equal_the_padded_whole_head(arch, attn, lora, top_p):
    # The reference is today's path: right-padded rows with their mask, the whole LM head.
    # Packing, right-padded rows without the mask (causal), the chunked head (chunk 3: the 5
    # samples' policy tokens do not divide by it) and both at once must give the same
    # logprobs, entropies and gradients of every parameter.
    model = _model(arch, attn, lora)
    trajs = _trajs(97)
    padded = collate(trajs, 0, "cpu")
    packed = _packed_like(padded, trajs)
    causal = dataclasses.replace(padded, attention_mask=None)
    assert packed.input_ids.shape[0] == 1 and packed.attention_mask is None
    results = []
    for batch, chunk in ((padded, 0), (packed, 0), (causal, 0), (padded, 3), (packed, 3), (causal, 3), (packed, 1000)):
        model.zero_grad()
        logp, ent = policy_forward(model, batch, 0.8, entropy=True, top_p=top_p, chunk=chunk)
        (logp * torch.linspace(0.5, 1.5, logp.numel()).view_as(logp).double()).sum().backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), ent, grads))
    lp_a, ent_a, g_a = results[0]
    assert lp_a.dtype == torch.float64 and len(g_a) > 0
    for lp_b, ent_b, g_b in results[1:]:
        assert (lp_a - lp_b).abs().max() < 1e-10 and (ent_a - ent_b).abs().max() < 1e-10
        assert g_a.keys() == g_b.keys()
        assert max(float((g_a[k] - g_b[k]).abs().max()) for k in g_a) < 1e-10


def test_packed_and_causal_values_equal_the_padded_ones():
    from zsearch_cli.train.policy import Critic

    model = _model("qwen2", "sdpa", False)
    critic = Critic(model.model, 32).double()
    torch.nn.init.normal_(critic.value_head.weight)  # not the zero start, so the values differ by position
    trajs = _trajs(97)
    padded = collate(trajs, 0, "cpu")
    packed = _packed_like(padded, trajs)
    inside = padded.mask | (padded.targets != 0)
    a, b = critic_forward(critic, padded), critic_forward(critic, packed)
    assert ((a - b).abs() * inside).max() < 1e-10
    c = critic_forward(critic, dataclasses.replace(padded, attention_mask=None))  # causal rows
    assert ((a - c).abs() * inside).max() < 1e-10


def test_packing_really_confines_attention_to_each_sample():
    # The control for the equality above: the same packed row with an all-ones attention mask
    # (so transformers does not detect the packing) lets later samples attend to earlier ones,
    # and positions that do not restart shift the rotary phases: both move the logprobs.
    model = _model("qwen2", "sdpa", False)
    trajs = _trajs(97)
    padded = collate(trajs, 0, "cpu")
    packed = _packed_like(padded, trajs)
    good, _ = policy_forward(model, packed, 1.0)
    leaky = _packed_like(padded, trajs)
    leaky.attention_mask = torch.ones_like(leaky.input_ids)
    leaked, _ = policy_forward(model, leaky, 1.0)
    unrestarted = _packed_like(padded, trajs)
    unrestarted.position_ids = torch.arange(unrestarted.input_ids.shape[1])[None]
    shifted, _ = policy_forward(model, unrestarted, 1.0)
    assert (good - leaked).abs().max() > 1e-3 and (good - shifted).abs().max() > 1e-3
    # the first sample sees nothing before it: unchanged by the leak
    first = padded.mask[0]
    assert (good[0][first] - leaked[0][first]).abs().max() < 1e-10


def test_auto_packs_for_varlen_attention_pads_causally_for_sdpa_and_on_refuses_a_leaking_model(monkeypatch):
    from transformers import masking_utils

    from zsearch_cli.errors import ZsearchError
    from zsearch_cli.train.logprobs import resolve_layout

    model = _model("qwen2", "sdpa", False)
    # sdpa computes a packed row's whole attention: auto keeps rows, without the mask (causal)
    layout, why = resolve_layout("auto", model, 97, "cpu", torch.float64, "sdpa")
    assert layout == "causal" and "sdpa attention computes a packed row's whole" in why
    # a varlen kernel (flash-attention) packs; the probe runs the model itself (sdpa here: exact)
    assert resolve_layout("auto", model, 97, "cpu", torch.float64, "flash_attention_2")[0] == "packed"
    assert resolve_layout("on", model, 97, "cpu", torch.float64, "sdpa")[0] == "packed"
    assert resolve_layout("off", model, 97, "cpu", torch.float64, "flash_attention_2")[0] == "causal"
    # A model whose attention ignores the restarts (as one with its own attention code would):
    # transformers' packed-sequence detection switched off, so the second sample sees the first.
    with monkeypatch.context() as patch:
        patch.setattr(masking_utils, "find_packed_sequence_indices", lambda position_ids: None)
        layout, why = resolve_layout("auto", model, 97, "cpu", torch.float64, "flash_attention_2")
        assert layout == "causal" and "does not confine itself to each packed sample" in why
        with pytest.raises(ZsearchError, match="--pack on: packing would change the logprobs"):
            resolve_layout("on", model, 97, "cpu", torch.float64, "sdpa")


def test_a_model_whose_attention_reads_to_the_right_keeps_its_mask(monkeypatch):
    # The causal layout's probe must see a model that is not causal: here eager attention with
    # no mask at all (Qwen2's causal mask builder returning None), i.e. bidirectional, so the
    # short, right-padded sample reads the padding after it and moves by far more than 1e-8.
    import transformers.models.qwen2.modeling_qwen2 as qwen2

    from zsearch_cli.train.logprobs import layout_probe, resolve_layout

    model = _model("qwen2", "eager", False)
    assert layout_probe(model, 97, "cpu", "causal") < 1e-7  # eager's fp32 softmax: ~1e-8

    monkeypatch.setattr(qwen2, "create_causal_mask", lambda **kwargs: None)
    assert layout_probe(model, 97, "cpu", "causal") > 1e-3
    layout, why = resolve_layout("auto", model, 97, "cpu", torch.float64, "eager")
    assert layout == "masked" and "attention is not causal" in why


def test_attn_implementation_switches_the_kernel_and_a_missing_one_is_one_line(tiny_model_dir):
    # --attn-implementation reaches the loaded policy; flash-attention is not installed here,
    # so asking for it is refused in one line that names the option.
    from zsearch_cli.errors import ZsearchError
    from zsearch_cli.train.config import TrainConfig, resolve_config
    from zsearch_cli.train.policy import load_policy

    def cfg(kernel: str):
        return resolve_config(TrainConfig.from_flat(algo="grpo", model=str(tiny_model_dir), attn_implementation=kernel))

    policy, _ = load_policy(cfg("eager"), "cpu", "float32")
    assert policy.config._attn_implementation == "eager"
    policy, _ = load_policy(cfg("sdpa"), "cpu", "float32")
    assert policy.config._attn_implementation == "sdpa"
    with pytest.raises(ZsearchError, match=r"^--attn-implementation flash_attention_2: .*FlashAttention2") as err:
        load_policy(cfg("flash_attention_2"), "cpu", "float32")
    assert "\n" not in str(err.value)
