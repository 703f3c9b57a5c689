"""The rollout engine: token-in/token-out masks, observation limits, the final turn, the
row context reaching the search backend, and failures of a real HTTP backend."""

from __future__ import annotations

import json
from typing import Any

import pytest

from zsearch_cli.prompts import INVALID_ACTION_OBSERVATION
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import QARow, RolloutEngine
from zsearch_cli.rollout.protocols import TagsProtocol, ToolCallProtocol
from zsearch_cli.search.base import SearchBackendError

from helpers import RecordingSearch, ScriptedBackend


class RecordingBackend:
    """Wraps a real backend and records every call's inputs and outputs."""

    def __init__(self, inner: Any):
        self.inner, self.tokenizer, self.calls = inner, inner.tokenizer, []

    def generate(self, prompts, params, stop=()):
        outs = self.inner.generate(prompts, params, stop)
        self.calls.append(([list(p) for p in prompts], outs))
        return outs


VIENNA = [Passage("geo-1", "Danube", "The Danube flows through Vienna and Budapest."),
          Passage("geo-2", "Vienna", "Vienna is the capital of Austria.")]


def _policy_segments(traj: dict[str, Any]) -> list[list[int]]:
    """Maximal runs of mask-1 ids in the response."""
    runs, cur = [], []
    for tok, m in zip(traj.response_ids, traj.loss_mask):
        if m:
            cur.append(tok)
        elif cur:
            runs.append(cur)
            cur = []
    return runs + ([cur] if cur else [])


def test_mask_one_tokens_are_exactly_the_sampled_tokens(tiny_backend):
    # Real sampling from the tiny random model: it never writes tags, so every turn is an
    # invalid action followed by Search-R1's message (mask 0). The mask-1 ids must be the
    # backend's sampled ids, turn by turn, with their logprobs one to one.
    backend = RecordingBackend(tiny_backend)
    engine = RolloutEngine(backend, TagsProtocol(), RecordingSearch(),
                           RolloutOptions(max_turns=2, max_turn_tokens=6, temperature=1.0), seed=3)
    rows = [QARow("a", "Which river flows through Vienna?", ["Danube"]), QARow("b", "Who wrote Hamlet?", ["Shakespeare"])]
    trajs = engine.rollout(rows, group_size=2)
    assert [t.id for t in trajs] == ["a#0", "a#1", "b#0", "b#1"]
    assert len({t.group_id for t in trajs}) == 2
    assert sum(len(outs) for _, outs in backend.calls) == sum(t.num_turns for t in trajs)
    for i, traj in enumerate(trajs):
        sampled, fed = [], []
        for c, (prompts, outs) in enumerate(backend.calls):
            active = [j for j, t in enumerate(trajs) if t.num_turns > c]  # engine keeps row order
            if i in active:
                sampled.append(outs[active.index(i)])
                fed.append(prompts[active.index(i)])
        assert _policy_segments(traj) == [o.token_ids for o in sampled if o.token_ids]
        lp = [lp for lp, m in zip(traj.logprobs, traj.loss_mask) if m]
        assert lp == pytest.approx([x for o in sampled for x in o.logprobs])
        assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.logprobs)
        # every call was fed the stored prompt plus the stored response so far: nothing re-tokenized
        full = traj.prompt_ids + traj.response_ids
        for context in fed:
            assert full[: len(context)] == context


def test_search_turn_layout_and_prediction(tiny_backend):
    tok = tiny_backend.tokenizer
    q = "Which river flows through Vienna?"
    turns = ["<think>I need a river.</think><search> river Vienna </search>", "<answer> Danube </answer>"]
    search = RecordingSearch({"river Vienna": VIENNA})
    engine = RolloutEngine(ScriptedBackend(tok, {q: turns}), TagsProtocol(), search, RolloutOptions(topk=2))
    (traj,) = engine.rollout([QARow("r1", q, ["Danube"])])
    t0 = tok.encode(turns[0], add_special_tokens=False)
    obs = tok.encode(TagsProtocol().render_observation([VIENNA]), add_special_tokens=False)
    t1 = tok.encode(turns[1], add_special_tokens=False)
    assert traj.response_ids == t0 + obs + t1
    assert traj.loss_mask == [1] * len(t0) + [0] * len(obs) + [1] * len(t1)
    assert traj.prediction == "Danube" and traj.finish_reason == "answer"
    assert (traj.num_searches, traj.num_turns, traj.num_invalid) == (1, 2, 0)
    assert traj.policy_tokens == len(t0) + len(t1)
    log = traj.turns
    assert log[0]["queries"] == ["river Vienna"] and log[0]["doc_ids"] == [["geo-1", "geo-2"]]
    assert "<information>Doc 1(Title: \"Danube\")" in traj.response_text


