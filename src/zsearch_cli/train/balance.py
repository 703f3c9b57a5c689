"""Token balance across processes (``--balance-tokens``, verl's ``balance_batch``; docs/methods.md §8).

Under DDP each process updates on its own samples and the gradients meet in one all-reduce at
the end of the backward: a step takes as long as the process with the most tokens. A search
agent's samples differ tenfold in length (one answers at once, another carries three blocks of
passages), so the prompts a process happened to draw can leave the others waiting.

The rule: before the update, every process sees every process's sample lengths (one small
``gather_object`` of (group, tokens) pairs), and the prompt groups (all G samples of a prompt, which the group baseline
reads together) are dealt again: longest group first (ties by their order), each to the process
with the fewest tokens so far among those with room, where a process has room for as many
samples as it drew (so every process keeps its sample count, and the sequence-mean losses, which
DDP averages per process, stay the mean over the batch). The deal is the same on every process:
it depends only on the gathered lengths. Then only the samples that change process travel (a
second gather, of those alone, skipped when the deal moves nothing): a sample carries its token
ids and logprobs, and at GPU batch sizes sending every sample to every process would cost more
than the balance saves. verl partitions single sequences (Karmarkar-Karp with equal sizes);
zsearch moves whole groups, so its advantages need no gathering.

Which process holds a sample changes neither the loss nor the gradient (the mean is over the
whole batch, tests/test_distributed.py), only the floating-point order of the sums.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any


def deal(groups: Sequence[tuple[int, int]], room: Sequence[int]) -> list[int] | None:
    """The process of each group, or None where the groups cannot fill ``room`` exactly.

    ``groups[k]``: (tokens, samples) of group k; ``room[r]``: the samples process r takes."""
    load = [0] * len(room)
    left = list(room)
    owner = [-1] * len(groups)
    for k in sorted(range(len(groups)), key=lambda k: (-groups[k][0], k)):  # longest first
        tokens, size = groups[k]
        fits = [r for r in range(len(room)) if left[r] >= size]
        if not fits:
            return None
        r = min(fits, key=lambda r: (load[r], r))
        owner[k] = r
        load[r] += tokens
        left[r] -= size
    return owner if all(x == 0 for x in left) else None


@dataclass
class Dealt:
    """This process's samples after the deal, and where each came from: (process, index in
    that process's list), so results per sample (the advantages of the saved rollouts) go home."""

    samples: list[Any]
    origin: list[tuple[int, int]]
    loads: list[int]
    """Tokens per process after the deal."""
    before: list[int]
    """Tokens per process as drawn."""


def balance(samples: list[Any], rank: int, world: int, gather: Any) -> Dealt:
    """Deal the prompt groups of every process's ``samples`` (:class:`~zsearch_cli.train.step_samples.Sample`)
    by :func:`deal`; ``gather(obj)``: the list of every process's ``obj`` in rank order
    (accelerate's ``gather_object`` of ``[obj]``, a collective every process calls alike).
    Unchanged where the deal is impossible."""
    mine_lengths = [(s.trajectory.group_id, len(s.trajectory.prompt_ids) + len(s.trajectory.response_ids))
                    for s in samples]
    everyone = gather(mine_lengths)  # [world] lists of (group id, tokens)
    flat = [(r, i) for r, part in enumerate(everyone) for i in range(len(part))]
    keys: dict[Hashable, int] = {}
    members: list[list[int]] = []
    for j, (r, i) in enumerate(flat):
        key = (r, everyone[r][i][0])  # a prompt's group lives on one process
        if key not in keys:
            keys[key] = len(members)
            members.append([])
        members[keys[key]].append(j)
    lengths = [everyone[r][i][1] for r, i in flat]
    groups = [(sum(lengths[j] for j in m), len(m)) for m in members]
    before = [sum(lengths[j] for j, (r, _) in enumerate(flat) if r == p) for p in range(world)]
    owner = deal(groups, [len(part) for part in everyone])
    if owner is None:
        return Dealt(list(samples), [(rank, i) for i in range(len(samples))], before, before)
    loads = [0] * world
    goes_to = [0] * len(flat)
    for k, m in enumerate(members):
        loads[owner[k]] += groups[k][0]
        for j in m:
            goes_to[j] = owner[k]
    received: dict[tuple[int, int], Any] = {}
    if any(goes_to[j] != r for j, (r, _) in enumerate(flat)):  # the same answer on every process
        leaving = [(i, samples[i]) for j, (r, i) in enumerate(flat) if r == rank and goes_to[j] != rank]
        for r, part in enumerate(gather(leaving)):
            received.update({(r, i): s for i, s in part})
    dealt = [j for k, m in enumerate(members) if owner[k] == rank for j in m]
    return Dealt([samples[flat[j][1]] if flat[j][0] == rank else received[flat[j]] for j in dealt],
                 [flat[j] for j in dealt], loads, before)


def send_home(values: list[Any], dealt: Dealt, rank: int, count: int, gather: Any) -> list[Any]:
    """Per-sample ``values`` of the dealt samples, back in the order of this process's own
    ``count`` samples as drawn (one ``gather``)."""
    everyone = gather(list(zip(dealt.origin, values)))
    home: list[Any] = [None] * count
    for part in everyone:
        for (r, i), v in part:
            if r == rank:
                home[i] = v
    return home


def _gather(obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order."""
    from accelerate.utils import gather_object

    return gather_object([obj])


class Balancer:
    """The trainer's use of this module: :meth:`deal` before the update, :meth:`home` after."""

    def __init__(self, accelerator: Any, enabled: bool):
        self.rank, self.world = accelerator.process_index, accelerator.num_processes
        self.on = enabled and self.world > 1

    def deal(self, samples: list[Any]) -> Dealt:
        if not self.on:
            return Dealt(list(samples), [(self.rank, i) for i in range(len(samples))], [], [])
        return balance(samples, self.rank, self.world, _gather)

    def home(self, values: list[Any], dealt: Dealt, count: int) -> list[Any]:
        return send_home(values, dealt, self.rank, count, _gather) if self.on else values
