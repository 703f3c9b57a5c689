"""Every option is declared once (issue 13 §1): each typer option of each command is one
dataclass field, whose declaration carries its default, help and range; a command passes on
only the values the user set, so the papers' presets fill in all the rest."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.config.fields import _docstrings, to_flat
from zsearch_cli.config.ranges import range_for
from zsearch_cli.presets import PRESETS

runner = CliRunner()


def _commands():
    group = typer.main.get_command(app)
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.replace("_", "-")
        yield name, group.commands[name], info.callback.options


def test_every_typer_option_maps_to_exactly_one_dataclass_field():
    seen = 0
    for name, cmd, options in _commands():
        params = [p.name for p in cmd.params if p.name not in ("config", "print_config", "help")]
        by_param = {}
        for opt in options.values():
            assert opt.param not in by_param, f"{name}: --{opt.param} is two fields"
            by_param[opt.param] = opt
        assert sorted(params) == sorted(by_param), f"{name}: options without a field or fields without an option"
        for param in params:
            opt = by_param[param]
            owner = opt.owner
            assert dataclasses.is_dataclass(owner) and opt.name in owner.__dataclass_fields__, (name, param)
            declared = owner.__dict__.get("__annotations__", {})
            assert opt.name in declared or opt.name in _docstrings(owner), (name, param, owner)
            assert opt.help, f"{name} --{param}: its field has no docstring (the help text)"
            seen += 1
    assert seen > 300


def test_every_numeric_range_is_declared_on_its_field():
    for name, cmd, options in _commands():
        for opt in options.values():
            if opt.annotation in (int, float) or str(opt.annotation) in ("typing.Optional[int]", "typing.Optional[float]"):
                assert range_for(name, opt.param) is not None, f"{name} --{opt.param}: declare option(range=...)"


def _capture_training(monkeypatch) -> list:
    import zsearch_cli.train.trainer as trainer

    seen: list = []
    monkeypatch.setattr(trainer, "run_training", lambda cfg, **kw: seen.append(cfg))
    return seen


def test_propose_applies_every_proposer_preset_key_the_user_did_not_set(monkeypatch, tmp_path):
    import zsearch_cli.commands.propose_train as propose_train

    seen: list = []
    monkeypatch.setattr(propose_train, "train_proposer", lambda cfg, **kw: seen.append(cfg))
    preset = {**PRESETS["drzero-proposer"], "lr": 5e-7, "steps": 7, "max_turn_tokens": 300, "topk": 4}
    monkeypatch.setitem(PRESETS, "drzero-proposer", preset)
    assert runner.invoke(app, ["propose", "--out", str(tmp_path)]).exit_code == 0
    cfg = seen[-1]
    assert {k: to_flat(cfg)[k] for k in preset} == preset  # all keys, not 4 of 12
    assert cfg.retrieval.index == Path("runs/index") and cfg.preset == "drzero-proposer"
    assert runner.invoke(app, ["propose", "--out", str(tmp_path), "--lr", "1e-5", "--topk", "2"]).exit_code == 0
    assert (seen[-1].optim.lr, seen[-1].rollout.topk, seen[-1].steps) == (1e-5, 2, 7)


def test_solve_trains_with_the_tokens_per_turn_of_the_drzero_solve_step(monkeypatch, tmp_path):
    from zsearch_cli.commands.drzero import DrZeroOptions

    seen = _capture_training(monkeypatch)
    assert runner.invoke(app, ["solve", "qa.parquet", "--out", str(tmp_path)]).exit_code == 0
    assert seen[-1].rollout.max_turn_tokens == DrZeroOptions().rollout.max_turn_tokens == 512
    assert (seen[-1].train_data, seen[-1].group_size, seen[-1].algo) == ("qa.parquet", 5, "grpo")


def test_trl_names_are_aliases_in_yaml_and_flags(monkeypatch, tmp_path):
    seen = _capture_training(monkeypatch)
    cfg = tmp_path / "trl.yaml"
    cfg.write_text("num_generations: 3\nlearning_rate: 2.0e-6\nbeta: 0.01\nepsilon: 0.1\n"
                   f"output_dir: {tmp_path / 'run'}\n")
    result = runner.invoke(app, ["train", "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    c = seen[-1]
    assert (c.group_size, c.optim.lr, c.loss.beta, c.clip_eps, c.run.out) == (3, 2e-6, 0.01, 0.1, tmp_path / "run")
    assert runner.invoke(app, ["train", "--num-generations", "4", "--learning-rate", "1e-6"]).exit_code == 0
    assert (seen[-1].group_size, seen[-1].optim.lr) == (4, 1e-6)


@pytest.mark.parametrize("command", ["train", "solve", "sft"])
def test_help_says_batch_sizes_count_prompts_or_examples(command):
    text = " ".join(runner.invoke(app, [command, "--help"], terminal_width=200).output.split())
    assert "TRL" in text


def test_drzero_defaults_are_the_dr_zero_presets():
    from zsearch_cli.commands.drzero import DrZeroOptions

    o, p, s = DrZeroOptions(), PRESETS["drzero-proposer"], PRESETS["drzero-solver"]
    shared = ("topk", "max_turns", "max_turn_tokens", "max_obs_tokens")
    assert {k: getattr(o.rollout, k) for k in shared} == {k: p[k] for k in shared} == {k: s[k] for k in shared}
    assert (o.proposer_lr, o.proposer_steps, o.proposer_context_tokens, o.batch_size, o.run.save_every) == \
        (p["lr"], p["steps"], p["max_context_tokens"], p["batch_size"], p["save_every"])
    assert (o.solver_lr, o.solver_steps, o.solver_context_tokens, o.group_size) == \
        (s["lr"], s["steps"], s["max_context_tokens"], s["group_size"])


# ----------------------------------------------------------------------------- choices and the execution mark (issue 34)


def _choice_options():
    from zsearch_cli.config.ranges import Choices

    for name, cmd, options in _commands():
        for opt in options.values():
            if isinstance(opt.range, Choices):
                yield name, cmd, opt


def test_every_choice_is_listed_in_help_and_pinned():
    seen = set()
    for name, cmd, opt in _choice_options():
        param = next(p for p in cmd.params if p.name == opt.param)
        assert f"(accepts {opt.range.describe()})" in param.help, f"{name} --{opt.param}: choices not in --help"
        assert range_for(name, opt.param) == opt.range  # the golden file pins them (tests/golden/flags.txt)
        seen.add(opt.name)
    assert {"backend", "rollout_mode", "lr_schedule", "report_to", "reward", "loss_agg", "rollout_is", "rollout_rs",
            "on_collapse", "method", "noise_schedule"} <= seen


@pytest.mark.parametrize("argv, line", [
    (["train", "--on-collapse", "panic"], "error: unknown --on-collapse 'panic': use one of warn, stop, rollback"),
    (["drzero", "--rollout-is", "tok"], "error: unknown --rollout-is 'tok': use one of none, token, sequence"),
    (["eval", "--method", "oracle"], "error: unknown --method 'oracle': use one of direct, cot, rag, agent"),
    (["solve", "qa.parquet", "--loss-agg", "sum"], "error: unknown --loss-agg 'sum'"),
])
def test_a_value_outside_the_choices_is_one_line_before_any_work(argv, line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # had the value got through, the error would name a missing file instead
    result = runner.invoke(app, argv)
    assert result.exit_code == 2 and result.output.strip().startswith(line), result.output


def test_a_config_files_bad_choice_names_the_file_and_key(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.yaml").write_text("rollout_rs: seq\n")
    result = runner.invoke(app, ["train", "--config", "run.yaml"])
    assert result.exit_code == 2
    assert "run.yaml: key 'rollout_rs' (--rollout-rs)" in result.output and "'seq'" in result.output, result.output


def test_what_a_resume_may_change_is_marked_on_each_field():
    from zsearch_cli.commands.drzero import DrZeroOptions
    from zsearch_cli.config.commands import EvalOptions
    from zsearch_cli.config.fields import execution_options
    from zsearch_cli.train.config import TrainConfig
    from zsearch_cli.train.sft_config import SFTConfig

    # the hand-kept sets the marks replace (trainer.py, sft.py, drzero.py, evaluate.py before issue 34):
    # none of their names is lost
    before = {
        TrainConfig: {"steps", "save_every", "keep_checkpoints", "resume", "report_to", "save_rollouts", "out",
                      "device", "backend", "preset", "val_data", "val_every", "val_limit", "val_search",
                      "val_allow_sim", "rollout_mode", "search_concurrency", "guard", "on_collapse", "merge_lora"},
        SFTConfig: {"max_steps", "epochs", "save_every", "keep_checkpoints", "resume", "eval_every", "out", "device"},
        DrZeroOptions: {"iterations", "eval_datasets", "eval_data_dir", "eval_limit", "backend", "device",
                        "save_every", "rollout_mode", "search_concurrency", "keep_checkpoints", "save_rollouts",
                        "report_to", "gradient_checkpointing"},
        EvalOptions: {"datasets", "data_dir", "download", "out", "limit", "batch_size", "device", "backend",
                      "predictions", "qa", "rollout_mode", "search_concurrency", "group_by", "pooled", "probe"},
    }
    for cls, names in before.items():
        assert names <= execution_options(cls), (cls.__name__, sorted(names - execution_options(cls)))
    # and what changes a result never is: the rule is not vacuous
    computing = {"topk", "temperature", "lr", "seed", "model", "batch_size", "group_size", "beta", "loss_agg",
                 "rollout_is", "max_turns", "lora_r", "ppo_epochs", "mini_batch_size"}
    assert not computing & execution_options(TrainConfig)
    assert not {"topk", "temperature", "model", "method", "seed"} & execution_options(EvalOptions)
    assert not {"solver_lr", "proposer_steps", "solver_steps", "questions_per_iteration", "topk"} & \
        execution_options(DrZeroOptions)
