"""Numbers you can publish (issue 10): eval never mixes up or reuses results, and every
number carries its protocol. Each test here failed on the code before the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.protocol import METRIC_VERSION, PROTOCOL_FIELDS, training_protocol
from zsearch_cli.rewards import score_answer
from zsearch_cli.artifacts import read_artifact, read_metadata
from zsearch_cli.schemas import EVAL_EXAMPLE, EVAL_SUMMARY, METRICS, PROTOCOL_COLUMNS
from zsearch_cli.commands.evaluate import dataset_dir

runner = CliRunner()


def _qa(path: Path, rows: list[tuple[str, str, str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": [a]}) + "\n" for i, q, a in rows))
    return path


def _summary(out: Path, key: str, method: str = "direct") -> dict:
    return read_artifact(dataset_dir(out, key) / f"{method}.summary.parquet", EVAL_SUMMARY).to_pylist()[0]


def _all_summaries(out: Path, method: str = "direct") -> dict[str, dict]:
    """Every summary under ``out`` by its dataset column, whatever the folder layout."""
    rows = [read_artifact(p, EVAL_SUMMARY).to_pylist()[0] for p in out.rglob(f"{method}.summary.parquet")]
    return {r["dataset"]: r for r in rows}


@pytest.fixture(scope="module")
def demo_index(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demo") / "index"
    result = runner.invoke(app, ["index", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def _direct(tiny_model_dir: Path, out: Path, *extra: str):
    """The cheapest model eval: one 4-token turn, no retrieval."""
    return runner.invoke(app, ["eval", "--method", "direct", "--model", str(tiny_model_dir), "--out", str(out),
                               "--max-turn-tokens", "4", "--device", "cpu", *extra])


def test_flashrag_files_with_one_file_name_are_two_datasets(tmp_path, tiny_model_dir, monkeypatch):
    # data/nq/test.jsonl (2 rows) and data/triviaqa/test.jsonl (3 rows) were both "test": the
    # second was skipped as "already scored" and its summary repeated the first's n = 2.
    monkeypatch.chdir(tmp_path)
    data = Path("data")
    _qa(data / "nq" / "test.jsonl", [("n1", "Capital of France?", "Paris"), ("n2", "Who wrote Hamlet?", "Shakespeare")])
    _qa(data / "triviaqa" / "test.jsonl", [("n1", "a?", "x"), ("t2", "b?", "y"), ("t3", "c?", "z")])
    out = tmp_path / "out"
    result = _direct(tiny_model_dir, out, "--datasets", "data/nq/test.jsonl,data/triviaqa/test.jsonl")
    assert result.exit_code == 0, result.output
    assert "already scored" not in result.output
    assert {k: s["n"] for k, s in _all_summaries(out).items()} == {"nq/test": 2, "triviaqa/test": 3}
    nq, tqa = _summary(out, "nq/test"), _summary(out, "triviaqa/test")
    assert (nq["split"], tqa["split"]) == ("test", "test")
    # by benchmark name: the same keys, so this run resumes those rows
    result = _direct(tiny_model_dir, out, "--datasets", "nq,TriviaQA", "--data-dir", str(data))
    assert result.exit_code == 0 and "nq/test: 2 examples already scored, 0 to go" in result.output
    # files outside --data-dir are keyed by their path relative to the working directory
    result = _direct(tiny_model_dir, out, "--datasets", "data/nq/test.jsonl", "--data-dir", "elsewhere")
    assert result.exit_code == 0 and "data/nq/test.jsonl" in _all_summaries(out)
    # the same file given once by name and once by path: one key, refused before any model loads
    result = runner.invoke(app, ["eval", "--datasets", f"nq,{data / 'nq' / 'test.jsonl'}", "--data-dir", str(data),
                                 "--out", str(out), "--model", "/nonexistent/model"])
    assert result.exit_code == 2
    assert "both map to dataset key 'nq/test'" in result.output and len(result.output.strip().splitlines()) == 1


def test_dataset_paths_keep_their_case(tmp_path, tiny_model_dir, monkeypatch):
    # `--datasets FlashRAG_datasets/nq/test.jsonl` was lowercased into "no such file".
    monkeypatch.chdir(tmp_path)
    _qa(tmp_path / "FlashRAG_datasets" / "nq" / "Test.jsonl", [("1", "Capital of France?", "Paris")])
    result = _direct(tiny_model_dir, tmp_path / "out", "--datasets", "FlashRAG_datasets/nq/Test.jsonl")
    assert result.exit_code == 0, result.output
    assert _summary(tmp_path / "out", "FlashRAG_datasets/nq/Test.jsonl")["n"] == 1
    result = _direct(tiny_model_dir, tmp_path / "out", "--datasets", "FlashRAG_datasets/nq/Test.jsonl, NQ_missing")
    assert "unknown dataset 'NQ_missing'" in result.output  # a name that is not a file keeps its case too


def test_rerun_into_an_out_of_another_run_is_refused(tmp_path, tiny_model_dir):
    # Rows of one model/settings were reused and credited to the next run into the same --out.
    import shutil

    from zsearch_cli.models.tiny import make_tiny_model

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    out = tmp_path / "out"
    assert _direct(model, out, "--limit", "2").exit_code == 0
    first = read_artifact(out / "demo" / "direct.examples.parquet", EVAL_EXAMPLE).to_pylist()

    result = _direct(model, out, "--limit", "2", "--max-turn-tokens", "6")  # the later flag wins
    assert result.exit_code == 2
    assert "max_turn_tokens=4->6" in result.output and len(result.output.strip().splitlines()) == 1
    result = _direct(model, out, "--limit", "2", "--temperature", "0.7", "--seed", "3")
    assert result.exit_code == 2 and "temperature=0.0->0.7" in result.output and "seed=0->3" in result.output

    # the same path, retrained (other weights): the options are equal, the protocol is not
    make_tiny_model(model, seed=1)
    result = _direct(model, out, "--limit", "2")
    assert result.exit_code == 2 and "model_revision=" in result.output
    assert read_artifact(out / "demo" / "direct.examples.parquet", EVAL_EXAMPLE).to_pylist() == first  # untouched

    # what may change: more rows, another batch size -> resumes from the saved rows
    fresh = tmp_path / "out2"
    assert _direct(model, fresh, "--limit", "1").exit_code == 0
    result = _direct(model, fresh, "--limit", "3", "--batch-size", "2")
    assert result.exit_code == 0, result.output
    assert "1 examples already scored, 2 to go" in result.output
    # a smaller --limit afterwards summarises exactly the rows asked for, not every row on disk
    result = _direct(model, fresh, "--limit", "2")
    s = _summary(fresh, "demo")
    assert (s["n"], s["limit"], s["full_set"]) == (2, 2, False)


def test_predictions_missing_from_the_file_count_as_wrong(tmp_path, monkeypatch):
    # Three questions, one correct prediction, two questions with none: EM = 1/3, not 1/1.
    monkeypatch.chdir(tmp_path)
    qa = _qa(tmp_path / "qa.jsonl", [("1", "Capital of France?", "Paris"), ("2", "b?", "y"), ("3", "c?", "z")])
    preds = tmp_path / "preds.jsonl"
    preds.write_text(json.dumps({"id": "1", "prediction": "Paris"}) + "\n")
    result = runner.invoke(app, ["eval", "--predictions", str(preds), "--qa", str(qa), "--out", "out"],
                           env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    (s,) = _all_summaries(tmp_path / "out", "predictions").values()
    assert s["em"] == pytest.approx(1 / 3)  # was 1.0: the two questions without a prediction were dropped
    assert (s["n"], s["missing"]) == (3, 2) and s["dataset"] == "preds.jsonl"
    assert s["em"] == pytest.approx(1 / 3) and s["f1"] == pytest.approx(1 / 3) and s["subem"] == pytest.approx(1 / 3)
    assert s["answered"] == pytest.approx(1 / 3)
    header = [c.strip() for c in next(ln for ln in result.output.splitlines() if "missing" in ln).split("┃")]
    row = [c.strip() for c in next(ln for ln in result.output.splitlines() if "predictions" in ln).split("│")]
    assert row[header.index("missing")] == "2" and row[header.index("n")] == "3"
    assert f"metric {METRIC_VERSION}" in result.output


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


def test_nothing_is_written_outside_out(tmp_path, tiny_model_dir, monkeypatch):
    # A predictions file named "...jsonl" had the stem "..": its outputs went to OUT/.. .
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    _qa(work / "qa.jsonl", [("1", "Capital of France?", "Paris")])
    (work / "...jsonl").write_text(json.dumps({"id": "1", "prediction": "Paris"}) + "\n")
    _qa(tmp_path / "elsewhere" / ".hidden.jsonl", [("1", "a?", "x")])
    _qa(work / "%2E" / "x.jsonl", [("1", "a?", "x")])  # must not meet the escaped ".x" folder
    _qa(work / ".x.jsonl", [("1", "a?", "x")])
    before = _files(tmp_path)
    out = work / "out"
    result = runner.invoke(app, ["eval", "--predictions", "...jsonl", "--qa", "qa.jsonl", "--out", "out"])
    assert result.exit_code == 0, result.output
    written = _files(tmp_path) - before
    assert written and all(out in p.parents for p in written), sorted(map(str, written))
    result = _direct(tiny_model_dir, out, "--datasets",
                     f"../elsewhere/.hidden.jsonl,{tmp_path / 'elsewhere' / '.hidden.jsonl'}")
    assert result.exit_code == 2 and "both map to dataset key" in result.output  # one file, two spellings
    result = _direct(tiny_model_dir, out, "--datasets", "../elsewhere/.hidden.jsonl,%2E/x.jsonl,.x.jsonl")
    assert result.exit_code == 0, result.output
    written = _files(tmp_path) - before
    assert written and all(out in p.parents for p in written), sorted(map(str, written))
    keys = {_summary(out, k)["dataset"] for k in (str(tmp_path / "elsewhere" / ".hidden.jsonl"), "%2E/x.jsonl",
                                                   ".x.jsonl")}
    assert len(keys) == 3


def test_every_eval_number_carries_its_protocol(tmp_path, tiny_model_dir, demo_index):
    out = tmp_path / "out"
    result = runner.invoke(app, ["eval", "--model", str(tiny_model_dir), "--index", str(demo_index), "--out", str(out),
                                 "--max-turn-tokens", "8", "--max-turns", "2", "--max-obs-tokens", "100", "--topk", "2",
                                 "--limit", "2", "--device", "cpu", "--seed", "5"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((demo_index / "manifest.json").read_text())
    s = _summary(out, "demo", "agent")
    expected = {
        "model": str(tiny_model_dir), "adapter": None, "corpus_fingerprint": manifest["corpus"]["fingerprint"],
        "corpus_size": manifest["n_docs"], "retriever": "bm25", "bm25_k1": 1.2, "bm25_b": 0.75,
        "bm25_analyzer": "bm25s stemmer=english stopwords=en", "encoder": None, "topk": 2, "max_turns": 2,
        "max_turn_tokens": 8, "max_obs_tokens": 100, "metric_version": METRIC_VERSION, "decoding": "greedy",
        "temperature": 0.0, "seed": 5, "dataset": "demo", "split": "test", "limit": 2, "full_set": False,
    }
    assert {k: s[k] for k in expected} == expected
    assert s["model_revision"].startswith("sha256s:") and s["prompt"].startswith("tags/agent:")
    meta = read_metadata(dataset_dir(out, "demo") / "agent.summary.parquet")["protocol"]
    assert {k: meta[k] for k in expected} == expected and set(meta) == set(PROTOCOL_FIELDS)
    assert read_metadata(dataset_dir(out, "demo") / "agent.examples.parquet")["protocol"] == meta
    line = next(line for line in result.output.splitlines() if line.startswith("protocol: "))
    assert "k1=1.2 b=0.75" in line and "top-2" in line and manifest["corpus"]["fingerprint"][:12] in line
    assert "greedy" in line and "turns 2 x 8 tok, obs 100 tok" in line


def test_training_metrics_carry_the_protocol(tmp_path, tiny_model_dir, demo_index):
    from zsearch_cli.train.config import TrainConfig
    from zsearch_cli.train.metrics import MetricsLog

    cfg = TrainConfig.from_flat(model=str(tiny_model_dir), index=demo_index, out=tmp_path, topk=4, max_turns=3,
                      temperature=1.0, seed=11, lora_r=8)
    log = MetricsLog(tmp_path, cfg.to_dict())
    log.log({"step": 1, "rollout/reward_mean": 0.5})
    rows = read_artifact(log.write_parquet(), METRICS).to_pylist()
    manifest = json.loads((demo_index / "manifest.json").read_text())
    assert rows[0]["rollout/reward_mean"] == 0.5
    assert (rows[0]["corpus_fingerprint"], rows[0]["corpus_size"]) == (manifest["corpus"]["fingerprint"],
                                                                       manifest["n_docs"])
    assert (rows[0]["topk"], rows[0]["max_turns"], rows[0]["decoding"], rows[0]["seed"]) == (4, 3, "sampling", 11)
    assert rows[0]["adapter"] == "lora r=8 alpha=16" and rows[0]["dataset"] == "demo"
    assert rows[0]["metric_version"] == METRIC_VERSION and rows[0]["model_revision"].startswith("sha256s:")
    assert read_metadata(tmp_path / "metrics.parquet")["protocol"] == training_protocol(cfg.to_dict()).as_dict()
    # the per-step jsonl (and trackers) get metrics only
    assert "corpus_fingerprint" not in json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    # sft: no rollout, nothing sampled
    from zsearch_cli.train.sft import SFTConfig

    sft = training_protocol(SFTConfig.from_flat(model=str(tiny_model_dir), data="d.jsonl", out=tmp_path).to_dict())
    assert (sft.retriever, sft.decoding, sft.prompt, sft.dataset) == ("none", "none", "sft", "d.jsonl")


def test_protocol_columns_are_declared_once():
    assert tuple(name for name, _ in PROTOCOL_COLUMNS) == PROTOCOL_FIELDS
    for name in PROTOCOL_FIELDS:
        assert name in EVAL_SUMMARY.schema.names and name in METRICS.schema.names


def test_metric_definition_matches_its_version():
    """Pins rewards.score_answer to METRIC_VERSION: if one of these changes, bump the version."""
    assert METRIC_VERSION == "squad-v1"
    # normalisation: case, punctuation, articles, whitespace
    assert score_answer("The  Eiffel-Tower!", ["eiffel tower"])["em"] == 0.0  # '-' is removed, not spaced
    assert score_answer("The  Eiffel Tower!", ["eiffel tower"])["em"] == 1.0
    # subEM: the gold inside the prediction; F1: tokens [playwright, shakespeare] vs [shakespeare] = 2/3
    s = score_answer("the playwright Shakespeare", ["Shakespeare"])
    assert (s["em"], s["subem"]) == (0.0, 1.0) and s["f1"] == pytest.approx(2 / 3)
    assert score_answer(None, ["x"]) == {"em": 0.0, "f1": 0.0, "subem": 0.0}


def test_train_and_eval_share_one_resume_rule():
    from zsearch_cli.protocol import differing
    from zsearch_cli.commands import evaluate
    from zsearch_cli.train import setup, sft

    # every key of `now` that differs and may not change is named, old -> new; a key the saved
    # run lacks counts as differing (None -> value)
    assert differing({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4, "d": 5}, {"c"}) == ["b=2->3", "d=None->5"]
    assert setup.differing is sft.differing is evaluate.differing is differing


def test_the_first_run_on_a_machine_names_the_default_models_revision(tmp_path, tiny_model_dir, monkeypatch):
    # On a fresh cache the smollm2 folder did not exist yet when the protocol was computed,
    # so the first eval recorded model 'smollm2' with no revision, and every later run (cache
    # built) a revision: two protocols for one model. The dequantization is replaced by a
    # copy of the tiny model here; what matters is that naming the model builds the cache.
    import shutil

    from zsearch_cli.models import loading
    from zsearch_cli.protocol import model_identity

    monkeypatch.setenv("ZSEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(loading, "_materialize_smollm2", lambda target: shutil.copytree(tiny_model_dir, target))
    first = model_identity("smollm2")
    assert first[1] is not None and first[1].startswith("sha256s:")
    assert model_identity("smollm2") == first
    # the warm adapter names the same base revision, whichever comes first
    base, revision, adapter = model_identity("smollm2-warm")
    assert (base, revision) == ("smollm2", first[1]) and adapter.startswith("smollm2-warm@")


def test_a_remote_zsearch_retriever_is_recorded_as_fully_as_a_local_one(demo_index):
    # Issue 23.7: --search http://… recorded the corpus only (k1, b, analyzer, encoder were
    # empty). A zsearch server's /health now carries the index's settings; the protocol of a
    # remote search equals the local one's on every retriever field but the retriever (the URL).
    from zsearch_cli.protocol import REMOTE_SETTINGS, _retriever
    from zsearch_cli.retrieval.index import load_index
    from zsearch_cli.retrieval.server import create_app, serving

    local = _retriever("bm25", demo_index, strict=True)
    with serving(create_app(load_index(demo_index), method="bm25")) as url:
        remote = _retriever(url, None, strict=True)
    assert remote["retriever"] == url
    assert {k: remote[k] for k in REMOTE_SETTINGS} == {k: local[k] for k in REMOTE_SETTINGS}
    assert remote["bm25_k1"] is not None and remote["bm25_analyzer"]


def test_replicas_record_the_settings_of_the_first_that_answers(demo_index):
    # --search http://a,http://b (replicas of one index): the protocol asked "http://a,http://b/health"
    # and recorded nothing; now a dead first replica is skipped and the live one's settings recorded.
    from zsearch_cli.protocol import REMOTE_SETTINGS, _retriever
    from zsearch_cli.retrieval.index import load_index
    from zsearch_cli.retrieval.server import create_app, serving

    local = _retriever("bm25", demo_index, strict=True)
    with serving(create_app(load_index(demo_index), method="bm25")) as url:
        dead = "http://127.0.0.1:9"  # discard port: nothing listens
        remote = _retriever(f"{dead},{url}", None, strict=True)
    assert {k: remote[k] for k in REMOTE_SETTINGS} == {k: local[k] for k in REMOTE_SETTINGS}
