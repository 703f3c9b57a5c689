"""Issue 23.7: small defects a first-time user meets in ``--help``."""

from __future__ import annotations

from typer.testing import CliRunner

from zsearch_cli.cli import app

runner = CliRunner()


def _help(*args: str) -> str:
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_dr_zero_commands_have_a_whole_one_line_help():
    # click ends a short help at the first ". ": it used to read just "Dr."
    lines = {line.split()[0]: line for line in _help().splitlines() if line.strip().startswith(("propose", "solve",
                                                                                               "drzero"))}
    assert set(lines) == {"propose", "solve", "drzero"}
    assert all("Dr. Zero" in line for line in lines.values()), lines


def test_the_seed_range_prints_as_a_whole_number():
    out = _help("train")
    assert "4294967295" in out and "e+09" not in out


def test_train_takes_max_steps_like_trl():
    from zsearch_cli.train.config import TrainConfig

    assert "--max-steps" in _help("train")
    result = runner.invoke(app, ["train", "--max-steps", "0"])  # the alias reaches the same field and range
    assert result.exit_code == 2 and "--steps must be >= 1, got 0" in result.output
    assert TrainConfig.from_flat(steps=3).steps == 3


def test_a_default_is_printed_once():
    out = _help("propose")
    index = out[out.index("--index"):].split("--topk")[0]
    assert "[runs/index]" not in index and "default: runs/index" in index


def test_every_command_that_writes_takes_output_dir_like_trl():
    import typer

    from zsearch_cli.cli import app

    def walk(group, prefix=""):
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from walk(cmd, f"{prefix}{name} ")
            else:
                yield prefix + name, cmd

    writers = {}
    for name, cmd in walk(typer.main.get_command(app)):
        flags = {o for p in cmd.params for o in getattr(p, "opts", [])}
        if "--out" in flags:
            writers[name] = flags
    assert {"train", "eval", "index", "collect", "judge", "sft", "simsft", "solve", "propose", "drzero",
            "export"} <= set(writers)
    missing = sorted(name for name, flags in writers.items() if "--output-dir" not in flags)
    assert not missing, missing


def test_a_hub_id_that_cannot_load_fails_at_once(monkeypatch, tmp_path):
    # Issue 23.7: a mistyped hub id used to spend ~2 minutes in transformers' retries on a
    # machine without network. Neither cached nor reachable: one line, naming the id.
    import pytest

    from zsearch_cli.errors import ZsearchError
    from zsearch_cli.models.loading import check_hub_id, loadable_model_path

    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    check_hub_id.cache_clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ZsearchError, match="nosuch-org/nosuch-model: not a local folder and not in the Hugging "
                                           "Face cache, and HF_HUB_OFFLINE is set"):
        loadable_model_path("nosuch-org/nosuch-model")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    check_hub_id.cache_clear()
    # no network here (CI): "cannot be reached"; with network: the hub has no such model
    with pytest.raises(ZsearchError, match="nosuch-org/nosuch-model: not a local folder, .*(cannot be reached|no such model)"):
        loadable_model_path("nosuch-org/nosuch-model")
    check_hub_id.cache_clear()
