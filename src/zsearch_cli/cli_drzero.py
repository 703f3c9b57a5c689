"""The Dr. Zero commands of the ``zsearch`` CLI: ``propose``, ``solve`` and ``drzero``.

Kept apart from ``cli.py`` only for length; ``cli.py`` registers them on the one app. Like
every command they are generated from their option dataclasses (``cli_options.command``)
and call library functions (``commands/propose*.py``, ``commands/drzero.py``, the trainer).
``propose`` and ``solve`` pass on only the values the user set: their presets
(drzero-proposer, drzero-solver) fill in the rest, and ``--help`` shows the preset's values.
"""

from __future__ import annotations

from pathlib import Path

import typer

from zsearch_cli.cli_base import resolved_options
from zsearch_cli.cli_options import command
from zsearch_cli.config.commands import GenerateOptions
from zsearch_cli.config.fields import build, leaves
from zsearch_cli.config.ranges import Range
from zsearch_cli.presets import PRESETS, apply_preset
from zsearch_cli.commands.drzero import PROPOSER_UNUSED, DrZeroOptions
from zsearch_cli.train.config import TrainConfig

SOLVE_EXCLUDES = ("algo", "preset", "protocol", "sim", "validation", "ppo_epochs", "mini_batch_size", "critic_lr",
                  "critic_model", "clip_eps", "clip_eps_low", "clip_eps_high", "max_gen_batches", "algo_args", "reward",
                  "format_bonus", "rollout_overlap")
"""What ``solve`` leaves out of TrainConfig: GRPO's own settings (the drzero-solver preset's), the
protocol (Dr. Zero's tool calls), the simulator and validation. Every other option, a new one
included, reaches it, and drzero's solve step (tests/test_drzero_parity.py)."""

PROPOSE_EXCLUDES = (*SOLVE_EXCLUDES, *PROPOSER_UNUSED)
"""``propose`` leaves out the same and what HRPO has no use for (``drzero.PROPOSER_UNUSED``, which
the loop's propose step leaves out too)."""

PROPOSE_DEFAULTS = {"index": Path("runs/index")}
SOLVE_DEFAULTS = {"out": Path("runs/solve")}


def _shown(preset: str, own: dict, **more: object) -> dict:
    """What ``--help`` shows as a command's defaults: its preset's values and its own."""
    return {**PRESETS[preset], **own, **more}


@command(GenerateOptions, TrainConfig, name="propose", exclude=PROPOSE_EXCLUDES,
         defaults=_shown("drzero-proposer", PROPOSE_DEFAULTS))
def propose(ctx: typer.Context, given: dict) -> None:
    """Dr. Zero proposer: train it with HRPO against a frozen solver, or (--generate-only) write n-hop questions.

    Training (the default): each step draws --batch-size (hop count, corpus passage) prompts,
    rolls out one question per prompt, has the solver answer each --solver-samples times and
    rewards r = I(0<k<n)(n-k)/(n-1) + format; HRPO standardizes rewards within each hop count.
    Writes OUT/final (proposer checkpoint), metrics and checkpoints like `zsearch train`.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    given = {**PROPOSE_DEFAULTS, **given}
    out = given.pop("out", None)
    if given.pop("generate_only", False):
        from zsearch_cli.commands.propose import generate_questions

        opts = build(GenerateOptions, apply_preset("drzero-proposer", given, set(given)))
        generate_questions(opts, out or Path("runs/propose/questions.parquet"), resolved_options(ctx))
        return
    from zsearch_cli.commands.propose_train import train_proposer

    proposer = build(GenerateOptions, given)
    cfg = TrainConfig.from_preset("drzero-proposer", **{k: v for k, v in given.items() if k in leaves(TrainConfig)},
                                  out=out or Path("runs/propose"))
    train_proposer(cfg, solver_model=proposer.proposer.solver_model, solver_url=proposer.proposer.solver_url,
                   solver_samples=proposer.proposer.solver_samples, hop_ratio=proposer.proposer.hop_ratio,
                   solver_protocol=proposer.proposer.solver_protocol, proposer_prompt=proposer.proposer.proposer_prompt,
                   answer_reward=proposer.proposer.answer_reward)


@command(TrainConfig, name="solve", exclude=SOLVE_EXCLUDES, defaults=_shown("drzero-solver", SOLVE_DEFAULTS),
         ranges={"group_size": Range(2, why="GRPO's group baseline")}, argument=("train_data", "qa", "QA file to train on: a `propose --generate-only` PROPOSED_QA Parquet "
                                          "(any QA file works)."))
def solve(ctx: typer.Context, given: dict) -> None:
    """Dr. Zero solver: GRPO (G=5, EM, tool calls, Figure 6 prompt) on a proposer-generated QA set.

    Exactly `zsearch train --preset drzero-solver --train-data QA`; flags override the preset.
    """
    from transformers.utils import logging as hf_logging

    from zsearch_cli.train.trainer import run_training

    hf_logging.disable_progress_bar()
    run_training(TrainConfig.from_preset("drzero-solver", **{**SOLVE_DEFAULTS, **given}))


@command(DrZeroOptions, name="drzero")
def drzero(ctx: typer.Context, given: dict) -> None:
    """Dr. Zero self-evolution: per iteration propose-train, generate, solve-train (, eval); resumable.

    Rerun the same command after an interruption: sub-steps recorded as done in
    OUT/lineage.json are skipped, and an interrupted training sub-step resumes from its
    latest checkpoint.
    """
    from transformers.utils import logging as hf_logging

    from zsearch_cli.commands.drzero import run_drzero

    hf_logging.disable_progress_bar()
    run_drzero(build(DrZeroOptions, given), resolved_options(ctx))
