"""Typer commands generated from option dataclasses: every option is declared once, as a
dataclass field, and each command's flags, defaults, help texts and accepted ranges come
from its dataclasses (the cleanrl ``Args`` / TRL ``HfArgumentParser`` pattern).

A field's help is its docstring (the string literal under it), or ``option(help=...)``.
``option(...)`` also carries what only the command line needs: the flags (``--index`` for
the field ``index``), the parameter name recorded in Parquet metadata, the accepted
:class:`Range`, and aliases (the names TRL users know). A class that composes parts may
change a part's default by declaring the field again with a new default only; the help,
flags and range stay those of the first declaration.

:func:`command` turns dataclasses into a typer command whose body gets only the values the
user set (command line, environment or ``--config`` file, per click's parameter source);
the dataclass defaults, or a preset (``presets.py``), fill in the rest.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from zsearch_cli.errors import ZsearchError
from zsearch_cli.progress import StopSignals
from zsearch_cli.cli_base import (CONFIG_ALIASES, ConfigOption, PrintConfigOption, config_yaml, one_line_errors,
                                 restore_run_config, write_run_config)
from zsearch_cli.ranges import (ANY, AT_LEAST_0, AT_LEAST_1, FRACTION, INF, POSITIVE, RANGES,  # noqa: F401 (declarations import them here)
                                Range, range_for)

# ----------------------------------------------------------------------------- field declarations

META = "zsearch"


def option(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, help: str | None = None,
           flags: tuple[str, ...] = (), param: str | None = None, range: Range | None = None,
           argument: bool = False, cli_type: Any = None, convert: Callable[[Any], Any] | None = None,
           aliases: tuple[str, ...] = (), required: bool = False) -> Any:
    """A dataclass field with what the command line needs beside its default: ``flags``
    (default ``--name``), ``param`` (the typer parameter name, recorded in metadata; default
    the field name), ``range``, ``argument`` (positional), ``cli_type``/``convert`` (when the
    flag's type differs from the field's), ``aliases`` (extra flag and YAML key names) and
    ``required`` (the command line must give it, though the library has a default)."""
    meta = dict(help=help, flags=tuple(flags), param=param, range=range, argument=argument,
                cli_type=cli_type, convert=convert, aliases=tuple(aliases), required=required)
    kwargs: dict[str, Any] = {"metadata": {META: {k: v for k, v in meta.items() if v}}}
    if factory is not dataclasses.MISSING:
        kwargs["default_factory"] = factory
    elif default is not dataclasses.MISSING:
        kwargs["default"] = default
    return dataclasses.field(**kwargs)


@functools.lru_cache(maxsize=None)
def _docstrings(cls: type) -> dict[str, str]:
    """``{field: docstring}`` of the fields ``cls`` itself declares (the string under each)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    out = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
            out[node.target.id] = " ".join(nxt.value.value.split())
    return out


@dataclass(frozen=True)
class Option:
    """One field of a command's dataclass, as the command line sees it."""

    name: str
    owner: type
    """The class that first declares the field: where the option is declared, once."""
    annotation: Any
    default: Any
    help: str
    flags: tuple[str, ...]
    param: str
    range: Range | None
    argument: bool
    convert: Callable[[Any], Any] | None

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING


def _owner(cls: type, name: str) -> type:
    meta = cls.__dataclass_fields__[name].metadata.get(META, {})
    return meta.get("owner") or next(c for c in reversed(cls.__mro__)
                                     if name in c.__dict__.get("__annotations__", {}))


