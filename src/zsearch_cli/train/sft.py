"""``zsearch sft``: supervised fine-tuning with the loss on completion tokens only.

One trainer for every SFT the pipeline needs (``SFTConfig`` + :func:`run_sft`, TRL style):

* **the ZeroSearch simulator** (paper §3.3): ``zsearch simsft`` builds Table 2 prompt +
  "Doc i:" completions from judged query-document rows and trains on them raw, without a
  chat template, at lr 1e-6;
* **Search-R1's SFT baseline**: (prompt, completion) pairs of questions and target
  responses, with the chat template;
* **the rejection-sampling baseline**: SFT on a policy's own correct trajectories,
  ``zsearch sft runs/collect/trajectories.parquet --only-correct`` (EM of the prediction
  against the golden answers); the loss mask keeps retrieved documents out of the loss;
* **a format warm-up** of a small policy before RL (a few hundred steps on well-formed
  trajectories), so its first rollouts already search and answer in tags.

The loss is the token-level mean NLL over every target token of the optimizer step (all
micro-batches of ``--grad-accum``, and all processes), so long and short completions weigh
by their tokens, as in TRL's default. Prompt, masked and padding positions have label -100.
Checkpoints (OUT/checkpoints/step-N) resume exactly: which examples a step trains on is a
pure function of (seed, step), and the RNG, optimizer and scheduler states are restored.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from zsearch_cli.config.fields import check_options, execution_options
from zsearch_cli.errors import ZsearchError, read_back
from zsearch_cli.protocol import differing
from zsearch_cli.train.distributed import check_sharded_saving
from zsearch_cli.train.checkpoint import (METRICS_FORMAT, STATE_FILE, atomic_dir, checkpoints,
                                          full_model_state, full_optimizer_state, latest_checkpoint,
                                          load_optimizer_state, load_pickle, read_state, rng_state,
                                          set_rng_state)
from zsearch_cli.train.metrics import MetricsLog
from zsearch_cli.train.policy import load_policy, save_policy
from zsearch_cli.train.optim import make_optimizer
from zsearch_cli.train.sft_config import SFTConfig
from zsearch_cli.train.sft_data import IGNORE, SFTItem, StepOrder, collate, load_sft_items, split_eval

def check_sft_config(cfg: SFTConfig) -> None:
    """Every invalid option is one ZsearchError line, before anything heavy is loaded."""
    check_options(cfg)  # the declared ranges and choices: the same check as the command line's
    if not str(cfg.data).strip():
        raise ZsearchError("name the training data (a .parquet or .jsonl file)")


# ----------------------------------------------------------------------------- the loss


def token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of −log p(label), number of labelled positions) for next-token prediction:
    ``logits[:, t]`` predicts ``labels[:, t + 1]``; positions labelled IGNORE add nothing."""
    shift_logits = logits[:, :-1, :]
    shift_labels = labels[:, 1:]
    keep = shift_labels != IGNORE
    nll = F.cross_entropy(shift_logits[keep].float(), shift_labels[keep], reduction="sum")
    return nll, keep.sum()


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Token-level mean NLL over the batch's target tokens (0 when there are none)."""
    nll, n = token_nll(logits, labels)
    return nll / n.clamp(min=1)


# ----------------------------------------------------------------------------- the trainer


