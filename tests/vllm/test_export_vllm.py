"""`zsearch export --merge-lora` of a LoRA run loads in vLLM (CPU build) and decodes greedily
as the HF backend does on the same exported folder (issue 23 §2)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.models.base import SamplingParams

pytestmark = pytest.mark.vllm
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
runner = CliRunner()


def _ok(args: list) -> None:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output


def test_a_merged_lora_export_loads_in_vllm_with_the_hf_greedy_ids(vllm_tiny_dir, hf_tiny, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from zsearch_cli.models.factory import load_backend

    index, run = tmp_path / "index", tmp_path / "run"
    _ok(["index", "--out", index, "--kind", "bm25"])
    _ok(["train", "--algo", "reinforce", "-G", "1", "--model", vllm_tiny_dir, "--index", index, "--steps", "1",
         "--batch-size", "2", "--max-turn-tokens", "8", "--max-turns", "1", "--device", "cpu", "--backend", "hf",
         "--out", run, "--lora-r", "4", "--save-every", "0"])
    # one REINFORCE step of a random model earns reward 0 (a zero LoRA): make the adapter random
    weights = run / "final" / "adapter_model.safetensors"
    gen = torch.Generator().manual_seed(0)
    save_file({k: (torch.randn(v.shape, generator=gen) * 0.5 if "lora_B" in k else v)
               for k, v in load_file(str(weights)).items()}, str(weights), metadata={"format": "pt"})
    _ok(["export", run, "--out", tmp_path / "merged", "--merge-lora"])

    prompts = [hf_tiny.tokenizer.encode("Who wrote the novel?"), hf_tiny.tokenizer.encode("The river flows")]
    hf = load_backend(str(tmp_path / "merged"), backend="hf", device="cpu", dtype="float32")
    want = [o.token_ids for o in hf.generate(prompts, GREEDY)]
    assert want != [o.token_ids for o in hf_tiny.generate(prompts, GREEDY)]  # the merged LoRA is really there
    engine = load_backend(str(tmp_path / "merged"), backend="vllm", dtype="float32", seed=0, max_model_len=256)
    try:
        got = [o.token_ids for o in engine.generate(prompts, GREEDY)]
    finally:
        engine.close()
    assert got == want