def _cli_annotation(annotation: Any) -> Any:
    """``int | None`` -> ``Optional[int]`` (typer reads typing's spelling)."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        return Optional[rest[0]] if len(rest) == 1 else annotation
    return annotation


def fields_of(cls: type) -> dict[str, Option]:
    """Every field of ``cls`` (its own and its parts') as an :class:`Option`."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        owner = _owner(cls, f.name)
        meta = dict(owner.__dataclass_fields__[f.name].metadata.get(META, {}))
        help_text = meta.get("help") or next((d[f.name] for c in (*cls.__mro__, owner)
                                              if f.name in (d := _docstrings(c))), "")
        default = (dataclasses.MISSING if meta.get("required") else f.default
                   if f.default is not dataclasses.MISSING else f.default_factory()
                   if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        param = meta.get("param", f.name)
        annotation = _cli_annotation(meta.get("cli_type") or hints[f.name])
        names = (f.name, *meta.get("aliases", ()))
        flags = meta.get("flags") or tuple(f"--{n.replace('_', '-')}" + (f"/--no-{n.replace('_', '-')}"
                                                                          if annotation is bool else "")
                                           for n in names[:1])
        flags = (*flags, *(f"--{n.replace('_', '-')}" for n in names[1:]))
        out[f.name] = Option(f.name, owner, annotation, default,
                             help_text, flags, param, meta.get("range"), meta.get("argument", False),
                             meta.get("convert"))
    return out


# ----------------------------------------------------------------------------- commands

_EXPLICIT = {"COMMANDLINE", "ENVIRONMENT", "DEFAULT_MAP"}
"""click ``ParameterSource`` names that mean "the user set it" (compared by name: typer may
bundle its own click, whose enum is a different class from ``click.core.ParameterSource``)."""


def user_set(ctx: Any, param: str) -> bool:
    """Whether the user gave parameter ``param`` (command line, environment or --config)."""
    return getattr(ctx.get_parameter_source(param), "name", None) in _EXPLICIT


def command_options(*classes: type, only: tuple[str, ...] | None = None, exclude: tuple[str, ...] = (),
                    defaults: dict[str, Any] | None = None) -> dict[str, Option]:
    """The options of a command made of ``classes``: their fields by name, in order, the
    first class's spelling winning (a field two classes share must have one declaration)."""
    out: dict[str, Option] = {}
    for cls in classes:
        for name, opt in fields_of(cls).items():
            if name in exclude or (only is not None and name not in only) or name in out:
                continue
            out[name] = opt
    for name, value in (defaults or {}).items():
        if name in out:
            out[name] = dataclasses.replace(out[name], default=value)
    return out


def command(*classes: type, name: str, only: tuple[str, ...] | None = None, exclude: tuple[str, ...] = (),
            defaults: dict[str, Any] | None = None, ranges: dict[str, Range] | None = None,
            argument: tuple[str, str, str] | None = None, config_file: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: ``run(ctx, given)`` becomes the typer command ``name`` whose options are
    the fields of ``classes``. ``given`` holds only the fields the user set, by field name
    (values converted as the field says). ``defaults`` shows a preset's values as the
    defaults in ``--help`` (the preset applies them; ``given`` never holds them); ``ranges``
    narrows a field's range for this command; ``argument`` (field, name, help) is a field this
    command takes as its required positional argument NAME."""
    opts = command_options(*classes, only=only, exclude=exclude, defaults=defaults)
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


STOP_ON_SIGNAL = {"train": "between steps", "solve": "between steps", "eval": "now"}
"""Commands that turn SIGTERM / SIGINT into one line and resumable state (progress.py):
training stops between two steps (checkpointing when due), eval at once (its rows are written
after every batch)."""


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


def build(cls: type, given: dict[str, Any], **fixed: Any) -> Any:
    """``cls`` from the values the user set (fields of ``cls`` only) and ``fixed`` ones."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in {**given, **fixed}.items() if k in names})


class Record:
    """Mixin for an options dataclass that is saved (checkpoints, metadata, lineage)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly fields (paths as strings)."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """The options :meth:`to_dict` wrote (other keys are left out): a path field gets a
        Path back, a str field a str."""
        hints = typing.get_type_hints(cls)
        kw = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in data:
                continue
            value, kinds = data[f.name], (hints[f.name], *typing.get_args(hints[f.name]))
            if value is not None and Path in kinds:
                value = Path(value)
            elif isinstance(value, Path) and str in kinds:
                value = str(value)
            kw[f.name] = value
        return cls(**kw)


def project(obj: Any, cls: type, **fixed: Any) -> Any:
    """``cls`` made of the fields of ``obj`` it shares (a command's options -> a library config)."""
    return cls(**{**{f.name: getattr(obj, f.name) for f in dataclasses.fields(cls) if hasattr(obj, f.name)}, **fixed})


def uses(part: type, *names: str, **defaults: Any) -> Callable[[type], type]:
    """Class decorator (below ``@dataclass``): give the class the fields ``names`` of the
    dataclass ``part`` (all of them when none are named), with ``defaults`` changed. The
    option stays declared once, in ``part``: its help, flags and range come from there."""
    hints = typing.get_type_hints(part)

    def add(cls: type) -> type:
        own = dict(cls.__dict__.get("__annotations__", {}))
        added = {}
        for f in dataclasses.fields(part):
            if names and f.name not in names:
                continue
            meta = {**f.metadata.get(META, {}), "owner": f.metadata.get(META, {}).get("owner", part)}
            if f.name in defaults:
                value = defaults.pop(f.name)
                new = dataclasses.field(default=value, metadata={META: meta})
            elif f.default_factory is not dataclasses.MISSING:
                new = dataclasses.field(default_factory=f.default_factory, metadata={META: meta})
            else:
                new = dataclasses.field(default=f.default, metadata={META: meta})
            added[f.name] = hints[f.name]
            setattr(cls, f.name, new)
        if defaults:
            raise TypeError(f"{part.__name__} has no field(s) {', '.join(defaults)}")
        cls.__annotations__ = {**added, **own}
        return cls

    return add

