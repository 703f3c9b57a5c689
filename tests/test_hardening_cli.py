"""Hardening of the command line: numeric options and config values are checked before any
work starts, and every usage error is one line (no click box, no traceback).

Nothing here loads a model: a value out of range must stop the command before that, so
these tests run in well under a second each.
"""

from __future__ import annotations

import math
from typing import get_args

import pytest
import typer
from typer.testing import CliRunner

from zsearch_cli.cli import app
from zsearch_cli.config.ranges import range_for

runner = CliRunner()

# Positional arguments / required options each command needs to get as far as validation.
REQUIRED = {
    "search": ["some query"],
    "judge": ["queries.parquet", "--judge-model", "m"],
    "warmup-data": ["qa.jsonl"],
    "sft": ["data.parquet"],
    "simsft": ["judgments.parquet"],
    "solve": ["qa.parquet"],
    "plot": ["runs/x"],
    "show": ["rollouts.parquet"],
}


def _numeric_kind(annotation) -> type | None:
    if annotation in (int, float):
        return annotation
    for arg in get_args(annotation):
        if arg in (int, float):
            return arg
    return None


def _numeric_options() -> list[tuple[str, str, str, type]]:
    """(command, parameter name, its --flag, int or float) for every numeric option."""
    group = typer.main.get_command(app)
    found = []
    for cname, cmd in sorted(group.commands.items()):
        for p in cmd.params:
            td = getattr(p, "type_descriptor", None)
            kind = _numeric_kind(td.annotation) if td is not None else None
            if kind is not None:
                flag = next(o for o in p.opts if o.startswith("--"))
                found.append((cname, p.name, flag, kind))
    return found


NUMERIC = _numeric_options()


@pytest.fixture(autouse=True)
def _in_empty_folder(tmp_path, monkeypatch):
    """Default paths (runs/index, runs/eval, data/) then name nothing: a value that slipped
    through validation fails on a missing file, never starts real work."""
    monkeypatch.chdir(tmp_path)


def _one_error_line(result) -> str:
    text = result.output.strip()
    assert "Traceback" not in text, text
    lines = text.splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{text}"
    assert lines[0].startswith("error:"), lines[0]
    return lines[0]


def test_every_numeric_option_of_every_command_declares_its_range():
    # A new int/float option that nobody bounded would accept 0 or -1 silently again.
    assert len(NUMERIC) > 100  # the sweep really sees all commands
    missing = sorted({f"{c} {flag}" for c, name, flag, _ in NUMERIC if range_for(c, name) is None})
    assert not missing, f"declare a range on these options' fields (option(range=...)): {missing}"


@pytest.mark.parametrize("argv, flag", [
    (["eval", "--batch-size", "0"], "--batch-size"),     # crashed deep in generation
    (["eval", "--limit", "-1"], "--limit"),              # silently evaluated nothing
    (["eval", "--topk", "0"], "--topk"),                 # accepted
    (["search", "q", "-k", "0"], "--topk"),              # showed the top 3
    (["serve", "--port", "99999"], "--port"),            # listened on a random port
])
def test_the_reported_cases_are_one_line_errors(argv, flag, tmp_path):
    result = runner.invoke(app, argv + (["--index", str(tmp_path / "none")] if argv[0] in ("search", "serve") else []))
    assert result.exit_code == 2
    line = _one_error_line(result)
    assert flag in line and argv[-1] in line, line


def _below(rng, kind) -> str | None:
    if rng.lo == -math.inf:
        return None
    if kind is int:
        return str(int(rng.lo) if rng.lo_open else int(rng.lo) - 1)
    return repr(rng.lo if rng.lo_open else rng.lo - 0.5)


def _above(rng, kind) -> str | None:
    if rng.hi == math.inf:
        return None
    if kind is int:
        return str(int(rng.hi) if rng.hi_open else int(rng.hi) + 1)
    return repr(rng.hi if rng.hi_open else rng.hi + 0.5)


CASES = [(c, flag, bad) for c, name, flag, kind in NUMERIC
         for bad in (_below(range_for(c, name), kind), _above(range_for(c, name), kind),
                     "nan" if kind is float else None) if bad is not None]


@pytest.mark.parametrize("command, flag, bad", CASES, ids=[f"{c}{f}={b}" for c, f, b in CASES])
def test_every_out_of_range_value_is_refused_before_any_work(command, flag, bad, tmp_path):
    # --out/--index point into an empty tmp folder and the model does not exist: had the
    # value got past validation, the error would be about those instead.
    argv = [command, *REQUIRED.get(command, []), f"{flag}={bad}"]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    line = _one_error_line(result)
    assert flag in line and "must be" in line, line


def test_in_range_boundaries_pass_validation():
    from zsearch_cli.config.ranges import Range

    assert Range(0).contains(0) and not Range(0, lo_open=True).contains(0)
    assert Range(0, 1, lo_open=True).contains(1) and not Range(0, 1, hi_open=True).contains(1)
    assert not Range().contains(float("nan")) and not Range().contains(float("inf"))


def test_config_value_of_wrong_type_names_the_file_and_key(tmp_path):
    cfg = tmp_path / "opts.yaml"
    cfg.write_text("batch-size: lots\n")
    result = runner.invoke(app, ["eval", "--config", str(cfg)])
    assert result.exit_code == 2
    line = _one_error_line(result)
    assert str(cfg) in line and "batch-size" in line and "lots" in line, line


def test_config_value_out_of_range_names_the_file_and_key(tmp_path):
    cfg = tmp_path / "opts.yaml"
    cfg.write_text("topk: 0\n")
    result = runner.invoke(app, ["eval", "--config", str(cfg)])
    assert result.exit_code == 2
    line = _one_error_line(result)
    assert str(cfg) in line and "topk" in line and "must be >= 1" in line, line


def test_config_unknown_key_and_bad_yaml_are_one_line(tmp_path):
    cfg = tmp_path / "opts.yaml"
    cfg.write_text("no_such_option: 1\n")
    line = _one_error_line(runner.invoke(app, ["eval", "--config", str(cfg)]))
    assert str(cfg) in line and "no_such_option" in line
    cfg.write_text("topk: [1,\n  2\n")  # PyYAML's message spans several lines
    line = _one_error_line(runner.invoke(app, ["eval", "--config", str(cfg)]))
    assert str(cfg) in line and "YAML" in line


def test_click_usage_errors_are_one_line_too():
    # a wrong type on the command line, an unknown flag, a missing argument
    for argv, needle in ((["eval", "--batch-size", "many"], "--batch-size"),
                         (["eval", "--no-such-flag"], "--no-such-flag"),
                         (["judge"], "queries")):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2, argv
        assert needle in _one_error_line(result).lower()


def test_help_and_version_still_work():
    assert runner.invoke(app, ["--version"]).exit_code == 0
    result = runner.invoke(app, ["eval", "--help"])
    assert result.exit_code == 0 and "--batch-size" in result.output and "(accepts" in result.output
    eval_cmd = typer.main.get_command(app).commands["eval"]  # --help tells the range it checks
    assert next(p.help for p in eval_cmd.params if p.name == "batch_size").endswith("(accepts >= 1)")
    result = runner.invoke(app, [])  # no_args_is_help: the help, not an "error:" line
    assert "Usage" in result.output and "error:" not in result.output
