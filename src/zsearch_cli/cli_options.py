"""Typer commands generated from option dataclasses (the cleanrl ``Args`` / TRL
``HfArgumentParser`` pattern): the typer side only. The declarations live in ``config/``
(no typer there): each option is a dataclass field, its docstring the help text, and
``option(...)`` its flags, parameter name, range and aliases; parts nest
(``config.fields.part``).

:func:`command` flattens a command's dataclasses, parts included, into one flag per option
(every flag and YAML key as it was before the parts nested: ``tests/golden/flags.txt``) and
turns them into a typer command whose body gets only the values the user set (command line,
environment or ``--config`` file, per click's parameter source), by flat name; the dataclass
defaults, or a preset (``presets.py``), fill in the rest.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from zsearch_cli.cli_base import (CONFIG_ALIASES, ConfigOption, PrintConfigOption, config_yaml, one_line_errors,
                                  restore_run_config, write_run_config)
from zsearch_cli.config.fields import Option, narrowed
from zsearch_cli.config.ranges import RANGES, Range
from zsearch_cli.errors import ZsearchError
from zsearch_cli.progress import StopSignals

# ----------------------------------------------------------------------------- commands

_EXPLICIT = {"COMMANDLINE", "ENVIRONMENT", "DEFAULT_MAP"}
"""click ``ParameterSource`` names that mean "the user set it" (compared by name: typer may
bundle its own click, whose enum is a different class from ``click.core.ParameterSource``)."""


def user_set(ctx: Any, param: str) -> bool:
    """Whether the user gave parameter ``param`` (command line, environment or --config)."""
    return getattr(ctx.get_parameter_source(param), "name", None) in _EXPLICIT


def command_options(*classes: type, exclude: tuple[str, ...] = (),
                    defaults: dict[str, Any] | None = None) -> dict[str, Option]:
    """The options of a command made of ``classes``: their fields (their parts' flattened) by
    name, in order, the first class's spelling winning. ``exclude`` names options, or whole
    parts by their field name (``"validation"``), that the command has no use for: a command
    narrows by exclusion, so an option added to a part reaches it."""
    out: dict[str, Option] = {}
    for cls in classes:
        for name, opt in narrowed(cls, exclude).items():
            out.setdefault(name, opt)
    for name, value in (defaults or {}).items():
        if name in out:
            out[name] = dataclasses.replace(out[name], default=value)
    return out


def command(*classes: type, name: str, exclude: tuple[str, ...] = (),
            defaults: dict[str, Any] | None = None, ranges: dict[str, Range] | None = None,
            argument: tuple[str, str, str] | None = None, config_file: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``run(ctx, given)`` becomes the typer command ``name`` whose options are
    the fields of ``classes``. ``given`` holds only the fields the user set, by field name
    (values converted as the field says). ``defaults`` shows a preset's values as the
    defaults in ``--help`` (the preset applies them; ``given`` never holds them); ``ranges``
    narrows a field's range for this command; ``argument`` (field, name, help) is a field this
    command takes as its required positional argument NAME."""
    opts = command_options(*classes, exclude=exclude, defaults=defaults)
    if argument is not None:
        field_name, param, help_text = argument
        opts[field_name] = dataclasses.replace(opts[field_name], argument=True, default=dataclasses.MISSING, param=param,
                                               help=help_text)
    by_param = {o.param: o for o in opts.values()}
    RANGES[name] = {o.param: (ranges or {}).get(o.name, o.range) for o in opts.values()
                    if (ranges or {}).get(o.name, o.range) is not None}
    CONFIG_ALIASES[name] = {o.name: o.param for o in opts.values() if o.name != o.param}

    def decorate(run: Callable[..., Any]) -> Callable[..., Any]:
        params = [inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
        for o in sorted(opts.values(), key=lambda o: not o.argument):
            default = ... if o.required else None if o.convert and o.default in ({}, []) else o.default
            help_text = o.help
            if default not in (None, ...):
                # "[runs/index]" says what None means; with a real default, typer shows it already
                help_text = re.sub(r"\s*\[[^\]]*\]\.?\s*$", ".", help_text).replace("..", ".")
            info = (typer.Argument(default, help=help_text) if o.argument
                    else typer.Option(default, *o.flags, help=help_text))
            params.append(inspect.Parameter(o.param, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=info,
                                            annotation=o.annotation))
        if config_file:
            params.append(inspect.Parameter("config", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            default=ConfigOption, annotation=Optional[Path]))
            params.append(inspect.Parameter("print_config", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                            default=PrintConfigOption, annotation=bool))

        def callback(ctx: typer.Context, **values: Any) -> Any:
            values.pop("config", None)
            print_config = values.pop("print_config", False)
            given = {}
            for param, value in values.items():
                o = by_param[param]
                if user_set(ctx, param):
                    given[o.name] = o.convert(value) if o.convert else value
            if not config_file:
                return run(ctx, given)
            body = config_yaml(recorded_options(ctx, values, given, by_param, defaults))
            if print_config:
                typer.echo(body, nl=False)
                return None
            out = values.get("out")
            record = None
            if name in RUN_FOLDERS and out is not None and Path(out).suffix not in FILE_SUFFIXES:
                record = write_run_config(Path(out), body, name)
            try:
                if name not in STOP_ON_SIGNAL:
                    return run(ctx, given)
                with StopSignals(immediate=STOP_ON_SIGNAL[name] == "now"):
                    return run(ctx, given)
            except ZsearchError:  # refused before any work: the folder keeps its own run's config
                restore_run_config(record)
                raise

        callback.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        callback.__annotations__ = {p.name: p.annotation for p in params}
        callback.__name__ = run.__name__
        callback.__qualname__ = run.__qualname__
        callback.__doc__ = run.__doc__
        callback.__module__ = run.__module__
        callback.options = opts  # type: ignore[attr-defined]
        return one_line_errors(callback)

    return decorate


RUN_FOLDERS = {"train", "eval", "sft", "simsft", "collect", "judge", "solve", "propose", "drzero"}
"""Commands whose ``--out`` is a run folder: they write OUT/config.yaml at the start (a
``--out`` naming a file, as ``propose --generate-only``'s, gets none)."""


FILE_SUFFIXES = {".parquet", ".jsonl", ".json", ".gz", ".csv", ".txt"}


STOP_ON_SIGNAL = {"train": "abandon the step", "solve": "abandon the step", "eval": "now"}
"""Commands that turn SIGTERM / SIGINT into one line and resumable state (progress.py):
training abandons the running step and writes the last completed one when a checkpoint is due
(train/signals.py), eval stops at once (its rows are written after every batch)."""


def recorded_options(ctx: Any, values: dict[str, Any], given: dict[str, Any], by_param: dict[str, Option],
                     defaults: dict[str, Any] | None) -> dict[str, Any]:
    """What OUT/config.yaml and ``--print-config`` hold: every option's resolved value by
    parameter name (what ``--config`` reads back), except those left to a preset (the
    command's own, or ``--preset``'s) that the user did not set: replaying the file then
    applies the preset the same way (its simulator-only keys included)."""
    from zsearch_cli.presets import preset_values

    try:
        preset = set(preset_values(given.get("preset"))) if given.get("preset") else set()
    except ZsearchError:
        preset = set()
    preset |= set(defaults or {})
    return {param: value for param, value in values.items()
            if user_set(ctx, param) or (by_param[param].name not in preset and value is not None)}


