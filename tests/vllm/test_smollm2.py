"""The bundled default model on the real engine: vLLM needs a safetensors folder, which the
``smollm2`` alias resolves to (the GGUF dequantized once into the cache, models/loading.py).
Greedy ids must equal the HF backend's, logprobs close, on a 30-layer model whose rounding
differences have more room to grow than the tiny model's."""

from __future__ import annotations

import pytest

from zsearch_cli.models.base import LOGP_TOLERANCE, SamplingParams


def test_smollm2_greedy_equals_hf(smollm2_model_and_tokenizer):
    from zsearch_cli.models.hf import HFBackend
    from zsearch_cli.models.loading import apply_chat
    from zsearch_cli.models.vllm import VLLMBackend

    model, tokenizer = smollm2_model_and_tokenizer
    hf = HFBackend(model, tokenizer)
    prompts = [apply_chat(tokenizer, "Who wrote Pride and Prejudice?")]
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    want = hf.generate(prompts, greedy)
    engine = VLLMBackend("smollm2", max_model_len=512)
    try:
        got = engine.generate(prompts, greedy)
        probe = prompts[0] + want[0].token_ids
        engine_logp = engine.sequence_logprobs(probe)
    finally:
        engine.close()
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-3)
    import torch

    with torch.no_grad():
        logp = model(torch.tensor([probe])).logits[0, :-1].float().log_softmax(-1)
    ours = logp.gather(-1, torch.tensor(probe[1:])[:, None]).squeeze(-1)
    gap = float((torch.tensor(engine_logp) - ours).abs().max())
    print(f"smollm2 probe max |engine - HF| logprob: {gap:.2e}")
    assert gap < LOGP_TOLERANCE["float32"]
    assert "Austen" in tokenizer.decode(want[0].token_ids)  # a real answer, not noise
