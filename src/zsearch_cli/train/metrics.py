"""Per-step metrics: OUT/metrics.jsonl while running (flushed every step, so a crash keeps
them), OUT/metrics.parquet (METRICS artifact, atomic) at checkpoints and at the end,
optional accelerate trackers (tensorboard / wandb), and ``zsearch plot`` curves.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zsearch_cli.averages import PLAIN_LABEL, WEIGHTED_LABEL
from zsearch_cli.errors import ZsearchError
from zsearch_cli.protocol import Protocol, training_protocol
from zsearch_cli.artifacts import read_artifact, write_artifact
from zsearch_cli.schemas import METRIC_COLUMNS, METRICS

if TYPE_CHECKING:  # `zsearch plot` reads metrics without importing torch
    from zsearch_cli.train.step_samples import StepSamples

PLOTTED = ("rollout/reward_mean", "rollout/em", "rollout/f1", "actor/kl_ref", "actor/entropy", "actor/clipfrac",
           "actor/grad_norm", "actor/lr", "rollout/response_length", "rollout/searches", "filter/kept_frac",
           "rollout/logp_mismatch", "critic/vf_loss", "search/noise_p", "val/em", "val/em_plain", "val/f1", "time/step",
           "proposer/difficulty", "proposer/format_reward", "proposer/solver_k", "proposer/gate_pass",
           "rollout/truncated_frac", "rollout/garbage_frac", "rollout/repeat_frac", "rollout/no_search_rate",
           "rollout/answer_in_context", "rollout/repeated_query_rate", "rollout/answer_tokens")
"""Curves ``zsearch plot`` draws, when the run logged them."""


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def average_over_processes(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One metrics row from every process's row: each float metric is the mean of the
    processes that have a number for it (a process with no kept samples may have None);
    anything else (the step, counts, texts) is the first process's.

    Why a gathered list rather than one all-reduce per key: the per-key collectives must run
    in the same order and number on every process, and a metric that is a float on one
    process and None on another breaks that: a hang, or worse, two different metrics
    averaged together. One gather of the whole rows cannot mismatch."""
    out = dict(rows[0])
    keys = [k for k in dict.fromkeys(k for row in rows for k in row)
            if k != "step" and any(isinstance(row.get(k), float) for row in rows)]
    for k in keys:
        values = [float(row[k]) for row in rows
                  if isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)]
        out[k] = sum(values) / len(values) if values else None
    return out


def step_metrics(step: int, collected: StepSamples, update: dict[str, float] | None,
                 extra: dict[str, Any]) -> dict[str, Any]:
    """One METRICS row from what the step collected, the update's statistics (already named
    ``actor/…`` and ``critic/…``) and ``extra`` (lr, timings, search and batch-reward
    metrics, validation). Missing values are None; a name that is not a METRICS column is
    an error, never silently dropped."""
    samples = collected.samples
    trajs = [s.trajectory for s in samples]
    rewards = [s.reward for s in samples]
    mean = _mean(rewards) or 0.0
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else None
    row: dict[str, Any] = {"step": step, **{c: None for c in METRIC_COLUMNS}}
    values: dict[str, Any] = {
        "rollout/reward_mean": mean,
        "rollout/reward_std": std,
        "rollout/em": _mean([s.em for s in samples]),
        "rollout/f1": _mean([s.f1 for s in samples]),
        "rollout/subem": _mean([s.subem for s in samples]),
        "rollout/response_length": _mean([t.response_tokens for t in trajs]),
        "rollout/policy_tokens": _mean([t.policy_tokens for t in trajs]),
        "rollout/turns": _mean([t.num_turns for t in trajs]),
        "rollout/searches": _mean([t.num_searches for t in trajs]),
        "rollout/invalid": _mean([t.num_invalid for t in trajs]),
        "rollout/answered": _mean([float(t.prediction is not None) for t in trajs]),
        "rollout/truncated_frac": _mean([float(t.truncated) for t in trajs]),
        "actor/samples": float(len(collected.train)),
        "filter/gen_batches": float(collected.gen_batches),
        "time/rollout": collected.time_rollout,
        "time/reward": collected.time_reward,
    }
    if collected.kept_groups is not None:
        values.update({"filter/kept_groups": float(collected.kept_groups), "filter/tokens_wasted": collected.tokens_wasted,
                       "filter/kept_frac": collected.kept_groups / max(collected.total_groups, 1)})
    if trajs:  # the policy's own text and tokens, never the retrieved passages (train/guard.py)
        from zsearch_cli.audit.behaviour import rollout_behaviour
        from zsearch_cli.train.guard import text_metrics

        values.update(rollout_behaviour(trajs))  # no-search answers, answer in context, repeated queries
        values.update(text_metrics(["".join(t.policy_texts) for t in trajs],
                                   [[i for i, k in zip(t.response_ids, t.loss_mask) if k] for t in trajs]))
    values.update(update or {})
    values.update(extra)
    unknown = sorted(set(values) - set(row))
    if unknown:
        raise ValueError(f"metrics {', '.join(unknown)} are not METRICS columns: add them to schemas.METRIC_COLUMNS")
    row.update(values)
    return row


