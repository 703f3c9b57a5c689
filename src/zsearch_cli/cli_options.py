"""Typer options several commands share, defined once so that a flag means the same thing,
with the same default and help, in every command that takes it.

Typer reads the parameter name from the function signature, so one option object can serve
many commands: ``device: str = opt.DEVICE``. Options whose default or help differs by command
(learning rates, step counts, output folders) stay in the command.
"""

from __future__ import annotations

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
