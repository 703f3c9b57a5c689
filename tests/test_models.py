"""Model loading, the tiny test model, and the HF generation backend's contract."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import time
import types
from types import SimpleNamespace

import pytest
import torch

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models import factory, loading
from zsearch_cli.models.base import SamplingParams
from zsearch_cli.models.hf import HFBackend
from zsearch_cli.models.loading import apply_chat, load_model, load_tokenizer, resolve_model_path
from zsearch_cli.models.factory import load_backend
from zsearch_cli.models.tiny import SPECIAL_TOKENS

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
QUESTIONS = ["who wrote pride and prejudice?", "capital of Romania", "x", "Where does the Danube end?"]


@pytest.fixture(scope="module")
def prompts(tiny_model_and_tokenizer) -> list[list[int]]:
    _, tok = tiny_model_and_tokenizer
    return [apply_chat(tok, q) for q in QUESTIONS]


@pytest.fixture(scope="module")
def greedy_single(tiny_backend, prompts):
    """Each prompt generated alone: the reference for the batching tests."""
    return [tiny_backend.generate([p], GREEDY)[0] for p in prompts]


def _fresh_backend(tiny_backend: HFBackend, **kw) -> HFBackend:
    """A backend over the same session model whose attributes a test may change."""
    return HFBackend(tiny_backend.model, tiny_backend.tokenizer, **kw)


# --- tiny model and loading ---------------------------------------------------------------


def test_tiny_model_tokenizer_and_loading(tiny_model_dir, tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    assert (tiny_model_dir / "model.safetensors").is_file()
    for token in SPECIAL_TOKENS:
        ids = tok.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and tok.decode(ids) == token
    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|endoftext|>"
    assert tok.pad_token_id != tok.eos_token_id
    assert model.config.vocab_size == len(tok)
    assert model.dtype == torch.float32 and not model.training
    assert not any(p.requires_grad for p in model.parameters())
    text = tok.decode(apply_chat(tok, "hi there"))
    assert text == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"


def test_tiny_model_is_seeded(tmp_path):
    from zsearch_cli.models.tiny import make_tiny_model

    a, b = make_tiny_model(tmp_path / "a", seed=1), make_tiny_model(tmp_path / "b", seed=1)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_trainable_load(tiny_model_dir):
    model, _ = load_model(str(tiny_model_dir), device="cpu", trainable=True)
    assert model.training and all(p.requires_grad for p in model.parameters())


def test_apply_chat_without_template_is_plain_encode(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    tok.chat_template = None
    assert apply_chat(tok, "who wrote it?") == tok.encode("who wrote it?")


def test_pad_reuses_existing_special_token(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    tok.pad_token = tok.eos_token  # as SmolLM2 ships it
    n = len(tok)
    loading._choose_pad_token(tok)
    assert tok.pad_token == "<|pad|>" and len(tok) == n  # reused, nothing added


def test_a_tokenizer_is_parsed_once_and_each_caller_gets_its_own(tmp_path, tiny_model_dir, monkeypatch):
    from transformers import AutoTokenizer

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    reads = []
    real = AutoTokenizer.from_pretrained
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: reads.append(a[0]) or real(*a, **k))
    first, second = load_tokenizer(str(folder)), load_tokenizer(str(folder))
    assert len(reads) == 1 and first is not second  # parsed once, a copy each
    assert first.encode("the river") == second.encode("the river") and first.pad_token_id == second.pad_token_id
    first.chat_template = "changed by one caller"
    assert load_tokenizer(str(folder)).chat_template == second.chat_template != first.chat_template
    # the folder's tokenizer rewritten in place (another max length): read again, not served stale
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 77}))
    assert load_tokenizer(str(folder)).model_max_length == 77 and len(reads) == 2


def test_resolve_model_path(tmp_path, monkeypatch, tiny_model_dir):
    assert resolve_model_path(str(tiny_model_dir)) == str(tiny_model_dir)
    assert resolve_model_path("Qwen/Qwen2.5-3B") == "Qwen/Qwen2.5-3B"  # hub ids pass through
    with pytest.raises(ZsearchError, match="no such model folder"):
        resolve_model_path(str(tmp_path / "missing"))
    with pytest.raises(ZsearchError, match="no such model folder"):
        load_model("./not/a/model")
    # The alias resolves to its cache folder and does not rebuild a complete one.
    monkeypatch.setenv("ZSEARCH_CACHE", str(tmp_path / "cache"))
    cached = tmp_path / "cache" / "models" / "smollm2"
    shutil.copytree(tiny_model_dir, cached)
    monkeypatch.setattr(loading, "_materialize_smollm2", lambda target: pytest.fail("rebuilt the cache"))
    assert resolve_model_path("smollm2") == str(cached)


def test_load_backend(tiny_model_dir):
    backend = load_backend(str(tiny_model_dir), backend="auto" if not factory.vllm_available() else "hf")
    assert isinstance(backend, HFBackend)
    with pytest.raises(ZsearchError, match="unknown backend"):
        load_backend(str(tiny_model_dir), backend="tgi")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_vllm_missing_is_a_one_line_error():
    from zsearch_cli.models.vllm import VLLM_MISSING, VLLMBackend

    with pytest.raises(ZsearchError) as err:
        VLLMBackend("smollm2")
    assert str(err.value) == VLLM_MISSING
    with pytest.raises(ZsearchError, match="vLLM is not installed"):
        load_backend("smollm2", backend="vllm")


def test_vllm_backend_maps_the_engine_api(tiny_model_dir, monkeypatch):
    """Our side of the vLLM contract, against a stand-in engine (no GPU in CI)."""
    calls: dict = {}

    class FakeLLM:
        def __init__(self, **kw):
            calls["llm"] = kw
            self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))

        def generate(self, prompts, sampling_params, use_tqdm):
            calls["sampling"] = sampling_params
            reasons = [("stop", "</search>"), ("stop", None), ("length", None)]
            outs = []
            for prompt, (finish, stop_reason) in zip(prompts, reasons):
                ids = [prompt["prompt_token_ids"][-1], 7]
                lps = [{t: SimpleNamespace(logprob=-0.5)} for t in ids]
                comp = SimpleNamespace(token_ids=ids, logprobs=lps, finish_reason=finish, stop_reason=stop_reason)
                outs.append(SimpleNamespace(outputs=[comp]))
            return outs

    class FakeCuda:  # vllm.platforms.current_platform on a CUDA machine
        device_type = "cuda"

        def is_unspecified(self):
            return False

        def is_cpu(self):
            return False

    fake = types.ModuleType("vllm")
    fake.LLM, fake.SamplingParams = FakeLLM, lambda **kw: kw
    fake.__version__ = "0.32.0"  # inside the supported range (models/vllm.py SUPPORTED_VLLM)
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = FakeCuda()
    monkeypatch.setitem(sys.modules, "vllm", fake)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    from zsearch_cli.models.vllm import VLLMBackend

    backend = VLLMBackend(str(tiny_model_dir))
    assert calls["llm"]["logprobs_mode"] == "processed_logprobs" and calls["llm"]["dtype"] == "bfloat16"
    assert calls["llm"]["gpu_memory_utilization"] == 0.5  # a GPU platform: the GPU memory share applies
    params = SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.9, seed=1)
    outs = backend.generate([[1, 2], [3], [4, 5]], params, stop=["</search>"])
    sp = calls["sampling"]
    assert sp[0]["stop"] == ["</search>"] and sp[0]["include_stop_str_in_output"] and sp[0]["logprobs"] == 0
    assert not sp[0]["skip_special_tokens"] and len({s["seed"] for s in sp}) == 3
    assert [(o.finish_reason, o.stop_string) for o in outs] == [("stop", "</search>"), ("eos", None), ("length", None)]
    assert outs[0].token_ids == [2, 7] and outs[0].logprobs == [-0.5, -0.5]
    assert backend.generate([[1]], SamplingParams(max_new_tokens=0))[0].token_ids == []


# --- HFBackend ----------------------------------------------------------------------------


def test_greedy_batched_equals_per_prompt(tiny_backend, prompts, greedy_single):
    batched = tiny_backend.generate(prompts, GREEDY)
    for got, want in zip(batched, greedy_single):
        assert got.token_ids == want.token_ids
        assert got.finish_reason == want.finish_reason == "length"
        assert got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
    # Greedy logprobs are the raw log-softmax at the argmax: the best token's, so <= 0.
    assert all(lp <= 0 for out in batched for lp in out.logprobs)


def _forward_logprobs(model, prompt: list[int], new: list[int]) -> list[float]:
    with torch.no_grad():
        logp = model(torch.tensor([prompt + new])).logits[0].float().log_softmax(-1)
    return [logp[len(prompt) - 1 + j, t].item() for j, t in enumerate(new)]


def test_logprobs_match_a_fresh_forward_pass(tiny_backend, prompts):
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=1.0, seed=7)
    for prompt, out in zip(prompts, tiny_backend.generate(prompts, params)):
        assert len(out.token_ids) == len(out.logprobs) == 16
        assert out.logprobs == pytest.approx(_forward_logprobs(tiny_backend.model, prompt, out.token_ids), abs=1e-4)


def test_logprobs_follow_temperature(tiny_backend, prompts):
    params = SamplingParams(max_new_tokens=8, temperature=0.7, seed=3)
    out = tiny_backend.generate(prompts[:1], params)[0]
    with torch.no_grad():
        logits = tiny_backend.model(torch.tensor([prompts[0] + out.token_ids])).logits[0]
    logp = (logits / 0.7).log_softmax(-1)
    want = [logp[len(prompts[0]) - 1 + j, t].item() for j, t in enumerate(out.token_ids)]
    assert out.logprobs == pytest.approx(want, abs=1e-4)


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_backend, prompts):
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=123)
    a = tiny_backend.generate(prompts, params)
    assert [o.token_ids for o in tiny_backend.generate(prompts, params)] == [o.token_ids for o in a]
    # Row 0 keeps its samples whatever else shares the batch (same row index, same seed).
    assert tiny_backend.generate([prompts[0], prompts[3]], params)[0].token_ids == a[0].token_ids
    assert tiny_backend.generate(prompts[:1], params)[0].token_ids == a[0].token_ids
    # Chunking into smaller batches keeps every row's seed.
    chunked = _fresh_backend(tiny_backend, max_batch_size=1).generate(prompts, params)
    assert [o.token_ids for o in chunked] == [o.token_ids for o in a]
    # Identical prompts in one batch (a GRPO group) still get different samples.
    group = tiny_backend.generate([prompts[0]] * 4, params)
    assert len({tuple(o.token_ids) for o in group}) > 1
    other = tiny_backend.generate(prompts, SamplingParams(max_new_tokens=12, temperature=1.0, seed=124))
    assert [o.token_ids for o in other] != [o.token_ids for o in a]


def test_tiny_top_p_is_greedy_with_zero_logprob(tiny_backend, prompts, greedy_single):
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=1e-6, seed=0)
    for got, want in zip(tiny_backend.generate(prompts, params), greedy_single):
        assert got.token_ids == want.token_ids
        assert got.logprobs == pytest.approx([0.0] * len(got.logprobs), abs=1e-6)


def test_stop_string_straddling_tokens_keeps_its_ids(tiny_backend, prompts, greedy_single):
    tok = tiny_backend.tokenizer
    full = greedy_single[0].token_ids
    # Pick a stop string made of the end of one token and the start of the next.
    for k in range(3, len(full) - 1):
        left, right = tok.decode(full[k : k + 1]), tok.decode(full[k + 1 : k + 2])
        stop = left[-1:] + right[:1]
        if len(stop) == 2 and "\ufffd" not in stop and stop not in tok.decode(full[: k + 1]):
            break
    else:
        pytest.skip("no straddling pair in this sample")
    out = tiny_backend.generate(prompts[:1], GREEDY, stop=[stop, "never-produced"])[0]
    assert (out.finish_reason, out.stop_string) == ("stop", stop)
    assert out.token_ids == full[: k + 2]  # up to and including the completing token
    assert stop in tok.decode(out.token_ids) and stop not in tok.decode(out.token_ids[:-1])
    assert out.logprobs == pytest.approx(greedy_single[0].logprobs[: k + 2], abs=1e-5)


@pytest.mark.parametrize("compact", [True, False], ids=["drop-finished-rows", "mask-finished-rows"])
def test_eos_and_finished_rows_in_a_batch(tiny_backend, prompts, greedy_single, compact, monkeypatch):
    if not compact:  # a cache that cannot drop rows: finished rows are computed but ignored
        from transformers.cache_utils import Cache

        monkeypatch.delattr(Cache, "batch_select_indices")
    backend = _fresh_backend(tiny_backend)
    eos = greedy_single[0].token_ids[4]  # make row 0's fifth token an end-of-sequence id
    backend.eos_ids = {eos}
    outs = backend.generate(prompts, GREEDY)
    for got, want in zip(outs, greedy_single):
        ids = want.token_ids
        if eos in ids:  # rows that finished early stop right after the EOS id, keeping it
            cut = ids.index(eos) + 1
            assert (got.finish_reason, got.token_ids) == ("eos", ids[:cut])
        else:  # the others keep generating exactly as they would alone
            assert (got.finish_reason, got.token_ids) == ("length", ids)
    assert outs[0].finish_reason == "eos" and len(outs[0].token_ids) <= 5


def test_length_edge_cases_and_errors(tiny_backend, prompts):
    outs = tiny_backend.generate(prompts[:2], SamplingParams(max_new_tokens=0))
    assert [(o.token_ids, o.finish_reason) for o in outs] == [([], "length"), ([], "length")]
    assert tiny_backend.generate([], GREEDY) == []
    one = tiny_backend.generate(prompts[:1], SamplingParams(max_new_tokens=1, temperature=0))[0]
    assert len(one.token_ids) == 1 and one.finish_reason == "length"
    with pytest.raises(ZsearchError, match="empty"):
        tiny_backend.generate([prompts[0], []], GREEDY)


def test_generate_restores_training_mode(tiny_model_dir, prompts):
    model, tok = load_model(str(tiny_model_dir), device="cpu", trainable=True)
    HFBackend(model, tok).generate(prompts[:1], SamplingParams(max_new_tokens=2, temperature=0))
    assert model.training


# --- the real default model ------------------------------------------------------------------


@pytest.mark.slow
def test_smollm2_alias_builds_cache_and_generates(zsearch_cache, smollm2_model_and_tokenizer, monkeypatch):
    model, tok = smollm2_model_and_tokenizer
    folder = zsearch_cache / "models" / "smollm2"
    assert any(folder.glob("*.safetensors")) and not list(folder.glob("*.gguf"))
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert model.dtype == torch.float32 and getattr(model, "hf_quantizer", None) is None
    assert tok.pad_token_id != tok.eos_token_id  # reused <|endoftext|>, not a new token
    assert len(tok) == model.config.vocab_size

    # The second load reads the cached folder; a rebuild would fail this test.
    monkeypatch.setattr(loading, "_materialize_smollm2", lambda target: pytest.fail("rebuilt the cache"))
    start = time.perf_counter()
    load_tokenizer("smollm2")
    assert time.perf_counter() - start < 15

    backend = HFBackend(model, tok)
    prompt = apply_chat(tok, "What is the capital of France?")
    out = backend.generate([prompt], SamplingParams(max_new_tokens=8, temperature=0), stop=["\n"])[0]
    assert 1 <= len(out.token_ids) <= 8 and out.finish_reason in {"eos", "stop", "length"}
    assert "Paris" in tok.decode(out.token_ids)
