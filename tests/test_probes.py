"""``zsearch eval --probe``: the counterfactual retrievers over the real demo index, and the
measures derived from scripted policies whose behaviour is known by construction."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from helpers import ScriptedBackend
from zsearch_cli.audit.behaviour import example_measures, is_candidate_list, list_warning
from zsearch_cli.audit.ceiling import default_audit_dir, find_ceiling, gold_passages
from zsearch_cli.commands.audit import run_audit
from zsearch_cli.config.commands import AuditOptions, EvalOptions
from zsearch_cli.config.fields import build
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.data.demo import demo_qa
from zsearch_cli.data.qa import load_qa
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.index import build_index
from zsearch_cli.rollout.engine import RolloutEngine
from zsearch_cli.rollout.protocols import TagsProtocol
from zsearch_cli.rollout.state import QARow
from zsearch_cli.scoring import example_rows
from zsearch_cli.search.base import SearchRequest
from zsearch_cli.search.local import IndexSearch
from zsearch_cli.search.probes import EmptySearch, GoldSearch, RandomSearch, ShuffledSearch, parse_probes

GLOBE = "In what year did Shakespeare's acting company build the Globe Theatre in Southwark?"
"""demo test question art-q001, gold 1599, which passage art-0003 holds (BM25's top hit for it)."""


@pytest.fixture(scope="module")
def audited_index(tmp_path_factory) -> Path:
    """The demo corpus's BM25 index with `zsearch audit` of the demo test set in INDEX/audit."""
    index = build_index(None, tmp_path_factory.mktemp("demo") / "index", {"kind": "bm25"})
    run_audit(build(AuditOptions, {"index": index}), {})
    return index


def _requests(n: int = 12) -> list[SearchRequest]:
    rows = load_qa(demo_qa("test")).to_pylist()[:n]
    return [SearchRequest(r["question"], r["id"], r["question"], tuple(r["golden_answers"])) for r in rows]


def test_shuffled_never_returns_the_real_top_k(audited_index):
    real = IndexSearch(audited_index, "bm25")
    reqs = _requests()
    top, deeper = real.search(reqs, 3), real.search(reqs, 6)
    for r, t, d, s in zip(reqs, top, deeper, ShuffledSearch(real).search(reqs, 3)):
        shuffled = [p.id for p in s.passages]
        assert not set(shuffled) & {p.id for p in t.passages}, r.query
        assert shuffled == [p.id for p in d.passages][3:6]  # ranks 4..6, in their order


def test_random_is_seeded_per_request_whatever_the_batch(audited_index):
    real = IndexSearch(audited_index, "bm25")
    reqs = _requests(6)
    one = RandomSearch(real, real.index, seed=7).search(reqs, 3)
    alone = [RandomSearch(real, real.index, seed=7).search([r], 3)[0] for r in reversed(reqs)][::-1]
    other = RandomSearch(real, real.index, seed=8).search(reqs, 3)
    ids = lambda results: [[p.id for p in res.passages] for res in results]  # noqa: E731
    assert ids(one) == ids(alone) and ids(one) != ids(other)
    assert all(len(set(x)) == 3 for x in ids(one))


def test_gold_puts_the_audits_passage_first(audited_index):
    real = IndexSearch(audited_index, "bm25")
    reqs = _requests(72)  # the whole test split: its three yes/no questions have no passage holding "yes"
    protocol = pq.read_table(default_audit_dir(audited_index) / "demo" / "audit.summary.parquet").to_pylist()[0]
    ceiling = find_ceiling(default_audit_dir(audited_index), "demo", protocol, [r.row_id for r in reqs], 3)
    gold = gold_passages(real.index, ceiling.gold)
    assert set(gold) == set(ceiling.gold) and all(gold[q].id == ceiling.gold[q] for q in gold)
    assert len(gold) == len(reqs) - 3
    for r, plain, probed in zip(reqs, real.search(reqs, 3), GoldSearch(real, gold).search(reqs, 3)):
        got = [p.id for p in probed.passages]
        if r.row_id in gold:
            assert got[0] == ceiling.gold[r.row_id] and len(got) == 3 and len(set(got)) == 3
        else:
            assert got == [p.id for p in plain.passages]


def _run(engine: RolloutEngine, search, question: str, golds: list[str]) -> dict:
    engine.search = search
    return example_rows("demo", "agent", engine.rollout([QARow("q", question, golds)]))[0]


def test_a_policy_that_never_searches_has_no_reliance_and_under_searches(audited_index, tiny_backend):
    real = IndexSearch(audited_index, "bm25")
    tok = tiny_backend.tokenizer
    engine = RolloutEngine(ScriptedBackend(tok, {GLOBE: ["<answer> 1600 </answer>"] * 2}), TagsProtocol(), real,
                           RolloutOptions(topk=3, max_turns=3))
    with_real, with_empty = _run(engine, real, GLOBE, ["1599"]), _run(engine, EmptySearch(real), GLOBE, ["1599"])
    # it never searches, so what search returns cannot matter: EM 0 both ways, reliance 0
    assert (with_real["em"], with_empty["em"], with_real["searches"]) == (0.0, 0.0, 0)
    m = example_measures([with_real])
    # a wrong answer with no search: under-search 1 of 1; no search at all: over-search undefined
    assert (m["under_search"], m["over_search"], m["answer_attribution"]) == (1.0, None, None)


def test_searching_after_the_answer_appeared_is_over_search(audited_index, tiny_backend):
    real = IndexSearch(audited_index, "bm25")
    turns = ["<search> Globe Theatre Southwark built </search>", "<search> Globe Theatre year </search>",
             "<answer> 1599 </answer>"]
    engine = RolloutEngine(ScriptedBackend(tiny_backend.tokenizer, {GLOBE: turns * 2}), TagsProtocol(), real,
                           RolloutOptions(topk=3, max_turns=3))
    row = _run(engine, real, GLOBE, ["1599"])
    m = example_measures([row])
    # search 1 returns art-0003 (holds 1599); search 2 came after it: 1 of 2 searches; the
    # correct answer's string was in the retrieved text: attributed
    assert (row["em"], row["searches"], m["over_search"], m["answer_attribution"], m["under_search"]) == (
        1.0, 2, 0.5, 1.0, 0.0)
    empty = example_measures([_run(engine, EmptySearch(real), GLOBE, ["1599"])])
    # nothing retrieved: never over-searching, and the (still correct) answer came from memory
    assert (empty["over_search"], empty["answer_attribution"], empty["answer_in_context"]) == (0.0, 0.0, 0.0)


def test_a_planted_candidate_list_triggers_the_subem_warning():
    golds = ["1599"]
    rows = [{"prediction": p, "golden_answers": golds, "em": float(p == "1599"), "subem": float("1599" in p),
             "turn_log": "[]"} for p in ("1599", "1598 or 1599 or 1600", "the year 1599", "1599")]
    m = example_measures(rows)
    # subEM 4/4, EM 2/4: gap 0.5; one of four answers is a list of candidates; no row searched,
    # so the two wrong ones are under-searches (the two right ones are not): 2/4
    assert (m["subem_em_gap"], m["candidate_lists"], m["under_search"]) == (0.5, 0.25, 0.5)
    assert "lists of candidates" in list_warning("demo", "real", m)
    # the same gap from a wordy answer alone is no hedge: no warning
    wordy = example_measures([rows[0], rows[2]])
    assert wordy["subem_em_gap"] == 0.5 and list_warning("demo", "real", wordy) is None
    assert is_candidate_list("Paris, London, 1599", golds) and not is_candidate_list("Southwark, 1599", golds)


def test_probe_names_are_checked():
    assert parse_probes("real, empty,real") == ["real", "empty"]
    with pytest.raises(ZsearchError, match="unknown probe 'golden'"):
        parse_probes("real,golden")


def test_eval_with_probes_reports_reliance_headroom_and_the_ceiling(audited_index, tiny_backend, tmp_path,
                                                                   monkeypatch, capsys):
    """The whole `zsearch eval --probe` path with a scripted policy: it searches the question,
    then answers with a candidate list when the retrieved text holds 1599, else "1600"."""
    from zsearch_cli.commands import evaluate as evaluate_module

    class Reader(ScriptedBackend):
        def generate(self, prompts, params, stop=()):
            outs = []
            for p in prompts:
                text = self.tokenizer.decode(p).rstrip()  # the prompt itself names the tags: read its tail
                info = text[text.rfind("<information>"):] if text.endswith("</information>") else None
                turn = ("<search> Globe Theatre Southwark </search>" if info is None else
                        "<answer> 1599 or 1600 </answer>" if "1599" in info else "<answer> 1600 </answer>")
                self.scripts = {GLOBE: [turn]}
                outs += super().generate([p], params, stop)
            return outs

    real = IndexSearch(audited_index, "bm25")
    engine = RolloutEngine(Reader(tiny_backend.tokenizer, {}), TagsProtocol(), real, RolloutOptions(topk=3, max_turns=2))
    monkeypatch.setattr(evaluate_module, "_build_engine", lambda opts: (engine, real))
    opts = build(EvalOptions, {"index": audited_index, "out": tmp_path, "limit": 1, "model": "scripted",
                               "probe": "real,empty,shuffled,gold"})
    summaries = evaluate_module.evaluate(opts, {"probe": opts.probe})
    out = capsys.readouterr().out
    assert [s["method"] for s in summaries] == ["agent", "agent+empty", "agent+shuffled", "agent+gold"]
    # the demo audit: art-q001's 1599 is in the corpus and in BM25's top 3 for the question
    assert (summaries[0]["audit_answerable"], summaries[0]["audit_recall"]) == (1.0, 1.0)
    assert "ceiling" in out and "lists of candidates" in out
    probes = {r["probe"]: r for r in pq.read_table(tmp_path / "demo" / "agent.probes.parquet").to_pylist()}
    # subEM: real and gold see 1599 and hedge ("1599 or 1600": subEM 1, EM 0); empty and
    # shuffled (ranks 4-6 lack it) answer 1600: subEM 0
    assert {p: r["subem"] for p, r in probes.items()} == {"real": 1.0, "empty": 0.0, "shuffled": 0.0, "gold": 1.0}
    assert probes["real"]["candidate_lists"] == 1.0 and probes["real"]["reliance"] == 0.0
    assert probes["gold"]["gold_headroom"] == 0.0  # EM 0 everywhere: no headroom, no reliance
    assert probes["empty"]["answer_in_context"] == 0.0 and probes["real"]["answer_in_context"] == 1.0
    meta = pq.read_schema(tmp_path / "demo" / "agent.summary.parquet").metadata
    assert b'"audit"' in meta[b"zsearch.protocol"]
    (empty_summary,) = pq.read_table(tmp_path / "demo" / "agent+empty.summary.parquet").to_pylist()
    assert empty_summary["retriever"] == "bm25+empty"


def test_gold_without_a_matching_audit_is_refused_before_any_model(tmp_path):
    from zsearch_cli.commands.evaluate import evaluate

    index = build_index(None, tmp_path / "index", {"kind": "bm25"})  # no audit under INDEX/audit
    opts = build(EvalOptions, {"index": index, "out": tmp_path / "eval", "probe": "gold", "model": "no-such-model"})
    with pytest.raises(ZsearchError, match="--probe gold: no audit of demo"):
        evaluate(opts, {})
