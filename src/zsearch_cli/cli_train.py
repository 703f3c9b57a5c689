"""The training commands of the ``zsearch`` CLI: ``train``, ``plot``, ``warmup-data``, ``sft``
and ``simsft``.

Kept apart from ``cli.py`` only for length; ``cli.py`` registers them on the one app. Like
every command they parse options and call library functions (``train/``, ``stages/``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from zsearch_cli import cli_options as opt
from zsearch_cli.cli_options import command
from zsearch_cli.config import ConfigOption, resolved_options, stage
from zsearch_cli.options import WarmupOptions


# ----------------------------------------------------------------------------- train / plot


@stage
def train(
    ctx: typer.Context,
    algo: str = typer.Option("grpo", help="reinforce, ppo, grpo, gspo, dspo (+ dspo-nofilter, dspo-token)."),
    preset: Optional[str] = typer.Option(None, help="search-r1, zerosearch, dspo or drzero-solver: the papers' settings; flags override."),
    model: str = typer.Option("smollm2", help="Policy to start from: HF id, local path, checkpoint dir, or smollm2."),
    train_data: Optional[str] = typer.Option(None, help="Comma list of QA files; default: the bundled demo train split."),
    out: Path = typer.Option(Path("runs/train"), "--out", "-o", help="Run directory (checkpoints/, final/, metrics)."),
    steps: int = typer.Option(100, help="Training steps."),
    seed: int = typer.Option(0, help="Seeds data order, sampling and mini-batch order."),
    batch_size: int = typer.Option(8, help="Prompts per step (DSPO: mixed groups to collect)."),
    group_size: Optional[int] = typer.Option(None, "--group-size", "-G", help="Responses per prompt [algo default: PPO 1, others 5]."),
    ppo_epochs: int = typer.Option(1, help="Passes over each rollout batch."),
    mini_batch_size: Optional[int] = typer.Option(None, help="Sequences per optimizer step [whole batch]."),
    micro_batch_size: int = typer.Option(8, help="Sequences per forward/backward (gradient accumulation)."),
    lr: Optional[float] = typer.Option(None, help="Actor learning rate [algo default 1e-6]."),
    critic_lr: Optional[float] = typer.Option(None, help="PPO critic learning rate [1e-5]."),
    critic_model: Optional[str] = typer.Option(None, help="PPO critic backbone [a copy of the policy]."),
    beta: Optional[float] = typer.Option(None, help="KL weight to the reference [algo default]; 0 loads no reference."),
    clip_eps: Optional[float] = typer.Option(None, help="Ratio clip ε, both sides [algo default]."),
    clip_eps_low: Optional[float] = typer.Option(None, help="Lower ratio clip ε."),
    clip_eps_high: Optional[float] = typer.Option(None, help="Upper ratio clip ε."),
    max_gen_batches: Optional[int] = typer.Option(None, help="DSPO: generation batches per step at most [10]."),
    algo_arg: Optional[list[str]] = typer.Option(None, help="KEY=VALUE for any other algo config field (repeatable)."),
    max_grad_norm: float = opt.MAX_GRAD_NORM,
    lr_schedule: str = typer.Option("constant", help="constant or cosine, after the warmup."),
    warmup_ratio: float = typer.Option(0.0, help="Fraction of steps with linear warmup."),
    min_lr_ratio: float = opt.MIN_LR_RATIO,
    weight_decay: float = opt.WEIGHT_DECAY,
    lora_r: int = opt.LORA_R,
    lora_alpha: int = opt.LORA_ALPHA,
    lora_targets: str = opt.LORA_TARGETS,
    gradient_checkpointing: bool = opt.GRADIENT_CHECKPOINTING,
    reward: Optional[str] = typer.Option(None, help="em, f1 or subem [algo default: ppo/grpo em, reinforce f1, dspo/gspo subem]."),
    format_bonus: float = typer.Option(0.0, help="Added when the response is well formed (0 = papers)."),
    search: str = typer.Option("bm25", help="bm25, dense, hybrid, http://host:port, serpapi, or the ZeroSearch "
                               "simulator: sim:MODEL[?opt=v&..] or sim+http://host:port/v1."),
    index_dir: Optional[Path] = typer.Option(None, "--index", help="Index directory for in-process search [runs/index]."),
    noise_start: Optional[float] = typer.Option(None, help="sim search: curriculum noise p_s [0]."),
    noise_end: Optional[float] = typer.Option(None, help="sim search: curriculum noise p_e [0.25; paper 7B: 0.75]."),
    noise_base: Optional[float] = typer.Option(None, help="sim search: curriculum base b [4]."),
    noise_schedule: Optional[str] = typer.Option(None, help="sim search: curriculum (eq. 1) or fixed (p = --noise-start) [curriculum]."),
    val_data: Optional[str] = typer.Option(None, help="QA file to validate on during training (greedy, real search)."),
    val_every: int = typer.Option(50, help="Validate every N steps and after the last (0 = after the last only)."),
    val_limit: Optional[int] = typer.Option(None, help="Validate on the first N questions only [all]."),
    val_search: Optional[str] = typer.Option(None, help="Validation search backend [bm25 over --index]."),
    val_allow_sim: bool = typer.Option(False, "--val-allow-sim", help="Allow a sim: --val-search (validation measures real search by default)."),
    protocol: str = opt.PROTOCOL,
    topk: int = opt.TOPK,
    max_turns: int = typer.Option(4, help="Search turns before the final turn."),
    max_turn_tokens: int = typer.Option(500, help="New tokens per turn."),
    max_obs_tokens: int = typer.Option(500, help="Tokens per observation."),
    max_context_tokens: int = typer.Option(4096, help="Prompt + response budget."),
    temperature: float = typer.Option(1.0, help="Sampling temperature."),
    top_p: float = opt.TOP_P,
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
    """RL-train a search agent: rollout, reward, (filter), advantages, update; one loop for every --algo."""
    from zsearch_cli.train.cli_support import config_from_cli
    from zsearch_cli.train.trainer import run_training

    run_training(config_from_cli(ctx, resolved_options(ctx)))


@stage
def plot(
    run_dir: Path = typer.Argument(..., help="A `zsearch train` output folder."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="PNG to write [RUN_DIR/curves.png]."),
) -> None:
    """Plot a training run's metric curves to a PNG."""
    from zsearch_cli.train.metrics import plot_metrics

    typer.echo(f"curves written to {plot_metrics(run_dir, out)}")


