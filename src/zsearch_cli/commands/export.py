"""``zsearch export``: a trained model as a plain HF folder that transformers, peft and vLLM
load on another machine.

The source is a run folder (its ``final/``, else its newest complete checkpoint), a
checkpoint folder (``OUT/checkpoints/step-N``: its weights only, never the optimizer, RNG or
trainer state) or a final/model folder. The export holds the safetensors weights (full, or a
peft adapter whose ``base_model_name_or_path`` is the base's portable name: an alias, a hub
id, never an absolute path), the tokenizer with its chat template, ``config.json`` /
``generation_config.json``, a README.md model card (``export_card.py``) and
``zsearch_export.json`` (where it came from, the base's name and fingerprint, the resolved
training config). An adapter on ``smollm2-warm`` also carries the shipped warm-up layer, in
``smollm2-warm/``: without it only zsearch could rebuild its base. It is written into a temp
folder beside ``--out`` and renamed, so a killed export leaves no half folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from zsearch_cli.commands.export_card import WARM_FOLDER, model_card
from zsearch_cli.config.commands import ExportOptions
from zsearch_cli.config.fields import choices_of
from zsearch_cli.errors import ZsearchError, stored_config
from zsearch_cli.files import new_folder_beside, swap_in, umask_mode

EXPORT_FILE = "zsearch_export.json"
DTYPES = choices_of(ExportOptions, "dtype")
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")


def _is_model(path: Path) -> bool:
    return (path.is_dir() and any(path.glob("*.safetensors"))
            and ((path / "config.json").is_file() or (path / "adapter_config.json").is_file()))


def find_source(path: Path) -> tuple[Path, str, Path | None, str]:
    """(model folder, ``final`` | ``checkpoint``, its run folder or None, one line saying which)."""
    from zsearch_cli.train.checkpoint import STATE_FILE, _step_dirs, checkpoint_problem, checkpoints

    if not path.is_dir():
        raise ZsearchError(f"{path}: no such folder (give a run, checkpoint or final folder)")
    if _is_model(path / "final"):
        return path / "final", "final", path, f"exporting {path / 'final'} (the run's final model)"
    found = checkpoints(path)
    if found:
        step_dir = found[-1][1]
        return step_dir, "checkpoint", path, f"{path} has no final/: exporting its newest checkpoint, {step_dir.name}"
    damaged = _step_dirs(path)
    if damaged:  # a run whose checkpoints are all damaged: name the newest one's damage, not "not a run"
        step_dir = damaged[-1][1]
        raise ZsearchError(f"{path}: has no final/ and no complete checkpoint; the newest, {step_dir}, is damaged: "
                           f"{checkpoint_problem(step_dir)}")
    if (path / STATE_FILE).is_file():
        problem = checkpoint_problem(path)
        if problem:
            raise ZsearchError(f"{path}: {problem}; the checkpoint is damaged")
        run = path.parent.parent if path.parent.name == "checkpoints" else None
        return path, "checkpoint", run, f"exporting the weights of checkpoint {path}"
    if _is_model(path):
        run = path.parent if path.name == "final" else None
        return path, "final", run, f"exporting {path}"
    raise ZsearchError(f"{path}: not a run, checkpoint or model folder (looked for final/, checkpoints/step-N/, "
                       "trainer_state.json, config.json or adapter_config.json beside *.safetensors)")


def run_info(model_dir: Path, kind: str, run: Path | None) -> tuple[dict[str, Any], int | None, dict[str, Any]]:
    """(resolved training config, steps trained, protocol) from the checkpoint's state or the
    run's metrics.parquet metadata (empty / None where neither says)."""
    import pyarrow.parquet as pq

    from zsearch_cli.artifacts import read_metadata
    from zsearch_cli.train.checkpoint import checkpoints, read_state

    config: dict[str, Any] = {}
    step: int | None = None
    protocol: dict[str, Any] = {}
    if kind == "checkpoint":
        state = read_state(model_dir)
        config, step = dict(state.get("config") or {}), state.get("step")
    metrics = run / "metrics.parquet" if run is not None else None
    if metrics is not None and metrics.is_file():
        try:
            meta = read_metadata(metrics)
            config = config or dict(meta.get("config") or {})
            protocol = dict(meta.get("protocol") or {})
            if step is None:
                steps = [s for s in pq.read_table(metrics, columns=["step"]).column("step").to_pylist() if s is not None]
                step = max(steps) if steps else None
        except Exception:  # noqa: BLE001 - a damaged metrics file only leaves the card shorter
            pass
    if run is not None and (not config or step is None):
        found = checkpoints(run)
        if found:
            state = read_state(found[-1][1])
            config = config or dict(state.get("config") or {})
    if kind == "final" and step is None and config.get("steps"):
        step = config.get("steps") if "algo" in config else config.get("max_steps")
    return config, step, protocol