def test_row_context_reaches_the_search_backend(tiny_backend):
    # Three rows; the middle one answers at once, so the batch's search call has two
    # requests, and each must carry its own row's question and golds (ZeroSearch's bug).
    tok = tiny_backend.tokenizer
    scripts = {
        "Q-alpha?": ["<search> alpha </search>", "<answer> A </answer>"],
        "Q-beta?": ["<answer> B </answer>"],
        "Q-gamma?": ["<search> gamma </search>", "<answer> C </answer>"],
    }
    search = RecordingSearch()
    engine = RolloutEngine(ScriptedBackend(tok, scripts), TagsProtocol(), search, RolloutOptions())
    engine.rollout([QARow("1", "Q-alpha?", ["a1"]), QARow("2", "Q-beta?", ["b1"]), QARow("3", "Q-gamma?", ["c1", "c2"])])
    (batch,) = search.requests
    assert [(r.query, r.row_id, r.question, r.golden_answers) for r in batch] == [
        ("alpha", "1", "Q-alpha?", ("a1",)),
        ("gamma", "3", "Q-gamma?", ("c1", "c2")),
    ]


def test_final_turn_executes_no_search(tiny_backend):
    tok = tiny_backend.tokenizer
    q = "Q-loop?"
    search = RecordingSearch()
    backend = ScriptedBackend(tok, {q: ["<search> one </search>", "<search> two </search>"]})
    engine = RolloutEngine(backend, TagsProtocol(), search, RolloutOptions(max_turns=1))
    (traj,) = engine.rollout([QARow("1", q, ["x"])])
    assert len(backend.calls) == 2  # one ordinary turn + the final turn
    assert [r.query for batch in search.requests for r in batch] == ["one"]
    assert traj.finish_reason == "max_turns" and traj.num_searches == 1
    assert traj.response_text.endswith("<search> two </search>")  # nothing appended after it


def test_observation_is_cut_by_whole_passages_and_keeps_closing_tag(tiny_backend):
    tok = tiny_backend.tokenizer
    q = "Q-long?"
    long_docs = [Passage(f"p{i}", f"T{i}", "river castle engine " * 20) for i in range(3)]
    search = RecordingSearch({"long": long_docs})
    one = len(tok.encode(TagsProtocol().render_observation([long_docs[:1]]), add_special_tokens=False))
    two = len(tok.encode(TagsProtocol().render_observation([long_docs[:2]]), add_special_tokens=False))
    engine = RolloutEngine(ScriptedBackend(tok, {q: ["<search> long </search>", "<answer> x </answer>"]}),
                           TagsProtocol(), search, RolloutOptions(topk=3, max_obs_tokens=(one + two) // 2))
    (traj,) = engine.rollout([QARow("1", q, ["x"])])
    log = traj.turns[0]
    assert log["passages_dropped"] == 2 and log["obs_tokens"] == one
    assert "</information>\n\n<answer>" in traj.response_text
    # a budget below one passage shortens that passage's text, and the frame survives
    engine.config.max_obs_tokens = one - 10
    engine.backend = ScriptedBackend(tok, {q: ["<search> long </search>", "<answer> x </answer>"]})
    (traj,) = engine.rollout([QARow("1", q, ["x"])])
    log = traj.turns[0]
    assert log["obs_tokens"] <= one - 10 and "</information>" in traj.response_text


def test_context_budget_never_drops_the_question(tiny_backend):
    tok = tiny_backend.tokenizer
    q = "Q-budget?"
    search = RecordingSearch({"long": [Passage("p", "T", "river castle engine " * 50)]})
    backend = ScriptedBackend(tok, {q: ["<search> long </search>", "<answer> x </answer>"]})
    engine = RolloutEngine(backend, TagsProtocol(), search, RolloutOptions(max_obs_tokens=500))
    budget = len(engine.encode_prompt(QARow("1", q, ["x"]))) + 60  # room for a turn and a short observation
    engine.config.max_context_tokens = budget
    (traj,) = engine.rollout([QARow("1", q, ["x"])])
    assert q in tok.decode(traj.prompt_ids)
    assert traj.prompt_tokens + traj.response_tokens <= budget
    assert "</information>" in traj.response_text  # the observation shrank to fit, frame intact


def test_invalid_action_gets_search_r1_message(tiny_backend):
    tok = tiny_backend.tokenizer
    q = "Q-rambling?"
    backend = ScriptedBackend(tok, {q: ["I am not sure what to do", "<answer> y </answer>"]})
    engine = RolloutEngine(backend, TagsProtocol(), RecordingSearch(), RolloutOptions())
    (traj,) = engine.rollout([QARow("1", q, ["y"])])
    assert traj.num_invalid == 1 and traj.prediction == "y"
    assert INVALID_ACTION_OBSERVATION in traj.response_text


def test_tool_call_protocol_sends_every_query_in_one_batch(tiny_backend):
    tok = tiny_backend.tokenizer
    q = "Q-tools?"
    call = '<tool_call> {"name": "search", "arguments": {"query_list": ["alpha", "beta"]}} </tool_call>'
    search = RecordingSearch()
    backend = ScriptedBackend(tok, {q: [call, "<answer> z </answer>"]})
    engine = RolloutEngine(backend, ToolCallProtocol(), search, RolloutOptions())
    (traj,) = engine.rollout([QARow("1", q, ["z"])])
    assert [r.query for r in search.requests[0]] == ["alpha", "beta"]
    assert "<tool_response>" in traj.response_text and traj.prediction == "z"


def test_http_backend_down_mid_run_keeps_finished_rows(tmp_path, tiny_backend):
    # A real zsearch server over a real index, stopped between two rollouts: the second
    # fails after bounded retries with a clear error carrying the rows already finished.
    from zsearch_cli.retrieval.index import build_index, load_index
    from zsearch_cli.retrieval.server import create_app, serving
    from zsearch_cli.search.http import HTTPSearch

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "title": f"T{i}", "text": f"river {i} castle"}) + "\n"
                              for i in range(20)))
    index = load_index(build_index(corpus, tmp_path / "idx", {"kind": "bm25"}))
    tok = tiny_backend.tokenizer
    scripts = {"Q-a?": ["<answer> a </answer>"], "Q-b?": ["<search> river </search>", "<answer> b </answer>"]}
    rows = [QARow("a", "Q-a?", ["a"]), QARow("b", "Q-b?", ["b"])]
    with serving(create_app(index)) as url:
        search = HTTPSearch(url, timeout=2, retries=2, backoff=0.01)
        engine = RolloutEngine(ScriptedBackend(tok, {k: list(v) for k, v in scripts.items()}), TagsProtocol(), search)
        assert [t.finish_reason for t in engine.rollout(rows)] == ["answer", "answer"]
    engine.backend = ScriptedBackend(tok, {k: list(v) for k, v in scripts.items()})
    with pytest.raises(SearchBackendError) as info:
        engine.rollout(rows)
    assert url in str(info.value) and "3 attempt" in str(info.value)
    assert [t.id for t in info.value.completed] == ["a#0"]


