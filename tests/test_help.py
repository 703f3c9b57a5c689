"""`--help` shows every option's help text whole: rich markup once ate every "[...]" in
them ("Sequences per optimizer step [whole batch]" printed as "Sequences per optimizer
step ."), which hid the defaults those brackets state."""

from __future__ import annotations

import re

import click
import typer
from typer.testing import CliRunner

from zsearch_cli.cli import app


def _commands() -> dict[str, click.Command]:
    group = typer.main.get_command(app)
    return dict(group.commands)  # type: ignore[attr-defined]


def test_every_bracket_in_a_help_text_reaches_help():
    runner = CliRunner()
    checked = 0
    for name, command in _commands().items():
        text = " ".join(runner.invoke(app, [name, "--help"], terminal_width=200).output.split())
        for param in command.params:
            for bracket in re.findall(r"\[[^\]]+\]", getattr(param, "help", None) or ""):
                assert " ".join(bracket.split()) in text, f"zsearch {name} --help lost {bracket!r}"
                checked += 1
    assert checked >= 20  # the help texts do state defaults in brackets


def test_every_option_shows_its_default():
    """A default click cannot show (None: "unset") is stated in brackets in the help text."""
    for name, command in _commands().items():
        for param in command.params:
            if param.name in ("config", "help") or param.required or getattr(param, "is_flag", False):
                continue
            shown = param.default is not None and getattr(param, "show_default", True) is not False
            assert shown or "[" in (param.help or ""), f"zsearch {name} --{param.name}: no default in --help"
