"""Options from YAML files and the command line, resolved in one place.

Every stage command takes ``--config FILE``. The YAML's keys are the command's option
names (``topk`` or ``top-k`` style both work); they become click's ``default_map``, so a
flag given on the command line always wins over the file. The resolved options are what
stages write into their output's Parquet metadata.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
import yaml
from rich.markup import escape
from typer.core import TyperGroup

from zsearch_cli.errors import ZsearchError, holds_withheld, install_log_redaction, one_line, stored_config, stored_value
from zsearch_cli.progress import Stopped, err_console
from zsearch_cli.config.ranges import ANY, range_for

try:  # recent typer ships its own copy of click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover - older typer on the real click
    from click import get_current_context
    from click.exceptions import ClickException, NoArgsIsHelpError

install_log_redaction()  # every command imports this module: no log line shows a secret

CONFIG_FILE = "zsearch.config_file"
CONFIG_ALIASES: dict[str, dict[str, str]] = {}
"""Per command (:func:`command_key`): extra config-file keys -> parameter name (a field's name
when its flag differs, as ``algo_args`` for ``--algo-arg``: the name older metadata recorded)."""
ARGV: list[str] = []
"""The command line of the running ``zsearch`` command (for the header of OUT/config.yaml)."""
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
    for key, name in CONFIG_ALIASES.get(command_key(ctx), {}).items():
        aliases.setdefault(key, name)
    multiple = {p.name for p in ctx.command.params if getattr(p, "multiple", False)}
    for key, v in list(options.items()):  # {baseline: rloo} (older metadata) -> ["baseline=rloo"]
        if isinstance(v, dict) and aliases.get(key) in multiple:
            options[key] = [f"{k}={_scalar(x)}" for k, x in v.items()]
    unknown = sorted(k for k in options if k not in aliases)
    if unknown:
        raise typer.BadParameter(f"{value}: unknown option(s) for '{ctx.info_name}': {', '.join(unknown)}")
    ctx.default_map = {**(ctx.default_map or {}), **{aliases[k]: v for k, v in options.items()}}
    ctx.meta[CONFIG_FILE] = value
    ctx.meta[CONFIG_KEYS] = {aliases[raw.replace("-", "_")]: raw for raw in _raw_keys(value)}
    return value


def _scalar(value: Any) -> str:
    """A value as the YAML scalar text ``KEY=VALUE`` options read back (``False`` -> ``false``)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


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
    """Refuse a number outside its declared range, or a text option's value outside its
    declared choices (both declared on its field, ``config.fields.option``), naming the flag,
    or the config file and key that set it."""
    command = command_key(ctx)
    params = {p.name: p for p in ctx.command.params} if ctx is not None else {}
    for name, value in values.items():
        rule = range_for(command, name)
        if rule is None or rule.admits(value):
            continue
        where = _source(ctx, name)
        flag = _flag(params[name]) if name in params else f"--{name.replace('_', '-')}"
        raise ZsearchError(rule.refusal(f"{where} ({flag})" if where != "flag" else flag, value))


def refuse_withheld(ctx: Any, values: dict[str, Any]) -> None:
    """Refuse a value holding ``***`` where a record withheld a key (errors.stored_value): a
    replayed OUT/config.yaml, or a command line copied from its header, would otherwise send
    ``***`` as the key. One line naming the option and how to give the key."""
    params = {p.name: p for p in ctx.command.params} if ctx is not None else {}
    for name, value in values.items():
        if not holds_withheld(value):
            continue
        where = _source(ctx, name)
        flag = _flag(params[name]) if name in params else f"--{name.replace('_', '-')}"
        if where != "flag":
            raise ZsearchError(f"{where} ({flag}) was recorded with its key withheld (***): give {flag} again on "
                               f"the command line, key included (it overrides the file){_key_hint(name, value)}")
        raise ZsearchError(f"{flag} holds ***, a key withheld when a run was recorded: give the key itself"
                           f"{_key_hint(name, value)}")


LLM_ENDPOINT_OPTIONS = ("judge_url", "solver_url")
"""Options naming an OpenAI-compatible endpoint, which llm_client.LLMClient serves; so does a
``sim+http://…`` search."""


def _key_hint(name: str, value: Any) -> str:
    """Where the backend of option ``name`` also reads a key from the environment, say so."""
    if name in LLM_ENDPOINT_OPTIONS or str(value).strip().startswith("sim+"):
        return ", or leave the URL's user:password@ out and set OPENAI_API_KEY (sent as a bearer key)"
    return ""


class OneLineErrors(TyperGroup):
    """The app's group: a usage error (a bad value, an unknown flag, a missing argument, a
    config value of the wrong type) is one ``error:`` line and exit status 2, like every
    other zsearch error, instead of click's usage box."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        show_ranges_in_help(self.commands)

    def main(self, args: Any = None, prog_name: Any = None, complete_var: Any = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        from zsearch_cli.progress import quiet_third_party

        ARGV[:] = [str(a) for a in (sys.argv[1:] if args is None else args)]
        quiet_third_party()  # in a log file, no tqdm bars from transformers / huggingface_hub
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
    """Append each option's accepted range or choices to its help text, so ``--help`` says
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


PrintConfigOption = typer.Option(
    False,
    "--print-config",
    help="Print the resolved options as YAML (what OUT/config.yaml records; --config reads it) and exit.",
)


