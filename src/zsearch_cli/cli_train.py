"""The training commands of the ``zsearch`` CLI: ``train``, ``plot``, ``export``, ``warmup-data``,
``sft`` and ``simsft``.

Kept apart from ``cli.py`` only for length; ``cli.py`` registers them on the one app. Like
every command they parse options and call library functions (``train/``, ``stages/``).
"""

from __future__ import annotations

import typer

from zsearch_cli.cli_base import resolved_options
from zsearch_cli.cli_options import command
from zsearch_cli.config.commands import ExportOptions, PlotOptions, WarmupOptions
from zsearch_cli.config.fields import build
from zsearch_cli.train.config import TrainConfig
from zsearch_cli.train.sft_config import SFTConfig, SimSFTOptions


# ----------------------------------------------------------------------------- train / plot


@command(TrainConfig, name="train")
def train(ctx: typer.Context, given: dict) -> None:
    """RL-train a search agent: rollout, reward, (filter), advantages, update; one loop for every --algo."""
    from transformers.utils import logging as hf_logging

    from zsearch_cli.train.trainer import run_training

    hf_logging.disable_progress_bar()  # the CLI shows its own progress; no per-load tqdm bars
    run_training(TrainConfig.from_preset(given.get("preset"), **given))


@command(PlotOptions, name="plot", config_file=False)
def plot(ctx: typer.Context, given: dict) -> None:
    """Plot a training run's metric curves to a PNG."""
    from zsearch_cli.train.metrics import plot_metrics

    opts = build(PlotOptions, given)
    typer.echo(f"curves written to {plot_metrics(opts.run_dir, opts.out, opts.title)}")


@command(ExportOptions, name="export", config_file=False)
def export(ctx: typer.Context, given: dict) -> None:
    """Export a run, checkpoint or final folder as a plain HF folder (weights, tokenizer, chat template,
    model card) that transformers, peft and vLLM load on another machine; --merge-lora merges a LoRA."""
    from zsearch_cli.commands.export import export as run_export
    from zsearch_cli.commands.export import folder_bytes

    o = build(ExportOptions, given)
    out = run_export(o.source, o.out, merge_lora=o.merge_lora, dtype=o.dtype, eval_dir=o.eval, force=o.force,
                     note=lambda line: typer.echo(line, err=True))
    typer.echo(f"exported to {out} ({folder_bytes(out) / 2**20:.1f} MiB; zsearch eval --model {out})")


# ----------------------------------------------------------------------------- SFT / simulator SFT
@command(WarmupOptions, name="warmup-data")
def warmup_data(ctx: typer.Context, given: dict) -> None:
    """Format warm-up data for `sft`: per question, a gold trajectory (search, then the answer).

    Each trajectory is played through the rollout engine: think, search the question, read
    the real results, answer the first gold answer. For small models that do not follow the action format yet (smollm2): a few tens of
    `zsearch sft` steps on this file, then RL. It teaches the format, not the answers.
    """
    from zsearch_cli.commands.warmup import build_warmup_data

    build_warmup_data(build(WarmupOptions, given), resolved_options(ctx))


@command(SFTConfig, name="sft")
def sft(ctx: typer.Context, given: dict) -> None:
    """Supervised fine-tuning with the loss on completion tokens only (pairs or trajectories).

    Uses: Search-R1's SFT baseline (question -> target response pairs, chat template); the
    rejection-sampling baseline (zsearch sft runs/collect/trajectories.parquet --only-correct:
    a policy's own EM-correct trajectories, retrieved tokens masked out); a format warm-up of a
    small policy before RL; and the ZeroSearch simulator (zsearch simsft builds its data and
    runs this trainer).
    """
    from zsearch_cli.train.sft import run_sft

    run_sft(build(SFTConfig, given))


@command(SimSFTOptions, name="simsft")
def simsft(ctx: typer.Context, given: dict) -> None:
    """Fine-tune the ZeroSearch simulator (§3.3) on judged query-document rows.

    Prompt: the paper's Table 2 text with the judge's label (useful/noisy) and the row's own
    question and first gold answer; target: its documents as "Doc i: ..." lines. Trained raw,
    without a chat template, as `--search sim:OUT/final` sends it (or `vllm serve OUT/final`
    and `--search sim+http://HOST:PORT/v1`).
    """
    from zsearch_cli.commands.simsft import simsft as run_simsft

    o = build(SimSFTOptions, given)
    run_simsft(o.judgments, o.sft, resolved_options(ctx), balance=o.balance, titles=o.titles,
               doc_words=o.doc_words)
