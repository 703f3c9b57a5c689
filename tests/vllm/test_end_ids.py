"""Finish reasons from the model's own end ids, on a second engine of its own (one engine
at a time per process: closing one tears down the distributed state any other shares)."""

from __future__ import annotations

from zsearch_cli.models.base import SamplingParams

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)


def test_an_end_id_from_the_generation_config_is_eos(vllm_tiny_dir, hf_tiny, tmp_path):
    # A model whose generation config lists an extra end id (as Qwen and the dequantized smollm2
    # do): both backends stop there with finish_reason 'eos', the end id kept in the output.
    import json
    import shutil

    from zsearch_cli.models.factory import load_backend
    from zsearch_cli.models.vllm import VLLMBackend

    prompts = [hf_tiny.tokenizer.encode("Who wrote the novel?")]
    full = hf_tiny.generate(prompts, GREEDY)[0]
    at = next(i for i in range(3, len(full.token_ids)) if full.token_ids[i] not in full.token_ids[:i])
    end_id = full.token_ids[at]
    model = shutil.copytree(vllm_tiny_dir, tmp_path / "with_end_id")
    config = json.loads((model / "generation_config.json").read_text())
    config["eos_token_id"] = [config["eos_token_id"], end_id]
    (model / "generation_config.json").write_text(json.dumps(config))
    hf = load_backend(str(model), backend="hf", device="cpu", dtype="float32")
    want = hf.generate(prompts, GREEDY)[0]
    assert (want.finish_reason, want.token_ids) == ("eos", full.token_ids[: at + 1])
    other = VLLMBackend(str(model), max_model_len=256)
    try:
        got = other.generate(prompts, GREEDY, stop=["</answer>"])[0]
    finally:
        other.close()
    assert (got.finish_reason, got.stop_string, got.token_ids) == ("eos", None, want.token_ids)
