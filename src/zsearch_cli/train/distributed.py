"""How the prepared models are spread over the processes (one process, DDP, FSDP, ZeRO),
asked by the checkpoint code (what to gather before saving) and by the policy's generation
copy (how to read sharded weights)."""

from __future__ import annotations

from typing import Any

from zsearch_cli.errors import ZsearchError


def distribution(acc: Any) -> str:
    """How the prepared models hold their state: ``replicated`` (one process, or DDP: every
    process has all of it), ``fsdp`` or ``deepspeed`` (sharded over the processes)."""
    kind = str(getattr(acc.distributed_type, "value", acc.distributed_type)).upper()
    if kind == "FSDP":
        return "fsdp"
    if kind == "DEEPSPEED":
        return "deepspeed"
    return "replicated"


def check_sharded_saving(acc: Any) -> None:
    """Refuse at start, not at the first checkpoint, a ZeRO-3 setup whose weights cannot be
    gathered for saving (accelerate's ``get_state_dict`` needs the 16-bit gather)."""
    if distribution(acc) != "deepspeed":
        return
    zero = acc.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
    if zero.get("stage") == 3 and not zero.get("stage3_gather_16bit_weights_on_model_save"):
        raise ZsearchError("DeepSpeed ZeRO-3 without zero3_save_16bit_model: true (stage3_gather_16bit_weights_"
                           "on_model_save) cannot save the model; set it in the accelerate config")
