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
from typer.core import TyperGroup

from zsearch_cli.errors import ZsearchError, install_log_redaction, one_line
from zsearch_cli.ranges import ANY, range_for

try:  # recent typer ships its own copy of click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover - older typer on the real click
    from click import get_current_context
    from click.exceptions import ClickException, NoArgsIsHelpError

err_console = Console(stderr=True)
install_log_redaction()  # every command imports this module: no log line shows a secret

CONFIG_FILE = "zsearch.config_file"
CONFIG_KEYS = "zsearch.config_keys"
"""``ctx.meta`` keys: the ``--config`` file and, per parameter, the key it was given as."""


def print_error(message: str) -> None:
    """The one way an error reaches the user: ``error: …`` on one line, secrets redacted."""
    err_console.print(f"[bold red]error:[/] {escape(one_line(message))}", highlight=False, soft_wrap=True)


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
    ctx.meta[CONFIG_FILE] = value
    ctx.meta[CONFIG_KEYS] = {aliases[raw.replace("-", "_")]: raw for raw in _raw_keys(value)}
    return value


def _raw_keys(path: Path) -> list[str]:
    """The config's keys as the user wrote them (``batch-size``), in file order."""
    with open(path, encoding="utf-8") as fh:
        return [str(k) for k in (yaml.safe_load(fh) or {})]


def _source(ctx: Any, name: str) -> str:
    """Where the value of parameter ``name`` came from: ``'flag'``, or ``"FILE: key 'k'"``
    when the --config file gave it."""
    source = ctx.get_parameter_source(name) if ctx is not None else None
    if source is not None and source.name == "DEFAULT_MAP" and CONFIG_FILE in ctx.meta:
        key = ctx.meta.get(CONFIG_KEYS, {}).get(name, name)
        return f"{ctx.meta[CONFIG_FILE]}: key '{key}'"
    return "flag"


def _flag(param: Any) -> str:
    return next((o for o in getattr(param, "opts", []) if o.startswith("--")), param.name.upper())


def command_key(ctx: Any) -> str:
    """The name :func:`cli_options.command` registered the running command's ranges under:
    ``serve`` for ``zsearch serve``, ``agent serve`` for a subcommand of ``zsearch agent``."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name)
        ctx = ctx.parent
    return " ".join(reversed(names)) or (ctx.info_name if ctx is not None else "") or ""


def check_ranges(ctx: Any, values: dict[str, Any]) -> None:
    """Refuse a numeric option outside its declared range (declared on its field,
    :func:`cli_options.option`),
    naming the flag, or the config file and key that set it."""
    command = command_key(ctx)
    params = {p.name: p for p in ctx.command.params} if ctx is not None else {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        rng = range_for(command, name)
        if rng is None or rng.contains(value):
            continue
        where = _source(ctx, name)
        flag = _flag(params[name]) if name in params else f"--{name.replace('_', '-')}"
        prefix = f"{where} ({flag})" if where != "flag" else flag
        raise ZsearchError(f"{prefix} must be {rng.describe()}, got {value!r}")


class OneLineErrors(TyperGroup):
    """The app's group: a usage error (a bad value, an unknown flag, a missing argument, a
    config value of the wrong type) is one ``error:`` line and exit status 2, like every
    other zsearch error, instead of click's usage box."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        show_ranges_in_help(self.commands)

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NoArgsIsHelpError as err:
            err.show()  # the help text, as asked
            sys.exit(err.exit_code)
        except ClickException as err:
            print_error(_usage_message(err))
            sys.exit(err.exit_code)
        except typer.Abort:
            print_error("aborted")
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def show_ranges_in_help(commands: dict[str, Any], prefix: str = "") -> None:
    """Append each numeric option's accepted range to its help text, so ``--help`` says
    what the check in :func:`check_ranges` will accept (``prefix``: a subgroup's name)."""
    for name, cmd in commands.items():
        for p in getattr(cmd, "params", []):
            rng = range_for(prefix + name, p.name) if getattr(p, "help", None) is not None else None
            if rng is not None and rng != ANY and "(accepts " not in p.help:
                p.help = f"{p.help.rstrip()} (accepts {rng.describe(why=False)})"


def _usage_message(err: Any) -> str:
    ctx, param = getattr(err, "ctx", None), getattr(err, "param", None)
    command = f"{ctx.info_name}: " if ctx is not None and ctx.parent is not None else ""
    if param is not None and ctx is not None and getattr(param, "name", None):
        where = _source(ctx, param.name)
        if where != "flag":
            value = (ctx.default_map or {}).get(param.name)
            return f"{where}: {err.message.rstrip('.')} (got {value!r})"
    return command + err.format_message()


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


def one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a CLI command: its numeric options are checked against their ranges first, and
    a :class:`ZsearchError` becomes one red line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            check_ranges(get_current_context(silent=True), kwargs)  # before any model loads
            return fn(*args, **kwargs)
        except ZsearchError as err:
            print_error(str(err))
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]")
            sys.exit(130)

    return wrapper
