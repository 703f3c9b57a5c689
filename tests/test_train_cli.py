"""`zsearch train` end to end on the tiny model and the bundled demo data, then `zsearch eval`
on its final checkpoint (full and LoRA) and `zsearch plot`; presets and one-line errors."""

from __future__ import annotations


import pytest
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.artifacts import read_artifact, read_metadata
from zsearch_cli.schemas import EVAL_SUMMARY, METRICS, ROLLOUT

runner = CliRunner()


def _ok(args: list[str]):
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return result


def test_train_eval_plot_end_to_end(tmp_path, tiny_model_dir, demo_index):
    out = tmp_path / "run"
    result = _ok(["train", "--algo", "grpo", "--model", str(tiny_model_dir), "--index", str(demo_index),
                  "--steps", "2", "--batch-size", "2", "-G", "2", "--max-turn-tokens", "16", "--max-turns", "2",
                  "--device", "cpu", "--out", str(out), "--save-rollouts", "--save-every", "1", "--lr", "1e-4"])
    assert f"final model written to {out / 'final'}" in " ".join(result.output.split())
    assert (out / "final" / "model.safetensors").is_file() and (out / "final" / "tokenizer.json").is_file()
    metrics = read_artifact(out / "metrics.parquet", METRICS).to_pylist()
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["actor/lr"] == 1e-4 and m["actor/grad_norm"] is not None and m["rollout/logp_mismatch"] < 1e-3
               for m in metrics)
    # every statistic GRPO's loss returns is logged, not only the classic few
    assert all(m[f"actor/{k}"] is not None for m in metrics for k in ("ratio_mean", "ratio_max", "approx_kl"))
    assert read_metadata(out / "metrics.parquet")["config"]["algo"] == "grpo"
    assert sorted(p.name for p in (out / "rollouts").iterdir()) == ["step-000001.parquet", "step-000002.parquet"]
    rollouts = read_artifact(out / "rollouts" / "step-000002.parquet", ROLLOUT).to_pylist()
    assert len(rollouts) == 4 and len({r["group_id"] for r in rollouts}) == 2
    assert all(r["step"] == 2 and r["kept"] and r["advantage"] is not None for r in rollouts)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-1", "step-2"]

    _ok(["eval", "--model", str(out / "final"), "--limit", "2", "--index", str(demo_index), "--out",
         str(tmp_path / "eval"), "--max-turn-tokens", "8", "--max-turns", "1", "--device", "cpu"])
    assert read_artifact(tmp_path / "eval" / "demo" / "agent.summary.parquet", EVAL_SUMMARY).to_pylist()[0]["n"] == 2

    result = _ok(["plot", str(out)])
    assert (out / "curves.png").stat().st_size > 5000 and "curves.png" in result.output


def test_lora_final_checkpoint_evaluates(tmp_path, tiny_model_dir, demo_index):
    out = tmp_path / "lora"
    _ok(["train", "--algo", "reinforce", "-G", "1", "--model", str(tiny_model_dir), "--index", str(demo_index),
         "--steps", "1", "--batch-size", "2", "--max-turn-tokens", "8", "--max-turns", "1", "--device", "cpu",
         "--out", str(out), "--lora-r", "4", "--lr", "1e-3"])
    final = out / "final"
    assert (final / "adapter_config.json").is_file() and not (final / "config.json").exists()
    from zsearch_cli.models.loading import load_model

    model, _ = load_model(str(final), device="cpu")  # base + adapter, merged
    assert not hasattr(model, "peft_config")
    _ok(["eval", "--model", str(final), "--limit", "1", "--index", str(demo_index), "--out", str(tmp_path / "ev"),
         "--max-turn-tokens", "8", "--max-turns", "1", "--device", "cpu"])


@pytest.mark.parametrize("args, message", [
    (["--algo", "nope"], "unknown --algo 'nope': use one of reinforce, ppo, grpo, gspo, dspo"),
    (["--algo", "grpo", "-G", "1"], "--algo grpo needs --group-size >= 2"),
    (["--algo", "ppo", "--critic-model", "none"], "--algo ppo needs a critic"),
    (["--preset", "nope"], "unknown --preset 'nope'"),
])
def test_bad_options_exit_2_with_one_line(args, message, tmp_path):
    result = runner.invoke(app, ["train", "--out", str(tmp_path), *args])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert message in text and text.count("error:") == 1


