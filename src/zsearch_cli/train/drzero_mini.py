"""The Dr. Zero loop in miniature, ``stages/drzero-mini.sh``: its measurements and its goals.

Dr. Zero's claim (issue 38): the difficulty reward moves the proposer towards questions the
solver answers only *sometimes*, and a solver trained on those questions, with no human
data, does not get worse on human-written questions. The recipe runs ``zsearch drzero`` one
iteration at a time (its ``OUT/lineage.json`` is the resume point) and this module reads
what each iteration left:

- ``python -m zsearch_cli.train.drzero_mini progress OUT``: the per-iteration table so far,
  written to ``OUT/iterations.md`` and ``OUT/iterations.json`` after every iteration.
- ``python -m zsearch_cli.train.drzero_mini report OUT --wall-s S [--strict]``: the
  before/after table, the goals checked (``--strict``: exit 1 naming each goal missed), and
  ``OUT/summary.json``.

Per iteration i (the generate step's questions were written by iteration i's proposer,
after its HRPO steps, and scored by the solver it trained against, iteration i-1's):

- parse: generated questions / proposer prompts, a question counting when it passed the
  format gate (a ``<question>``, an ``<answer>``, the answer not inside the question), best
  of ``--samples`` per prompt as Dr. Zero generates; and the per-sample share during HRPO;
- the solver's pass rate k/n on them, as a histogram of k, and the share in the difficulty
  reward's band 0 < k < n (where the reward is non-zero);
- the proposer's mean difficulty reward, on the generated set and over its HRPO steps;
- the iteration's solver's greedy EM on the held-out human questions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from zsearch_cli.errors import ZsearchError
from zsearch_cli.train.recipe_report import WALL_LIMIT_S, goal_lines, missed_goals, wall_time_line, write_text_atomic

PARSE_MIN = 0.8
BEFORE = "eval-heldout-before"
"""OUT/BEFORE: the greedy eval of the base model on the held-out questions, with the settings
of the loop's own eval step (checked: :data:`SAME_SETTINGS`)."""
SAME_SETTINGS = ("corpus_fingerprint", "retriever", "topk", "max_turns", "max_turn_tokens", "max_obs_tokens",
                 "prompt", "decoding", "dataset_fingerprint", "limit")
"""Eval summary columns the before and after evals must share, else the change in EM would
not be the solver's alone (a different prompt or token budget moves EM by itself)."""


def _lineage(out: Path) -> dict[str, Any]:
    path = out / "lineage.json"
    if not path.is_file():
        raise ZsearchError(f"{path}: no lineage (has `zsearch drzero` run in {out}?)")
    return json.loads(path.read_text())


def _eval_summary(folder: Path) -> dict[str, Any]:
    """The one agent eval summary row under ``folder`` (one dataset per eval)."""
    import pyarrow.parquet as pq

    found = sorted(folder.rglob("agent.summary.parquet"))
    if len(found) != 1:
        raise ZsearchError(f"{folder}: expected one agent.summary.parquet, found {len(found)}")
    return pq.read_table(found[0]).to_pylist()[0]


def _training(run_dir: Path, batch_size: int) -> dict[str, float | None]:
    """The proposer's HRPO steps: mean difficulty reward and the per-sample gate pass rate."""
    from zsearch_cli.artifacts import read_artifact
    from zsearch_cli.schemas import METRICS

    path = run_dir / "metrics.parquet"
    if not path.is_file():
        return {"train_difficulty": None, "train_parse": None, "proposer_steps": 0}
    rows = read_artifact(path, METRICS).to_pylist()
    diff = [r["proposer/difficulty"] for r in rows if r.get("proposer/difficulty") is not None]
    passed = [r["proposer/gate_pass"] for r in rows if r.get("proposer/gate_pass") is not None]
    return {"train_difficulty": sum(diff) / len(diff) if diff else None,
            "train_parse": sum(passed) / (len(passed) * batch_size) if passed else None,
            "proposer_steps": len(rows)}


