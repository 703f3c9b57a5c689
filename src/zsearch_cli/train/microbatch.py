"""How a mini-batch is cut into micro-batches (docs/methods.md §8).

Two rules, one function:

- **Rows** (``--micro-batch-size R``, no token budget): R samples at a time, longest first, so
  that each right-padded micro-batch holds samples of similar length (arrival order padded
  the smollm2 bench's mix by 19%; longest first, 16%).
- **A token budget** (``--micro-batch-tokens N``, verl's ``use_dynamic_bsz`` with
  ``ppo_max_token_len_per_gpu``): samples are grouped by length, first-fit decreasing, into
  micro-batches whose cost is at most N tokens. The cost is what the forward computes: the sum
  of the lengths when packed (one row, no padding), rows × the longest when right-padded.
  Right-padded, a sample also joins a micro-batch only if its padding stays within
  :data:`PADDING_LIMIT` of the cost: padding is computed in every layer and thrown away. A
  sample longer than N goes alone. The budget wins over ``--micro-batch-size``, which is then
  not read.

Under several processes every process runs the same number of micro-batches: under FSDP and
ZeRO-3 each forward gathers the sharded parameters, a collective that must pair with the other
processes' (DDP all-reduces only at the last micro-batch's backward). :func:`equalize` brings a process's plan to
the largest count of any process (``Accelerator.gather`` of the counts): it splits its heaviest
micro-batch in two (the halves balanced by the longest-first rule) until the count is reached,
and when no micro-batch has two samples left, it adds empty ones (:data:`PAD_MICRO`), which the
update runs on a real sample with weight 0, so their collectives pair up and add nothing.

Any partition gives the same loss and gradients: each micro-batch's loss is weighted by its share
of what the mini-batch loss averages over (train/update.py), so the grouping changes only the
floating-point summation order.
"""

from __future__ import annotations

from collections.abc import Sequence

PAD_MICRO: list[int] = []
"""An empty micro-batch: run for the collectives only (weight 0)."""

PADDING_LIMIT = 0.05
"""Right-padded under a token budget: the most of a micro-batch's token slots that may be padding."""


def plan(idx: Sequence[int], lengths: Sequence[int], rows: int, tokens: int | None, packed: bool) -> list[list[int]]:
    """Micro-batches (lists of sample indices from ``idx``) for one mini-batch.

    ``lengths[i]``: sample i's prompt + response tokens. ``rows``: ``--micro-batch-size``;
    ``tokens``: ``--micro-batch-tokens`` (None: cut by rows)."""
    idx = sorted(idx, key=lambda j: -lengths[j])  # longest first; stable: equal lengths keep their order
    if tokens is None:
        return [idx[i : i + rows] for i in range(0, len(idx), rows)]
    bins: list[list[int]] = []
    loads: list[int] = []  # each bin's cost
    for i in idx:
        for b, members in enumerate(bins):
            after = _cost(loads[b], members, lengths[i], lengths, packed)
            real = sum(lengths[j] for j in members) + lengths[i]
            if after <= tokens and (packed or after - real <= PADDING_LIMIT * after):
                members.append(i)
                loads[b] = after
                break
        else:
            bins.append([i])
            loads.append(lengths[i])
    return [sorted(b) for b in bins]


def _cost(load: int, members: list[int], new: int, lengths: Sequence[int], packed: bool) -> int:
    """The cost of a bin after adding a sample of length ``new``: packed, the tokens; padded,
    rows × the longest (the first member is the longest: samples arrive longest first)."""
    if packed:
        return load + new
    longest = max([new, *(lengths[j] for j in members[:1])])
    return (len(members) + 1) * longest


def cost(micro: Sequence[int], lengths: Sequence[int], packed: bool) -> int:
    """Token slots one micro-batch's forward computes."""
    if not micro:
        return 0
    own = [lengths[i] for i in micro]
    return sum(own) if packed else len(own) * max(own)


def equalize(micros: list[list[int]], count: int, lengths: Sequence[int], packed: bool) -> list[list[int]]:
    """``micros`` brought to exactly ``count`` micro-batches (``count`` >= ``len(micros)``):
    split the costliest splittable micro-batch in two, balanced; pad with :data:`PAD_MICRO`
    when none can be split."""
    out = [list(m) for m in micros]
    if count < len(out):
        raise ValueError(f"cannot bring {len(out)} micro-batches down to {count}")
    while len(out) < count:
        splittable = [m for m in out if len(m) >= 2]
        if not splittable:
            out.extend([list(PAD_MICRO) for _ in range(count - len(out))])
            break
        heaviest = max(splittable, key=lambda m: cost(m, lengths, packed))
        out.remove(heaviest)
        halves: tuple[list[int], list[int]] = ([], [])
        for i in sorted(heaviest, key=lambda j: (-lengths[j], j)):  # longest first onto the lighter half
            lighter = min(halves, key=lambda h: (sum(lengths[j] for j in h), len(h)))
            lighter.append(i)
        out.extend(sorted(h) for h in halves)
    return out
