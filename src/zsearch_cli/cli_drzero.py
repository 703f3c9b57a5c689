"""The Dr. Zero commands of the ``zsearch`` CLI: ``propose``, ``solve`` and ``drzero``.

Kept apart from ``cli.py`` only for length; ``cli.py`` registers them on the one app. Like
every command they parse options and call library functions (``stages/propose*.py``,
``stages/drzero.py``, the trainer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from zsearch_cli import cli_options as opt
from zsearch_cli.config import ConfigOption, resolved_options, stage


@stage
def propose(
    ctx: typer.Context,
    generate_only: bool = typer.Option(False, "--generate-only", help="Write a QA set from the proposer without training."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Training: run directory [runs/propose]; "
                                       "--generate-only: output Parquet, PROPOSED_QA [runs/propose/questions.parquet]."),
    model: str = typer.Option("smollm2", help="Proposer model: HF id, path, checkpoint or smollm2."),
    solver_model: Optional[str] = typer.Option(None, help="Frozen solver that measures difficulty [same as --model; "
                                               "loaded as a separate copy]. With --solver-url: its tokenizer."),
    solver_url: Optional[str] = typer.Option(None, help="OpenAI-compatible server the solver answers from, e.g. "
                                             "`vllm serve SOLVER` at http://127.0.0.1:8000/v1 (token ids in and out)."),
    index_dir: Path = typer.Option(Path("runs/index"), "--index", help="Index: seed passages and in-process search."),
    search: str = typer.Option("bm25", help="bm25, dense, hybrid, http://host:port or serpapi."),
    steps: int = typer.Option(50, help="Training: HRPO steps (Dr. Zero: 50 per iteration)."),
    batch_size: int = typer.Option(16, help="Proposer prompts per step (training) or per batch (generation)."),
    num_questions: int = typer.Option(64, help="--generate-only: proposer prompts (one seed passage each)."),
    samples: int = typer.Option(4, help="--generate-only: proposer samples per prompt; the best by format score is kept."),
    solver_samples: int = typer.Option(5, help="Solver answers per question (n of the difficulty reward)."),
    hop_ratio: str = typer.Option("4:3:2:1", help="Ratio of 1:2:3:4-hop questions."),
    seed: int = typer.Option(0, help="Seeds passages, hop draws and sampling."),
    lr: float = typer.Option(1e-6, help="Training: learning rate (Dr. Zero: 5e-7 to 1e-6)."),
    warmup_ratio: float = typer.Option(0.03, help="Training: fraction of steps with linear warmup."),
    max_grad_norm: float = typer.Option(1.0, help="Training: gradient-norm clip (Dr. Zero: 0.1 to 1.0)."),
    weight_decay: float = typer.Option(0.0, help="Training: AdamW weight decay (Dr. Zero: 0.01)."),
    micro_batch_size: int = typer.Option(8, help="Training: sequences per forward/backward."),
    lora_r: int = typer.Option(0, help="Training: LoRA rank (0 = full fine-tune)."),
    lora_alpha: int = typer.Option(16, help="Training: LoRA alpha."),
    lora_targets: str = typer.Option("q_proj,k_proj,v_proj,o_proj", help="Training: modules that get LoRA adapters."),
    gradient_checkpointing: bool = typer.Option(False, help="Training: trade compute for memory."),
    topk: int = opt.TOPK,
    max_turns: int = typer.Option(5, help="Turns before the final no-search turn."),
    max_turn_tokens: int = typer.Option(512, help="New tokens per turn."),
    max_obs_tokens: int = typer.Option(512, help="Tokens per tool response."),
    max_context_tokens: int = typer.Option(4096, help="Prompt + response budget."),
    temperature: float = typer.Option(1.0, help="Sampling temperature for proposer and solver."),
    backend: str = opt.BACKEND,
    device: str = opt.DEVICE,
    dtype: str = typer.Option("auto", help="Training: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16."),
    save_every: int = typer.Option(10, help="Training: checkpoint every N steps (0 = final only)."),
    keep_checkpoints: int = typer.Option(2, help="Training: checkpoints to keep."),
    resume: bool = typer.Option(False, help="Training: continue from the latest checkpoint in --out."),
    save_rollouts: bool = typer.Option(False, help="Training: write OUT/rollouts/step-N.parquet every step."),
    report_to: str = typer.Option("none", help="Training: none, tensorboard or wandb."),
    config: Optional[Path] = ConfigOption,
) -> None:
    """Dr. Zero proposer: train it with HRPO against a frozen solver, or (--generate-only) write n-hop questions.

    Training (the default): each step draws --batch-size (hop count, corpus passage) prompts,
    rolls out one question per prompt, has the solver answer each --solver-samples times and
    rewards r = I(0<k<n)(n-k)/(n-1) + format; HRPO standardizes rewards within each hop count.
    Writes OUT/final (proposer checkpoint), metrics and checkpoints like `zsearch train`.
    """
    from zsearch_cli.stages.propose import GenerateOptions, generate_questions

    if generate_only:
        opts = GenerateOptions(
            model=model, solver_model=solver_model, solver_url=solver_url, index=str(index_dir), search=search, num_questions=num_questions,
            samples=samples, solver_samples=solver_samples, hop_ratio=hop_ratio, seed=seed, topk=topk,
            max_turns=max_turns, max_turn_tokens=max_turn_tokens, max_obs_tokens=max_obs_tokens,
            max_context_tokens=max_context_tokens, temperature=temperature, batch_size=batch_size,
            backend=backend, device=device,
        )
        generate_questions(opts, out or Path("runs/propose/questions.parquet"), resolved_options(ctx))
        return
    from transformers.utils import logging as hf_logging

    from zsearch_cli.stages.propose_train import train_proposer
    from zsearch_cli.train.config import TrainConfig

    hf_logging.disable_progress_bar()
    cfg = TrainConfig.from_preset(
        "drzero-proposer", model=model, out=out or Path("runs/propose"), steps=steps, seed=seed,
        batch_size=batch_size, lr=lr, warmup_ratio=warmup_ratio, max_grad_norm=max_grad_norm,
        weight_decay=weight_decay, micro_batch_size=micro_batch_size, lora_r=lora_r, lora_alpha=lora_alpha,
        lora_targets=lora_targets, gradient_checkpointing=gradient_checkpointing, search=search, index=index_dir,
        topk=topk, max_turns=max_turns, max_turn_tokens=max_turn_tokens, max_obs_tokens=max_obs_tokens,
        max_context_tokens=max_context_tokens, temperature=temperature, backend=backend, device=device, dtype=dtype,
        save_every=save_every, keep_checkpoints=keep_checkpoints, resume=resume, save_rollouts=save_rollouts,
        report_to=report_to,
    )
    train_proposer(cfg, solver_model=solver_model, solver_url=solver_url, solver_samples=solver_samples,
                   hop_ratio=hop_ratio)


@stage
def solve(
    ctx: typer.Context,
    qa: Path = typer.Argument(..., help="QA file to train on: a `propose --generate-only` PROPOSED_QA Parquet (any QA file works)."),
    model: str = typer.Option("smollm2", help="Solver to start from: HF id, local path, checkpoint dir, or smollm2."),
    out: Path = typer.Option(Path("runs/solve"), "--out", "-o", help="Run directory (checkpoints/, final/, metrics)."),
    steps: int = typer.Option(50, help="Training steps [preset: 50]."),
    seed: int = typer.Option(0, help="Seeds data order, sampling and mini-batch order."),
    batch_size: int = typer.Option(8, help="Questions per step."),
    group_size: int = typer.Option(5, "--group-size", "-G", help="Responses per question [preset: 5]."),
    lr: float = typer.Option(1e-6, help="Learning rate [preset: 1e-6]."),
    beta: Optional[float] = typer.Option(None, help="KL weight to the reference [GRPO: 0.001; Dr. Zero: 0 to 0.001]."),
    micro_batch_size: int = typer.Option(8, help="Sequences per forward/backward."),
    max_grad_norm: float = opt.MAX_GRAD_NORM,
    warmup_ratio: float = typer.Option(0.03, help="Fraction of steps with linear warmup [preset: 0.03]."),
    lora_r: int = opt.LORA_R,
    lora_alpha: int = opt.LORA_ALPHA,
    lora_targets: str = opt.LORA_TARGETS,
    gradient_checkpointing: bool = opt.GRADIENT_CHECKPOINTING,
    search: str = typer.Option("bm25", help="bm25, dense, hybrid, http://host:port, serpapi."),
    index_dir: Optional[Path] = typer.Option(None, "--index", help="Index directory for in-process search [runs/index]."),
    topk: int = typer.Option(3, help="Passages per search [preset: 3]."),
    max_turns: int = typer.Option(5, help="Search turns before the final turn [preset: 5]."),
    max_turn_tokens: int = typer.Option(500, help="New tokens per turn."),
    max_obs_tokens: int = typer.Option(512, help="Tokens per tool response [preset: 512]."),
    max_context_tokens: int = typer.Option(3072, help="Prompt + response budget [preset: 3072]."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    backend: str = opt.BACKEND,
    device: str = opt.DEVICE,
    dtype: str = opt.DTYPE,
    save_every: int = typer.Option(50, help="Checkpoint every N steps (0 = final only)."),
    keep_checkpoints: int = opt.KEEP_CHECKPOINTS,
    resume: bool = opt.RESUME,
    save_rollouts: bool = opt.SAVE_ROLLOUTS,
    report_to: str = opt.REPORT_TO,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Dr. Zero solver: GRPO (G=5, EM, tool calls, Figure 6 prompt) on a proposer-generated QA set.

    Exactly `zsearch train --preset drzero-solver --train-data QA`; flags override the preset.
    """
    from zsearch_cli.train.cli_support import config_from_cli
    from zsearch_cli.train.trainer import run_training

    run_training(config_from_cli(ctx, {**resolved_options(ctx), "preset": "drzero-solver", "train_data": str(qa)}))


