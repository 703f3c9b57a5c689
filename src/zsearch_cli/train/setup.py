"""What :class:`~zsearch_cli.train.trainer.Trainer` settles before its first step: the
accelerator (and the refusals of what a distribution cannot run), the checkpoint a
``--resume`` continues from, and the micro-batch layout every process agrees on. Kept apart
from the loop so that ``trainer.py`` reads as the step it runs."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from zsearch_cli.algos import AlgoSpec
from zsearch_cli.config.fields import execution_options
from zsearch_cli.errors import ZsearchError
from zsearch_cli.protocol import differing
from zsearch_cli.train.checkpoint import check_resumable, latest_checkpoint, read_state
from zsearch_cli.train.config import TrainConfig, check_processes, with_later_options
from zsearch_cli.train.distributed import check_deepspeed, check_sharded_saving, distribution, init_tracker


def make_accelerator(cfg: TrainConfig, spec: AlgoSpec) -> Any:
    """accelerate's ``Accelerator`` for this run, after the refusals of what its distribution
    cannot run (sharded saving, the process count, the chunked head under sharding, DeepSpeed's
    limits); the tracker (``--report-to``) is started."""
    from accelerate import Accelerator

    cpu = cfg.policy.device == "cpu" or not torch.cuda.is_available()
    kwargs: dict[str, Any] = {}
    if cfg.run.report_to != "none":
        kwargs.update(log_with=cfg.run.report_to, project_dir=str(cfg.run.out))
    try:
        with warnings.catch_warnings():  # a missing tracker package gets its own error below
            warnings.filterwarnings("ignore", message="`log_with=", category=UserWarning)
            acc = Accelerator(cpu=cpu, **kwargs)
    except (ImportError, ValueError, RuntimeError) as err:  # e.g. an accelerate config this machine cannot run
        raise ZsearchError(f"accelerate: {err}") from None
    check_sharded_saving(acc)
    check_processes(cfg, acc.num_processes)
    if distribution(acc) != "replicated" and cfg.batch.logits_chunk:
        raise ZsearchError(f"--logits-chunk {cfg.batch.logits_chunk} under {distribution(acc)}: the chunked LM "
                           "head reads the head's whole weight, which FSDP/ZeRO-3 shard outside the forward; leave "
                           "--logits-chunk unset (the whole head is used there) or set 0")
    if distribution(acc) == "deepspeed":
        check_deepspeed(acc, cfg, spec)
    init_tracker(acc, cfg)
    return acc


def resume_point(cfg: TrainConfig, accelerator: Any, console: Any) -> Path | None:
    """The checkpoint to resume from, after checking the options still match it."""
    latest = latest_checkpoint(Path(cfg.run.out))
    if latest is None:
        if cfg.run.resume:
            console.print(f"[dim]--resume: no checkpoint in {cfg.run.out}/checkpoints, starting fresh[/]")
        return None
    if not cfg.run.resume:
        raise ZsearchError(f"{cfg.run.out} already holds checkpoints (latest {latest.name}): "
                           "pass --resume to continue that run, or choose another --out")
    check_resumable(latest, accelerator)
    # only what changes how the run executes may differ (option(execution=True))
    changed = differing(with_later_options(read_state(latest)["config"]), cfg.to_dict(),
                        execution_options(TrainConfig))
    if changed:
        raise ZsearchError(f"--resume: options differ from the run in {cfg.run.out} ({', '.join(changed)}); "
                           "pass the same options or choose another --out")
    return latest


def resume_hint(out: Path) -> str:
    """What a run stopped by an error can go on from (issue 36.11)."""
    try:
        latest = latest_checkpoint(out, note=lambda _: None)
    except ZsearchError:
        return "no complete checkpoint to resume from"
    if latest is None:
        return "no checkpoint to resume from (--save-every N writes them)"
    return f"the newest checkpoint is {latest}: rerun the same command with --resume to go on from there"


def agreed_layout(cfg: TrainConfig, policy: Any, accelerator: Any, console: Any) -> str:
    """``--pack``: the start-up probes (train/logprobs.py), the same answer on every process
    (the most conservative of theirs: LAYOUTS runs from packed to masked)."""
    from zsearch_cli.train.logprobs import LAYOUTS, resolve_layout

    base = accelerator.unwrap_model(policy)
    layout, why = resolve_layout(cfg.batch.pack, policy, int(base.config.vocab_size), accelerator.device,
                                 next(base.parameters()).dtype, getattr(base.config, "_attn_implementation", None))
    if accelerator.num_processes > 1:
        mine = torch.tensor([LAYOUTS.index(layout)], device=accelerator.device)
        layout = LAYOUTS[int(accelerator.gather(mine).max())]
    if accelerator.is_main_process:
        console.print(why, soft_wrap=True)
    return layout
