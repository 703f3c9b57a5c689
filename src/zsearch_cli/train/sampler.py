"""Training prompts: QA files in a seeded order, drawn B at a time, with a resumable cursor.

The order of epoch ``e`` is a permutation from ``numpy.random.default_rng((seed, e))``, so
it depends only on the seed and the epoch: the cursor ``(epoch, position)`` is all a
checkpoint needs to continue exactly. A batch never straddles two epochs (the tail of an
epoch that cannot fill a batch is skipped, as Search-R1's ``drop_last``), so one batch never
holds the same question twice and group ids stay unique per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zsearch_cli.errors import ZsearchError
from zsearch_cli.rollout.engine import QARow


@dataclass
class Cursor:
    epoch: int = 0
    position: int = 0


def load_rows(spec: str | None) -> list[QARow]:
    """QARows from a comma list of QA files (None: the bundled demo train split)."""
    from zsearch_cli.data.demo import demo_qa
    from zsearch_cli.data.qa import load_qa

    paths = [Path(p.strip()) for p in spec.split(",") if p.strip()] if spec else [demo_qa("train")]
    rows: list[QARow] = []
    seen: dict[str, Path] = {}
    for path in paths:
        for r in load_qa(path).to_pylist():
            if r["id"] in seen:
                raise ZsearchError(f"{path}: id {r['id']!r} is also in {seen[r['id']]}: training ids must be unique")
            seen[r["id"]] = path
            rows.append(QARow(r["id"], r["question"], list(r["golden_answers"])))
    return rows


class PromptSampler:
    """Draws batches of B prompts in a seeded, epoch-wise shuffled order."""

    def __init__(self, rows: list[QARow], batch_size: int, seed: int):
        if batch_size > len(rows):
            raise ZsearchError(f"--batch-size {batch_size} is larger than the training set ({len(rows)} questions)")
        self.rows = rows
        self.batch_size = batch_size
        self.seed = seed
        self.cursor = Cursor()

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((self.seed, epoch)).permutation(len(self.rows))

    def next_batch(self) -> list[QARow]:
        """The next B rows; moves the cursor."""
        c = self.cursor
        if c.position + self.batch_size > len(self.rows):
            c.epoch, c.position = c.epoch + 1, 0
        idx = self._order(c.epoch)[c.position : c.position + self.batch_size]
        c.position += self.batch_size
        return [self.rows[i] for i in idx]

    def state(self) -> dict[str, int]:
        return {"epoch": self.cursor.epoch, "position": self.cursor.position}

    def load_state(self, state: dict[str, int]) -> None:
        self.cursor = Cursor(int(state["epoch"]), int(state["position"]))
