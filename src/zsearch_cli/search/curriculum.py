"""ZeroSearch's curriculum noise (paper §3.4, eq. 1; docs/methods.md §3).

During RL the simulator writes *noisy* documents with probability

    p(t) = p_s + (b^{t/T} − 1) / (b − 1) · (p_e − p_s),    t/T clamped to [0, 1],

so the policy first learns the format on useful documents and meets harder, noisier
retrieval later. The ablation "random" keeps p fixed (0.5 in the paper).

Why the draws are hashed rather than taken from a stateful RNG: the quality a query gets
must not depend on which other rows happen to share its batch, on their order, or on how
many searches other samples made. Each draw is a pure function of (seed, step, row id,
sample index, query, call index), so a resumed or re-batched run sees the same qualities.
``hashlib`` is used because Python's ``hash()`` of a string is salted per process.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field

from zsearch_cli.config.fields import choices_of
from zsearch_cli.config.parts import SimOptions
from zsearch_cli.errors import ZsearchError, shown_name

SCHEDULES = choices_of(SimOptions, "noise_schedule")
"""As ``--noise-schedule`` declares them; checked here too, for a ``sim:MODEL?schedule=`` spec."""


def noise_probability(
    step: int,
    total_steps: int,
    p_start: float,
    p_end: float,
    base: float = 4.0,
    schedule: str = "curriculum",
) -> float:
    """p(t) of eq. 1 at ``step`` of ``total_steps``.

    ``fixed`` returns ``p_start`` at every step. ``base == 1`` is the limit of eq. 1, the
    linear ramp t/T. With ``total_steps <= 0`` the progress is unknown: t/T counts as 0 at
    step 0 (or before) and as 1 after it.
    """
    if schedule not in SCHEDULES:
        raise ZsearchError(f"unknown noise schedule {shown_name(str(schedule))}: use one of {', '.join(SCHEDULES)}")
    if schedule == "fixed":
        return float(p_start)
    if base <= 0:
        raise ZsearchError(f"the curriculum base must be > 0, not {base}")
    if total_steps <= 0:
        ratio = 0.0 if step <= 0 else 1.0
    else:
        ratio = min(1.0, max(0.0, step / total_steps))
    if math.isclose(base, 1.0, abs_tol=1e-9):
        growth = ratio  # lim_{b→1} (b^x − 1)/(b − 1) = x
    else:
        growth = math.expm1(ratio * math.log(base)) / (base - 1.0)
    return float(p_start + growth * (p_end - p_start))


def unit_draw(*parts: object) -> float:
    """A uniform number in [0, 1) that depends only on ``parts`` (53 bits of a blake2b digest)."""
    key = "\x1f".join(str(p) for p in parts).encode("utf-8")
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) / float(1 << 53)


def derived_seed(*parts: object) -> int:
    """A 31-bit seed from ``parts`` (for sampling seeds sent to generators and servers)."""
    return int(unit_draw("seed", *parts) * (2**31 - 1))


@dataclass
class NoiseCurriculum:
    """The noise schedule plus the training progress and the per-call quality draws.

    ``set_progress`` is called by the trainer once per step; it also resets the per-step
    call counters, which tell apart repeated identical queries of one sample (a sample that
    searches "x" on two turns of a step gets two independent draws).
    """

    p_start: float = 0.0
    p_end: float = 0.25
    base: float = 4.0
    schedule: str = "curriculum"
    seed: int = 0
    step: int = 0
    total_steps: int = 0
    _calls: Counter = field(default_factory=Counter, repr=False)

    def __post_init__(self) -> None:
        for name in ("p_start", "p_end"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ZsearchError(f"noise {name} must be in [0, 1], not {value}")
        if self.schedule not in SCHEDULES:
            raise ZsearchError(f"unknown noise schedule {shown_name(str(self.schedule))}: use one of {', '.join(SCHEDULES)}")
        if self.base <= 0:
            raise ZsearchError(f"the curriculum base must be > 0, not {self.base}")

    def set_progress(self, step: int, total_steps: int) -> None:
        if (step, total_steps) != (self.step, self.total_steps):
            self._calls.clear()
        self.step, self.total_steps = int(step), int(total_steps)

    @property
    def p(self) -> float:
        """The noise probability at the current step."""
        return noise_probability(self.step, self.total_steps, self.p_start, self.p_end, self.base, self.schedule)

    def next_call_index(self, row_id: str, sample_index: int, query: str) -> int:
        """How many times this (row, sample, query) has already been drawn for this step."""
        key = (row_id, sample_index, query)
        index = self._calls[key]
        self._calls[key] += 1
        return index

    def uniform(self, row_id: str, sample_index: int, query: str, call_index: int) -> float:
        """The uniform number behind one call's quality (a pure function of its identity)."""
        return unit_draw(self.seed, self.step, row_id, sample_index, query, call_index)

    def draw(self, row_id: str, sample_index: int, query: str, call_index: int | None = None) -> tuple[float, str]:
        """``(u, quality)`` for one search call: ``noisy`` when u < p(t), else ``useful``.
        Without ``call_index`` the next one for this (row, sample, query) is used."""
        if call_index is None:
            call_index = self.next_call_index(row_id, sample_index, query)
        u = self.uniform(row_id, sample_index, query, call_index)
        return u, ("noisy" if u < self.p else "useful")
