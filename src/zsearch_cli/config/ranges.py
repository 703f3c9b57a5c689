"""What an option accepts, as declared on its field: a numeric :class:`Range`
(``option(range=...)``) or the :class:`Choices` of a text option (``option(choices=...)``);
and the registry of each generated command's rules that ``cli_base.check_ranges`` checks and
``--help`` shows. Both rules answer the same three questions (``admits``, ``describe``,
``refusal``), so one check serves both.

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

    def admits(self, value: object) -> bool:
        """Whether the check lets ``value`` through: a number in range, or anything that is no
        number (None: an unset optional option; a bool; text), which is not this rule's to judge."""
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            return True
        return self.contains(value)

    def refusal(self, where: str, value: object) -> str:
        """The one-line error for ``value`` given as ``where`` (a flag, or a config file's key)."""
        return f"{where} must be {self.describe()}, got {value!r}"

    def describe(self, why: bool = True) -> str:
        lo_bound, hi_bound = self.lo != -INF, self.hi != INF
        lo = f"{'>' if self.lo_open else '>='} {_number(self.lo)}"
        hi = f"{'<' if self.hi_open else '<='} {_number(self.hi)}"
        text = (f"{lo} and {hi}" if lo_bound and hi_bound else lo if lo_bound else hi if hi_bound
                else "a finite number")
        return f"{text} ({self.why})" if self.why and why else text


@dataclass(frozen=True)
class Choices:
    """The values a text option accepts, declared once on its field (``option(choices=...)``):
    ``--help`` lists them, and the check that refuses an out-of-range number refuses any other
    value. ``None`` (an unset optional option: "the algorithm's default") always passes."""

    values: tuple[str, ...]

    def admits(self, value: object) -> bool:
        return value is None or value in self.values

    def refusal(self, where: str, value: object) -> str:
        return f"unknown {where} {value!r}: use {self.describe()}"

    def describe(self, why: bool = True) -> str:
        return "one of " + ", ".join(self.values)


def _number(x: float) -> str:
    """A bound as a person writes it: whole numbers in full (the seed's 4294967295, not
    4.29497e+09), others in the shortest form."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


AT_LEAST_0 = Range(0)
AT_LEAST_1 = Range(1)
POSITIVE = Range(0, lo_open=True)
FRACTION = Range(0, 1)
ANY = Range()

Rule = Range | Choices
"""What one option accepts."""

RANGES: dict[str, dict[str, Rule]] = {}
"""command name -> parameter name -> the range or choices its field declares; filled by
:func:`cli_options.command`."""


def range_for(command: str, name: str) -> Rule | None:
    """The range or choices parameter ``name`` of ``command`` accepts (None: any value)."""
    return RANGES.get(command, {}).get(name)
