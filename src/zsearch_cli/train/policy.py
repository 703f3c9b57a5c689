"""The models a run trains or consults: policy (full or LoRA), frozen reference, PPO critic.

Why a LoRA policy needs no second copy for its reference: the reference is the base
weights, which are exactly the LoRA model with the adapter switched off (peft's
``disable_adapter()``). A full fine-tune loads a frozen copy once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.loading import ALIASES, load_model, resolve_model_path
from zsearch_cli.models.warm import BASE_FILE
from zsearch_cli.train.config import TrainConfig
from zsearch_cli.train.distributed import distribution


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def _lora_config(cfg: TrainConfig, task_type: str | None) -> Any:
    from peft import LoraConfig

    targets = [t.strip() for t in cfg.optim.lora_targets.split(",") if t.strip()]
    return LoraConfig(r=cfg.optim.lora_r, lora_alpha=cfg.optim.lora_alpha, target_modules=targets, lora_dropout=0.0,
                      bias="none", task_type=task_type)


def base_reference(name: str) -> str:
    """How a LoRA checkpoint names its base: hub ids as given, folders absolute, and an alias
    as its cache folder, so plain peft (``AutoPeftModelForCausalLM``) finds the base; the
    alias itself goes to ``zsearch_base.json`` (:func:`save_policy`) for zsearch's loader."""
    if name not in ALIASES and not Path(name).expanduser().exists():
        return name
    return str(Path(resolve_model_path(name)).resolve())


_HUB_SNAPSHOT = re.compile(r"models--([^/]+)--([^/]+)/snapshots/([0-9a-f]{7,})/?$")


def portable_base(name: str) -> tuple[str, str | None, bool]:
    """(portable name, fingerprint, resolvable) of a base model: an alias stays the alias,
    a hub id stays the id, a folder of the hub cache becomes its ``org/name`` and the
    dequantized smollm2 cache its alias; any other folder can only be named by its folder
    name (``resolvable`` False: a copy elsewhere needs that folder, or a merged export).
    The fingerprint is protocol.py's model revision: the hub commit, or ``sha256s:`` of
    the weights. Never an absolute path."""
    from zsearch_cli.models.loading import smollm2_cache_path
    from zsearch_cli.protocol import model_identity

    def fingerprint(model: str) -> str | None:
        _, revision, adapter = model_identity(model)  # an adapter base: the adapter's own
        return adapter.rpartition("@")[2] if adapter else revision

    path = Path(name).expanduser()
    if not path.exists() and (path.is_absolute() or name.startswith(("./", "../")) or name.count("/") > 1):
        return path.name, None, False  # a folder of another machine, or gone
    if name in ALIASES or not path.exists():
        return name, fingerprint(name), True
    real = path.resolve()
    if real == smollm2_cache_path().resolve():
        return ALIASES[0], fingerprint(str(real)), True
    hub = _HUB_SNAPSHOT.search(real.as_posix())
    if hub:
        return f"{hub.group(1)}/{hub.group(2)}", hub.group(3), True
    return real.name, fingerprint(str(real)), False