def resolved_options(ctx: typer.Context) -> dict[str, Any]:
    """The command's fully resolved options (after YAML and flags), JSON-friendly, as outputs
    record them and compare them with an earlier output's: secrets withheld (errors.stored_config)."""
    return stored_config({k: (str(v) if isinstance(v, Path) else v) for k, v in ctx.params.items()
                          if k not in ("config", "print_config")})


def one_line_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a CLI command: its numeric options are checked against their ranges first, and
    a :class:`ZsearchError` becomes one red line and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            ctx = get_current_context(silent=True)
            if not kwargs.get("print_config"):
                refuse_withheld(ctx, kwargs)
            check_ranges(ctx, kwargs)  # before any model loads
            result = fn(*args, **kwargs)
            if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
                # one of `accelerate launch`'s processes, its work done and written: leave without the
                # interpreter's teardown, where a C++ thread of the process group can abort (-6) a run
                # that completed
                _leave_now(0)
            return result
        except ZsearchError as err:
            print_error(str(err))
            raise typer.Exit(2) from None
        except Stopped as stop:  # SIGTERM / SIGINT: one line, resumable state, 128 + signal
            _print_line(str(stop))
            if stop.hard_exit:  # an abandoned step: threads may still wait on calls nobody reads
                _leave_now(stop.code)
            sys.exit(stop.code)
        except KeyboardInterrupt:
            err_console.print("[yellow]interrupted[/]")
            sys.exit(130)

    return wrapper


def _leave_now(code: int) -> None:
    """Exit without the interpreter's teardown, which would join the threads of an abandoned
    step (a search call in flight for minutes, a collective whose peers left); what was
    written is flushed first. The state that matters is already on disk."""
    import logging

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    os._exit(code)


def _print_line(text: str) -> None:
    try:
        sys.stderr.write(one_line(text) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


# ----------------------------------------------------------------------------- OUT/config.yaml

RUN_CONFIG = "config.yaml"


def config_yaml(values: dict[str, Any]) -> str:
    """The resolved options as a YAML mapping that ``--config`` accepts as is (parameter names
    as keys, paths as strings, tuples as lists)."""
    def plain(v: Any) -> Any:
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)

    # a run folder is shared: a key in a --search URL or spec is written as *** (a replay asks for it)
    return yaml.safe_dump(stored_config({k: plain(v) for k, v in values.items()}), sort_keys=False,
                          default_flow_style=False)


RunConfigRecord = tuple[Path, Optional[str], bool, dict[str, tuple[int, int]]]
"""What :func:`restore_run_config` needs: the path, its previous text, whether the folder was created, the folder's state."""


def write_run_config(out: Path, body: str, command: str) -> Optional[RunConfigRecord]:
    """Write OUT/config.yaml atomically: a comment header (version, command line), then
    ``body``. Returns what :func:`restore_run_config` needs to undo it."""
    import os
    import shlex

    from zsearch_cli import __version__
    from zsearch_cli.errors import redact

    out = Path(out)
    created = not out.exists()
    path = out / RUN_CONFIG
    try:
        out.mkdir(parents=True, exist_ok=True)
        previous = path.read_text(encoding="utf-8") if path.is_file() else None
        # the recorded --out is this folder, which a fresh run refuses once it holds results: a
        # replay names a new one (issue 36.11)
        header = (f"# zsearch {__version__}: the resolved options of this run; replay it into a new folder with\n"
                  f"#   zsearch {command} --config {path} --out NEW_FOLDER\n"
                  + ("# a key was withheld (***): give its option again on the command line with the key\n"
                     if holds_withheld(yaml.safe_load(body)) else "")
                  + f"# command line: {redact(shlex.join(['zsearch', *map(stored_value, ARGV)]))}\n")
        tmp = out / f".{RUN_CONFIG}.{os.getpid()}.tmp"
        tmp.write_text(header + body, encoding="utf-8")
        tmp.replace(path)
    except OSError as err:
        raise ZsearchError(f"{path}: cannot write the run's config ({err.strerror})") from None
    return path, previous, created, folder_state(out)


def folder_state(out: Path) -> dict[str, tuple[int, int]]:
    """What a run has written under ``out``: (size, mtime) of every file, by relative path,
    except the run's own config, logs and hidden temporaries (none of them is work)."""
    state: dict[str, tuple[int, int]] = {}
    for root, dirs, files in os.walk(out):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), out)
            if rel == RUN_CONFIG or name.startswith(".") or name.endswith(".log"):
                continue
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            state[rel] = (st.st_size, st.st_mtime_ns)
    return state


def restore_run_config(record: Optional[RunConfigRecord]) -> None:
    """Undo :func:`write_run_config` when the command refused to run, i.e. wrote nothing in
    the folder (:func:`folder_state` unchanged): the folder's own run keeps its config. A run
    that failed after doing work (a train stopped by the collapse guard, an eval whose
    retrievers died after some rows) keeps the config that would replay it."""
    if record is None:
        return
    path, previous, created, before = record
    if folder_state(path.parent) != before:
        return
    try:
        if previous is not None:
            path.write_text(previous, encoding="utf-8")
        else:
            path.unlink(missing_ok=True)
            if created and not any(path.parent.iterdir()):
                path.parent.rmdir()
    except OSError:
        pass
