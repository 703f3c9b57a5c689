"""Token balance across processes (train/balance.py): the deal by hand, and the exchange of
samples and their results through a gather, on one machine without processes (the gather of
two ranks built by hand). tests/test_distributed.py runs it under 2 real processes."""

from __future__ import annotations

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


def test_balance_moves_whole_groups_keeps_counts_and_sends_results_home():
    # rank 0 drew two long groups (2 x 20 tokens each), rank 1 two short ones (2 x 5).
    ranks = [[_Sample("a", 20, "a0"), _Sample("a", 20, "a1"), _Sample("b", 20, "b0"), _Sample("b", 20, "b1")],
             [_Sample("c", 5, "c0"), _Sample("c", 5, "c1"), _Sample("d", 5, "d0"), _Sample("d", 5, "d1")]]
    dealt = [balance(ranks[r], r, 2, lambda obj: ranks) for r in (0, 1)]
    # a (40) -> 0, b (40) -> 1, c (10) -> 0 (tie at 40: the first), d (10) -> 1
    assert [[s.trajectory.row_id for s in d.samples] for d in dealt] == [["a0", "a1", "c0", "c1"], ["b0", "b1", "d0", "d1"]]
    assert dealt[0].before == [80, 20] and dealt[0].loads == [50, 50]
    assert dealt[1].origin == [(0, 2), (0, 3), (1, 2), (1, 3)]
    # each process computes a number per dealt sample; every one goes back to its drawer
    results = [[f"{s.trajectory.row_id}@{r}" for s in dealt[r].samples] for r in (0, 1)]
    parts = [list(zip(dealt[r].origin, results[r])) for r in (0, 1)]
    gather = lambda obj: parts  # noqa: E731
    assert send_home(results[0], dealt[0], 0, 4, gather) == ["a0@0", "a1@0", "b0@1", "b1@1"]
    assert send_home(results[1], dealt[1], 1, 4, gather) == ["c0@0", "c1@0", "d0@1", "d1@1"]
