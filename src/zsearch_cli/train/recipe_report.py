"""What the miniature recipes' reports share (``train/overfit.py``, ``train/zerosearch_mini.py``,
``train/drzero_mini.py``): the time budget of the reference machine, atomic writes of the
report files, and the goal checklist the README shows."""

from __future__ import annotations

from pathlib import Path

# 60 minutes on the 2-core reference machine with nothing else running (issues 36, 38).
WALL_LIMIT_S = 3600.0


def write_text_atomic(path: Path, text: str) -> None:
    """``text`` to ``path`` through a sibling temporary file: a report killed mid-write leaves
    the previous file whole, never half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def goal_lines(goals: dict[str, bool]) -> list[str]:
    """The Markdown checklist of goals: ``- [x] goal`` when met, ``- [ ] goal`` when missed."""
    return [f"- [{'x' if met else ' '}] {goal}" for goal, met in goals.items()]


def wall_time_line(wall_s: float, within: bool) -> str:
    """The wall time against the reference machine's budget: reported, never a goal, since a
    slower machine is no failure of what the recipe learns (issue 36.11)."""
    return (f"- wall time {wall_s / 60:.1f} min, {'within' if within else 'over'} the {WALL_LIMIT_S / 60:.0f}-minute "
            "budget of the reference machine (reported, not a goal)")


def missed_goals(goals: dict[str, bool]) -> list[str]:
    return [goal for goal, met in goals.items() if not met]