def eval_rows(*folders: Path | None) -> list[dict[str, Any]]:
    """Every EVAL_SUMMARY row under the folders (a run folder, a `zsearch eval --out` folder)."""
    from zsearch_cli.artifacts import read_artifact
    from zsearch_cli.schemas import EVAL_SUMMARY

    rows = []
    for folder in folders:
        for path in sorted(folder.rglob("*.summary.parquet")) if folder is not None and folder.is_dir() else []:
            try:
                rows += read_artifact(path, EVAL_SUMMARY).to_pylist()
            except ZsearchError:
                continue
    return rows


def same_model_rows(eval_dir: Path | None, src: Path) -> list[dict[str, Any]]:
    """The ``--eval DIR`` rows, each checked to be of the exported weights: an eval of another
    model would put its numbers in this model's card. The check compares fingerprints
    (protocol.model_identity): each adapter's of a LoRA source, base side first (the warm
    layer of smollm2-warm, then the trained one), the weights' otherwise."""
    from zsearch_cli.protocol import model_identity

    rows = eval_rows(eval_dir)
    if not rows:
        return rows
    _, revision, adapter = model_identity(str(src))
    own = _layer_fingerprints(adapter) if adapter else revision
    for row in rows:
        theirs = _layer_fingerprints(row["adapter"]) if row.get("adapter") else row.get("model_revision")
        if own is None or theirs != own:
            raise ZsearchError(
                f"--eval {eval_dir}: its results ({row.get('dataset')}) are of {row.get('model')!r} "
                f"({theirs or 'no fingerprint'}), not of the exported weights {src} ({own or 'no fingerprint'}); "
                f"evaluate {src} itself (`zsearch eval --model {src}`) or export without --eval")
    return rows


def _layer_fingerprints(adapter: str) -> str:
    """``fp1 + fp2``: the fingerprints of an adapter stack's layers, without the folders they
    were evaluated from (an eval of a copy elsewhere is of the same weights)."""
    from zsearch_cli.protocol import ADAPTER_JOIN, adapter_layers

    return ADAPTER_JOIN.join(layer.rpartition("@")[2] for layer in adapter_layers(str(adapter)))


def _carry_warm_layer(base: dict[str, Any], tmp: Path, note: Any) -> str:
    """Copy the shipped warm-up layer of ``smollm2-warm`` into ``tmp/smollm2-warm`` (the files
    as shipped: their fingerprint is the one the eval protocol records); returns the folder
    name. A warm layer other than the one trained on is said in one line: the export and
    zsearch's own loading both use the installed one."""
    from zsearch_cli.models.warm import WARM_ALIAS, checked_shipped_dir
    from zsearch_cli.protocol import model_identity

    shipped = checked_shipped_dir()
    installed = (model_identity(WARM_ALIAS)[2] or "").rpartition("@")[2]
    if base["fingerprint"] and installed != base["fingerprint"]:
        note(f"the adapter was trained on the {WARM_ALIAS} layer {base['fingerprint']}; this zsearch ships "
             f"{installed}, which the export carries: export with the zsearch version that trained it")
    shutil.copytree(shipped, tmp / WARM_FOLDER)
    return WARM_FOLDER


def _merged_beside(src: Path, source: Path) -> str | None:
    """``final/merged`` (relative to the folder exported from) when ``train --merge-lora`` wrote
    the adapter's full weights beside it, else None."""
    merged = src / "merged"
    if not (merged / "config.json").is_file():
        return None
    try:
        return merged.resolve().relative_to(source.resolve()).as_posix()
    except ValueError:
        return merged.name


def _stored_dtype(folder: str | Path) -> str:
    try:
        data = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    found = str(data.get("dtype") or data.get("torch_dtype") or "float32")
    return found if found in DTYPES else "float32"


def _write_full(model: Any, tokenizer: Any, dtype: str, tmp: Path) -> None:
    from zsearch_cli.models.loading import resolve_dtype

    model.to(resolve_dtype(dtype, "cpu"))
    model.config.use_cache = True  # training turned it off; generation wants it
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)


def _write_adapter(src: Path, base_name: str, dtype: str, tmp: Path) -> None:
    from safetensors.torch import load_file, save_file

    from zsearch_cli.models.loading import load_tokenizer, resolve_dtype

    weights = src / ADAPTER_FILES[0]
    if dtype == "auto":
        shutil.copyfile(weights, tmp / weights.name)
    else:
        to = resolve_dtype(dtype, "cpu")
        tensors = {k: (v.to(to) if v.is_floating_point() else v) for k, v in load_file(str(weights)).items()}
        save_file(tensors, str(tmp / weights.name), metadata={"format": "pt"})
    config = json.loads((src / ADAPTER_FILES[1]).read_text())
    config["base_model_name_or_path"] = base_name
    (tmp / ADAPTER_FILES[1]).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer = load_tokenizer(str(src) if any(src.glob("tokenizer*")) else base_name)
    tokenizer.save_pretrained(tmp)


