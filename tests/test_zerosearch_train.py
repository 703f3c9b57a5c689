"""`zsearch train` for ZeroSearch: the --noise-* options (one-line errors, the preset, what
reaches the simulator), the per-step search/noise_p metric, and validation on a real engine
(--val-data) whose val/em, val/f1, val/subem land in the metrics rows. Tiny model, CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.artifacts import read_artifact, read_metadata
from zsearch_cli.schemas import EVAL_EXAMPLE, METRICS
from zsearch_cli.search.curriculum import noise_probability
from zsearch_cli.search.factory import make_search_backend
from zsearch_cli.train.config import TrainConfig, search_options

runner = CliRunner()


@pytest.fixture(scope="module")
def val_qa(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("zs_val") / "val.jsonl"
    rows = [("v1", "Which river flows through Vienna?", ["Danube"]), ("v2", "Who wrote Hamlet?", ["Shakespeare"]),
            ("v3", "What is the capital of France?", ["Paris"])]
    path.write_text("".join(json.dumps({"id": i, "question": q, "golden_answers": g}) + "\n" for i, q, g in rows))
    return path


@pytest.mark.parametrize("args, message", [
    (["--noise-end", "0.5"], "--noise-end only applies to the simulated search (--search sim:MODEL or "
                             "sim+http://HOST:PORT/v1), not --search 'bm25'"),
    (["--search", "http://127.0.0.1:9", "--noise-start", "0.1", "--noise-schedule", "fixed"],
     "--noise-start/--noise-schedule only applies to the simulated search"),
    (["--search", "sim:m?noise_end=0.75", "--noise-end", "0.5"], "--noise-end and --search …?noise_end= both set it"),
    (["--search", "sim:m", "--noise-end", "1.5"], "--noise-end must be >= 0 and <= 1, got 1.5"),
    (["--search", "sim:m", "--noise-schedule", "linear"], "unknown --noise-schedule 'linear': use one of curriculum, fixed"),
    (["--search", "sim:m", "--topk", "6"], "--topk 6: the ZeroSearch simulator writes 5 documents"),
    (["--val-data", "v.jsonl", "--val-search", "sim:m"], "--val-search 'sim:m' is the simulator"),
    (["--search", "sim:m", "--val-data", "v.jsonl", "--val-search", "sim+http://127.0.0.1:9/v1"],
     "pass --val-allow-sim to validate on it anyway"),
    (["--val-limit", "0"], "--val-limit must be >= 1"),
])  # fmt: skip
def test_bad_zerosearch_options_exit_2_with_one_line(args, message, tmp_path):
    result = runner.invoke(app, ["train", "--out", str(tmp_path), *args], env={"COLUMNS": "300"})
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert message in text and text.count("error:") == 1


def test_zerosearch_preset_sets_the_paper_values_for_the_simulator_only(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr("zsearch_cli.train.trainer.run_training", lambda cfg, **kw: seen.append(cfg))

    def train(*args: str) -> TrainConfig:
        result = runner.invoke(app, ["train", "--preset", "zerosearch", "--out", str(tmp_path), *args])
        assert result.exit_code == 0, result.output
        return seen[-1]

    cfg = train("--search", "sim:sim-model")
    assert (cfg.algo, cfg.reward, cfg.group_size, cfg.rollout.topk, cfg.rollout.max_turns, cfg.steps, cfg.optim.lr, cfg.loss.beta) == \
        ("reinforce", "f1", 5, 5, 5, 200, 1e-6, 0.001)
    assert (cfg.sim.noise_start, cfg.sim.noise_end, cfg.sim.noise_base, cfg.sim.noise_schedule) == (0.0, 0.25, 4.0, "curriculum")
    assert train("--search", "sim:sim-model", "--noise-end", "0.75").sim.noise_end == 0.75  # a flag wins
    cfg = train("--search", "sim:sim-model?noise_end=0.5")  # so does the spec's own option
    assert (cfg.sim.noise_start, cfg.sim.noise_end) == (0.0, None) and search_options(cfg)["noise_start"] == 0.0
    # with a real engine (the paper's real-search comparison) the simulator values are left out
    cfg = train("--search", "bm25")
    assert (cfg.sim.noise_start, cfg.sim.noise_end, cfg.sim.noise_base, cfg.sim.noise_schedule) == (None, None, None, None)
    assert (cfg.algo, cfg.reward) == ("reinforce", "f1") and search_options(cfg) == {}
    lib = TrainConfig.from_preset("zerosearch", search="bm25")
    assert lib.sim.noise_end is None and TrainConfig.from_preset("zerosearch", search="sim:x").sim.noise_end == 0.25


def test_noise_options_and_seed_reach_the_simulator():
    cfg = TrainConfig.from_flat(search="sim:unused?mode=prompt", noise_start=0.1, noise_end=0.6, noise_base=2.0,
                      noise_schedule="curriculum", seed=7)
    kwargs = search_options(cfg)
    assert kwargs == {"noise_start": 0.1, "noise_end": 0.6, "noise_base": 2.0, "noise_schedule": "curriculum",
                      "seed": 7}
    sim = make_search_backend(cfg.retrieval.search, generator=object(), **kwargs)  # generator: no model load
    cur = sim.curriculum
    assert (cur.p_start, cur.p_end, cur.base, cur.schedule, cur.seed, sim.config.mode) == \
        (0.1, 0.6, 2.0, "curriculum", 7, "prompt")
    sim.progress(5, 10)
    assert sim.noise_p == pytest.approx(noise_probability(5, 10, 0.1, 0.6, 2.0))
    # the spec's seed is the user's choice; fixed schedule = p_s at every step
    cfg = TrainConfig.from_flat(search="sim:unused?seed=3", noise_start=0.5, noise_schedule="fixed", seed=7)
    sim = make_search_backend(cfg.retrieval.search, generator=object(), **search_options(cfg))
    sim.progress(9, 10)
    assert (sim.curriculum.seed, sim.noise_p) == (3, 0.5)


def test_noise_p_per_step_and_validation_on_bm25(tmp_path, tiny_model_dir, demo_index, val_qa):
    out = tmp_path / "run"
    result = runner.invoke(app, [
        "train", "--algo", "reinforce", "-G", "2", "--model", str(tiny_model_dir), "--index", str(demo_index),
        "--search", f"sim:{tiny_model_dir}?max_tokens=8&device=cpu", "--noise-start", "0.1", "--noise-end", "0.7",
        "--noise-base", "2", "--steps", "3", "--batch-size", "2", "--max-turn-tokens", "12", "--max-turns", "1",
        "--topk", "3", "--device", "cpu", "--out", str(out), "--save-every", "0", "--lr", "1e-4",
        "--val-data", str(val_qa), "--val-every", "2", "--val-limit", "2"], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    metrics = read_artifact(out / "metrics.parquet", METRICS).to_pylist()
    assert [m["search/noise_p"] for m in metrics] == pytest.approx(
        [noise_probability(t, 3, 0.1, 0.7, 2.0) for t in range(3)])  # eq. 1's t: the steps done before
    assert metrics[0]["search/noise_p"] == pytest.approx(0.1)
    assert metrics[2]["search/noise_p"] == pytest.approx(0.1 + 0.6 * (2 ** (2 / 3) - 1))
    # validated after step 2 (--val-every 2) and after the last step (3), not after step 1
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["val/em"] is not None for m in metrics] == [False, True, True]
    assert all(m["time/val"] > 0 for m in metrics[1:])
    for step in (2, 3):
        examples = read_artifact(out / "val" / f"step-{step:06d}.examples.parquet", EVAL_EXAMPLE).to_pylist()
        assert [e["id"] for e in examples] == ["v1", "v2"] and {e["dataset"] for e in examples} == {"val"}
        for key in ("em", "f1", "subem"):
            assert metrics[step - 1][f"val/{key}"] == pytest.approx(sum(e[key] for e in examples) / 2)
    assert not (out / "val" / "step-000001.examples.parquet").exists()
    assert read_metadata(out / "metrics.parquet")["config"]["noise_base"] == 2.0
    assert "| val em" in result.output


def test_validation_reuses_the_training_engine_when_it_is_the_same(tiny_model_dir, demo_index, val_qa, tmp_path):
    from zsearch_cli.search.local import IndexSearch
    from zsearch_cli.train.trainer import Trainer

    cfg = TrainConfig.from_flat(algo="reinforce", model=str(tiny_model_dir), index=demo_index, out=tmp_path / "r", steps=1,
                      batch_size=1, group_size=1, device="cpu", val_data=str(val_qa), val_limit=1)
    trainer = Trainer(cfg)
    assert trainer.validator.search is trainer.search and isinstance(trainer.search, IndexSearch)
    assert trainer.validator.engine.config.temperature == 0.0 and len(trainer.validator.rows) == 1
    assert trainer.validator.engine.backend is trainer.generation  # the policy itself, not a copy
