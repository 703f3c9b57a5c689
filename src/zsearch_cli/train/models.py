"""The models a run trains or consults: policy (full or LoRA), frozen reference, PPO critic.

Why a LoRA policy needs no second copy for its reference: the reference is the base
weights, which are exactly the LoRA model with the adapter switched off (peft's
``disable_adapter()``). A full fine-tune loads a frozen copy once.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.loading import SMOLLM2_ALIAS, load_model, resolve_model_path
from zsearch_cli.train.config import TrainConfig


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


def _lora_config(cfg: TrainConfig, task_type: str | None) -> Any:
    from peft import LoraConfig

    targets = [t.strip() for t in cfg.lora_targets.split(",") if t.strip()]
    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules=targets, lora_dropout=0.0,
                      bias="none", task_type=task_type)


def base_reference(name: str) -> str:
    """How a LoRA checkpoint names its base: aliases and hub ids as given, folders absolute."""
    if name == SMOLLM2_ALIAS or not Path(name).expanduser().exists():
        return name
    return str(Path(resolve_model_path(name)).resolve())


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


def load_policy(cfg: TrainConfig, device: str, dtype: str, resume_dir: Path | None = None) -> tuple[Any, Any]:
    """(policy, tokenizer), in train mode. From ``resume_dir`` when resuming: a full model
    folder, or (LoRA) the base from ``cfg.model`` plus the saved adapter."""
    if resume_dir is not None and cfg.lora_r == 0:
        model, tokenizer = load_model(str(resume_dir), device=device, dtype=dtype, trainable=True)
    else:
        model, tokenizer = load_model(cfg.model, device=device, dtype=dtype, trainable=True)
    if cfg.lora_r > 0:
        from peft import PeftModel, get_peft_model

        try:
            if resume_dir is not None:
                model = PeftModel.from_pretrained(model, str(resume_dir), is_trainable=True)
            else:
                model = get_peft_model(model, _lora_config(cfg, "CAUSAL_LM"))
        except ValueError as err:  # e.g. a target module the architecture lacks
            raise ZsearchError(f"--lora-targets {cfg.lora_targets}: {err}") from None
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False  # training forwards never need the cache; rollout passes use_cache=True
    disable_dropout(model)
    model.train()
    return model, tokenizer


def load_reference(cfg: TrainConfig, policy: Any, device: str, dtype: str, needed: bool) -> Any:
    """The frozen reference: None when not needed (β = 0), the policy itself for LoRA (use
    :func:`reference_mode`), else a frozen copy of ``cfg.model``."""
    if not needed:
        return None
    if is_peft(policy):
        return policy
    model, _ = load_model(cfg.model, device=device, dtype=dtype, trainable=False)
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

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """input_ids, attention_mask [B, L] -> values [B, L] (float32)."""
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()


def load_critic(cfg: TrainConfig, device: str, dtype: str) -> Critic:
    """A fresh critic on ``--critic-model`` (default: the policy's starting weights)."""
    from transformers import AutoModel

    from zsearch_cli.models.loading import resolve_device, resolve_dtype

    source = cfg.critic_model or cfg.model
    path = resolve_model_path(source)
    dev = resolve_device(device)
    try:
        backbone = AutoModel.from_pretrained(path, dtype=resolve_dtype(dtype, dev), weights_only=True)
    except (OSError, ValueError) as err:
        raise ZsearchError(f"--critic-model {source}: cannot load ({err})") from None
    if cfg.lora_r > 0:
        from peft import get_peft_model

        backbone = get_peft_model(backbone, _lora_config(cfg, "FEATURE_EXTRACTION"))
    if cfg.gradient_checkpointing:
        backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    disable_dropout(backbone)
    critic = Critic(backbone, backbone.config.hidden_size).to(dev)
    critic.value_head.to(torch.float32)
    critic.train()
    return critic


def trainable_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters that train (LoRA + head, or everything), for critic checkpoints."""
    return {n: p.detach().contiguous() for n, p in module.named_parameters() if p.requires_grad}


def save_policy(model: Any, tokenizer: Any, path: Path, base: str) -> None:
    """An HF model folder (full weights) or a peft adapter folder whose
    ``base_model_name_or_path`` is ``base``; both load with ``zsearch eval --model PATH``."""
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    if is_peft(model):
        cfg_path = path / "adapter_config.json"
        data = json.loads(cfg_path.read_text())
        data["base_model_name_or_path"] = base_reference(base)
        cfg_path.write_text(json.dumps(data, indent=2) + "\n")


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
