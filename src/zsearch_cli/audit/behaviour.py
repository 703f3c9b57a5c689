"""Search behaviour read off a trajectory's turn log: what training logs as ``rollout/…``
and what ``zsearch eval --probe`` derives its measures from. Pure functions of the engine's
record (``Trajectory.turns``, or an eval example's ``turn_log`` JSON): no model, no index.

Definitions (docs/commands/audit.md):

- a *search* is a turn whose queries ran (it has ``docs``), as ``num_searches`` counts;
- the answer *appeared* once a retrieved passage (title or text) held a gold answer,
  FlashRAG-normalised, as a token sequence (:mod:`.answers`);
- an *over-search* is a search run after the answer had appeared;
- an *under-search* is a wrong answer (EM 0) given without any search;
- a *repeated query* is a query equal (case and spacing aside) to an earlier one of the same sample;
- an answer is *attributed* when the prediction's own string appeared in retrieved text;
- a *candidate list* hedges between answers: split at " or ", "/", ";", "|" or a newline into
  two or more parts (or at commas into three or more), one part a gold, the whole not one.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from zsearch_cli.audit.answers import AnswerSet
from zsearch_cli.rewards import em as exact_match
from zsearch_cli.rewards import normalize_answer

LIST_WARN_SHARE = 0.01
"""Warn about candidate lists when at least this share of the answers are lists: one planted
list in a 72-question set warns, a stray one in thousands does not."""
_HEDGE = re.compile(r"\s*(?:\bor\b|/|;|\||\n)\s*", re.IGNORECASE)
_COMMA = re.compile(r"\s*,\s*")


@dataclass
class Behaviour:
    """One sample's search behaviour."""

    searches: int
    queries: int
    repeated_queries: int
    answer_seen: bool
    """A gold answer appeared in retrieved text."""
    searches_after_answer: int
    prediction_seen: bool
    """The prediction's string appeared in retrieved text (False without a prediction)."""


def _turns(turns: str | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return json.loads(turns) if isinstance(turns, str) else list(turns)


def _docs_text(turn: dict[str, Any]) -> list[str]:
    return [str(d.get(k) or "") for per_query in turn.get("docs") or [] for d in per_query for k in ("title", "text")]


def behaviour(turns: str | Sequence[dict[str, Any]], golden_answers: Sequence[str], prediction: str | None) -> Behaviour:
    """The behaviour of one sample from its turn log (see the module docstring)."""
    golds = AnswerSet(golden_answers)
    said = AnswerSet([prediction]) if prediction is not None else None
    searches = after = queries = repeated = 0
    seen_answer = seen_prediction = False
    asked: set[str] = set()
    for turn in _turns(turns):
        if turn.get("action") == "search":
            for q in turn.get("queries") or []:
                key = " ".join(str(q).lower().split())
                queries += 1
                repeated += key in asked
                asked.add(key)
        if "docs" not in turn:
            continue
        searches += 1
        after += seen_answer
        texts = _docs_text(turn)
        seen_answer = seen_answer or bool(golds and golds.found_in(texts))
        seen_prediction = seen_prediction or bool(said and said.found_in(texts))
    return Behaviour(searches, queries, repeated, seen_answer, after, seen_prediction)


def answer_words(prediction: str | None) -> int | None:
    """The answer's length in F1's tokens (words of the normalised answer); None without one."""
    return None if prediction is None else len(normalize_answer(prediction).split())


def is_candidate_list(prediction: str | None, golden_answers: Sequence[str]) -> bool:
    """Whether the answer hedges between candidates, one of them a gold (module docstring)."""
    if prediction is None or exact_match(prediction, golden_answers):
        return False
    parts = [p for p in _HEDGE.split(prediction) if normalize_answer(p)]
    if len(parts) < 2:
        parts = [p for p in _COMMA.split(prediction) if normalize_answer(p)]
        if len(parts) < 3:
            return False
    return any(exact_match(p, golden_answers) for p in parts)


def _mean(values: Sequence[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def rollout_behaviour(trajectories: Iterable[Any]) -> dict[str, float | None]:
    """The step's behaviour metrics (METRICS columns) over its trajectories; searches per
    sample is ``rollout/searches``, already logged."""
    trajs = list(trajectories)
    done = [behaviour(t.turns, t.golden_answers, t.prediction) for t in trajs]
    queries = sum(b.queries for b in done)
    words = [w for w in (answer_words(t.prediction) for t in trajs) if w is not None]
    return {
        "rollout/no_search_rate": _mean([float(t.prediction is not None and b.searches == 0)
                                         for t, b in zip(trajs, done)]),
        "rollout/answer_in_context": _mean([float(b.answer_seen) for b in done]),
        "rollout/repeated_query_rate": sum(b.repeated_queries for b in done) / queries if queries else None,
        "rollout/answer_tokens": _mean([float(w) for w in words]),
    }


def example_measures(examples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The behaviour measures of one probe over its EVAL_EXAMPLE rows: answer attribution
    (correct answers whose string appeared in retrieved text, of the correct ones),
    over-search (searches after the answer appeared, of all searches), under-search (wrong
    answers with no search, of all questions), answer in context, the subEM − EM gap and the
    share of candidate-list answers. None where the denominator is 0."""
    done = [behaviour(r["turn_log"], r["golden_answers"], r["prediction"]) for r in examples]
    correct = [b for r, b in zip(examples, done) if r["em"] >= 1.0]
    searches = sum(b.searches for b in done)
    n = len(examples)
    lists = sum(is_candidate_list(r["prediction"], r["golden_answers"]) for r in examples)
    return {
        "answer_attribution": _mean([float(b.prediction_seen) for b in correct]),
        "over_search": sum(b.searches_after_answer for b in done) / searches if searches else None,
        "under_search": _mean([float(r["em"] < 1.0 and b.searches == 0) for r, b in zip(examples, done)]),
        "answer_in_context": _mean([float(b.answer_seen) for b in done]),
        "subem_em_gap": (sum(r["subem"] for r in examples) - sum(r["em"] for r in examples)) / n if n else None,
        "candidate_lists": lists / n if n else None,
    }


def list_warning(dataset: str, label: str, measures: dict[str, Any]) -> str | None:
    """A line when the subEM − EM gap comes with candidate-list answers (a lenient reward's hack)."""
    share, gap = measures.get("candidate_lists"), measures.get("subem_em_gap")
    if share is None or share < LIST_WARN_SHARE or not gap or gap <= 0:
        return None
    return (f"warning: {dataset} {label}: {share:.1%} of the answers are lists of candidates (e.g. 'A or B'); "
            f"subEM exceeds EM by {gap:.3f}, so subEM rewards hedging here: read EM")