def test_preset_values_yield_to_flags_and_config_file(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr("zsearch_cli.train.trainer.run_training", lambda cfg, **kw: seen.append(cfg))
    _ok(["train", "--preset", "search-r1", "--lr", "1e-5", "--out", str(tmp_path)])
    cfg = seen[-1]
    assert (cfg.algo, cfg.optim.lr, cfg.critic_lr, cfg.loss.beta, cfg.clip_eps, cfg.steps, cfg.rollout.max_turns) == \
        ("ppo", 1e-5, 1e-5, 0.001, 0.2, 500, 4)
    conf = tmp_path / "train.yaml"
    conf.write_text("steps: 7\nalgo: grpo\n")
    _ok(["train", "--preset", "zerosearch", "--config", str(conf), "--topk", "2", "--out", str(tmp_path)])
    cfg = seen[-1]
    assert (cfg.algo, cfg.steps, cfg.rollout.topk, cfg.reward, cfg.group_size, cfg.preset) == ("grpo", 7, 2, "f1", 5, "zerosearch")
    _ok(["train", "--out", str(tmp_path), "--algo-arg", "baseline=rloo", "--algo", "reinforce"])
    assert seen[-1].algo_args == {"baseline": "rloo"} and seen[-1].preset is None


def test_existing_run_needs_resume(tmp_path, tiny_model_dir, demo_index):
    from zsearch_cli.train.checkpoint import atomic_dir

    # a (complete: its manifest lists what was written) checkpoint of an earlier run
    atomic_dir(tmp_path / "checkpoints" / "step-2", lambda d: (d / "trainer_state.json").write_text('{"config": {}}'))
    result = runner.invoke(app, ["train", "--out", str(tmp_path), "--model", str(tiny_model_dir),
                                 "--index", str(demo_index), "--device", "cpu"])
    assert result.exit_code == 2
    assert "already holds checkpoints (latest step-2): pass --resume" in " ".join(result.output.split())


def test_metadata_holds_the_resolved_config_and_the_algorithms_reward(tmp_path, tiny_model_dir, demo_index):
    # No --preset and no --reward/--lr/--beta/--clip-eps/--mini-batch-size: the run must use,
    # and record, DSPO's own defaults (subEM; lr 1e-6; β 0; sequence clip 3e-4/4e-4; G 5)
    # and the mini-batch it really took (the whole batch: 2 prompts × 2 samples = 4
    # sequences). Before, the metadata said null for each and DSPO filtered on EM.
    out = tmp_path / "dspo"
    _ok(["train", "--algo", "dspo", "--model", str(tiny_model_dir), "--index", str(demo_index), "-G", "2",
         "--steps", "1", "--batch-size", "2", "--max-gen-batches", "1", "--max-turn-tokens", "8",
         "--max-turns", "1", "--device", "cpu", "--out", str(out)])
    config = read_metadata(out / "metrics.parquet")["config"]
    assert config["reward"] == "subem"
    assert (config["lr"], config["beta"], config["group_size"]) == (1e-6, 0.0, 2)
    assert (config["clip_eps_low"], config["clip_eps_high"], config["clip_eps"]) == (3e-4, 4e-4, None)
    assert config["max_gen_batches"] == 1 and config["mini_batch_size"] == 4
    assert config["critic_lr"] == 1e-5  # a trainer setting (unused without a critic), not a loss field


@pytest.mark.parametrize("algo,reward", [("grpo", "em"), ("ppo", "em"), ("reinforce", "f1"), ("dspo", "subem"),
                                         ("gspo", "subem"), ("dspo-token", "subem")])
def test_each_algorithm_defaults_to_its_papers_reward(algo, reward):
    from zsearch_cli.train.config import TrainConfig, algo_config, resolve_config

    cfg = resolve_config(TrainConfig.from_flat(algo=algo, group_size=1 if algo in ("ppo", "reinforce") else 2))
    assert cfg.reward == reward
    assert resolve_config(cfg) == cfg  # idempotent: a resumed run compares equal
    if algo.startswith("dspo"):
        assert algo_config(cfg).reward == reward  # the filter's metric is the reward
    # A value the user set always wins over the algorithm's default.
    assert resolve_config(TrainConfig.from_flat(algo=algo, reward="f1" if reward != "f1" else "em")).reward != reward
