"""Per-step metrics: OUT/metrics.jsonl while running (flushed every step, so a crash keeps
them), OUT/metrics.parquet (METRICS artifact, atomic) at checkpoints and at the end,
optional accelerate trackers (tensorboard / wandb), and ``zsearch plot`` curves.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from zsearch_cli.errors import ZsearchError
from zsearch_cli.protocol import Protocol, training_protocol
from zsearch_cli.schemas import METRIC_COLUMNS, METRICS, read_artifact, write_artifact

PLOTTED = ("reward_mean", "em", "f1", "kl", "entropy", "clipfrac", "grad_norm", "lr", "response_length",
           "searches", "kept_frac", "logp_mismatch", "vf_loss", "noise_p", "val_em", "val_f1", "time_step", "difficulty",
           "format_reward", "solver_k", "gate_pass")
"""Curves ``zsearch plot`` draws, when the run logged them."""


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def step_metrics(step: int, collected: Any, update: dict[str, float] | None, extra: dict[str, Any]) -> dict[str, Any]:
    """One METRICS row from what the step collected, the update's stats and ``extra``
    (lr, timings, noise_p, logp_mismatch). Missing values are None."""
    trajs = collected.trajs
    rewards = [t["reward"] for t in trajs]
    mean = _mean(rewards) or 0.0
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else None
    row: dict[str, Any] = {"step": step, **{c: None for c in METRIC_COLUMNS}}
    row.update(
        reward_mean=mean,
        reward_std=std,
        em=_mean([t["em"] for t in trajs]),
        f1=_mean([t["f1"] for t in trajs]),
        subem=_mean([t["subem"] for t in trajs]),
        response_length=_mean([t["response_tokens"] for t in trajs]),
        policy_tokens=_mean([t["policy_tokens"] for t in trajs]),
        turns=_mean([t["num_turns"] for t in trajs]),
        searches=_mean([t["num_searches"] for t in trajs]),
        invalid=_mean([t["num_invalid"] for t in trajs]),
        answered=_mean([float(t["prediction"] is not None) for t in trajs]),
        samples=float(len(collected.train)),
        gen_batches=float(collected.gen_batches),
        time_rollout=collected.time_rollout,
        time_reward=collected.time_reward,
    )
    if collected.kept_groups is not None:
        row.update(kept_groups=float(collected.kept_groups), tokens_wasted=collected.tokens_wasted,
                   kept_frac=collected.kept_groups / max(collected.total_groups, 1))
    if update:
        row.update(kl=update.get("kl_ref"), entropy=update.get("entropy"), clipfrac=update.get("clipfrac"),
                   approx_kl=update.get("approx_kl"), pg_loss=update.get("pg_loss"), loss=update.get("loss"),
                   grad_norm=update.get("grad_norm"), vf_loss=update.get("vf_loss"),
                   vf_clipfrac=update.get("vf_clipfrac"), critic_grad_norm=update.get("critic_grad_norm"))
    row.update({k: v for k, v in extra.items() if k in row})
    return row


class MetricsLog:
    """Collects metric rows; ``log`` appends one line to metrics.jsonl and flushes it.
    metrics.parquet carries the run's protocol (zsearch_cli/protocol.py) on every row and in
    its metadata; the jsonl and the trackers get the metrics only."""

    def __init__(self, out: Path, config: dict[str, Any], accelerator: Any = None, enabled: bool = True):
        self.out = Path(out)
        self.config = config
        self.accelerator = accelerator
        self.enabled = enabled  # False on non-main processes
        self.protocol: Protocol | None = training_protocol(config) if enabled else None
        self.rows: list[dict[str, Any]] = []
        self.jsonl = self.out / "metrics.jsonl"

    def restore(self, rows: list[dict[str, Any]]) -> None:
        """Start from ``rows`` (a checkpoint's), rewriting metrics.jsonl to match them: lines a
        killed run wrote after its last checkpoint are dropped, as those steps will rerun."""
        self.rows = [dict(r) for r in rows]
        if self.enabled:
            self._rewrite()

    def start_fresh(self) -> None:
        self.rows = []
        if self.enabled:
            self._rewrite()

    def _rewrite(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.jsonl.with_name(".metrics.jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        os.replace(tmp, self.jsonl)

    def log(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if not self.enabled:
            return
        with open(self.jsonl, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
        if self.accelerator is not None and self.accelerator.trackers:
            self.accelerator.log({k: v for k, v in row.items() if v is not None and k != "step"}, step=row["step"])

    def write_parquet(self) -> Path | None:
        """OUT/metrics.parquet, atomically (with the run's config in its metadata)."""
        if not self.enabled or not self.rows:
            return None
        protocol = self.protocol.as_dict() if self.protocol is not None else None
        rows = [{**r, **(protocol or {})} for r in self.rows]
        return write_artifact(rows, self.out / "metrics.parquet", METRICS, self.config, protocol)


def load_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """A run's metric rows: metrics.parquet, else metrics.jsonl (a run still going or killed)."""
    run_dir = Path(run_dir)
    if (run_dir / "metrics.parquet").is_file():
        return read_artifact(run_dir / "metrics.parquet", METRICS).to_pylist()
    if (run_dir / "metrics.jsonl").is_file():
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        if rows:
            return rows
    raise ZsearchError(f"{run_dir}: no metrics.parquet or metrics.jsonl (is it a `zsearch train` output folder?)")


def plot_metrics(run_dir: Path, out: Path | None = None, title: str | None = None) -> Path:
    """One PNG grid of the main curves (x = step) -> RUN_DIR/curves.png (or ``out``), under
    ``title`` (default: the run folder's name), e.g. which model and task the run trained."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = load_metrics(run_dir)
    steps = [r["step"] for r in rows]
    names = [n for n in PLOTTED if any(r.get(n) is not None for r in rows)]
    cols = 3
    nrows = max(1, -(-len(names) // cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.6 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        pts = [(s, r.get(name)) for s, r in zip(steps, rows) if r.get(name) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 30 else None)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(title or f"zsearch train: {Path(run_dir).name}", fontsize=11)
    fig.tight_layout()
    path = Path(out) if out is not None else Path(run_dir) / "curves.png"
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
    return path
