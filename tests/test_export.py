"""`zsearch export` (issue 23 §2): a trained run as a plain HF folder that transformers, peft
and vLLM load elsewhere; a LoRA names its base portably (the alias, never a local path); and
`train --merge-lora` writes OUT/final/merged.

The LoRA run trains from the ``smollm2`` alias, served here by a zsearch cache whose
``models/smollm2`` is the tiny model: the alias path of the code runs, in seconds.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from zsearch_cli.cli import app

runner = CliRunner()
PROMPTS = [[5, 17, 42, 8], [3, 99, 120, 7, 64, 11]]


def _ok(args: list[str]):
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def _fake_smollm2_cache(root: Path, tiny_model_dir: Path) -> Path:
    """``root`` as a zsearch cache whose smollm2 is the tiny model (marked current)."""
    from zsearch_cli.models.loading import _smollm2_gguf

    target = root / "models" / "smollm2"
    shutil.copytree(tiny_model_dir, target)
    try:
        size = _smollm2_gguf().stat().st_size
    except Exception:  # noqa: BLE001 - no package: any zsearch_source.json is current
        size = 0
    (target / "zsearch_source.json").write_text(json.dumps({"gguf": "tiny", "gguf_bytes": size}))
    return root


TRAIN = ["train", "--algo", "reinforce", "-G", "1", "--steps", "1", "--batch-size", "2", "--max-turn-tokens", "8",
         "--max-turns", "1", "--device", "cpu", "--lr", "1e-3", "--save-every", "1"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model_dir, demo_index):
    """A 1-step LoRA run from the smollm2 alias, with --merge-lora; its final adapter's B
    matrices are then made random (one REINFORCE step on a random model earns reward 0, so
    the trained LoRA is still zero, and a merge of zero would prove nothing)."""
    from safetensors.torch import load_file, save_file

    root = tmp_path_factory.mktemp("export")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZSEARCH_CACHE", str(_fake_smollm2_cache(root / "cache", tiny_model_dir)))
        out = root / "run"
        _ok([*TRAIN, "--model", "smollm2", "--index", demo_index, "--out", out, "--lora-r", "4", "--merge-lora"])
        weights = out / "final" / "adapter_model.safetensors"
        gen = torch.Generator().manual_seed(0)
        tensors = {k: (torch.randn(v.shape, generator=gen) * 0.5 if "lora_B" in k else v)
                   for k, v in load_file(str(weights)).items()}
        save_file(tensors, str(weights), metadata={"format": "pt"})
        yield out


def _greedy_backend(model, tokenizer) -> list[list[int]]:
    from zsearch_cli.models.base import SamplingParams
    from zsearch_cli.models.hf import HFBackend

    outs = HFBackend(model, tokenizer, device="cpu").generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0))
    return [o.token_ids for o in outs]


def _weights_only(folder: Path) -> None:
    names = [p.name for p in folder.rglob("*")]
    assert not [n for n in names if n.startswith(("optimizer", "scheduler", "rng", "ranks", "critic"))
                or n.endswith((".pt", ".bin")) or n in ("trainer_state.json", "zsearch-manifest.json",
                                                         "zsearch_base.json", "healthy")], names
    assert not [p for p in folder.iterdir() if p.is_dir()]


def test_lora_run_exports_as_adapter_and_merged_with_the_same_greedy_ids(lora_run, tmp_path, monkeypatch,
                                                                         tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from zsearch_cli.models.loading import load_model, resolve_model_path

    final = lora_run / "final"
    result = _ok(["export", lora_run, "--out", tmp_path / "e1"])
    assert f"exporting {final}" in " ".join(result.output.split())
    _ok(["export", lora_run, "--out", tmp_path / "e2", "--merge-lora"])
    e1, e2 = tmp_path / "e1", tmp_path / "e2"
    _weights_only(e1)
    _weights_only(e2)

    config_text = (e1 / "adapter_config.json").read_text()
    assert json.loads(config_text)["base_model_name_or_path"] == "smollm2"
    assert '"/' not in config_text and str(lora_run.parent) not in config_text  # no absolute path at all
    meta = json.loads((e1 / "zsearch_export.json").read_text())
    assert meta["base"]["name"] == "smollm2" and meta["base"]["fingerprint"].startswith("sha256s:")
    assert meta["source_step"] == 1 and meta["algo"] == "reinforce" and meta["config"]["lora_r"] == 4

    reference_model, tok = load_model(str(final), device="cpu")  # zsearch: base + adapter, merged
    reference = _greedy_backend(reference_model, tok)
    base, _ = load_model("smollm2", device="cpu")
    assert _greedy_backend(base, tok) != reference  # the adapter changes the continuation

    tokenizer = AutoTokenizer.from_pretrained(e2)
    assert tokenizer.chat_template  # the chat template travels with the tokenizer
    merged = AutoModelForCausalLM.from_pretrained(e2)  # plain transformers
    assert not merged.config.to_dict().get("quantization_config") and merged.config.use_cache
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(resolve_model_path("smollm2")), str(e1))
    peft_model.eval()
    assert _greedy_backend(merged, tokenizer) == reference
    assert _greedy_backend(peft_model, tokenizer) == reference
    with torch.no_grad():
        ids = torch.tensor([PROMPTS[1]])
        torch.testing.assert_close(merged(ids).logits, peft_model(ids).logits, atol=1e-5, rtol=1e-5)

    # the weights dominate the folder: no second copy, no optimizer state
    weights = sum(p.stat().st_size for p in e2.glob("*.safetensors"))
    total = sum(p.stat().st_size for p in e2.iterdir())
    assert weights <= total < weights + 5 * 2**20
    assert sum(p.stat().st_size for p in e1.iterdir()) < weights / 4

    # zsearch's loader resolves the alias from another working directory and another cache
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.setenv("ZSEARCH_CACHE", str(_fake_smollm2_cache(tmp_path / "cache2", tiny_model_dir)))
    monkeypatch.chdir(other)
    moved = other / "copy"
    shutil.copytree(e1, moved)
    again, tok2 = load_model("copy", device="cpu")
    assert _greedy_backend(again, tok2) == reference


def test_export_of_a_checkpoint_takes_only_its_weights(lora_run, tmp_path):
    step = lora_run / "checkpoints" / "step-1"
    assert (step / "optimizer.pt").is_file()  # the source does hold optimizer and RNG state
    result = _ok(["export", step, "--out", tmp_path / "ck", "--dtype", "bfloat16"])
    assert "exporting the weights of checkpoint" in result.output
    _weights_only(tmp_path / "ck")
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "ck" / "adapter_model.safetensors"))
    assert tensors and all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert json.loads((tmp_path / "ck" / "zsearch_export.json").read_text())["source_step"] == 1


def test_train_merge_lora_writes_final_merged_for_plain_transformers(lora_run):
    from transformers import AutoModelForCausalLM

    merged = lora_run / "final" / "merged"
    assert (merged / "config.json").is_file() and not (merged / "adapter_config.json").exists()
    AutoModelForCausalLM.from_pretrained(merged)


def test_model_card_names_algorithm_base_protocol_and_eval(lora_run, tmp_path, demo_index):
    _ok(["eval", "--model", lora_run / "final", "--limit", "1", "--index", demo_index, "--out", tmp_path / "ev",
         "--max-turn-tokens", "4", "--max-turns", "1", "--device", "cpu"])
    _ok(["export", lora_run, "--out", tmp_path / "card", "--eval", tmp_path / "ev"])
    card = (tmp_path / "card" / "README.md").read_text()
    assert "--algo reinforce" in card and "LoRA r=4" in card and "`smollm2`" in card
    assert "prompt protocol: `tags`" in card and "top-k: 3" in card and "Training steps**: 1" in card
    assert "| demo | agent |" in card and "zsearch eval --model card" in card


def test_full_run_exports_and_refuses_what_it_should(tmp_path, tiny_model_dir, demo_index):
    from transformers import AutoModelForCausalLM

    from zsearch_cli.models.loading import load_model

    out = tmp_path / "full"
    _ok([*TRAIN, "--model", tiny_model_dir, "--index", demo_index, "--out", out, "--save-every", "0"])
    shutil.rmtree(out / "final")  # no final/: the newest checkpoint is exported (none here: an error)
    bad = runner.invoke(app, ["export", str(out), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "not a run, checkpoint or model folder" in bad.output
    assert "final/" in bad.output and "checkpoints/step-N/" in bad.output

    out2 = tmp_path / "full2"
    _ok([*TRAIN, "--model", tiny_model_dir, "--index", demo_index, "--out", out2, "--steps", "2",
         "--keep-checkpoints", "2"])
    shutil.rmtree(out2 / "final")
    result = _ok(["export", out2, "--out", tmp_path / "f"])
    assert "has no final/: exporting its newest checkpoint, step-2" in " ".join(result.output.split())
    _weights_only(tmp_path / "f")
    ours, tok = load_model(str(out2 / "checkpoints" / "step-2"), device="cpu")
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "f")
    assert _greedy_backend(theirs, tok) == _greedy_backend(ours, tok)
    assert json.loads((tmp_path / "f" / "zsearch_export.json").read_text())["base"]["resolvable"] is False

    again = runner.invoke(app, ["export", str(out2), "--out", str(tmp_path / "f")])
    assert again.exit_code == 2 and "exists and is not empty; pass --force" in again.output
    _ok(["export", out2, "--out", tmp_path / "f", "--force", "--dtype", "float16"])
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "f").dtype == torch.float16
    assert not list(tmp_path.glob(".f.*"))  # the temp folder and the old export moved aside are gone
    # shareable: every file with the mode open() gives (transformers writes its weights 0600)
    from zsearch_cli.files import umask_mode

    assert {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "f").iterdir()} == {
        p.name: oct(umask_mode(0o666)) for p in (tmp_path / "f").iterdir()}
    bad = runner.invoke(app, ["export", str(out2), "--out", str(out2)])
    assert bad.exit_code == 2 and "is (or holds) the source" in bad.output

    # A run whose checkpoints are all damaged (here cut short): the damage is named (issue 36.3;
    # it said "not a run, checkpoint or model folder")
    for step in (1, 2):
        weights = out2 / "checkpoints" / f"step-{step}" / "model.safetensors"
        with open(weights, "r+b") as fh:
            fh.truncate(weights.stat().st_size // 2)
    bad = runner.invoke(app, ["export", str(out2), "--out", str(tmp_path / "g")])
    text = " ".join(bad.output.split())
    assert bad.exit_code == 2 and "no complete checkpoint" in text and "step-2, is damaged" in text, text
    assert "model.safetensors" in text and "not a run" not in text


def test_portable_base_names_never_an_absolute_path(tmp_path, tiny_model_dir):
    from zsearch_cli.models.loading import adapter_base
    from zsearch_cli.train.policy import portable_base

    snapshot = tmp_path / "hub" / "models--org--name" / "snapshots" / "0123abcd"
    shutil.copytree(tiny_model_dir, snapshot)
    assert portable_base(str(snapshot)) == ("org/name", "0123abcd", True)
    name, fingerprint, resolvable = portable_base(str(tiny_model_dir))
    assert (name, resolvable) == (tiny_model_dir.name, False) and fingerprint.startswith("sha256s:")
    assert portable_base(str(tmp_path / "gone" / "model")) == ("model", None, False)
    assert portable_base("org/other")[::2] == ("org/other", True)

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    (adapter / "zsearch_base.json").write_text(json.dumps({"base": "org/name", "fingerprint": "0123abcd"}))
    assert adapter_base(adapter) == "org/name"  # the local folder is gone: the hub id it came from
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(snapshot)}))
    assert adapter_base(adapter) == str(snapshot)  # here it still is: this machine's copy


def test_export_eval_of_another_model_is_refused(lora_run, tmp_path, demo_index, tiny_model_dir):
    # issue 36.10: `export --eval DIR` copied any eval's numbers into the card, another model's too.
    # An eval of the tiny base model is not an eval of the run's trained adapter.
    _ok(["eval", "--model", tiny_model_dir, "--limit", "1", "--index", demo_index, "--out", tmp_path / "other",
         "--max-turn-tokens", "4", "--max-turns", "1", "--device", "cpu"])
    result = runner.invoke(app, [str(a) for a in ["export", lora_run, "--out", tmp_path / "card", "--eval",
                                                  tmp_path / "other"]])
    assert result.exit_code == 2, result.output
    assert "are of" in result.output and "not of the exported weights" in result.output
    assert "evaluate" in result.output and not (tmp_path / "card").exists()