# ----------------------------------------------------------------------------- SFT / simulator SFT
@command(WarmupOptions, name="warmup-data")
def warmup_data(ctx: typer.Context, given: dict) -> None:
    """Format warm-up data for `sft`: per question, a gold trajectory (search, then the answer).

    Each trajectory is played through the rollout engine: think, search the question, read
    the real results, answer the first gold answer. For small models that do not follow the action format yet (smollm2): a few tens of
    `zsearch sft` steps on this file, then RL. It teaches the format, not the answers.
    """
    from zsearch_cli.train.warmup import build_warmup_data

    build_warmup_data(WarmupOptions(**given), resolved_options(ctx))


@stage
def sft(
    ctx: typer.Context,
    data: Path = typer.Argument(..., help="prompt/completion pairs (sft_example) or trajectories (prompt_ids, response_ids, loss_mask)."),
    model: str = typer.Option("smollm2", help="Model to start from: HF id, local path, checkpoint dir, or smollm2."),
    out: Path = typer.Option(Path("runs/sft"), "--out", "-o", help="Run directory (checkpoints/, final/, metrics.jsonl)."),
    eval_data: Optional[Path] = typer.Option(None, help="Held-out file of the same kind (default: an --eval-fraction split of DATA)."),
    eval_fraction: float = typer.Option(0.05, help="Seeded fraction of DATA held out for the eval loss (0 = none)."),
    eval_every: int = typer.Option(100, help="Eval loss every N steps, and after the last (0 = only after the last)."),
    chat_template: bool = typer.Option(True, "--chat-template/--no-chat-template", help="Pairs: wrap the prompt in the chat template (off: raw prompt text)."),
    only_correct: bool = typer.Option(False, "--only-correct", help="Trajectories: keep EM-correct ones only (rejection sampling)."),
    max_length: int = typer.Option(2048, help="Tokens per example; prompts are cut from the left, completions never."),
    epochs: float = typer.Option(1.0, help="Passes over the training examples."),
    max_steps: Optional[int] = opt.MAX_STEPS,
    batch_size: int = typer.Option(8, help="Examples per forward/backward (per process)."),
    grad_accum: int = opt.GRAD_ACCUM,
    lr: float = typer.Option(1e-5, help="Peak learning rate."),
    lr_schedule: str = typer.Option("cosine", help="constant or cosine, after the warmup."),
    warmup_ratio: float = typer.Option(0.03, help="Fraction of steps with linear warmup."),
    min_lr_ratio: float = opt.MIN_LR_RATIO,
    weight_decay: float = opt.WEIGHT_DECAY,
    max_grad_norm: float = opt.MAX_GRAD_NORM,
    lora_r: int = opt.LORA_R,
    lora_alpha: int = opt.LORA_ALPHA,
    lora_targets: str = opt.LORA_TARGETS,
    gradient_checkpointing: bool = opt.GRADIENT_CHECKPOINTING,
    merge_lora: bool = typer.Option(False, help="LoRA: also write OUT/final/merged (full weights, for vLLM)."),
    seed: int = typer.Option(0, help="Seeds the eval split, example order and fresh weights."),
    device: str = opt.DEVICE,
    dtype: str = opt.DTYPE,
    save_every: int = typer.Option(100, help="Checkpoint every N steps (0 = final only)."),
    keep_checkpoints: int = opt.KEEP_CHECKPOINTS,
    resume: bool = opt.RESUME,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Supervised fine-tuning with the loss on completion tokens only (pairs or trajectories).

    Uses: Search-R1's SFT baseline (question -> target response pairs, chat template); the
    rejection-sampling baseline (zsearch sft runs/collect/trajectories.parquet --only-correct:
    a policy's own EM-correct trajectories, retrieved tokens masked out); a format warm-up of a
    small policy before RL; and the ZeroSearch simulator (zsearch simsft builds its data and
    runs this trainer).
    """
    from zsearch_cli.train.sft import SFTConfig, run_sft

    run_sft(SFTConfig.from_dict(resolved_options(ctx)))


@stage
def simsft(
    ctx: typer.Context,
    judgments: Path = typer.Argument(..., help="judgments(.balanced).parquet from `zsearch judge`."),
    balance: bool = typer.Option(False, "--balance", help="Equal useful/noisy rows (majority downsampled, seeded)."),
    titles: bool = typer.Option(False, "--titles/--no-titles", help="Start each document with its title (ZeroSearch's have none)."),
    doc_words: int = typer.Option(30, help="Words per target document (Table 2: about 30; 0 = whole documents)."),
    model: str = typer.Option("smollm2", help="Simulator to start from (paper: Qwen2.5-3B/7B/14B-Instruct)."),
    out: Path = typer.Option(Path("runs/simsft"), "--out", "-o", help="Run directory: sim_sft.parquet, checkpoints/, final/."),
    eval_fraction: float = typer.Option(0.05, help="Seeded fraction held out for the eval loss (0 = none)."),
    eval_every: int = typer.Option(100, help="Eval loss every N steps, and after the last."),
    max_length: int = typer.Option(1024, help="Tokens per example (prompt cut from the left, documents never)."),
    epochs: float = typer.Option(1.0, help="Passes over the examples."),
    max_steps: Optional[int] = opt.MAX_STEPS,
    batch_size: int = typer.Option(8, help="Examples per forward/backward (per process)."),
    grad_accum: int = opt.GRAD_ACCUM,
    lr: float = typer.Option(1e-6, help="Peak learning rate (paper: 1e-6)."),
    lr_schedule: str = typer.Option("cosine", help="constant or cosine, after the warmup."),
    warmup_ratio: float = typer.Option(0.03, help="Fraction of steps with linear warmup."),
    min_lr_ratio: float = opt.MIN_LR_RATIO,
    weight_decay: float = opt.WEIGHT_DECAY,
    max_grad_norm: float = opt.MAX_GRAD_NORM,
    lora_r: int = opt.LORA_R,
    lora_alpha: int = opt.LORA_ALPHA,
    lora_targets: str = opt.LORA_TARGETS,
    gradient_checkpointing: bool = opt.GRADIENT_CHECKPOINTING,
    merge_lora: bool = typer.Option(True, help="LoRA: also write OUT/final/merged for `vllm serve`."),
    seed: int = typer.Option(0, help="Seeds --balance, the eval split and the example order."),
    device: str = opt.DEVICE,
    dtype: str = opt.DTYPE,
    save_every: int = typer.Option(100, help="Checkpoint every N steps (0 = final only)."),
    keep_checkpoints: int = opt.KEEP_CHECKPOINTS,
    resume: bool = opt.RESUME,
    config: Optional[Path] = ConfigOption,
) -> None:
    """Fine-tune the ZeroSearch simulator (§3.3) on judged query-document rows.

    Prompt: the paper's Table 2 text with the judge's label (useful/noisy) and the row's own
    question and first gold answer; target: its documents as "Doc i: ..." lines. Trained raw,
    without a chat template, as `--search sim:OUT/final` sends it (or `vllm serve OUT/final`
    and `--search sim+http://HOST:PORT/v1`).
    """
    from zsearch_cli.stages.simsft import simsft as run_simsft
    from zsearch_cli.train.sft import SFTConfig

    options = resolved_options(ctx)
    run_simsft(judgments, SFTConfig.from_dict(options), options, balance=balance, titles=titles, doc_words=doc_words)