def iteration(out: Path, rec: dict[str, Any], options: dict[str, Any]) -> dict[str, Any] | None:
    """One finished iteration's measures (None while its generate step is not done)."""
    from zsearch_cli.artifacts import read_artifact
    from zsearch_cli.schemas import PROPOSED_QA

    gen = rec.get("generate") or {}
    if gen.get("status") != "done":
        return None
    qa = read_artifact(gen["data"], PROPOSED_QA).to_pylist()
    n = qa[0]["n"] if qa else int(options.get("solver_samples", 5))
    hist = [sum(r["k"] == k for r in qa) for k in range(n + 1)]
    row: dict[str, Any] = {
        "iteration": rec["iteration"], "prompts": gen["prompts"], "questions": len(qa),
        "parse": len(qa) / gen["prompts"], "n": n, "k_hist": hist,
        "band": sum(0 < r["k"] < n for r in qa) / len(qa) if qa else 0.0,
        "pass_rate": sum(r["k"] / n for r in qa) / len(qa) if qa else None,
        "difficulty": sum(r["difficulty"] for r in qa) / len(qa) if qa else None,
        **_training(Path(rec["propose"]["run_dir"]), int(options.get("batch_size", 1))),
        "heldout_em": None, "heldout_n": None,
    }
    ev = rec.get("eval") or {}
    if ev.get("status") == "done" and ev.get("results"):
        row["heldout_em"], row["heldout_n"] = float(ev["results"][0]["em"]), int(ev["results"][0]["n"])
        row["eval_dir"] = ev["out"]
    return row


def iterations(out: Path) -> list[dict[str, Any]]:
    """Every iteration whose questions are generated, in order."""
    lineage = _lineage(out)
    rows = [iteration(out, rec, lineage.get("options", {})) for rec in lineage["iterations"]]
    return [r for r in rows if r is not None]


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def _em(em: float | None, n: int | None) -> str:
    return "–" if em is None else f"{em:.3f} ({round(em * n)}/{n})"


