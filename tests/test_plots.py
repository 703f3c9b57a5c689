"""The PNGs a person looks at: `em.png` (EM per dataset and method, values on the bars, an
all-zero result still visible) and `curves.png` (integer step ticks). Each is read back as
an image and checked for its size and for the pixels of its bars and labels."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pytest

from zsearch_cli.artifacts import write_artifact
from zsearch_cli.schemas import EVAL_SUMMARY


def _summary(out: Path, dataset: str, method: str, em: float) -> None:
    row = {"dataset": dataset, "method": method, "model": "m", "n": 4, "em": em, "f1": em, "subem": em,
           "answered": 1.0, "avg_searches": 1.0, "avg_turns": 2.0, "avg_tokens": 30.0}
    write_artifact([row], out / dataset / f"{method}.summary.parquet", EVAL_SUMMARY)


def _image(path: Path) -> np.ndarray:
    import matplotlib.image

    assert path.is_file() and path.stat().st_size > 2000
    return matplotlib.image.imread(str(path))  # [H, W, 4] floats in [0, 1]


@contextlib.contextmanager
def _saved_figures():
    """Every matplotlib figure saved inside the block, to look at what was drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: list = []
    savefig = plt.Figure.savefig

    def keep(self, *args, **kwargs):
        figures.append(self)
        return savefig(self, *args, **kwargs)

    plt.Figure.savefig = keep
    try:
        yield figures
    finally:
        plt.Figure.savefig = savefig


@pytest.mark.parametrize("scores", [(0.25, 0.5), (0.0, 0.0)], ids=["values", "all-zero"])
def test_em_png_labels_its_bars_and_shows_zero_bars(tmp_path, scores):
    from zsearch_cli.commands.eval_report import plot_em

    _summary(tmp_path, "demo", "agent", scores[0])
    _summary(tmp_path, "demo", "rag", scores[1])
    with _saved_figures() as figures:
        img = _image(plot_em(tmp_path))
    # figsize (max(4, 1.2 * 1 dataset * 2 methods), 3.5) inches at 120 dpi
    assert img.shape[:2] == (420, 480)
    (fig,) = figures
    (ax,) = fig.axes
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == sorted(f"{v:.3f}" for v in scores)  # every bar carries its value
    bars = ax.patches
    assert sorted(round(b.get_height(), 3) for b in bars) == sorted(scores)
    # A bar of height 0 is still drawn: its edge is a visible line at 0.
    assert all(b.get_linewidth() > 0 and b.get_edgecolor()[3] > 0 for b in bars)


def test_curves_have_integer_step_ticks(tmp_path):
    import json

    from zsearch_cli.train.metrics import plot_metrics

    rows = [{"step": s, "rollout/reward_mean": 0.1 * s, "actor/grad_norm": 1.0 / s} for s in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with _saved_figures() as figures:
        path = plot_metrics(tmp_path)
    img = _image(path)
    assert img.shape[0] > 200 and img.shape[1] == 1320  # 3 columns x 4 inches at 110 dpi
    (fig,) = figures
    assert sorted(ax.get_title() for ax in fig.axes if ax.get_title()) == ["actor/grad_norm", "rollout/reward_mean"]
    for ax in fig.axes:
        if ax.get_title():
            ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
            assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)


def test_curves_carry_the_title_they_are_given(tmp_path):
    """`zsearch plot --title` (the demo names the model and task on its reward curve)."""
    import json

    from zsearch_cli.train.metrics import plot_metrics

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0, "rollout/reward_mean": 0.5}) + "\n")
    with _saved_figures() as figures:
        plot_metrics(tmp_path, tmp_path / "a.png")
        plot_metrics(tmp_path, tmp_path / "b.png", title="GRPO on a tiny model")
    assert [f._suptitle.get_text() for f in figures] == [f"zsearch train: {tmp_path.name}", "GRPO on a tiny model"]


def test_console_line_prints_namespaces_the_trainer_does_not_own():
    from zsearch_cli.train.metrics import console_line

    row = {"step": 3, "rollout/reward_mean": 0.5, "search/noise_p": 0.16666, "proposer/gate_pass": 2.0,
           "proposer/solver_k": None, "val/em": 0.25, "val/f1": 0.5}
    line = console_line(row, 10)
    assert line.startswith("step 3/10 reward 0.500 ")  # counted from 1, as the checkpoints
    assert " noise_p 0.167" in line and " gate_pass 2" in line and "solver_k" not in line  # None is left out
    assert "| val em 0.25 f1 0.5" in line
