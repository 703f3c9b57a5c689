"""Every command's flags, YAML keys and defaults, pinned in ``tests/golden/flags.txt``.

The options are declared once, as nested dataclass parts (``config/``), and flattened into
flags by ``cli_options``: a change to the nesting must leave every flag, every ``--config``
key (the parameter name), every default and every accepted range exactly as users know them.
The golden file was written from the flat declarations before parts were nested, so a
nesting that drops, renames or re-defaults an option fails here, naming the line.

Regenerate it (only for an intended change, reviewed in the diff) with
``ZSEARCH_WRITE_GOLDEN=1 pytest tests/test_flags_golden.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from zsearch_cli.cli import app
from zsearch_cli.config.ranges import range_for
from zsearch_cli.cli_reference import walk_commands

GOLDEN = Path(__file__).parent / "golden" / "flags.txt"


def flag_lines() -> list[str]:
    """One line per parameter: command, parameter (the YAML key), flags, default, range.
    (The same walk writes docs/reference.md.)"""
    lines = []
    for name, cmd in walk_commands(typer.main.get_command(app)):
        for p in sorted(cmd.params, key=lambda p: p.name):
            flags = " ".join(sorted([*getattr(p, "opts", []), *getattr(p, "secondary_opts", [])]))
            kind = "argument" if p.param_type_name == "argument" else "option"
            default = "REQUIRED" if p.required else repr(p.default)
            rng = range_for(name, p.name)
            lines.append(f"{name} | {p.name} | {kind} {flags} | default {default} | "
                         f"range {rng.describe(why=False) if rng else '-'} | multiple {bool(getattr(p, 'multiple', False))}")
    return lines


def test_every_flag_yaml_key_and_default_is_unchanged():
    lines = flag_lines()
    if os.environ.get("ZSEARCH_WRITE_GOLDEN") == "1":
        GOLDEN.write_text("\n".join(lines) + "\n", encoding="utf-8")
    golden = GOLDEN.read_text(encoding="utf-8").splitlines()
    missing = [line for line in golden if line not in lines]
    extra = [line for line in lines if line not in golden]
    assert not missing and not extra, (
        "the command-line surface changed:\n" + "\n".join([*("- " + m for m in missing), *("+ " + e for e in extra)]))


def test_the_golden_file_covers_every_command():
    # a golden file written from a partial app would pin nothing for the missing commands
    commands = {line.split(" | ")[0] for line in GOLDEN.read_text(encoding="utf-8").splitlines()}
    assert {"train", "eval", "collect", "judge", "serve", "drzero", "solve", "propose", "sft", "simsft",
            "agent serve", "export", "index", "search", "warmup-data"} <= commands