def disable_dropout(model: nn.Module) -> None:
    """Dropout off everywhere (as TRL's RL trainers do): the ratio π_θ/π_old and the KL compare
    two forwards of the same weights, which random dropout masks would make differ."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):  # attention layers copy the config value
            module.attention_dropout = 0.0
    config = getattr(model, "config", None)
    for key in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if config is not None and isinstance(getattr(config, key, None), float):
            setattr(config, key, 0.0)


def use_attention(model: Any, choice: str) -> None:
    """``--attn-implementation``: switch a loaded model's attention kernel in place
    (transformers checks that the kernel is installed). Under ``--pack auto`` only the varlen
    flash-attention kernels pack (train/logprobs.py; docs/methods.md §8)."""
    if getattr(model.config, "_attn_implementation", None) == choice:
        return
    try:
        model.set_attn_implementation(choice)
    except (ImportError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ZsearchError(f"--attn-implementation {choice}: {first}") from None


def attention_of(cfg: Any) -> str:
    """``--attn-implementation`` of an RL config; sdpa for a config without it (``zsearch sft``)."""
    batch = getattr(cfg, "batch", None)
    return getattr(batch, "attn_implementation", "sdpa")


def load_policy(cfg: TrainConfig, device: str, dtype: str, resume_dir: Path | None = None) -> tuple[Any, Any]:
    """(policy, tokenizer), in train mode. From ``resume_dir`` when resuming: a full model
    folder, or (LoRA) the base from ``cfg.policy.model`` plus the saved adapter."""
    if resume_dir is not None and cfg.optim.lora_r == 0:
        model, tokenizer = load_model(str(resume_dir), device=device, dtype=dtype, trainable=True)
    else:
        model, tokenizer = load_model(cfg.policy.model, device=device, dtype=dtype, trainable=True)
    use_attention(model, attention_of(cfg))
    if cfg.optim.lora_r > 0:
        from peft import PeftModel, get_peft_model

        try:
            if resume_dir is not None:
                model = PeftModel.from_pretrained(model, str(resume_dir), is_trainable=True)
            else:
                model = get_peft_model(model, _lora_config(cfg, "CAUSAL_LM"))
        except ValueError as err:  # e.g. a target module the architecture lacks
            raise ZsearchError(f"--lora-targets {cfg.optim.lora_targets}: {err}") from None
    if cfg.optim.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False  # training forwards never need the cache; rollout passes use_cache=True
    disable_dropout(model)
    model.train()
    return model, tokenizer


def load_reference(cfg: TrainConfig, policy: Any, device: str, dtype: str, needed: bool) -> Any:
    """The frozen reference: None when not needed (β = 0), the policy itself for LoRA (use
    :func:`reference_mode`), else a frozen copy of ``cfg.policy.model``."""
    if not needed:
        return None
    if is_peft(policy):
        return policy
    model, _ = load_model(cfg.policy.model, device=device, dtype=dtype, trainable=False)
    use_attention(model, attention_of(cfg))
    return model


@contextlib.contextmanager
def reference_mode(reference: Any) -> Iterator[Any]:
    """Yield the module to run as π_ref: a LoRA policy with its adapter disabled, or the copy."""
    if is_peft(reference):
        with reference.disable_adapter():
            yield reference
    else:
        yield reference


class Critic(nn.Module):
    """V(s_t): a transformer backbone (no LM head) + ``nn.Linear(hidden, 1)`` on every position.

    The head starts at zero, so V = 0 everywhere before the first update (a neutral baseline);
    the backbone starts from the policy's (or ``--critic-model``'s) weights, as in verl.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, attention_mask [B, L] -> values [B, L] (float32). Packed: one row, no mask,
        ``position_ids`` restarting at each sample (train/logprobs.py)."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False).last_hidden_state
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()


def load_critic(cfg: TrainConfig, device: str, dtype: str, resume_dir: Path | None = None) -> Critic:
    """A fresh critic on ``--critic-model`` (default: the policy's starting weights), with the
    trainable weights of ``resume_dir/critic.safetensors`` when resuming. They are loaded here,
    before ``accelerator.prepare``, because afterwards FSDP / ZeRO-3 hold only shards."""
    from transformers import AutoModel

    from zsearch_cli.models.loading import resolve_device, resolve_dtype

    source = cfg.critic_model or cfg.policy.model
    path = resolve_model_path(source)
    dev = resolve_device(device)
    try:
        backbone = AutoModel.from_pretrained(path, dtype=resolve_dtype(dtype, dev), weights_only=True)
    except (OSError, ValueError) as err:
        raise ZsearchError(f"--critic-model {source}: cannot load ({err})") from None
    use_attention(backbone, attention_of(cfg))
    if cfg.optim.lora_r > 0:
        from peft import get_peft_model

        backbone = get_peft_model(backbone, _lora_config(cfg, "FEATURE_EXTRACTION"))
    if cfg.optim.gradient_checkpointing:
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    disable_dropout(backbone)
    critic = Critic(backbone, backbone.config.hidden_size).to(dev)
    critic.value_head.to(torch.float32)
    if resume_dir is not None:
        from safetensors.torch import load_file

        found = critic.load_state_dict(load_file(str(resume_dir / "critic.safetensors")), strict=False)
        if found.unexpected_keys:
            raise ZsearchError(f"{resume_dir}: critic checkpoint has unknown weights {found.unexpected_keys[:3]}")
    critic.train()
    return critic


