"""``zsearch show FILE``: what the agent did, turn by turn, in the terminal.

Reads any Parquet that holds trajectories: a TRAJECTORY file (``warmup-data``, ``collect``),
a ROLLOUT file (``train --save-rollouts``) or an EVAL_EXAMPLE file (``eval``). For each
trajectory it prints the question, the gold answers, the prediction and its score (and the
training reward, where there is one), then every turn: the model's reasoning, the action,
the queries and the titles of what came back. The engine's per-turn log is the source, so
nothing is re-parsed from the decoded response.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from zsearch_cli.config.commands import ShowOptions
from zsearch_cli.config.fields import choices_of
from zsearch_cli.errors import ZsearchError

WHERE = choices_of(ShowOptions, "where")
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)
_REASONING_CHARS = 600
"""Longer reasoning is cut (with a note): a terminal is for reading, the Parquet keeps it all."""


@dataclass(frozen=True)
class ShownTrajectory:
    """One trajectory as ``show`` renders it, whatever file it came from."""

    id: str
    question: str
    golden_answers: list[str]
    prediction: str | None
    em: float
    f1: float | None
    reward: float | None
    finish_reason: str | None
    turns: list[dict[str, Any]]


def _turn_log(row: dict[str, Any], path: Path, index: int) -> list[dict[str, Any]]:
    raw = row.get("turns") if isinstance(row.get("turns"), str) else row.get("turn_log")
    if raw is None:
        return []
    try:
        turns = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ZsearchError(f"{path}: row {index}: column 'turns' is not JSON ({err.msg})") from None
    if not isinstance(turns, list):
        raise ZsearchError(f"{path}: row {index}: column 'turns' must be a JSON list")
    return turns


def read_trajectories(path: Path) -> list[ShownTrajectory]:
    """Every trajectory in ``path`` (TRAJECTORY, ROLLOUT or EVAL_EXAMPLE Parquet)."""
    import pyarrow.parquet as pq

    from zsearch_cli.rewards import score_answer

    if not path.is_file():
        raise ZsearchError(f"{path}: no such file")
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a file that is not Parquet
        raise ZsearchError(f"{path}: not a readable Parquet file ({type(err).__name__})") from None
    names = set(table.column_names)
    needed = {"id", "question", "golden_answers", "prediction"}
    missing = sorted(needed - names)
    if missing or not names & {"turns", "turn_log"}:
        what = ", ".join(repr(m) for m in missing) or "'turns' (or 'turn_log')"
        raise ZsearchError(f"{path}: missing column {what}: `zsearch show` reads trajectory, rollout or "
                           "eval example files")
    out = []
    for i, row in enumerate(table.to_pylist()):
        golds = list(row["golden_answers"] or [])
        scores = score_answer(row["prediction"], golds) if row.get("em") is None else None
        out.append(ShownTrajectory(
            id=str(row["id"]), question=str(row["question"]), golden_answers=[str(g) for g in golds],
            prediction=row["prediction"], em=float(row["em"] if scores is None else scores["em"]),
            f1=float(row["f1"]) if row.get("f1") is not None else (scores or {}).get("f1"),
            reward=float(row["reward"]) if row.get("reward") is not None else None,
            finish_reason=row.get("finish_reason"), turns=_turn_log(row, path, i)))
    return out


def select(trajs: Sequence[ShownTrajectory], ids: Sequence[str] = (), where: str | None = None,
           limit: int | None = None) -> list[ShownTrajectory]:
    """``--id`` (an id, or a question id matching all its samples ``ID#k``), ``--where``
    (correct: EM 1; wrong: EM 0), then the first ``--limit``."""
    if where is not None and where not in WHERE:
        raise ZsearchError(f"unknown --where {where!r}: use one of {', '.join(WHERE)}")
    chosen = [t for t in trajs if not ids or t.id in ids or t.id.split("#")[0] in ids]
    if ids and not chosen:
        raise ZsearchError(f"no trajectory with id {', '.join(ids)}")
    if where is not None:
        chosen = [t for t in chosen if (t.em >= 1.0) == (where == "correct")]
    return chosen[:limit] if limit is not None else chosen


def _reasoning(text: str) -> str:
    found = _THINK.findall(text)
    body = " ".join(" ".join(f.split()) for f in found) if found else " ".join(text.split())
    return body if len(body) <= _REASONING_CHARS else body[:_REASONING_CHARS] + f" … (+{len(body) - _REASONING_CHARS} chars)"


def _titles(turn: dict[str, Any]) -> list[str]:
    if turn.get("docs"):
        return [str(d.get("title") or d.get("id")) for docs in turn["docs"] for d in docs]
    return [str(d) for ids in turn.get("doc_ids") or [] for d in ids]


def render(traj: ShownTrajectory) -> Any:
    """A rich renderable for one trajectory."""
    from rich.markup import escape
    from rich.panel import Panel
    from rich.text import Text

    verdict = "[green]correct[/]" if traj.em >= 1.0 else "[red]wrong[/]"
    score = f"EM {traj.em:.0f}" + (f"  F1 {traj.f1:.2f}" if traj.f1 is not None else "")
    score += f"  reward {traj.reward:.3f}" if traj.reward is not None else ""
    lines = [f"[bold]Q:[/] {escape(traj.question)}",
             f"[bold]gold:[/] {escape(' | '.join(traj.golden_answers))}",
             f"[bold]answer:[/] {escape(traj.prediction) if traj.prediction is not None else '[dim](no <answer>)[/]'}"
             f"   {verdict}  {score}" + (f"  [dim]finish {escape(traj.finish_reason)}[/]" if traj.finish_reason else "")]
    for turn in traj.turns:
        lines.append(f"\n[bold cyan]turn {int(turn.get('turn', 0)) + 1}[/] [dim]({escape(str(turn.get('action')))})[/]")
        lines.append(f"  [dim]think:[/] {escape(_reasoning(str(turn.get('text', ''))))}")
        for q in turn.get("queries") or []:
            lines.append(f"  [yellow]search:[/] {escape(str(q))}")
        titles = _titles(turn)
        if titles:
            lines.append(f"  [magenta]retrieved:[/] {escape('; '.join(titles))}")
        if turn.get("error"):
            lines.append(f"  [red]invalid:[/] {escape(str(turn['error']))}")
    return Panel(Text.from_markup("\n".join(lines)), title=escape(traj.id), title_align="left")


def show(path: Path, ids: Sequence[str] = (), where: str | None = None, limit: int | None = 3,
         console: Any = None) -> int:
    """Print the selected trajectories of ``path``; returns how many were shown."""
    from rich.console import Console

    console = console or Console()
    trajs = read_trajectories(Path(path))
    chosen = select(trajs, ids, where, limit)
    for traj in chosen:
        console.print(render(traj))
    kept = sum(1 for t in trajs if t.em >= 1.0)
    console.print(f"[dim]{path}: {len(trajs)} trajectories, {kept} correct; showing {len(chosen)}[/]")
    return len(chosen)
