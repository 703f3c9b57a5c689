"""Options from YAML files and the command line, resolved in one place.

Every stage command takes ``--config FILE``. The YAML's keys are the command's option
names (``topk`` or ``top-k`` style both work); they become click's ``default_map``, so a
flag given on the command line always wins over the file. The resolved options are what
stages write into their output's Parquet metadata.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
import yaml
from rich.console import Console
from rich.markup import escape

from zsearch_cli.errors import ZsearchError

err_console = Console(stderr=True)


def load_yaml_options(path: Path) -> dict[str, Any]:
    """Read a YAML mapping of option name -> value; names may use dashes or underscores."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except OSError as err:
        raise ZsearchError(f"{path}: cannot read config ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ZsearchError(f"{path}: not valid YAML ({err})") from None
    if not isinstance(data, dict):
        raise ZsearchError(f"{path}: a config file must be a mapping of option names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _config_callback(ctx: typer.Context, param: Any, value: Optional[Path]) -> Optional[Path]:
    if value is None:
        return None
    try:
        options = load_yaml_options(value)
    except ZsearchError as err:
        raise typer.BadParameter(str(err)) from None
    # A key may be the parameter's name (index_dir) or its flag (index for --index).
    aliases: dict[str, str] = {}
    for p in ctx.command.params:
        aliases[p.name] = p.name
        for opt in getattr(p, "opts", []):
            if opt.startswith("--"):
                aliases[opt[2:].replace("-", "_")] = p.name
    unknown = sorted(k for k in options if k not in aliases)
    if unknown:
        raise typer.BadParameter(f"{value}: unknown option(s) for '{ctx.info_name}': {', '.join(unknown)}")
    ctx.default_map = {**(ctx.default_map or {}), **{aliases[k]: v for k, v in options.items()}}
    return value


ConfigOption = typer.Option(
    None,
    "--config",
    help="YAML file of option values; command-line flags override it.",
    callback=_config_callback,
    is_eager=True,
    exists=False,
    dir_okay=False,
)


def resolved_options(ctx: typer.Context) -> dict[str, Any]:
    """The command's fully resolved options (after YAML and flags), JSON-friendly."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in ctx.params.items() if k != "config"}


def stage(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a CLI command so a :class:`ZsearchError` becomes one red line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ZsearchError as err:
            err_console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]")
            sys.exit(130)

    return wrapper
