"""ZeroSearch in miniature (``stages/zerosearch-mini.sh``): the paper's central claim measured
with smollm2 on the bundled corpus, and this module's two non-``zsearch`` steps:

- ``python -m zsearch_cli.train.zerosearch_mini control --sim SPEC --eval DIR --topk K --out DIR``:
  the simulator's controllability (:mod:`zsearch_cli.audit.controllability`) on the held-out
  queries of the agent eval in DIR; writes ``OUT/control.parquet`` (SIM_CONTROL).
- ``python -m zsearch_cli.train.zerosearch_mini report OUT [--strict]``: the README's table
  (the judges compared, U and N before and after ``simsft``, held-out EM before and after RL
  on the simulator, the curriculum, the time of each stage), issue 38's goals checked
  (``--strict``: exit 1 naming a missed one), and ``OUT/summary.json``.

The goals (issue 38), all four pass/fail:

- the fine-tuned simulator's U − N is at least 0.30 on the held-out queries;
- and larger than the base model's U − N (the fine-tune, not the prompt alone, makes the switch);
- after RL on the simulator, held-out EM on real search falls by at most one question;
- the whole recipe takes at most 60 minutes. Issue 38 lists the time as a goal, so it is one
  here (the overfit check reports its time without failing on it: issue 36.11). The time is the
  sum of the stages' times, each stage's from its marker ``STAGE/.done`` (seconds, then the
  command), so a run stopped and resumed is timed by the parts that did the work, and a rerun
  that skips every stage is not mistaken for a fast one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from zsearch_cli.errors import ZsearchError
from zsearch_cli.train.recipe_report import WALL_LIMIT_S, goal_lines, missed_goals, write_text_atomic

GAP_MIN = 0.30
WINDOW = 5
"""Steps averaged at each end of the RL run (fewer when it is shorter than 2 x WINDOW)."""
STAGES = ("collect", "judge-rule", "judge-lm", "eval-heldout-before", "control-base", "simsft",
          "control-sim", "train", "eval-heldout-after")
"""The recipe's stage folders under OUT, in order; each holds its marker ``.done``."""
GOALS = {
    "gap": f"controllability: the fine-tuned simulator's U - N >= {GAP_MIN:.2f} on the held-out queries",
    "gap_vs_base": "controllability: the fine-tuned simulator's U - N is above the base model's",
    "em": "held-out EM on real search after RL falls by at most one question",
    "time": f"the whole recipe takes <= {WALL_LIMIT_S / 60:.0f} min",
}


def control(spec: str, eval_dir: Path, topk: int, out: Path, limit: int | None = None) -> dict[str, Any]:
    """Measure the simulator ``spec`` on the held-out queries of ``eval_dir``; write
    ``out/control.parquet``; returns :func:`~zsearch_cli.audit.controllability.shares`."""
    from zsearch_cli.artifacts import write_artifact
    from zsearch_cli.schemas import SIM_CONTROL
    from zsearch_cli.audit.controllability import heldout_requests, measure, shares
    from zsearch_cli.search.factory import is_simulated, make_search_backend

    if not is_simulated(spec):
        raise ZsearchError("--sim must be a simulator spec, sim:MODEL[?option=value&…]")
    requests = heldout_requests(eval_dir, limit)
    if not requests:
        raise ZsearchError(f"{eval_dir}: no held-out question with a gold answer")
    rows = measure(make_search_backend(spec), requests, topk)
    write_artifact(rows, out / "control.parquet", SIM_CONTROL,
                   {"sim": spec, "eval": str(eval_dir), "topk": topk, "limit": limit})
    return shares(rows)


# ----------------------------------------------------------------------------- the report


def _stage_seconds(out: Path) -> dict[str, float]:
    """Seconds of each finished stage, from its marker (the first line)."""
    seconds = {}
    for stage in STAGES:
        marker = out / stage / ".done"
        if marker.is_file():
            first = marker.read_text().split("\n", 1)[0].strip()
            seconds[stage] = float(first) if first.replace(".", "", 1).isdigit() else 0.0
    return seconds


def _labels(path: Path) -> tuple[dict[str, str | None], str | None]:
    """(row id -> label, the judge's name) of a judgments file."""
    from zsearch_cli.artifacts import read_artifact
    from zsearch_cli.schemas import JUDGMENT

    if not path.is_file():
        raise ZsearchError(f"{path}: no judgments (has the judge stage run?)")
    rows = read_artifact(path, JUDGMENT).select(["id", "label", "judge_model"]).to_pylist()
    return {r["id"]: r["label"] for r in rows}, (rows[0]["judge_model"] if rows else None)


