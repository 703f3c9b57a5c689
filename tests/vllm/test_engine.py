"""VLLMBackend on the real engine (vLLM's CPU build) against the HF backend on the same tiny
model: the generation contract of ``models/base.py`` and the weight sync.

Tolerances: both backends compute fp32 log-softmax of the same logits; the gap is kernel
rounding, measured ~1e-6 to 1e-5 nats here, so 1e-4 (and the trainer's 1e-3, see
``LOGP_TOLERANCE``) fail on any real difference while passing rounding.
"""

from __future__ import annotations

import pytest
import torch

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import LOGP_TOLERANCE, SamplingParams
from zsearch_cli.models.hf import HFBackend, _filter_top_p

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
SAMPLED = SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9, seed=3)
TEXTS = ["Who wrote the novel?", "The river flows", "Water boils at 100 degrees", "A search engine returns"]


@pytest.fixture(scope="module")
def prompts(hf_tiny):
    return [hf_tiny.tokenizer.encode(t) for t in TEXTS]


def _processed_logprobs(model, prompt, new, temperature, top_p):
    """The HF backend's definition (models/hf.py): log_softmax(logits / T) over the top-p
    nucleus, at each sampled token, from one fresh forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + new])).logits[0, len(prompt) - 1 : -1].float()
    logp = _filter_top_p(logits / temperature, top_p).log_softmax(-1)
    return logp.gather(-1, torch.tensor(new)[:, None]).squeeze(-1).tolist()


def test_runs_on_the_cpu_platform_with_its_settings(engine):
    # The check is vLLM's platform, not torch.cuda (this machine has no GPU).
    from zsearch_cli.models.vllm import engine_settings, vllm_platform

    assert not torch.cuda.is_available() and engine.platform == "cpu"
    assert engine.dtype == torch.float32  # 'auto' on the CPU: fp32, the project's CPU dtype
    platform = vllm_platform()
    assert engine_settings(platform, "auto", None) == {"dtype": "float32"}  # no GPU memory share on a CPU
    with pytest.raises(ZsearchError, match="VLLM_CPU_KVCACHE_SPACE"):
        engine_settings(platform, "auto", 0.9)


def test_greedy_ids_equal_hf_and_logprobs_close(engine, hf_tiny, prompts):
    want = hf_tiny.generate(prompts, GREEDY)
    got = engine.generate(prompts, GREEDY)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids and len(g.token_ids) == GREEDY.max_new_tokens
        assert g.finish_reason == w.finish_reason == "length"
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    # Not vacuous: the outputs differ between prompts and the logprobs are not all ~0.
    assert len({tuple(g.token_ids) for g in got}) == len(prompts)
    assert min(lp for g in got for lp in g.logprobs) < -1.0


def test_sampled_logprobs_are_hf_processed_logprobs(engine, hf_tiny, prompts):
    # vLLM draws other tokens than HF (other RNG), so compare the logprob of what it drew with
    # HF's definition: temperature 0.7, nucleus 0.9 renormalised. A raw log-softmax (vLLM's
    # default logprobs_mode) would be off by whole nats here.
    for prompt, out in zip(prompts, engine.generate(prompts, SAMPLED)):
        assert len(out.token_ids) == len(out.logprobs) == SAMPLED.max_new_tokens
        want = _processed_logprobs(hf_tiny.model, prompt, out.token_ids, 0.7, 0.9)
        assert out.logprobs == pytest.approx(want, abs=1e-4)
        raw = _processed_logprobs(hf_tiny.model, prompt, out.token_ids, 1.0, 1.0)
        assert max(abs(a - b) for a, b in zip(out.logprobs, raw)) > 0.05


def test_per_row_seeds_are_reproducible_and_batch_independent(engine, prompts):
    first = engine.generate(prompts, SAMPLED)
    again = engine.generate(prompts, SAMPLED)
    assert [o.token_ids for o in again] == [o.token_ids for o in first]
    # Row i keeps its sample whatever else is in the batch, as long as it is row i.
    assert engine.generate(prompts[:1], SAMPLED)[0].token_ids == first[0].token_ids
    assert engine.generate([prompts[0], prompts[3]], SAMPLED)[0].token_ids == first[0].token_ids
    # Rows with the same prompt get different streams; another seed gives another sample.
    same = engine.generate([prompts[0]] * 3, SAMPLED)
    assert len({tuple(o.token_ids) for o in same}) == 3
    other = engine.generate(prompts[:1], SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.9, seed=4))
    assert other[0].token_ids != first[0].token_ids


def test_stop_strings_finish_reasons_and_the_stop_text_kept(engine, hf_tiny, prompts):
    # The tiny model's greedy continuation of "The river flows" holds "ayay..." and later the
    # special token </information>; a stop string that ends inside a token and one that is a
    # special token (detokenized with special tokens kept) must both end the sample, with the
    # ids up to and including the token that completes the stop string (base.py's contract).
    tok = hf_tiny.tokenizer
    full = hf_tiny.generate(prompts[1:2], GREEDY)[0]
    text = tok.decode(full.token_ids, skip_special_tokens=False)
    assert "yay" in text and "</information>" in text and text.index("yay") < text.index("</information>")
    for stop, expected in ((["</information>", "yay"], "yay"), (["</information>"], "</information>")):
        want = hf_tiny.generate(prompts[1:2], GREEDY, stop=stop)[0]
        got = engine.generate(prompts[1:2], GREEDY, stop=stop)[0]
        assert (got.finish_reason, got.stop_string) == (want.finish_reason, want.stop_string) == ("stop", expected)
        assert got.token_ids == want.token_ids == full.token_ids[: len(got.token_ids)]
        got_text = tok.decode(got.token_ids, skip_special_tokens=False)
        assert expected in got_text and expected not in tok.decode(got.token_ids[:-1], skip_special_tokens=False)
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    # max_new_tokens == 0 and empty prompts keep the HF backend's behaviour.
    assert engine.generate(prompts[:1], SamplingParams(max_new_tokens=0))[0].finish_reason == "length"
    with pytest.raises(ZsearchError, match="prompt 0 is empty"):
        engine.generate([[]], GREEDY)


def _hf_copy(vllm_tiny_dir):
    from zsearch_cli.models.loading import load_model

    model, tokenizer = load_model(str(vllm_tiny_dir), device="cpu", dtype="float32")
    return model, tokenizer


def _assert_engine_is(engine, model, tokenizer, prompts, what):
    from zsearch_cli.models.vllm import VLLMBackend

    hf = HFBackend(model, tokenizer)
    want, got = hf.generate(prompts, GREEDY), engine.generate(prompts, GREEDY)
    assert [g.token_ids for g in got] == [w.token_ids for w in want], what
    for w, g in zip(want, got):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4), what
    probe = prompts[0] + want[0].token_ids
    with torch.no_grad():
        logp = model(torch.tensor([probe])).logits[0, :-1].float().log_softmax(-1)
    ours = logp.gather(-1, torch.tensor(probe[1:])[:, None]).squeeze(-1)
    gap = float((torch.tensor(VLLMBackend.sequence_logprobs(engine, probe)) - ours).abs().max())
    assert gap < LOGP_TOLERANCE["float32"], what
    return gap


def test_update_weights_full_and_lora_make_the_engine_the_updated_model(engine, vllm_tiny_dir, prompts):
    from peft import LoraConfig, get_peft_model

    from zsearch_cli.train.policy import merged_weights

    model, tokenizer = _hf_copy(vllm_tiny_dir)
    before = [o.token_ids for o in engine.generate(prompts, GREEDY)]
    gaps = {"start": _assert_engine_is(engine, model, tokenizer, prompts, "engine at start")}

    # Full fine-tune: a step large enough to change every greedy continuation.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    engine.update_weights(merged_weights(model))
    assert [o.token_ids for o in engine.generate(prompts, GREEDY)] != before  # the sync did something
    gaps["full"] = _assert_engine_is(engine, model, tokenizer, prompts, "after a full update")
    after_full = [o.token_ids for o in engine.generate(prompts, GREEDY)]

    # LoRA: random A and B (B = 0 at init would be a no-op), merged without mutating the base.
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                                            init_lora_weights=False))
    engine.update_weights(merged_weights(lora))
    gaps["lora"] = _assert_engine_is(engine, lora, tokenizer, prompts, "after a LoRA update")
    assert [o.token_ids for o in engine.generate(prompts, GREEDY)] != after_full  # the adapter mattered

    # Back to the folder's weights, so the module's other tests see the original model.
    fresh, _ = _hf_copy(vllm_tiny_dir)
    engine.update_weights(fresh.state_dict().items())
    assert [o.token_ids for o in engine.generate(prompts, GREEDY)] == before
    print(f"probe |engine - HF| max logprob gap: {gaps}")


def test_the_sync_refuses_a_multi_process_engine(engine, monkeypatch):
    monkeypatch.setattr(engine.llm.llm_engine, "engine_core", object())
    with pytest.raises(ZsearchError, match="in-process engine"):
        engine.update_weights([])