class SFTTrainer:
    """Build with an :class:`SFTConfig`, then :meth:`train`."""

    def __init__(self, cfg: SFTConfig, console: Console | None = None):
        from accelerate import Accelerator

        check_sft_config(cfg)
        self.cfg = cfg
        self.console = console or Console(stderr=True)
        self.accelerator = acc = Accelerator(cpu=cfg.policy.device == "cpu" or not torch.cuda.is_available())
        check_sharded_saving(acc)
        resume_dir = self._resume_point()
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        # load_policy reads only model, lora_* and gradient_checkpointing, which SFTConfig shares
        # with TrainConfig: full weights or a fresh/resumed LoRA adapter, exactly as `train` does.
        self.policy, self.tokenizer = load_policy(cfg, str(acc.device), cfg.policy.dtype, resume_dir)  # type: ignore[arg-type]
        self.train_items, self.eval_items = self._load_data()
        self.global_batch = cfg.batch_size * cfg.grad_accum * acc.num_processes
        self.order = StepOrder(len(self.train_items), self.global_batch, cfg.seed)
        self.total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * len(self.train_items) / self.global_batch))
        self.optimizer, self.scheduler = make_optimizer(self.policy.parameters(), cfg.optim.lr, cfg.optim.weight_decay,
                                                        self.total_steps, cfg.optim.warmup_ratio, cfg.optim.lr_schedule,
                                                        cfg.optim.min_lr_ratio)
        self.policy, self.optimizer = acc.prepare(self.policy, self.optimizer)
        self.pad_id = int(self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0)
        self.metrics = MetricsLog(Path(cfg.run.out), cfg.to_dict(), acc, acc.is_main_process)
        self.start_step = 0
        if resume_dir is not None:
            state = read_state(resume_dir)
            load_optimizer_state(acc, self.policy, self.optimizer, resume_dir / "optimizer.pt")
            self.scheduler.load_state_dict(load_pickle(resume_dir / "scheduler.pt"))
            set_rng_state(state["rng"], load_pickle(resume_dir / "rng.pt"))
            self.start_step = int(state["step"])
            self.metrics.restore(state["metrics"])
            self.console.print(f"resuming from {resume_dir} (step {self.start_step}/{self.total_steps})")
        else:
            self.metrics.start_fresh()

    def _resume_point(self) -> Path | None:
        """The checkpoint to resume from, after checking the options still match it."""
        cfg = self.cfg
        latest = latest_checkpoint(Path(cfg.run.out))
        if latest is None:
            if cfg.run.resume:
                self.console.print(f"[dim]--resume: no checkpoint in {cfg.run.out}/checkpoints, starting fresh[/]")
            return None
        if not cfg.run.resume:
            raise ZsearchError(f"{cfg.run.out} already holds checkpoints (latest {latest.name}): "
                               "pass --resume to continue that run, or choose another --out")
        state = read_state(latest)
        if state.get("metrics_format", 1) != METRICS_FORMAT:  # its rows count steps from 0
            raise ZsearchError(f"--resume: {latest} was written by an older zsearch (its metrics count steps from 0): "
                               f"finish that run with the zsearch that started it, or start a new --out")
        # only what changes how the run executes may differ (option(execution=True))
        # read back: a key the checkpoint withheld (***) equals the one given again
        changed = differing(read_back(state["config"]), cfg.to_dict(), execution_options(SFTConfig))
        if changed:
            raise ZsearchError(f"--resume: options differ from the run in {cfg.run.out} ({', '.join(changed)}); "
                               "pass the same options or choose another --out")
        return latest

    def _load_data(self) -> tuple[list[SFTItem], list[SFTItem]]:
        cfg = self.cfg
        opts = dict(chat_template=cfg.chat_template, max_length=cfg.max_length, only_correct=cfg.only_correct)
        items, stats = load_sft_items(cfg.data, self.tokenizer, **opts)
        self.console.print(stats.summary(str(cfg.data)), highlight=False)
        if cfg.eval_data:
            eval_items, eval_stats = load_sft_items(cfg.eval_data, self.tokenizer, **opts)
            self.console.print(eval_stats.summary(str(cfg.eval_data)), highlight=False)
            return items, eval_items
        train_idx, eval_idx = split_eval(len(items), cfg.eval_fraction, cfg.seed)
        if eval_idx:
            self.console.print(f"holding out {len(eval_idx)} of {len(items)} examples for the eval loss",
                               highlight=False)
        return [items[i] for i in train_idx], [items[i] for i in eval_idx]

    # ------------------------------------------------------------------ steps

    def _sum(self, value: float) -> float:
        """Sum of ``value`` over processes (itself on one process)."""
        acc = self.accelerator
        if acc.num_processes == 1:
            return value
        return float(acc.reduce(torch.tensor(value, dtype=torch.float64, device=acc.device), "sum"))

    def _forward_nll(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        dev = self.accelerator.device
        out = self.policy(input_ids=batch["input_ids"].to(dev), attention_mask=batch["attention_mask"].to(dev),
                          use_cache=False)
        return token_nll(out.logits, batch["labels"].to(dev))

    def train_step(self, step: int) -> dict[str, Any]:
        """One optimizer step over this process's share of the step's examples. ``step`` is the
        0-based index the data order and the schedule use; the metrics row says ``step + 1``,
        as the console and ``checkpoints/step-N`` count."""
        cfg, acc = self.cfg, self.accelerator
        t0 = time.perf_counter()
        per = cfg.batch_size * cfg.grad_accum
        mine = self.order.indices(step)[acc.process_index * per:(acc.process_index + 1) * per]
        items = [self.train_items[i] for i in mine]
        batches = [collate(items[k:k + cfg.batch_size], self.pad_id) for k in range(0, len(items), cfg.batch_size)]
        n_local = sum(int((b["labels"][:, 1:] != IGNORE).sum()) for b in batches)
        n_global = self._sum(float(n_local))
        # DDP averages gradients over processes, so scaling each process's NLL sum by
        # P / n_global makes the step's gradient that of the global token-level mean.
        scale = acc.num_processes / max(n_global, 1.0)
        self.policy.train()
        nll_total = 0.0
        for k, batch in enumerate(batches):
            sync = contextlib.nullcontext() if k == len(batches) - 1 else acc.no_sync(self.policy)
            with sync:
                nll, _ = self._forward_nll(batch)
                acc.backward(nll * scale)
            nll_total += float(nll.detach())
        params = [p for p in self.policy.parameters() if p.requires_grad]
        limit = cfg.optim.max_grad_norm if cfg.optim.max_grad_norm > 0 else float("inf")
        grad_norm = float(acc.clip_grad_norm_(params, limit))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]  # the lr this step used
        self.scheduler.step()
        return {"step": step + 1, "loss": self._sum(nll_total) / max(n_global, 1.0), "eval_loss": None, "lr": lr,
                "grad_norm": grad_norm, "tokens": n_global, "epoch": self.order.epoch(step),
                "time_step": time.perf_counter() - t0}

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Token-level mean NLL over the held-out examples (None without any)."""
        if not self.eval_items:
            return None
        acc, bs = self.accelerator, self.cfg.batch_size
        mine = sorted(self.eval_items[acc.process_index::acc.num_processes], key=lambda it: len(it.input_ids))
        self.policy.eval()
        total = count = 0.0
        for k in range(0, len(mine), bs):
            nll, n = self._forward_nll(collate(mine[k:k + bs], self.pad_id))
            total, count = total + float(nll), count + float(n)
        self.policy.train()
        return self._sum(total) / max(self._sum(count), 1.0)

    # ------------------------------------------------------------------ saving

    def checkpoint(self, completed: int) -> Path | None:
        """OUT/checkpoints/step-``completed`` (the layout and atomic write of train/checkpoint.py).
        Every process calls it (FSDP / ZeRO-3 shards are gathered); the main process writes."""
        acc, cfg = self.accelerator, self.cfg
        weights = full_model_state(acc, self.policy)
        optimizer = full_optimizer_state(acc, self.policy, self.optimizer)
        if not acc.is_main_process:
            acc.wait_for_everyone()
            return None

        def write(tmp: Path) -> None:
            save_policy(acc.unwrap_model(self.policy), self.tokenizer, tmp, cfg.policy.model, weights)
            torch.save(optimizer, tmp / "optimizer.pt")
            torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            json_rng, torch_rng = rng_state()
            torch.save(torch_rng, tmp / "rng.pt")
            state = {"trainer": "sft", "step": completed, "total_steps": self.total_steps, "rng": json_rng,
                     "config": cfg.to_dict(), "metrics_format": METRICS_FORMAT, "metrics": self.metrics.rows}
            (tmp / STATE_FILE).write_text(json.dumps(state, default=str) + "\n")

        root = Path(cfg.run.out) / "checkpoints"
        for stale in root.glob(".step-*.tmp-*") if root.is_dir() else []:
            shutil.rmtree(stale, ignore_errors=True)  # left by a process killed mid-save
        path = atomic_dir(root / f"step-{completed}", write)
        for _, old in checkpoints(Path(cfg.run.out))[: -cfg.run.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()  # the checkpoint is complete before any process goes on
        return path

    def save_final(self) -> Path:
        """OUT/final: an HF model folder with safetensors and the tokenizer (``load_model``,
        ``zsearch eval --model`` and ``vllm serve`` load it), or a LoRA adapter folder
        (plus OUT/final/merged with ``merge_lora``)."""
        acc, cfg = self.accelerator, self.cfg
        final = Path(cfg.run.out) / "final"
        weights = full_model_state(acc, self.policy)
        if acc.is_main_process:
            model = acc.unwrap_model(self.policy)
            model.config.use_cache = True  # training turned it off; generation wants it
            atomic_dir(final, lambda tmp: save_policy(model, self.tokenizer, tmp, cfg.policy.model, weights))
            model.config.use_cache = False
            if cfg.optim.lora_r > 0 and cfg.run.merge_lora:
                from zsearch_cli.models.loading import merged_lora_dir

                merged_lora_dir(str(final))
        acc.wait_for_everyone()
        return final

    # ------------------------------------------------------------------ the loop

    def train(self) -> Path:
        """Run the remaining steps; returns the final model folder."""
        cfg, acc = self.cfg, self.accelerator
        show = acc.is_main_process
        columns = (TextColumn("[bold]sft"), BarColumn(), MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                   TextColumn("eval {task.fields[eval]}"), TimeElapsedColumn())
        from zsearch_cli.progress import ProgressLines, progress_bar

        lines = ProgressLines("sft", self.total_steps, "steps", done=self.start_step, enabled=None if show else False)
        with progress_bar(*columns, console=self.console, disable=not show) as bar, lines:  # lines: in a log file
            task = bar.add_task("sft", total=self.total_steps, completed=self.start_step, loss="-", eval="-")
            for step in range(self.start_step, self.total_steps):
                row = self.train_step(step)
                last = step + 1 == self.total_steps
                if self.eval_items and (last or (cfg.eval_every and (step + 1) % cfg.eval_every == 0)):
                    row["eval_loss"] = self.evaluate()
                    bar.update(task, eval=f"{row['eval_loss']:.4f}")
                    if show:
                        bar.console.print(f"step {step + 1}/{self.total_steps} loss {row['loss']:.4f} "
                                          f"eval_loss {row['eval_loss']:.4f} lr {row['lr']:.2e}", highlight=False)
                self.metrics.log(row)
                bar.update(task, advance=1, loss=f"{row['loss']:.4f}")
                lines.advance(1, loss=row["loss"])
                if cfg.run.save_every and (step + 1) % cfg.run.save_every == 0:
                    self.checkpoint(step + 1)
        final = self.save_final()
        if show:
            self.console.print(f"final model written to {final} (zsearch eval --model {final})", highlight=False)
        acc.end_training()
        return final


def run_sft(cfg: SFTConfig, console: Console | None = None) -> Path:
    """Library entry point behind ``zsearch sft``: build an SFTTrainer and train it."""
    return SFTTrainer(cfg, console=console).train()