def compare_judges(lm: dict[str, str | None], rule: dict[str, str | None]) -> dict[str, Any]:
    """The LM judge against the rule on the rows the LM judged: its parse rate, each one's
    share of "useful", and their agreement and Cohen's kappa where both gave a label (a judge
    that says "no" to everything agrees with the rule as often as the rule says no, and
    kappa 0 says that)."""
    both = [(lm[i], rule.get(i)) for i in lm if lm[i] is not None and rule.get(i) is not None]
    n = len(both)
    s: dict[str, Any] = {"rows": len(lm), "lm_parsed": sum(v is not None for v in lm.values()), "both": n}
    if not n:
        return {**s, "lm_useful": None, "rule_useful": None, "agreement": None, "kappa": None}
    a = sum(x == "useful" for x, _ in both) / n
    b = sum(y == "useful" for _, y in both) / n
    agree = sum(x == y for x, y in both) / n
    chance = a * b + (1 - a) * (1 - b)
    kappa = (agree - chance) / (1 - chance) if chance < 1 else None
    return {**s, "lm_useful": a, "rule_useful": b, "agreement": agree, "kappa": kappa}


def _control(out: Path, name: str) -> dict[str, Any]:
    from zsearch_cli.artifacts import read_artifact
    from zsearch_cli.schemas import SIM_CONTROL
    from zsearch_cli.audit.controllability import shares

    path = out / name / "control.parquet"
    if not path.is_file():
        raise ZsearchError(f"{path}: no controllability measure (has the {name} stage run?)")
    rows = read_artifact(path, SIM_CONTROL).to_pylist()
    return {**shares(rows), "simulator": rows[0]["simulator"] if rows else None}


