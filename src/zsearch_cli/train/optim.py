"""AdamW and the learning-rate schedule: linear warmup, then constant or cosine.

The schedule advances once per *training step* (not per mini-batch), as verl does, so the
lr a step uses does not depend on how many mini-batches DSPO's filter left it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def warmup_steps(total_steps: int, warmup_ratio: float) -> int:
    """W = floor(warmup_ratio · total_steps) (verl's rule)."""
    return int(warmup_ratio * total_steps)


def lr_factor(step: int, total_steps: int, warmup: int, schedule: str = "constant", min_ratio: float = 0.0) -> float:
    """The lr multiplier at 0-based training ``step``:

    - warmup, step < W: (step + 1)/W (so the first step already moves the weights);
    - constant: 1;
    - cosine: min_ratio + (1 − min_ratio)·½(1 + cos(π·p)), p = (step − W)/(T − 1 − W) in [0, 1],
      so the last step (T − 1) runs at min_ratio · lr.
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        p = min(1.0, (step - warmup) / max(1, total_steps - 1 - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))
    raise ValueError(f"unknown lr schedule {schedule!r}")


def make_optimizer(
    params: Iterable[torch.nn.Parameter], lr: float, weight_decay: float, total_steps: int,
    warmup_ratio: float, schedule: str, min_ratio: float,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable ``params`` and its LambdaLR (lr at step s = lr·lr_factor(s))."""
    trainable = [p for p in params if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999), eps=1e-8)
    w = warmup_steps(total_steps, warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total_steps, w, schedule, min_ratio)
    )
    return optimizer, scheduler
