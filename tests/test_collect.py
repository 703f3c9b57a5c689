"""`zsearch collect`: query rows from trajectories (pure), the engine's recorded documents,
and the CLI end to end on the tiny model over a real BM25 index, with resuming."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import QARow, RolloutEngine
from zsearch_cli.rollout.trajectory import Trajectory
from zsearch_cli.rollout.protocols import TagsProtocol
from zsearch_cli.artifacts import read_artifact, read_metadata
from zsearch_cli.schemas import COLLECTED_QUERY, TRAJECTORY
from zsearch_cli.commands.collect import query_rows

from helpers import RecordingSearch, ScriptedBackend, make_trajectory

runner = CliRunner()


def _doc(i: str, title: str, text: str) -> dict:
    return {"id": i, "title": title, "text": text}


def _traj(tid: str, prediction: str | None, golds: list[str], turns: list[dict]):
    return make_trajectory(tid, golden_answers=golds, prediction=prediction, turns=turns)


def test_query_rows_from_hand_made_trajectories():
    danube = [_doc("g1", "Danube", "The Danube flows through Vienna."), _doc("g2", "Vienna", "Capital of Austria.")]
    trajs = [
        _traj("r1#0", "the Danube.", ["Danube"], [  # EM after normalization: correct
            {"turn": 0, "action": "search", "queries": ["river vienna"], "doc_ids": [["g1", "g2"]], "docs": [danube]},
            {"turn": 1, "action": "invalid", "queries": []},  # no search ran: no row
            {"turn": 2, "action": "search", "queries": ["danube"], "doc_ids": [["g1"]], "docs": [danube[:1]]},
            {"turn": 3, "action": "answer", "queries": []},
        ]),
        _traj("r1#1", "Rhine", ["Danube"], [  # wrong answer; the final turn's search never ran
            {"turn": 0, "action": "search", "queries": ["rivers"], "doc_ids": [[]], "docs": [[]]},
            {"turn": 1, "action": "search", "queries": ["unanswered"]},
        ]),
        _traj("r2#0", None, ["x"], [  # no answer at all; a tool call with two queries
            {"turn": 0, "action": "search", "queries": ["a", "b"], "doc_ids": [["d1"], ["d2"]],
             "docs": [[_doc("d1", "", "untitled text")], [_doc("d2", "T2", "two")]]},
        ]),
    ]
    rows = query_rows(trajs)
    assert [r["id"] for r in rows] == ["r1#0/t0/q0", "r1#0/t2/q0", "r1#1/t0/q0", "r2#0/t0/q0", "r2#0/t0/q1"]
    assert [r["correct"] for r in rows] == [True, True, False, False, False]
    assert [(r["turn"], r["query_index"], r["query"]) for r in rows] == [
        (0, 0, "river vienna"), (2, 0, "danube"), (0, 0, "rivers"), (0, 0, "a"), (0, 1, "b")]
    first = rows[0]
    assert first["documents"] == ["Danube\nThe Danube flows through Vienna.", "Vienna\nCapital of Austria."]
    assert first["doc_ids"] == ["g1", "g2"]
    assert (first["row_id"], first["trajectory_id"], first["sample_index"]) == ("r1", "r1#0", 0)
    assert (first["question"], first["golden_answers"], first["prediction"]) == ("Question r1?", ["Danube"], "the Danube.")
    assert rows[2]["documents"] == [] and rows[3]["documents"] == ["\nuntitled text"]
    assert rows[4]["prediction"] is None
    # a log written before the engine recorded documents cannot be turned into rows
    old = _traj("r3#0", "x", ["x"], [{"turn": 0, "queries": ["q"], "doc_ids": [["d"]]}])
    with pytest.raises(ZsearchError, match="'r3#0': turn 0 logged doc_ids but no docs"):
        query_rows([old])


def test_engine_records_returned_documents_in_turn_log(tiny_backend):
    # a scripted policy that searches twice, then answers; the documents in the rows must be
    # exactly what the search backend returned (before any observation budget)
    tok = tiny_backend.tokenizer
    q = "Which river flows through Vienna?"
    docs = [Passage("geo-1", "Danube", "The Danube flows through Vienna."), Passage("geo-2", "Vienna", "Austria.")]
    search = RecordingSearch({"river Vienna": docs})
    backend = ScriptedBackend(tok, {q: ["<search> river Vienna </search>", "<search> nothing </search>",
                                        "<answer> Danube </answer>"]})
    engine = RolloutEngine(backend, TagsProtocol(), search, RolloutOptions(topk=2, max_turns=3))
    (traj,) = engine.rollout([QARow("r", q, ["Danube"])])
    log = traj.turns
    assert log[0]["docs"] == [[{"id": "geo-1", "title": "Danube", "text": "The Danube flows through Vienna."},
                               {"id": "geo-2", "title": "Vienna", "text": "Austria."}]]
    rows = query_rows([traj])
    assert [(r["query"], r["doc_ids"], r["correct"]) for r in rows] == [
        ("river Vienna", ["geo-1", "geo-2"], True), ("nothing", ["d0"], True)]
    assert rows[1]["documents"] == ["Nothing\nno result"]


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("collect") / "index"
    result = runner.invoke(app, ["index", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _collect(out: Path, index: Path, model: Path, *extra: str):
    args = ["collect", "--model", str(model), "--index", str(index), "--out", str(out), "--device", "cpu",
            "--samples-per-question", "2", "--max-turn-tokens", "8", "--max-turns", "2", "--batch-size", "2",
            "--seed", "7", *extra]
    return runner.invoke(app, args)


def test_collect_cli_end_to_end_resume_matches_a_fresh_run(tmp_path, demo_index, tiny_model_dir):
    out = tmp_path / "resumed"
    result = _collect(out, demo_index, tiny_model_dir, "--limit", "2")
    assert result.exit_code == 0, result.output
    trajs = read_artifact(out / "trajectories.parquet", TRAJECTORY)
    assert trajs.num_rows == 4 and sorted(trajs.column("id").to_pylist()) == ["art-q003#0", "art-q003#1",
                                                                               "art-q008#0", "art-q008#1"]
    assert read_metadata(out / "trajectories.parquet")["config"]["samples_per_question"] == 2
    queries = pq.read_table(out / "queries.parquet")  # may have no rows: the random model rarely searches
    assert queries.schema.remove_metadata() == COLLECTED_QUERY.schema
    assert queries.to_pylist() == query_rows([Trajectory.from_row(r) for r in trajs.to_pylist()])
    assert read_metadata(out / "queries.parquet")["artifact"] == "collected_query"

    result = _collect(out, demo_index, tiny_model_dir, "--limit", "3")
    assert result.exit_code == 0, result.output
    assert "2 questions already collected, 1 to go" in result.output
    resumed = read_artifact(out / "trajectories.parquet", TRAJECTORY)
    assert resumed.num_rows == 6

    fresh_out = tmp_path / "fresh"
    assert _collect(fresh_out, demo_index, tiny_model_dir, "--limit", "3").exit_code == 0
    fresh = read_artifact(fresh_out / "trajectories.parquet", TRAJECTORY)
    key = lambda t: t["id"]  # noqa: E731
    for a, b in zip(sorted(resumed.to_pylist(), key=key), sorted(fresh.to_pylist(), key=key), strict=True):
        assert (a["id"], a["group_id"], a["response_ids"], a["turns"]) == (b["id"], b["group_id"], b["response_ids"],
                                                                          b["turns"])

    # resuming with different sampling options would mix two collections in one file
    result = _collect(out, demo_index, tiny_model_dir, "--limit", "3", "--temperature", "0.5")
    assert result.exit_code == 2
    assert "was collected with --temperature 1.0, this run has 0.5" in result.output


def test_collect_bad_options_and_missing_index(tmp_path, tiny_model_dir):
    result = _collect(tmp_path / "o", tmp_path / "no-index", tiny_model_dir, "--limit", "1")
    assert result.exit_code == 2 and "no-index" in result.output
    result = runner.invoke(app, ["collect", "--samples-per-question", "0", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--samples-per-question must be >= 1" in result.output
