"""``docs/reference.md``: every command's options, written from their declarations.

Each option is declared once, as a dataclass field (``config/``); ``cli_options.command``
turns the fields into a typer command and keeps them on its callback (``.options``). This
module walks the app's commands and writes one table per command: flags, the ``--config``
key, the default and the accepted range or choices as ``--help`` shows them, the dataclass
that declares the option, and its help text. ``tests/test_reference_docs.py`` fails when the
page is stale, so the page cannot drift from the flags.

    python -m zsearch_cli.cli_reference            # (re)write docs/reference.md
    python -m zsearch_cli.cli_reference --check    # exit 1 naming the first stale line

Light on purpose: the CLI is imported only when a page is rendered (no torch either way). A
``cli_`` module: it reads the typer app, which no library module may import
(``tests/test_config_parts.py``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Iterator

PAGE = Path("docs/reference.md")
REGENERATE = "python -m zsearch_cli.cli_reference"


def walk_commands(group: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every command of a click group and of its subgroups, sorted, as ``("agent serve", cmd)``:
    the name ``cli_options.command`` registers its ranges under."""
    for name, cmd in sorted(group.commands.items()):
        if hasattr(cmd, "commands"):
            yield from walk_commands(cmd, f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", cmd


def click_app() -> Any:
    """The ``zsearch`` app as click builds it (what ``--help`` and the range check read)."""
    import typer

    from zsearch_cli.cli import app

    return typer.main.get_command(app)


# ----------------------------------------------------------------------------- Markdown text

_CODE = re.compile(r"(`[^`]*`)")


def escape(text: str) -> str:
    """``text`` (help text, where backticks mark code) as Markdown that renders as written,
    in a table cell too: outside code, what Markdown or HTML would read as markup is escaped;
    a code span holding ``|`` becomes plain text, since renderers disagree on ``\\|`` in code
    (GitHub drops the backslash, Python-Markdown shows it)."""
    out = []
    for piece in _CODE.split(" ".join(text.split())):
        if _CODE.fullmatch(piece) and "|" not in piece:
            out.append(piece)
            continue
        piece = re.sub(r"([\\|*`])", r"\\\1", piece)
        # only what HTML would read: a tag's "<" (<answer>) and an entity's "&" ("<= 1" stays)
        piece = re.sub(r"<(?=[A-Za-z/!?])", "&lt;", re.sub(r"&(?=#?\w+;)", "&amp;", piece))
        # "_" emphasises only at a word's edge (snake_case reads as written)
        out.append(re.sub(r"(?<!\w)_|_(?!\w)", r"\\_", piece))
    return "".join(out)


def _code(text: str) -> str:
    return f"`{text}`" if "`" not in text and "|" not in text else escape(text)


def default_text(param: Any) -> str:
    """The default as a ``--config`` file writes it: ``true``, ``0.001``, ``runs/index``;
    "required"; "unset" where the help's brackets, if any, say what that means."""
    if param.required:
        return "required"
    value = param.default
    if value is None or value == () or value == []:
        return "unset"
    if isinstance(value, bool):
        return _code(str(value).lower())
    if isinstance(value, str) and value == "":
        return '`""`'
    return _code(str(value))


def help_text(name: str, param: Any) -> str:
    """The help as ``--help`` shows it, less the "(accepts …)" that ``show_ranges_in_help``
    appends: the table has a column for it."""
    from zsearch_cli.config.ranges import range_for

    text = param.help or ""
    rule = range_for(name, param.name)
    if rule is not None:
        text = text.removesuffix(f" (accepts {rule.describe(why=False)})")
    return text


def _flags(param: Any) -> str:
    if param.param_type_name == "argument":
        return f"`{param.name.upper()}` (argument)"
    flags = " / ".join(f"`{f}`" for f in [*param.opts, *param.secondary_opts])
    return flags + (" (repeatable)" if getattr(param, "multiple", False) else "")


def _sort_key(param: Any) -> tuple[bool, str]:
    # arguments first, as the usage line shows them; then options by their main flag
    first = param.name if param.param_type_name == "argument" else param.opts[0].lstrip("-")
    return param.param_type_name != "argument", first.lower()


# ----------------------------------------------------------------------------- the page

COMMAND_LINE_ONLY = {"config", "print_config"}
"""Parameters every stage command adds beside its dataclasses' options: no ``--config`` key."""


def command_section(name: str, cmd: Any) -> list[str]:
    """``## zsearch NAME``, the command's first help paragraph and its options' table."""
    from zsearch_cli.config.ranges import range_for

    options = {o.param: o for o in getattr(cmd.callback, "options", {}).values()}
    summary = escape((cmd.help or "").strip().split("\n\n")[0])
    config_file = any(p.name == "config" for p in cmd.params)
    if not config_file:
        summary += " No `--config` file: flags only."
    lines = [f"## zsearch {name}", "", summary, "",
             "| flags | `--config` key | default | accepts | part | help |", "|---|---|---|---|---|---|"]
    for p in sorted(cmd.params, key=_sort_key):
        opt = options.get(p.name)
        if p.name in COMMAND_LINE_ONLY or not config_file:
            key = "—"
        else:
            key = f"`{p.name}`" + (f" or `{opt.name}`" if opt is not None and opt.name != p.name else "")
        part = opt.owner.__name__ if opt is not None else "—"
        rule = range_for(name, p.name)
        accepts = escape(rule.describe()) if rule is not None else "—"
        lines.append(f"| {_flags(p)} | {key} | {default_text(p)} | {accepts} | {part} | {escape(help_text(name, p))} |")
    return [*lines, ""]


def parts_table(commands: list[tuple[str, Any]]) -> list[str]:
    """Each dataclass the "part" column names, with the file that declares it."""
    owners = {o.owner for _, cmd in commands for o in getattr(cmd.callback, "options", {}).values()}
    lines = ["| part | declared in |", "|---|---|"]
    for cls in sorted(owners, key=lambda c: c.__name__):
        path = cls.__module__.removeprefix("zsearch_cli.").replace(".", "/") + ".py"
        lines.append(f"| {cls.__name__} | `src/zsearch_cli/{path}` |")
    return [*lines, ""]


def render() -> str:
    """The whole page, deterministic: commands and options sorted."""
    commands = list(walk_commands(click_app()))
    head = [
        "# Option reference",
        "",
        f"Generated from the option declarations by `{REGENERATE}` (`make docs` runs it); "
        "change the declarations, not this page.",
        "",
        "One table per command. **flags**: what the command line takes (`--x` / `--no-x` for a "
        "switch). **`--config` key**: the key a YAML file given to `--config` sets it with (a "
        "flag's name without dashes works too; the command line wins over the file). **default**: "
        "as the file writes it; *unset* means the help's brackets, if any, say what happens. "
        "**accepts**: the range or choices checked before any work starts. **part**: the "
        "dataclass that declares the option, once, for every command that holds it.",
        "",
        "Commands: " + ", ".join(f"[{n}](#zsearch-{n.replace(' ', '-')})" for n, _ in commands) + ".",
        "",
    ]
    body = [line for name, cmd in commands for line in command_section(name, cmd)]
    tail = ["## Parts", "", "Where each part is declared (its fields' docstrings are the help texts).", "",
            *parts_table(commands)]
    return "\n".join([*head, *body, *tail]).rstrip("\n") + "\n"


def first_difference(old: str, new: str) -> str | None:
    """``None`` when equal, else the first differing line of the two, numbered."""
    a, b = old.splitlines(), new.splitlines()
    for i in range(max(len(a), len(b))):
        left = a[i] if i < len(a) else "(end of file)"
        right = b[i] if i < len(b) else "(end of file)"
        if left != right:
            return f"line {i + 1}:\n  on disk:   {left}\n  generated: {right}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name if __spec__ else 'zsearch_cli.cli_reference'}",
                                     description="Write the option reference from the declarations.")
    parser.add_argument("--out", type=Path, default=PAGE, help=f"the page [{PAGE}]")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        old = args.out.read_text(encoding="utf-8") if args.out.is_file() else ""
        diff = first_difference(old, text)
        if diff is None:
            return 0
        print(f"{args.out} is stale ({REGENERATE} rewrites it); first difference at {diff}", file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
