"""How the prepared models are spread over the processes (one process, DDP, FSDP, ZeRO),
asked by the checkpoint code (what to gather before saving) and by the policy's generation
copy (how to read sharded weights); the checks and the tracker the accelerator needs at start."""

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


def check_deepspeed(acc: Any, cfg: Any, spec: Any) -> None:
    """DeepSpeed runs its optimizer step inside every ``accelerator.backward`` (update.py
    does not mark accumulation boundaries), so one optimizer step must be one micro-batch."""
    if spec.needs_critic:  # accelerate sends every backward through its last prepared engine
        raise ZsearchError(f"--algo {cfg.algo} under DeepSpeed: the critic would be a second DeepSpeed engine, "
                           "which zsearch does not drive; use DDP or FSDP")
    per_process = cfg.batch.mini_batch_size or -(-cfg.batch_size // acc.num_processes) * cfg.group_size
    if cfg.batch.micro_batch_size < per_process:
        raise ZsearchError(f"under DeepSpeed every backward is an optimizer step: set --micro-batch-size >= "
                           f"{per_process} (the mini-batch of one process), got {cfg.batch.micro_batch_size}")
    plugin = acc.state.deepspeed_plugin
    if plugin.is_auto("train_micro_batch_size_per_gpu"):
        # accelerate sizes DeepSpeed's batch from a prepared DataLoader, and zsearch has none
        plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = cfg.batch.micro_batch_size


def init_tracker(acc: Any, cfg: Any) -> None:
    """--report-to: accelerate's tracker, on the main process, writing under OUT."""
    from zsearch_cli.train.config import resolved_dict

    report_to = cfg.run.report_to
    if report_to == "none":
        return
    hparams = resolved_dict(cfg, acc.num_processes)
    flat = {k: v for k, v in hparams.items() if isinstance(v, (int, float, str, bool))}
    try:
        acc.init_trackers("zsearch", config=flat)
    except (ImportError, ValueError, RuntimeError) as err:
        raise ZsearchError(f"--report-to {report_to}: {err}") from None
    if acc.is_main_process and not acc.trackers:
        # accelerate drops a tracker whose package is missing with only a warning
        raise ZsearchError(f"--report-to {report_to}: the {report_to} package is not installed "
                           f"(pip install {report_to})")