@stage
def drzero(
    ctx: typer.Context,
    out: Path = typer.Option(Path("runs/drzero"), "--out", "-o", help="Loop directory: iter-N/{proposer,questions.parquet,solver,eval}, lineage.json."),
    model: str = typer.Option("smollm2", help="Base model both the proposer and the solver start from."),
    iterations: int = typer.Option(3, help="Self-evolution iterations (Dr. Zero: 3)."),
    proposer_steps: int = typer.Option(50, help="HRPO steps per iteration."),
    solver_steps: int = typer.Option(50, help="GRPO steps per iteration."),
    questions_per_iteration: int = typer.Option(64, help="Proposer prompts at each generate sub-step."),
    samples: int = typer.Option(1, help="Proposer samples per prompt at generation (best by format kept)."),
    batch_size: int = typer.Option(16, help="Proposer prompts per HRPO step and per generation batch."),
    solver_batch_size: int = typer.Option(8, help="Questions per GRPO step (capped at the generated set's size)."),
    group_size: int = typer.Option(5, "--group-size", "-G", help="Solver responses per question."),
    solver_samples: int = typer.Option(5, help="Solver answers per proposed question (n of the difficulty reward)."),
    hop_ratio: str = typer.Option("4:3:2:1", help="Ratio of 1:2:3:4-hop questions."),
    seed: int = typer.Option(0, help="Every iteration's seeds derive from it (lineage.json records them)."),
    proposer_lr: float = typer.Option(1e-6, help="Proposer learning rate."),
    solver_lr: float = typer.Option(1e-6, help="Solver learning rate."),
    lora_r: int = typer.Option(0, help="LoRA rank for both (0 = full fine-tune)."),
    index_dir: Path = typer.Option(Path("runs/index"), "--index", help="Index: seed passages and in-process search."),
    search: str = typer.Option("bm25", help="bm25, dense, hybrid, http://host:port or serpapi."),
    topk: int = opt.TOPK,
    max_turns: int = typer.Option(5, help="Turns before the final no-search turn."),
    max_turn_tokens: int = typer.Option(512, help="New tokens per turn."),
    max_obs_tokens: int = typer.Option(512, help="Tokens per tool response."),
    proposer_context_tokens: int = typer.Option(4096, help="Proposer prompt + response budget."),
    solver_context_tokens: int = typer.Option(3072, help="Solver prompt + response budget."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (eval is greedy)."),
    save_every: int = typer.Option(10, help="Trainer checkpoints every N steps (the mid-training resume points)."),
    eval_datasets: str = typer.Option("", help="Evaluate each iteration's solver on these (as `eval --datasets`); empty = no eval."),
    eval_data_dir: Path = typer.Option(Path("data"), help="Benchmark files for --eval-datasets (FlashRAG layout)."),
    eval_limit: Optional[int] = typer.Option(None, help="Only the first N examples of each eval dataset."),
    backend: str = opt.BACKEND,
    device: str = opt.DEVICE,
    dtype: str = opt.DTYPE,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Dr. Zero self-evolution: per iteration propose-train, generate, solve-train (, eval); resumable.

    Rerun the same command after an interruption: sub-steps recorded as done in
    OUT/lineage.json are skipped, and an interrupted training sub-step resumes from its
    latest checkpoint.
    """
    from transformers.utils import logging as hf_logging

    from zsearch_cli.stages.drzero import DrZeroOptions, run_drzero

    hf_logging.disable_progress_bar()
    options = resolved_options(ctx)
    values = {("index" if k == "index_dir" else k): v for k, v in options.items()}
    for key in ("out", "index", "eval_data_dir"):
        values[key] = Path(values[key])
    run_drzero(DrZeroOptions(**values), options)
