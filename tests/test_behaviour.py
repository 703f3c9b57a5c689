"""The search-behaviour metrics training logs (``rollout/…``), on hand-made trajectories whose
values are counted by hand, and ``zsearch plot`` drawing them."""

from __future__ import annotations

import json

import pytest

from helpers import make_trajectory
from zsearch_cli.audit.behaviour import behaviour, rollout_behaviour
from zsearch_cli.schemas import METRIC_COLUMNS

DOC_1599 = {"id": "a", "title": "Globe Theatre", "text": "Built in 1599 by the company."}
DOC_OTHER = {"id": "b", "title": "Southwark", "text": "A district of London."}


def _search(turn: int, queries: list[str], docs: list[list[dict]] | None) -> dict:
    t = {"turn": turn, "text": "", "action": "search", "queries": queries}
    if docs is not None:  # a search on the final turn never runs: no docs
        t["docs"] = docs
    return t


def _answer(turn: int) -> dict:
    return {"turn": turn, "text": "", "action": "answer", "queries": []}


TRAJS = [
    # s0: searches twice (the same query, spaced and cased differently), the answer appears in
    # the first search's passages; answers "1599" (1 word)
    make_trajectory("r#0", golden_answers=["1599"], prediction="1599", num_searches=2, turns=[
        _search(0, ["Globe built"], [[DOC_1599]]), _search(1, ["globe  BUILT"], [[DOC_OTHER]]), _answer(2)]),
    # s1: answers without searching, "the year 1600" (2 words after normalisation: year 1600)
    make_trajectory("r#1", golden_answers=["1599"], prediction="the year 1600", turns=[_answer(0)]),
    # s2: one search (2 queries in one turn, distinct), never sees the answer, no answer at all
    make_trajectory("r#2", golden_answers=["1599"], prediction=None, num_searches=1, turns=[
        _search(0, ["Southwark", "London theatre"], [[DOC_OTHER], [DOC_OTHER]]), _search(1, ["Southwark"], None)]),
]


def test_rollout_behaviour_by_hand():
    got = rollout_behaviour(TRAJS)
    # answered with no search: s1 only, of 3 samples
    assert got["rollout/no_search_rate"] == pytest.approx(1 / 3)
    # a gold in retrieved text: s0 only
    assert got["rollout/answer_in_context"] == pytest.approx(1 / 3)
    # queries: s0 2 (1 repeat), s2 3 (the final-turn "Southwark" repeats its first): 2 repeats of 5
    assert got["rollout/repeated_query_rate"] == pytest.approx(2 / 5)
    # answer words over the samples with an answer: (1 + 2) / 2
    assert got["rollout/answer_tokens"] == pytest.approx(1.5)


def test_behaviour_of_one_sample_from_an_eval_turn_log():
    b = behaviour(json.dumps(TRAJS[0].turns), ["1599"], "1599")
    # the second search ran after 1599 had appeared: one over-search; the answer was read
    assert (b.searches, b.searches_after_answer, b.answer_seen, b.prediction_seen) == (2, 1, True, True)
    assert behaviour(TRAJS[2].turns, ["1599"], None).searches == 1  # the unrun final-turn search is no search


def test_training_logs_and_plots_the_behaviour_metrics(tmp_path):
    from zsearch_cli.train.metrics import PLOTTED, plot_metrics, step_metrics
    from zsearch_cli.train.step_samples import Sample, StepSamples

    names = ("rollout/no_search_rate", "rollout/answer_in_context", "rollout/repeated_query_rate",
             "rollout/answer_tokens")
    assert set(names) <= set(METRIC_COLUMNS) and set(names) <= set(PLOTTED)
    samples = [Sample(trajectory=t, step=1, gen_batch=0, group_key="g") for t in TRAJS]
    row = step_metrics(1, StepSamples(samples), None, {})
    assert row["rollout/repeated_query_rate"] == pytest.approx(0.4) and row["rollout/searches"] == 1.0
    (tmp_path / "metrics.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "step": 2}) + "\n")
    assert plot_metrics(tmp_path).is_file()