def console_line(row: dict[str, Any], total_steps: int) -> str:
    """The one line ``zsearch train`` prints per step. Namespaces the trainer does not own
    (``search/…`` from the backend, ``proposer/…`` from a batch reward, ``val/…``) are
    printed as they come, so the trainer needs to know nothing of what fills them."""

    def f(key: str, fmt: str = ".3f") -> str:
        v = row.get(key)
        return "-" if v is None else format(v, fmt)

    def namespace(ns: str) -> str:
        return "".join(f" {k.split('/', 1)[1]} {f(k, '.3g')}" for k, v in row.items()
                       if k.startswith(ns + "/") and v is not None)

    extra = ""
    if row.get("filter/kept_frac") is not None:
        extra = f" kept {f('filter/kept_frac', '.2f')} gen {f('filter/gen_batches', '.0f')}"
    extra += namespace("search") + namespace("proposer")
    if row.get("val/em") is not None:
        extra += f" | val{namespace('val')}"
    return (f"step {row['step']}/{total_steps} reward {f('rollout/reward_mean')} em {f('rollout/em')} "
            f"kl {f('actor/kl_ref', '.4f')} ent {f('actor/entropy')} gnorm {f('actor/grad_norm')} "
            f"lr {f('actor/lr', '.2e')} len {f('rollout/response_length', '.0f')}{extra} | {f('time/step', '.1f')}s "
            f"(rollout {f('time/rollout', '.1f')} reward {f('time/reward', '.2f')} update {f('time/update', '.1f')})")


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
    ``title`` (default: the run folder's name), e.g. which model and task the run trained.
    Collapse-guard events (RUN_DIR/guard.jsonl) are marked on every panel: a dashed red line
    at each event's step, a solid purple one where the run rolled back."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = load_metrics(run_dir)
    steps = [r["step"] for r in rows]
    marks: dict[int, str] = {}  # step -> the guard's action there (a rollback wins)
    guard_log = Path(run_dir) / "guard.jsonl"
    if guard_log.is_file():
        for line in guard_log.read_text(encoding="utf-8").splitlines():
            try:
                event = json.loads(line)
                step, action = int(event["step"]), str(event.get("action", "warn"))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by a killed run
            if marks.get(step) != "rollback":
                marks[step] = action
    names = [n for n in PLOTTED if any(r.get(n) is not None for r in rows)]
    # over several sources val/em is one of two averages: each panel says which, as the tables do
    titles = ({"val/em": f"val/em: {WEIGHTED_LABEL}", "val/em_plain": f"val/em_plain: {PLAIN_LABEL}"}
              if "val/em_plain" in names else {})
    cols = 3
    nrows = max(1, -(-len(names) // cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 2.6 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        pts = [(s, r.get(name)) for s, r in zip(steps, rows) if r.get(name) is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 30 else None)
        for step, action in marks.items():
            rollback = action == "rollback"
            ax.axvline(step, color="purple" if rollback else "red", linestyle="-" if rollback else "--",
                       linewidth=1.0, alpha=0.6)
        ax.set_title(titles.get(name, name), fontsize=10)
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


def check_logp_mismatch(row: dict[str, Any], dtype: Any) -> None:
    """Stop when the sampler's logprobs disagree with the training forward's (the mean over
    the step's policy tokens, averaged over processes so all stop together); ``dtype`` is the
    sampler's compute dtype. Also with top_p < 1: the training forward replays the nucleus
    (train/logprobs.py), so both sides are renormalised over the same support."""
    from zsearch_cli.models.base import logp_tolerance

    mismatch = row.get("rollout/logp_mismatch")
    tol = logp_tolerance(dtype)
    if mismatch is not None and mismatch > tol:
        raise ZsearchError(f"step {row['step']}: the rollout logprobs differ from the policy's by "
                           f"{mismatch:.2e} nats per token on average (logp_mismatch; tolerance {tol:.0e}): "
                           "rollouts and training disagree, so the update would be off-policy by an unknown "
                           "amount")