def _rl(out: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from zsearch_cli.train.overfit import _mean

    metrics = out / "train" / "metrics.parquet"
    if not metrics.is_file():
        raise ZsearchError(f"{metrics}: no training metrics (has the RL stage run?)")
    rows = sorted(pq.read_table(metrics).to_pylist(), key=lambda r: r["step"])
    w = max(1, min(WINDOW, len(rows) // 2))
    return {"steps": len(rows), "window": w, "reward_first": _mean(rows[:w], "rollout/reward_mean"),
            "reward_last": _mean(rows[-w:], "rollout/reward_mean"),
            "noise_p_first": rows[0].get("search/noise_p") if rows else None,
            "noise_p_last": rows[-1].get("search/noise_p") if rows else None}


def _simsft(out: Path) -> dict[str, Any]:
    from zsearch_cli.artifacts import read_artifact, read_metadata
    from zsearch_cli.schemas import SFT_EXAMPLE

    path = out / "simsft" / "sim_sft.parquet"
    if not path.is_file():
        raise ZsearchError(f"{path}: no simulator training set (has the simsft stage run?)")
    labels = [json.loads(m)["label"] for m in read_artifact(path, SFT_EXAMPLE).column("metadata").to_pylist()]
    judgments = read_metadata(path).get("config", {}).get("judgments")
    return {"examples": len(labels), "useful": labels.count("useful"), "noisy": labels.count("noisy"),
            "judgments": judgments}


def _nan_to_none(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    return value


def report(out: Path) -> dict[str, Any]:
    """The measured numbers of a finished recipe run in OUT and issue 38's goals; writes
    OUT/summary.json atomically."""
    from zsearch_cli.train.overfit import _em

    rule, _ = _labels(out / "judge-rule" / "judgments.parquet")
    lm, lm_model = _labels(out / "judge-lm" / "judgments.parquet")
    base, sim = _control(out, "control-base"), _control(out, "control-sim")
    (em_before, n), (em_after, _) = _em(out, "heldout-before"), _em(out, "heldout-after")
    seconds = _stage_seconds(out)
    s: dict[str, Any] = {
        "judges": {"rule_rows": len(rule), "rule_useful_rows": sum(v == "useful" for v in rule.values()),
                   "lm_model": lm_model, **compare_judges(lm, rule)},
        "simsft": _simsft(out), "control_base": base, "control_sim": sim, "rl": _rl(out),
        "em_heldout_before": em_before, "em_heldout_after": em_after, "heldout_n": n,
        "stage_s": seconds, "wall_s": sum(seconds.values()),
    }
    ok = {
        "gap": sim["gap"] >= GAP_MIN - 1e-9,
        "gap_vs_base": sim["gap"] > base["gap"],
        "em": em_after >= em_before - 1 / n - 1e-9,
        "time": s["wall_s"] <= WALL_LIMIT_S,
    }
    s["goals"] = {GOALS[k]: bool(v) for k, v in ok.items()}  # NaN compares False: a missed goal
    s = _nan_to_none(s)
    write_text_atomic(out / "summary.json", json.dumps(s, indent=2) + "\n")
    return s


def _f(value: Any, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def table(s: dict[str, Any]) -> str:
    """The README's table of a :func:`report`."""
    b, f, rl, j, sft = s["control_base"], s["control_sim"], s["rl"], s["judges"], s["simsft"]
    q = f["queries"]
    lines = [
        "| measure | before | after |", "|---|---|---|",
        f"| U: simulated documents holding a gold answer, useful prompt ({q} held-out queries); the base model vs "
        f"after simsft | {_f(b['u'])} | {_f(f['u'])} |",
        f"| N: the same, noisy prompt | {_f(b['n'])} | {_f(f['n'])} |",
        f"| U - N | {_f(b['gap'])} | {_f(f['gap'])} |",
        f"| queries with a gold answer in any document, useful / noisy prompt | {_f(b['u_any'], '.2f')} / "
        f"{_f(b['n_any'], '.2f')} | {_f(f['u_any'], '.2f')} / {_f(f['n_any'], '.2f')} |",
        f"| greedy EM, the {s['heldout_n']} held-out questions, real BM25; before vs after RL on the simulator "
        f"| {_f(s['em_heldout_before'])} | {_f(s['em_heldout_after'])} |",
        f"| RL reward on the simulator, mean of the first vs the last {rl['window']} steps | {_f(rl['reward_first'])} "
        f"| {_f(rl['reward_last'])} |",
        f"| noise probability p(t), the first vs the last step | {_f(rl['noise_p_first'])} | {_f(rl['noise_p_last'])} |",
        "",
        f"Judges, on the first {j['rows']} collected queries: {j['lm_model']} gave a verdict on {j['lm_parsed']}, "
        f"\"useful\" on {_f(j['lm_useful'], '.2f')} of the {j['both']} both labelled, rule:answer on "
        f"{_f(j['rule_useful'], '.2f')}; agreement {_f(j['agreement'], '.2f')}, Cohen's kappa {_f(j['kappa'], '.2f')}. "
        f"rule:answer over all {j['rule_rows']} queries: {j['rule_useful_rows']} useful. "
        f"simsft trained on {sft['examples']} examples ({sft['useful']} useful, {sft['noisy']} noisy). "
        f"Simulators: {b['simulator']} (base), {f['simulator']} (fine-tuned).",
        "",
        "Minutes per stage: " + ", ".join(f"{k} {v / 60:.1f}" for k, v in s["stage_s"].items())
        + f"; the whole recipe {s['wall_s'] / 60:.1f} min.", "",
    ]
    lines += goal_lines(s["goals"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zsearch_cli.train.zerosearch_mini",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("control", help="the simulator's U and N on held-out queries")
    c.add_argument("--sim", required=True, help="the simulator spec, sim:MODEL?option=value&…")
    c.add_argument("--eval", type=Path, required=True, help="an agent eval of the held-out questions (its queries)")
    c.add_argument("--topk", type=int, required=True, help="documents per query, as in training")
    c.add_argument("--limit", type=int, default=None, help="only the first N held-out questions")
    c.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("report", help="the measured table and the goals; writes OUT/summary.json")
    r.add_argument("out", type=Path)
    r.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "control":
            s = control(args.sim, args.eval, args.topk, args.out, args.limit)
            print(f"control: U {s['u']:.3f}, N {s['n']:.3f}, U - N {s['gap']:.3f} on {s['queries']} held-out queries "
                  f"-> {args.out / 'control.parquet'}")
            return 0
        summary = report(args.out)
        print(table(summary))
        missed = missed_goals(summary["goals"])
        print(f"zerosearch-mini check: {'MISSED: ' + '; '.join(missed) if missed else 'every goal met'}")
        return 1 if missed and args.strict else 0
    except ZsearchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
