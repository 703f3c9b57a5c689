"""The shipped format-warmed smollm2 adapter (``--model smollm2-warm``, issue 14): its
manifest matches the recipe that regenerates it (stages/warmup.sh) and the data it was
trained on, it is small safetensors, it loads by name in zsearch and with plain peft, and it
changes what smollm2 writes. A LoRA that zsearch trains from the ``smollm2`` alias loads with
plain peft too, and still with zsearch when its cache folder is gone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import zsearch_cli
from zsearch_cli.data.demo import demo_corpus, demo_qa
from zsearch_cli.errors import ZsearchError
from zsearch_cli.models import warm
from zsearch_cli.models.warm import MANIFEST, WEIGHTS, read_manifest, sha256_file, shipped_dir

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "stages" / "warmup.sh"
PROMPT = "Answer the question. Question: which river flows through Vienna?"


def _recipe_options(recipe: Path) -> dict[str, list[str]]:
    env = {**os.environ, "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([str(Path(zsearch_cli.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(["bash", str(recipe), "--print-options"], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout)


def test_the_shipped_manifest_holds_the_recipes_options():
    manifest = read_manifest()
    assert _recipe_options(RECIPE) == manifest["options"], "stages/warmup.sh and the shipped adapter disagree: rerun the recipe"
    sft = manifest["options"]["sft"]
    assert manifest["seed"] == int(sft[sft.index("--seed") + 1])
    for step, command in zip(warm.RECIPE_STEPS, manifest["commands"]):
        assert command.startswith(f"zsearch {step} ") and command.endswith(" ".join(manifest["options"][step]))


def test_an_edited_recipe_no_longer_matches(tmp_path):
    """The check above can fail: one changed option in a copy of the recipe is caught."""
    edited = tmp_path / "warmup.sh"
    text = RECIPE.read_text()
    assert "--lr 1e-3 " in text
    edited.write_text(text.replace("--lr 1e-3 ", "--lr 2e-3 "))
    assert _recipe_options(edited) != read_manifest()["options"]


def test_the_manifest_names_the_bundled_data_and_the_file_it_ships():
    manifest = read_manifest()
    data = manifest["data"]
    assert data["train"]["sha256"] == sha256_file(demo_qa("train")), "the bundled train split changed: rerun the recipe"
    assert data["corpus"]["sha256"] == sha256_file(demo_corpus()), "the bundled corpus changed: rerun the recipe"
    assert data["train"]["rows"] == data["trajectories"]["rows"] > 0
    assert manifest["versions"]["zsearch"] and manifest["versions"]["peft"]
    folder = shipped_dir()
    weights = folder / WEIGHTS
    assert manifest["adapter"]["sha256"] == sha256_file(weights)
    assert manifest["adapter"]["bytes"] == weights.stat().st_size < 5_000_000  # a few MB
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors", MANIFEST]
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == "smollm2"


def test_a_damaged_install_is_one_line(tmp_path, monkeypatch):
    copy = tmp_path / "smollm2-warm"
    shutil.copytree(shipped_dir(), copy)
    with open(copy / WEIGHTS, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 1]))
    monkeypatch.setattr(warm, "shipped_dir", lambda: copy)
    with pytest.raises(ZsearchError, match="not the file its manifest names; reinstall"):
        warm.warm_adapter_path(base=str(tmp_path), cache=tmp_path / "cache")


def _greedy(model, tok, n: int = 12) -> list[int]:
    import torch

    from zsearch_cli.models.loading import apply_chat

    ids = torch.tensor([apply_chat(tok, PROMPT)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.slow
def test_loads_by_name_and_with_plain_peft(zsearch_cache, smollm2_model_and_tokenizer):
    """``--model smollm2-warm`` (zsearch's one name resolver) and
    ``AutoPeftModelForCausalLM.from_pretrained`` on the folder it resolves to give the same
    greedy tokens, and not the base model's."""
    from peft import AutoPeftModelForCausalLM

    from zsearch_cli.models.loading import load_model, load_tokenizer, resolve_model_path
    from zsearch_cli.protocol import model_identity

    base, tok = smollm2_model_and_tokenizer
    folder = Path(resolve_model_path("smollm2-warm"))
    assert folder.parent == zsearch_cache / "models"
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        (zsearch_cache / "models" / "smollm2").resolve())
    merged, _ = load_model("smollm2-warm", device="cpu")
    peft_model = AutoPeftModelForCausalLM.from_pretrained(str(folder))
    ours, theirs, plain = _greedy(merged, tok), _greedy(peft_model, tok), _greedy(base, tok)
    assert ours == theirs
    assert ours != plain
    model, _, adapter = model_identity("smollm2-warm")
    assert model == "smollm2" and adapter.startswith("smollm2-warm@sha256s:")
    # The tokenizer alone, as `propose` loads the proposer's: the adapter folder has none of its
    # own, so it is its base's (this failed with "cannot load tokenizer" and stopped drzero-mini)
    assert not any(folder.glob("tokenizer*"))
    text = "<search> Who painted the Mona Lisa? </search>"
    assert load_tokenizer("smollm2-warm")(text)["input_ids"] == tok(text)["input_ids"]


@pytest.mark.slow
def test_a_lora_trained_from_the_alias_loads_with_peft_and_without_its_cache(
        tmp_path, zsearch_cache, smollm2_model_and_tokenizer):
    """What `zsearch sft/train --model smollm2 --lora-r N` save: the config names the cache
    folder (plain peft loads it) and zsearch_base.json the alias (zsearch loads it when the
    folder is gone, e.g. on another machine)."""
    from peft import AutoPeftModelForCausalLM, LoraConfig, get_peft_model

    from zsearch_cli.models.loading import load_model
    from zsearch_cli.train.policy import save_policy

    base, tok = smollm2_model_and_tokenizer
    fresh, _ = load_model("smollm2", device="cpu")
    lora = get_peft_model(fresh, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    save_policy(lora, tok, tmp_path / "final", "smollm2")
    reference = _greedy(AutoPeftModelForCausalLM.from_pretrained(str(tmp_path / "final")), tok)
    assert reference != _greedy(base, tok)  # a random (not zero) LoRA: the adapter is really applied
    recorded = json.loads((tmp_path / "final" / "zsearch_base.json").read_text())
    assert recorded["base"] == "smollm2" and recorded["fingerprint"].startswith("sha256s:")
    config = tmp_path / "final" / "adapter_config.json"
    data = json.loads(config.read_text())
    data["base_model_name_or_path"] = str(tmp_path / "gone" / "smollm2")  # another machine's cache
    config.write_text(json.dumps(data))
    merged, _ = load_model(str(tmp_path / "final"), device="cpu")
    assert _greedy(merged, tok) == reference