def test_a_literal_observation_tag_written_by_the_policy_does_not_hide_its_answer(tiny_backend):
    # The policy itself writes "<information>" (unclosed) in its reasoning, then answers.
    # Only the engine knows which spans it inserted: a text search for the observation tag
    # took the policy's literal tag for an unclosed observation and dropped everything after
    # it, so the answer vanished and the reward was 0. The score must read the model's
    # turns as the engine recorded them: answer "Paris", EM 1.
    from zsearch_cli.rewards import extract_answer, is_well_formed
    from zsearch_cli.train.step_samples import Sample, score

    tok = tiny_backend.tokenizer
    q = "Q-capital?"
    turns = ["<think> look it up </think><search> capital of France </search>",
             "<think> the <information> block above says Paris </think><answer> Paris </answer>"]
    engine = RolloutEngine(ScriptedBackend(tok, {q: turns}), TagsProtocol(), RecordingSearch({"capital of France": VIENNA}),
                           RolloutOptions(topk=1))
    (traj,) = engine.rollout([QARow("1", q, ["Paris"])])
    assert traj.num_searches == 1 and traj.prediction == "Paris"
    # The text search alone loses the answer: this is the bug the spans avoid.
    assert extract_answer(traj.response_text) is None
    assert extract_answer(traj.policy_texts) == "Paris"
    assert is_well_formed(traj.policy_texts)
    sample = Sample(traj, step=1, gen_batch=0, group_key=traj.group_id)
    score([sample], "em", "tags", 0.1)
    assert sample.em == 1.0 and sample.reward == pytest.approx(1.1)  # the format bonus reads the same turns


def test_trajectory_fields_are_the_trajectory_artifacts_columns(tiny_backend, tmp_path):
    """The engine's record and the artifact it is saved as cannot drift apart: the fields are
    the columns, in order, and a trajectory survives a write and a read unchanged."""
    from dataclasses import fields

    from zsearch_cli.rollout.trajectory import Trajectory
    from zsearch_cli.artifacts import read_artifact, write_artifact
    from zsearch_cli.schemas import TRAJECTORY

    assert [f.name for f in fields(Trajectory)] == TRAJECTORY.schema.names
    tok = tiny_backend.tokenizer
    scripts = {"Q?": ["<search> river </search>", "<answer> Danube </answer>"]}
    engine = RolloutEngine(ScriptedBackend(tok, scripts), TagsProtocol(), RecordingSearch({"river": VIENNA}))
    (traj,) = engine.rollout([QARow("r", "Q?", ["Danube"])])
    assert isinstance(traj, Trajectory) and isinstance(traj.turns, list)
    path = write_artifact([traj.to_row()], tmp_path / "t.parquet", TRAJECTORY)
    back = Trajectory.from_row(read_artifact(path, TRAJECTORY).to_pylist()[0])
    assert back.turns == traj.turns and back.response_ids == traj.response_ids and back.prediction == "Danube"
    assert back.logprobs == pytest.approx(traj.logprobs)