def base_of(src: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The base model: portable name, fingerprint, and whether that name resolves elsewhere."""
    from zsearch_cli.models.loading import adapter_base, is_lora_checkpoint
    from zsearch_cli.models.warm import BASE_FILE
    from zsearch_cli.train.policy import portable_base

    if is_lora_checkpoint(src):
        name, fingerprint, resolvable = portable_base(adapter_base(src))
        try:  # what training recorded: the fingerprint of the base it really trained on
            recorded = json.loads((src / BASE_FILE).read_text())
            if recorded.get("base") == name and recorded.get("fingerprint"):
                fingerprint = recorded["fingerprint"]
        except (OSError, ValueError, AttributeError):
            pass
    elif config.get("model"):
        name, fingerprint, resolvable = portable_base(str(config["model"]))
    else:
        return {"name": None, "fingerprint": None, "resolvable": False}
    return {"name": name, "fingerprint": fingerprint, "resolvable": resolvable}


def export(source: Path, out: Path, *, merge_lora: bool = False, dtype: str = "auto", eval_dir: Path | None = None,
           force: bool = False, note: Any = print) -> Path:
    """Write ``out`` from ``source`` (see the module docstring); returns ``out``."""
    from zsearch_cli import __version__
    from zsearch_cli.models.loading import WARM_ALIAS, _load_lora_merged, is_lora_checkpoint, load_model

    if dtype not in DTYPES:
        raise ZsearchError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if eval_dir is not None and not eval_dir.is_dir():
        raise ZsearchError(f"--eval {eval_dir}: no such folder (give a `zsearch eval --out` folder)")
    src, kind, run, line = find_source(source)
    o, s = out.resolve(), source.resolve()
    if o == s or o in s.parents or o == src.resolve():
        raise ZsearchError(f"--out {out}: is (or holds) the source {source}; choose another folder")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise ZsearchError(f"--out {out}: exists and is not empty; pass --force to replace it")
    evaluated = same_model_rows(eval_dir, src)  # before any weights load: another model's numbers are refused
    note(line)
    config, step, protocol = run_info(src, kind, run)
    # a run written before keys were withheld may hold one: the export never copies it (errors.stored_config)
    config, protocol = stored_config(config), stored_config(protocol)
    base = base_of(src, config)
    adapter = is_lora_checkpoint(src)
    weights = "LoRA adapter" if adapter and not merge_lora else "full weights (LoRA merged)" if adapter else "full weights"
    if adapter and not merge_lora and not base["resolvable"]:
        note(f"the base is a local folder: the adapter names it {base['name']!r}; load it with peft on a copy of that "
             "folder, or export with --merge-lora")
    written, warm_layer = dtype, None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = new_folder_beside(out, note)  # the folder rule (files.py); a dead export's leftovers go first
    try:
        if adapter and not merge_lora:
            written = dtype if dtype != "auto" else "as trained"
            _write_adapter(src, base["name"], dtype, tmp)
            if base["name"] == WARM_ALIAS:
                warm_layer = _carry_warm_layer(base, tmp, note)
        else:
            if adapter:
                from zsearch_cli.models.loading import adapter_base, resolve_model_path

                written = dtype if dtype != "auto" else _stored_dtype(resolve_model_path(adapter_base(src)))
                model, tokenizer = _load_lora_merged(str(src), "cpu", "float32", False)  # merge in fp32, then cast
            else:
                written = dtype if dtype != "auto" else _stored_dtype(src)
                model, tokenizer = load_model(str(src), device="cpu", dtype=written)
            _write_full(model, tokenizer, written, tmp)
        info = {"zsearch_version": __version__, "source": str(source.resolve()), "source_kind": kind,
                "source_folder": str(src.resolve()), "source_step": step, "weights": weights, "dtype": written,
                "base": base, "algo": config.get("algo") or ("sft" if "grad_accum" in config else None),
                "method": (f"lora r={config.get('lora_r')}" if adapter else "full") + (" merged" if adapter and merge_lora else ""),
                "protocol": protocol, "config": config, "warm_layer": warm_layer,
                # the full weights train --merge-lora wrote beside the adapter: what vLLM can serve
                "merged_beside": _merged_beside(src, source) if adapter else None}
        (tmp / EXPORT_FILE).write_text(json.dumps(info, indent=2, default=str) + "\n")
        (tmp / "README.md").write_text(model_card(info, eval_rows(run) + evaluated, out.name))
        for f in tmp.rglob("*"):  # transformers writes the weights 0600: an export is meant to be shared
            f.chmod(umask_mode(0o777 if f.is_dir() else 0o666))
        swap_in(tmp, out)  # the old export moved aside, the new one renamed in, the old removed
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
