"""Token balance across processes (train/balance.py): the deal by hand, and the exchange of
samples and their results through a gather, on one machine without processes (the gather of
two ranks built by hand). tests/test_distributed.py runs it under 2 real processes."""

from __future__ import annotations

import threading
from typing import Any

from zsearch_cli.train.balance import balance, deal, send_home

from helpers import make_trajectory


def test_the_deal_gives_the_longest_group_to_the_lightest_process_with_room():
    # groups (tokens, samples): 50, 40, 30, 20, 10, each of 2 samples; 2 processes of 4 and 6.
    # 50 -> 0 (a tie at 0 tokens: the first); 40 -> 1; 30 -> 1 (40 < 50); 20 -> 0 (50 < 70),
    # now full (4 samples); 10 -> 1: loads 70 and 80.
    assert deal([(50, 2), (40, 2), (30, 2), (20, 2), (10, 2)], [4, 6]) == [0, 1, 1, 0, 1]
    # room that the groups cannot fill exactly: no deal
    assert deal([(5, 3), (5, 3)], [2, 4]) is None
    assert deal([(5, 2)], [2, 2]) is None


class _Sample:
    def __init__(self, group: str, n: int, name: str):
        self.trajectory = make_trajectory(f"{name}#0", group_id=group, prompt_ids=[1], response_ids=[2] * (n - 1),
                                          loss_mask=[1] * (n - 1))


class _AllGather:
    """An all-gather among ``world`` threads (one per rank), as accelerate's ``gather_object`` is
    among processes: every rank calls it with its object, each gets the list in rank order. It
    records what each call carried, to see what travels."""

    def __init__(self, world: int):
        self.world = world
        self.slots: list[Any] = [None] * world
        self.barrier = threading.Barrier(world)
        self.sent: list[list[Any]] = []

    def __call__(self, rank: int, obj: Any) -> list[Any]:
        self.slots[rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        if rank == 0:
            self.sent.append(out)
        self.barrier.wait()  # nobody overwrites a slot before every rank has read it
        return out

    def run(self, work: Any) -> list[Any]:
        """``work(rank, gather)`` on every rank at once; their results in rank order."""
        results: list[Any] = [None] * self.world
        threads = [threading.Thread(target=lambda r=r: results.__setitem__(r, work(r, lambda obj, r=r: self(r, obj))))
                   for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        return results


def test_balance_moves_whole_groups_keeps_counts_and_sends_results_home():
    # rank 0 drew two long groups (2 x 20 tokens each), rank 1 two short ones (2 x 5).
    ranks = [[_Sample("a", 20, "a0"), _Sample("a", 20, "a1"), _Sample("b", 20, "b0"), _Sample("b", 20, "b1")],
             [_Sample("c", 5, "c0"), _Sample("c", 5, "c1"), _Sample("d", 5, "d0"), _Sample("d", 5, "d1")]]
    wire = _AllGather(2)
    dealt = wire.run(lambda r, gather: balance(ranks[r], r, 2, gather))
    # a (40) -> 0, b (40) -> 1, c (10) -> 0 (tie at 40: the first), d (10) -> 1
    assert [[s.trajectory.row_id for s in d.samples] for d in dealt] == [["a0", "a1", "c0", "c1"], ["b0", "b1", "d0", "d1"]]
    assert dealt[0].before == [80, 20] and dealt[0].loads == [50, 50]
    assert dealt[1].origin == [(0, 2), (0, 3), (1, 2), (1, 3)]
    # what travelled: every sample's (group, tokens), then only the 4 samples that changed process
    lengths, moved = wire.sent
    assert lengths == [[("a", 20), ("a", 20), ("b", 20), ("b", 20)], [("c", 5), ("c", 5), ("d", 5), ("d", 5)]]
    assert [[s.trajectory.row_id for _, s in part] for part in moved] == [["b0", "b1"], ["c0", "c1"]]
    # each process computes a number per dealt sample; every one goes back to its drawer
    results = [[f"{s.trajectory.row_id}@{r}" for s in dealt[r].samples] for r in (0, 1)]
    home = _AllGather(2).run(lambda r, gather: send_home(results[r], dealt[r], r, 4, gather))
    assert home == [["a0@0", "a1@0", "b0@1", "b1@1"], ["c0@0", "c1@0", "d0@1", "d1@1"]]


def test_a_deal_that_moves_nothing_sends_no_sample():
    # each rank holds one group of each length: the deal keeps them where they are
    ranks = [[_Sample("a", 20, "a0"), _Sample("a", 20, "a1"), _Sample("c", 5, "c0"), _Sample("c", 5, "c1")],
             [_Sample("b", 20, "b0"), _Sample("b", 20, "b1"), _Sample("d", 5, "d0"), _Sample("d", 5, "d1")]]
    wire = _AllGather(2)
    dealt = wire.run(lambda r, gather: balance(ranks[r], r, 2, gather))
    assert [[s.trajectory.row_id for s in d.samples] for d in dealt] == [["a0", "a1", "c0", "c1"], ["b0", "b1", "d0", "d1"]]
    assert len(wire.sent) == 1  # the lengths only
