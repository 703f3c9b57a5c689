"""``SFTConfig``: the options of one SFT run (``zsearch sft``; ``zsearch simsft`` trains with it).

Apart from ``train/sft.py`` so that the CLI can build ``--help`` without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from zsearch_cli.config.fields import Record, option, part
from zsearch_cli.config.parts import ModelOptions, OptimConfig, RunConfig, Seeded
from zsearch_cli.config.ranges import AT_LEAST_0, AT_LEAST_1, POSITIVE, Range


@dataclass(kw_only=True)
class SFTConfig(Seeded, Record):
    """Options of one SFT run."""

    policy: ModelOptions = part(ModelOptions, exclude=("backend",))
    optim: OptimConfig = part(OptimConfig, lr=1e-5, lr_schedule="cosine", warmup_ratio=0.03)
    run: RunConfig = part(RunConfig, exclude=("save_rollouts", "report_to", "vllm_sleep", "gpu_memory_utilization"),
                          out=Path("runs/sft"), save_every=100)

    data: str = option("", argument=True, required=True, cli_type=Path, convert=str)
    """prompt/completion pairs (SFT_EXAMPLE) or trajectories (prompt_ids, response_ids, loss_mask)."""
    eval_data: Optional[str] = option(None, cli_type=Optional[Path], convert=str)
    """Held-out file of the same kind [an --eval-fraction split of DATA]."""
    eval_fraction: float = option(0.05, range=Range(0, 1, hi_open=True))
    """Seeded fraction of DATA held out for the eval loss (0 = none)."""
    eval_every: int = option(100, range=AT_LEAST_0, execution=True)
    """Eval loss every N steps, and after the last (0 = only after the last)."""
    chat_template: bool = True
    """Pairs: wrap the prompt in the chat template (off: raw prompt text, as the ZeroSearch simulator
    is served). Trajectories are already token ids."""
    only_correct: bool = option(False, flags=("--only-correct",))
    """Trajectories: keep EM-correct ones only (rejection sampling)."""
    max_length: int = option(2048, range=Range(2, why="a prompt token and a completion token"))
    """Tokens per example; prompts are cut from the left, completions never (one longer alone is dropped)."""
    # a resume may extend (or shorten) a run: the steps done stay what they were
    epochs: float = option(1.0, range=POSITIVE, execution=True)
    """Passes over the training examples (ignored when --max-steps is set)."""
    max_steps: Optional[int] = option(None, range=AT_LEAST_1, execution=True)
    """Optimizer steps (overrides --epochs) [from --epochs]."""
    batch_size: int = option(8, range=AT_LEAST_1)
    """Examples per forward/backward (per process); TRL's per_device_train_batch_size."""
    grad_accum: int = option(1, range=AT_LEAST_1, aliases=("gradient_accumulation_steps",))
    """Micro-batches per optimizer step: the step sees batch_size x grad_accum x processes."""


@dataclass(kw_only=True)
class SimSFTOptions:
    """``zsearch simsft``: the SFT options (the simulator's defaults: ZeroSearch's lr 1e-6, short
    documents, merged LoRA weights for `vllm serve`) and how judged rows become examples."""

    sft: SFTConfig = part(SFTConfig, exclude=("data", "eval_data", "chat_template", "only_correct"),
                          out=Path("runs/simsft"), max_length=1024, lr=1e-6, merge_lora=True)

    judgments: Path = option(argument=True)
    """judgments(.balanced).parquet from `zsearch judge`."""
    balance: bool = option(False, flags=("--balance",))
    """Equal useful/noisy rows (majority downsampled, seeded)."""
    titles: bool = False
    """Start each document with its title (ZeroSearch's have none)."""
    doc_words: int = option(30, range=AT_LEAST_0)
    """Words per target document (Table 2: about 30; 0 = whole documents)."""
