"""The numeric ranges options declare (``option(range=...)``), and the registry of each
generated command's ranges that ``config.check_ranges`` checks and ``--help`` shows.

Its own module so that the typer plumbing (``config``) and the command generator
(``cli_options``) both read it without importing each other."""

from __future__ import annotations

import math
from dataclasses import dataclass

INF = math.inf


@dataclass(frozen=True)
class Range:
    """The values a numeric option accepts: ``lo``..``hi``, each end closed unless marked
    open. ``None`` (an unset optional option) always passes; NaN and infinities never do."""

    lo: float = -INF
    hi: float = INF
    lo_open: bool = False
    hi_open: bool = False
    why: str = ""
    """Said after the range when the reason is not obvious (e.g. the difficulty reward's n - 1)."""

    def contains(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        return above and below

    def describe(self, why: bool = True) -> str:
        lo_bound, hi_bound = self.lo != -INF, self.hi != INF
        lo = f"{'>' if self.lo_open else '>='} {_number(self.lo)}"
        hi = f"{'<' if self.hi_open else '<='} {_number(self.hi)}"
        text = (f"{lo} and {hi}" if lo_bound and hi_bound else lo if lo_bound else hi if hi_bound
                else "a finite number")
        return f"{text} ({self.why})" if self.why and why else text


def _number(x: float) -> str:
    """A bound as a person writes it: whole numbers in full (the seed's 4294967295, not
    4.29497e+09), others in the shortest form."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


AT_LEAST_0 = Range(0)
AT_LEAST_1 = Range(1)
POSITIVE = Range(0, lo_open=True)
FRACTION = Range(0, 1)
ANY = Range()

RANGES: dict[str, dict[str, Range]] = {}
"""command name -> parameter name -> the range its field declares; filled by :func:`command`."""


def range_for(command: str, name: str) -> Range | None:
    """The range parameter ``name`` of ``command`` accepts (None: not a numeric option)."""
    return RANGES.get(command, {}).get(name)