def iteration_table(rows: list[dict[str, Any]], before: tuple[float, int] | None = None) -> str:
    """The per-iteration table: one column per iteration, ``before`` the base model's EM."""
    head = ["measure", "before", *[f"iteration {r['iteration']}" for r in rows]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def line(label: str, values: list[str], first: str = "–") -> None:
        lines.append("| " + " | ".join([label, first, *values]) + " |")

    line("questions that parse / proposer prompts", [f"{r['questions']}/{r['prompts']} = {r['parse']:.2f}" for r in rows])
    line("proposals that parse during HRPO (per sample)", [_fmt(r["train_parse"], ".2f") for r in rows])
    line("solver k of n on them: 0, 1, …, n", [" ".join(map(str, r["k_hist"])) for r in rows])
    line("share in the reward's band 0 < k < n", [f"{r['band']:.3f}" for r in rows])
    line("solver pass rate k/n, mean", [_fmt(r["pass_rate"]) for r in rows])
    line("difficulty reward, mean over the generated set", [_fmt(r["difficulty"]) for r in rows])
    line("difficulty reward, mean over the HRPO steps", [_fmt(r["train_difficulty"]) for r in rows])
    line("greedy EM, held-out human questions", [_em(r["heldout_em"], r["heldout_n"]) for r in rows],
         first=_em(*before) if before else "–")
    return "\n".join(lines)


def _before(out: Path) -> tuple[float, int] | None:
    return None if not (out / BEFORE).is_dir() else _em_n(_eval_summary(out / BEFORE))


def _em_n(summary: dict[str, Any]) -> tuple[float, int]:
    return float(summary["em"]), int(summary["n"])


def progress(out: Path) -> list[dict[str, Any]]:
    """Write the table so far (OUT/iterations.md, OUT/iterations.json); returns its rows."""
    rows = iterations(out)
    before = _before(out)
    write_text_atomic(out / "iterations.md", iteration_table(rows, before) + "\n")
    write_text_atomic(out / "iterations.json", json.dumps({"before_em": before, "iterations": rows}, indent=2) + "\n")
    return rows


def _check_same_settings(before: dict[str, Any], after: dict[str, Any], where: Path) -> None:
    differ = [f"{k} {before.get(k)!r} vs {after.get(k)!r}" for k in SAME_SETTINGS if before.get(k) != after.get(k)]
    if differ:
        raise ZsearchError(f"{where}: the held-out evals before and after differ in {', '.join(differ)}; "
                           "the change in EM would not be the solver's alone")


def report(out: Path, wall_s: float, iterations_expected: int = 2) -> dict[str, Any]:
    """The measured numbers of a finished recipe run in OUT, and the issue's goals."""
    rows = progress(out)
    done = [r for r in rows if r["heldout_em"] is not None]
    if len(done) < max(iterations_expected, 2):
        raise ZsearchError(f"{out}: {len(done)} of {iterations_expected} iterations finished with their eval; "
                           "rerun the recipe to resume")
    base = _eval_summary(out / BEFORE)
    for r in done:
        _check_same_settings(base, _eval_summary(Path(r["eval_dir"])), Path(r["eval_dir"]))
    first, last = done[0], done[-1]
    em_before, n = _em_n(base)
    s: dict[str, Any] = {
        "iterations": rows, "em_before": em_before, "em_after": last["heldout_em"], "heldout_n": n,
        "em_change_questions": round(last["heldout_em"] * n) - round(em_before * n),
        "band_first": first["band"], "band_last": last["band"], "wall_s": wall_s,
    }
    s["goals"] = {
        f"the share of proposed questions in the reward's band rises from iteration {first['iteration']} to "
        f"{last['iteration']}": last["band"] > first["band"],
        f"the parse rate is >= {PARSE_MIN} from iteration 1": all(r["parse"] >= PARSE_MIN for r in done),
        "held-out human EM is not lower than before": s["em_change_questions"] >= 0,
    }
    # Reported, never a goal: a recipe passes or fails on what it learns (issue 36.11).
    s["within_time_budget"] = wall_s <= WALL_LIMIT_S
    write_text_atomic(out / "summary.json", json.dumps(s, indent=2) + "\n")
    return s


def table(s: dict[str, Any]) -> str:
    """The README's table of a :func:`report`, then the goals."""
    lines = [iteration_table(s["iterations"], (s["em_before"], s["heldout_n"])), "",
             f"held-out EM {s['em_before']:.3f} -> {s['em_after']:.3f} ({s['em_change_questions']:+d} of "
             f"{s['heldout_n']} questions); the whole recipe {s['wall_s'] / 60:.1f} min.", ""]
    lines += goal_lines(s["goals"])
    lines.append(wall_time_line(s["wall_s"], s["within_time_budget"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zsearch_cli.train.drzero_mini", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("progress", help="the per-iteration table so far: OUT/iterations.md and .json")
    p.add_argument("out", type=Path)
    r = sub.add_parser("report", help="the measured table and the goals; writes OUT/summary.json")
    r.add_argument("out", type=Path)
    r.add_argument("--wall-s", type=float, required=True, help="the whole recipe's wall time")
    r.add_argument("--iterations", type=int, default=2, help="iterations the recipe ran")
    r.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "progress":
            rows = progress(args.out)
            print((args.out / "iterations.md").read_text(), end="")
            print(f"{len(rows)} iteration(s) -> {args.out / 'iterations.md'}")
            return 0
        summary = report(args.out, args.wall_s, args.iterations)
    except ZsearchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(summary))
    missed = missed_goals(summary["goals"])
    print(f"drzero-mini check: {'MISSED: ' + '; '.join(missed) if missed else 'every goal met'}")
    return 1 if missed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