_WRAPPER_PREFIXES = re.compile(r"(_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod)\.")
"""What FSDP1, activation checkpointing and torch.compile insert into parameter names."""


def trainable_state(module: nn.Module, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The parameters that train (LoRA + head, or everything), for critic checkpoints: taken
    from ``state`` (a gathered full state dict, as FSDP / ZeRO-3 need) or from ``module``."""
    names = {_WRAPPER_PREFIXES.sub("", n) for n, p in module.named_parameters() if p.requires_grad}
    if state is None:
        state = {_WRAPPER_PREFIXES.sub("", n): p for n, p in module.named_parameters()}
    return {n: t.detach().contiguous() for n, t in state.items() if n in names}


def _without_tied_copies(model: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the second name of each tied weight (lm_head.weight = embed_tokens.weight): a
    gathered state dict holds the two as separate tensors, which save_pretrained would write
    twice instead of recording the tie."""
    first: dict[int, str] = {}
    copies = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        name = _WRAPPER_PREFIXES.sub("", name)
        if first.setdefault(id(param), name) != name:
            copies.add(name)
    return {k: v for k, v in state.items() if k not in copies}


def save_policy(model: Any, tokenizer: Any, path: Path, base: str,
                state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """An HF model folder (full weights) or a peft adapter folder whose
    ``base_model_name_or_path`` is ``base``; both load with ``zsearch eval --model PATH``.

    ``state_dict``: the full weights gathered by ``accelerator.get_state_dict`` (under FSDP /
    ZeRO-3 the module itself holds only this process's shard); peft keeps only the adapter
    weights of it (``get_peft_model_state_dict``)."""
    if state_dict is not None and not is_peft(model):
        state_dict = _without_tied_copies(model, state_dict)
    model.save_pretrained(path, safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(path)
    if is_peft(model):
        cfg_path = path / "adapter_config.json"
        data = json.loads(cfg_path.read_text())
        data["base_model_name_or_path"] = base_reference(base)
        cfg_path.write_text(json.dumps(data, indent=2) + "\n")
        # the folder above is this machine's; the portable name and fingerprint travel
        # (the alias, the hub id; models/loading.py adapter_base reads them)
        name, fingerprint, _ = portable_base(base)
        (path / BASE_FILE).write_text(json.dumps({"base": name, "fingerprint": fingerprint}) + "\n")


def save_merged(final: Path, cfg: Any) -> Path | None:
    """``--merge-lora`` of train / solve / propose: beside the adapter in OUT/final, write
    OUT/final/merged (full weights, the LoRA merged in: a plain HF folder for vLLM and
    transformers), as ``zsearch sft --merge-lora`` does; None for a full fine-tune or
    without the option. Main process only."""
    if not (cfg.run.merge_lora and cfg.optim.lora_r > 0):
        return None
    from zsearch_cli.models.loading import merged_lora_dir

    return Path(merged_lora_dir(str(final)))


@contextlib.contextmanager
def unsharded_loading(accelerator: Any) -> Iterator[None]:
    """Load a model that every process holds whole and that ``prepare`` never sees (the
    frozen reference, the generation copy): outside DeepSpeed's ``zero.Init``, which would
    partition it, and without FSDP's cpu-ram-efficient loading, which gives every process
    but the first zeros, expecting ``prepare`` to broadcast the real weights."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    saved = os.environ.pop("FSDP_CPU_RAM_EFFICIENT_LOADING", None)
    if plugin is not None:
        from transformers.integrations import unset_hf_deepspeed_config

        # transformers partitions every from_pretrained while accelerate's DeepSpeed config is
        # registered, whatever zero3_init_flag says (accelerate 1.15 registers it regardless)
        unset_hf_deepspeed_config()
    try:
        yield
    finally:
        if saved is not None:
            os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] = saved
        if plugin is not None:
            plugin.set_deepspeed_weakref()


def generation_copy(cfg: TrainConfig, accelerator: Any, resume_dir: Path | None) -> Any:
    """A full, frozen copy of the policy for the HF backend under FSDP / ZeRO-3, and under
    --rollout-overlap (rollouts go on while the policy trains). Why FSDP / ZeRO-3: there
    each process holds a shard, and a forward through the sharded model gathers the weights
    with a collective, so every process would have to run the same forwards in lockstep,
    while rollouts differ in length, turns and (DSPO) generation batches per process. Costs
    one full model per process; :func:`sync_generation_copy` refreshes it after each update."""
    with unsharded_loading(accelerator):
        model, _ = load_policy(cfg, str(accelerator.device), cfg.policy.dtype, resume_dir)
    model.requires_grad_(False)
    model.config.use_cache = True  # generation only
    return model


@torch.no_grad()
def sync_generation_copy(accelerator: Any, policy: Any, copy: Any) -> None:
    """Load the sharded ``policy``'s current weights into ``copy`` on every process (a
    collective: call it on all); a whole policy (one process, --rollout-overlap) is copied."""
    if distribution(accelerator) == "replicated":
        copy.load_state_dict(accelerator.unwrap_model(policy).state_dict())
        return
    if distribution(accelerator) == "deepspeed":
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(policy.parameters())):  # read-only gather
            copy.load_state_dict(accelerator.unwrap_model(policy).state_dict())
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    # full_state_dict without cpu_offload: every process gets the whole (FSDP1 and FSDP2)
    copy.load_state_dict(get_model_state_dict(policy, options=StateDictOptions(full_state_dict=True)))


@torch.no_grad()
def merged_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of the policy as a plain model, LoRA merged *without* mutating the
    weights (merge/unmerge in place would drift the base by rounding every sync): for vLLM."""
    if not is_peft(model):
        yield from model.state_dict().items()
        return
    from peft.tuners.lora import LoraLayer

    inner = model.get_base_model()
    merged = {}
    for name, module in inner.named_modules():
        if isinstance(module, LoraLayer):
            delta = module.get_delta_weight(module.active_adapters[0])
            merged[f"{name}.weight"] = module.base_layer.weight + delta.to(module.base_layer.weight.dtype)
    for name, tensor in inner.state_dict().items():
        if "lora_" in name:
            continue
        name = name.replace(".base_layer.", ".")
        yield name, merged.get(name, tensor)


def generation_backend(cfg: TrainConfig, accelerator: Any, policy: Any, tokenizer: Any,
                       resume_dir: Path | None) -> tuple[Any, Any]:
    """The backend rollouts sample from, and the HF generation copy it samples with (None
    when it shares the policy object, or is vLLM with weights of its own)."""
    from zsearch_cli.models.factory import vllm_available

    kind = cfg.policy.backend
    if kind == "auto":
        kind = "vllm" if vllm_available() else "hf"
    if kind == "hf":
        from zsearch_cli.models.hf import HFBackend

        if distribution(accelerator) == "replicated" and not cfg.rollout_overlap:
            # Shares the policy object: generation always sees the weights being trained.
            return HFBackend(accelerator.unwrap_model(policy), tokenizer), None
        # FSDP / ZeRO-3, or rollouts that go on while the policy trains: a full copy,
        # refreshed after each update (see generation_copy)
        copy = generation_copy(cfg, accelerator, resume_dir)
        return HFBackend(copy, tokenizer), copy
    if distribution(accelerator) != "replicated":
        raise ZsearchError("--backend vllm under FSDP / ZeRO-3 is not supported yet (the weight sync reads "
                           "whole tensors); use DDP (stages/accelerate/ddp.yaml) or --backend hf")
    from zsearch_cli.models.vllm import VLLMBackend

    start = str(resume_dir) if resume_dir is not None and cfg.optim.lora_r == 0 else cfg.policy.model
    return VLLMBackend(start, dtype=cfg.policy.dtype, seed=cfg.seed, tokenizer=tokenizer,
                       max_model_len=cfg.rollout.max_context_tokens, sleep_level=cfg.run.vllm_sleep,
                       gpu_memory_utilization=cfg.run.gpu_memory_utilization), None
