"""docs/reference.md is generated from the option declarations (``zsearch_cli.cli_reference``):
it must be current, and it must say what ``--help`` says, markup and all."""

from __future__ import annotations

import importlib.util
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from zsearch_cli import cli_reference
from zsearch_cli.cli_reference import click_app, first_difference, help_text, main, render, walk_commands

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "reference.md"


def test_the_reference_page_is_current():
    diff = first_difference(PAGE.read_text(encoding="utf-8"), render())
    assert diff is None, f"docs/reference.md is stale: run python -m zsearch_cli.cli_reference ({diff})"


def test_a_changed_default_or_help_makes_the_page_stale(tmp_path, monkeypatch, capsys):
    # the check above must be able to fail: one option's default and another's help change in
    # memory, as an edit of their declarations would change them
    page = tmp_path / "reference.md"
    assert main(["--out", str(page)]) == 0
    group = click_app()
    params = {p.name: p for p in group.commands["train"].params}
    lr = params["lr"].default
    monkeypatch.setattr(params["lr"], "default", 0.5)
    monkeypatch.setattr(cli_reference, "click_app", lambda: group)
    diff = first_difference(page.read_text(encoding="utf-8"), render())
    assert diff is not None and "`--lr`" in diff and "| `0.5` |" in diff.split("generated:")[1], diff

    monkeypatch.setattr(params["lr"], "default", lr)
    monkeypatch.setattr(params["topk"], "help", "Passages per search | planted.")
    assert main(["--check", "--out", str(page)]) == 1
    err = capsys.readouterr().err
    assert "stale" in err and "`--topk`" in err and "Passages per search \\| planted." in err, err


def test_the_check_passes_on_the_page_it_wrote(tmp_path):
    page = tmp_path / "reference.md"
    assert main(["--out", str(page)]) == 0 and main(["--check", "--out", str(page)]) == 0
    assert main(["--check", "--out", str(tmp_path / "missing.md")]) == 1


def test_every_command_has_a_section():
    text = render()
    names = [name for name, _ in walk_commands(click_app())]
    assert {"train", "agent serve", "warmup-data", "drzero"} <= set(names)
    for name in names:
        assert f"\n## zsearch {name}\n" in text
    assert "| `--lr` / `--learning-rate` | `lr` | " in text  # flags, then the --config key


class _Cells(HTMLParser):
    """The text of every table cell of a page, as a browser shows it."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "td":
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None:
            self.cells.append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


@pytest.mark.skipif(importlib.util.find_spec("markdown") is None, reason="Python-Markdown is not installed")
def test_every_help_text_renders_as_written():
    # help texts hold <answer>, "|", "*", "_" and backticks: escaped wrongly, a tag vanishes,
    # a pipe splits the row or a star starts emphasis, and the site says less than --help
    import markdown

    parser = _Cells()
    parser.feed(markdown.markdown(render(), extensions=["tables"]))
    shown = set(parser.cells)
    missing = [f"{name} {p.name}: {help_text(name, p)}" for name, cmd in walk_commands(click_app())
               for p in cmd.params if help_text(name, p)
               and " ".join(re.sub(r"`([^`|]*)`", r"\1", help_text(name, p)).split()) not in shown]
    assert not missing, "help texts the page does not show as written:\n" + "\n".join(missing[:10])
