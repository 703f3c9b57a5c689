"""``--rollout-overlap K``: the trainer's side of :class:`~zsearch_cli.rollout.stream.RolloutStream`.

The data loader draws K steps ahead and puts each step's rows in the stream, which rolls
them out on its own thread while earlier steps train; step t's rollout may start at policy
version t − 1 − K (the staleness bound) and is trained at version t − 1. ``sample_step``
reads this object as both its data (``next_batch``: the rows drawn for the step) and its
engine (``rollout``: the step's trajectories from the stream), so scoring, rewards and
metrics are the on-policy path's own. Checkpoints save the data cursor as it was before the
first step not trained yet: a resumed run draws those steps again and rolls them out anew
(the in-flight rollouts of the killed run are lost), so overlap runs resume exactly in data
order but not bit for bit.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

from zsearch_cli.rollout.stream import RolloutStream
from zsearch_cli.rollout.trajectory import Trajectory


class OverlapSource:
    def __init__(self, stream: RolloutStream, data: Any, overlap: int, last_step: int):
        self.stream, self.data, self.overlap, self.last_step = stream, data, overlap, last_step
        self.drawn: deque[tuple[list, dict]] = deque()  # (rows, data state before drawing them), per step
        self.queued = 0  # the last step put in the stream

    @property
    def batch_size(self) -> int:
        return self.data.batch_size

    def fill(self, step: int) -> None:
        """Put every step up to ``step`` + K (and at most the last) in the stream, from ``step`` on."""
        self.queued = max(self.queued, step - 1)
        while self.queued < min(self.last_step, step + self.overlap):
            self.queued += 1
            state = self.data.state()
            rows = self.data.next_batch()
            self.drawn.append((rows, state))
            # The same rollout step (seeds, group ids) the on-policy path gives step `queued`.
            self.stream.put(rows, self.queued - 1, min_version=self.queued - 1 - self.overlap)

    # ---- what sample_step reads as its data
    def next_batch(self) -> list:
        rows, _ = self.drawn.popleft()
        return rows

    def state(self) -> dict:
        """The cursor before the oldest step drawn but not trained (what a checkpoint saves)."""
        return dict(self.drawn[0][1]) if self.drawn else self.data.state()

    def load_state(self, state: dict) -> None:
        self.data.load_state(state)

    # ---- what sample_step reads as its engine
    def rollout(self, rows: Sequence[Any], group_size: int = 1, step: int = 0) -> list[Trajectory]:
        return self.stream.get()
