"""Typer options several commands share, defined once so that a flag means the same thing,
with the same default and help, in every command that takes it.

Typer reads the parameter name from the function signature, so one option object can serve
many commands: ``device: str = opt.DEVICE``. Options whose default or help differs by command
(learning rates, step counts, output folders) stay in the command.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import typer

DEVICE = typer.Option("auto", help="auto, cpu or cuda.")
BACKEND = typer.Option("auto", help="hf, vllm or auto.")
DTYPE = typer.Option("auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16.")
TOPK = typer.Option(3, help="Passages per search.")
MAX_GRAD_NORM = typer.Option(1.0, help="Gradient-norm clip (0 = off).")
LORA_R = typer.Option(0, help="LoRA rank (0 = full fine-tune).")
LORA_ALPHA = typer.Option(16, help="LoRA alpha.")
LORA_TARGETS = typer.Option("q_proj,k_proj,v_proj,o_proj", help="Modules that get LoRA adapters.")
KEEP_CHECKPOINTS = typer.Option(2, help="Checkpoints to keep.")
RESUME = typer.Option(False, help="Continue from the latest checkpoint in --out.")
MIN_LR_RATIO = typer.Option(0.0, help="Cosine floor as a fraction of the lr.")
WEIGHT_DECAY = typer.Option(0.0, help="AdamW weight decay.")
TOP_P = typer.Option(1.0, help="Nucleus sampling mass.")
REPORT_TO = typer.Option("none", help="none, tensorboard or wandb.")
SAVE_ROLLOUTS = typer.Option(False, help="Write OUT/rollouts/step-N.parquet every step.")
GRAD_ACCUM = typer.Option(1, help="Micro-batches per optimizer step.")
MAX_STEPS = typer.Option(None, help="Optimizer steps (overrides --epochs).")
PROTOCOL = typer.Option("tags", help="tags (Search-R1) or tool_call (Dr. Zero).")
GRADIENT_CHECKPOINTING = typer.Option(False, help="Trade compute for memory (activations are recomputed in the backward).")


# ----------------------------------------------------------------------------- numeric ranges

INF = math.inf


@dataclass(frozen=True)
class Range:
    """The values a numeric option accepts: ``lo``..``hi``, each end closed unless marked
    open. ``None`` (an unset optional option) always passes; NaN and infinities never do."""

    lo: float = -INF
    hi: float = INF
    lo_open: bool = False
    hi_open: bool = False
    why: str = ""
    """Said after the range when the reason is not obvious (e.g. the difficulty reward's n - 1)."""

    def contains(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def describe(self, why: bool = True) -> str:
        lo_bound, hi_bound = self.lo != -INF, self.hi != INF
        lo = f"{'>' if self.lo_open else '>='} {self.lo:g}"
        hi = f"{'<' if self.hi_open else '<='} {self.hi:g}"
        text = (f"{lo} and {hi}" if lo_bound and hi_bound else lo if lo_bound else hi if hi_bound
                else "a finite number")
        return f"{text} ({self.why})" if self.why and why else text


AT_LEAST_0 = Range(0)
AT_LEAST_1 = Range(1)
POSITIVE = Range(0, lo_open=True)
FRACTION = Range(0, 1)
ANY = Range()

RANGES: dict[str, Range] = {
    # counts of things: at least one
    **{name: AT_LEAST_1 for name in (
        "batch_size", "micro_batch_size", "mini_batch_size", "solver_batch_size", "grad_accum", "ppo_epochs",
        "steps", "max_steps", "iterations", "proposer_steps", "solver_steps", "questions_per_iteration",
        "num_questions", "samples", "samples_per_question", "topk", "max_topk", "max_queries", "limit",
        "val_limit", "eval_limit", "max_gen_batches", "keep_checkpoints", "max_turn_tokens", "max_obs_tokens",
        "max_context_tokens", "proposer_context_tokens", "solver_context_tokens", "max_length", "max_new_tokens",
        "concurrency", "lora_alpha", "group_size")},
    # 0 means "off", "none" or "only at the end"
    **{name: AT_LEAST_0 for name in (
        "max_turns", "save_every", "val_every", "eval_every", "lora_r", "doc_words", "cache_size", "cache_mb", "retries",
        "weight_decay", "max_grad_norm", "temperature", "beta", "k1")},
    **{name: POSITIVE for name in ("lr", "critic_lr", "proposer_lr", "solver_lr", "epochs", "timeout",
                                   "clip_eps", "clip_eps_high", "noise_base")},
    **{name: FRACTION for name in ("b", "warmup_ratio", "min_lr_ratio", "noise_start", "noise_end")},
    "clip_eps_low": Range(0, 1, lo_open=True, hi_open=True),
    "eval_fraction": Range(0, 1, hi_open=True),
    "top_p": Range(0, 1, lo_open=True),
    "seed": Range(0, 2**32 - 1, why="numpy's seed range"),
    "port": Range(0, 65535, why="0 picks a free port"),
    "solver_samples": Range(2, why="the difficulty reward divides by n - 1"),
    "format_bonus": ANY,
    # per command, where one name means a different thing (COMMAND.name wins over name)
    "solve.group_size": Range(2, why="GRPO's group baseline"),
    "drzero.group_size": Range(2, why="GRPO's group baseline"),
}
"""Every int/float option of every command, by parameter name. A test checks that no
numeric option is missing, so a new option must say here what it accepts."""


def range_for(command: str, name: str) -> Range | None:
    return RANGES.get(f"{command}.{name}", RANGES.get(name))
