"""How an option is declared: a dataclass field with its default, its docstring (the help
text) and, through :func:`option`, its flags, accepted range and aliases; the record base
that saves a config; and the reading of those declarations (:func:`fields_of`).

No typer here: the library (trainer, engine, index) declares and checks its options with
this module alone, and ``cli_options`` turns the declarations into typer commands.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from zsearch_cli.config.ranges import Range

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

