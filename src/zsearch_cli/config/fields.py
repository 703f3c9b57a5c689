"""How an option is declared: a dataclass field with its default, its docstring (the help
text) and, through :func:`option`, its flags, accepted range or choices, aliases and whether
it only changes how a run executes; nested parts (:func:`part`), narrowed by exclusion; the
bases that build a config from flat values and save it flat (:class:`Options`,
:class:`Record`); and the reading of those declarations (:func:`leaves`, :func:`check_options`,
:func:`execution_options`).

Objects nest (``cfg.rollout.topk``); names are flat (``--topk``, the YAML key ``topk``, the
saved key ``topk``), so a flat name is unique in a command's tree.

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

from zsearch_cli.config.ranges import Choices, Range, Rule

META = "zsearch"


def option(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, help: str | None = None,
           flags: tuple[str, ...] = (), param: str | None = None, range: Range | None = None,
           choices: tuple[str, ...] = (), argument: bool = False, cli_type: Any = None,
           convert: Callable[[Any], Any] | None = None, aliases: tuple[str, ...] = (), required: bool = False,
           execution: bool = False) -> Any:
    """A dataclass field with what the command line needs beside its default: ``flags``
    (default ``--name``), ``param`` (the typer parameter name, recorded in metadata; default
    the field name), ``range`` (a number's) or ``choices`` (a text option's values, the only
    place they are listed), ``argument`` (positional), ``cli_type``/``convert`` (when the
    flag's type differs from the field's), ``aliases`` (extra flag and YAML key names),
    ``required`` (the command line must give it, though the library has a default) and
    ``execution``: the option changes how a run executes (where it writes, how it batches or
    places the same work, how far it goes, what it reports), not what a step or a row
    computes, so a resumed run or a reused result may differ in it (:func:`execution_options`)."""
    if choices and range is not None:
        raise TypeError("an option has a range or choices, not both")
    rule = Choices(tuple(choices)) if choices else range
    meta = dict(help=help, flags=tuple(flags), param=param, range=rule, argument=argument,
                cli_type=cli_type, convert=convert, aliases=tuple(aliases), required=required, execution=execution)
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


def part(cls: type, *, exclude: tuple[str, ...] = (), ranges: dict[str, Range] | None = None, **defaults: Any) -> Any:
    """A nested part: a field holding a ``cls`` (``rollout: RolloutOptions = part(RolloutOptions)``).

    The command gets every option of ``cls``, so an option added to the part reaches every
    command that holds it; ``exclude`` names the ones this command has no use for (never the
    ones it keeps), ``defaults`` changes a default where a paper's setting differs, and
    ``ranges`` narrows what a field accepts here (RL sampling needs a temperature > 0; eval
    takes 0 for greedy). All name options at any depth by their flat name (``topk``, not
    ``rollout.topk``)."""
    known = set(leaves(cls))
    unknown = sorted((set(exclude) | set(defaults) | set(ranges or {})) - known)
    if unknown:
        raise TypeError(f"{cls.__name__} has no option(s) {', '.join(unknown)}")
    spec = {PART: cls, "exclude": tuple(exclude), "defaults": dict(defaults), "ranges": dict(ranges or {})}
    return dataclasses.field(default_factory=functools.partial(from_flat, cls, dict(defaults)),
                             metadata={META: spec})


PART = "part"


def _part_spec(f: dataclasses.Field) -> dict[str, Any] | None:
    spec = f.metadata.get(META, {})
    return spec if PART in spec else None


@dataclass(frozen=True)
class Option:
    """One option of a command, as the command line sees it: a plain field of the command's
    dataclass or of one of its parts (``path`` names the part fields leading to it)."""

    name: str
    owner: type
    """The class that declares the field: where the option is declared, once."""
    annotation: Any
    default: Any
    help: str
    flags: tuple[str, ...]
    param: str
    range: Rule | None
    """What it accepts: a numeric :class:`Range` or the :class:`Choices` of a text option."""
    argument: bool
    convert: Callable[[Any], Any] | None
    execution: bool = False
    """Changes how a run executes, not what it computes (:func:`option`'s ``execution``)."""
    path: tuple[str, ...] = ()
    """The part fields above the option: ``("rollout",)`` for ``cfg.rollout.topk``."""

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    @property
    def flag(self) -> str:
        """The option's main flag, as errors name it (``--mask-truncated``)."""
        return self.flags[0].split("/")[0] if self.flags else f"--{self.name.replace('_', '-')}"


def _owner(cls: type, name: str) -> type:
    return next(c for c in reversed(cls.__mro__) if name in c.__dict__.get("__annotations__", {}))


def _cli_annotation(annotation: Any) -> Any:
    """``int | None`` -> ``Optional[int]`` (typer reads typing's spelling)."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        return Optional[rest[0]] if len(rest) == 1 else annotation
    return annotation


def _plain_option(cls: type, f: dataclasses.Field, hints: dict[str, Any]) -> Option:
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
    return Option(f.name, owner, annotation, default, help_text, flags, param, meta.get("range"),
                  meta.get("argument", False), meta.get("convert"), meta.get("execution", False))


@functools.lru_cache(maxsize=None)
def leaves(cls: type) -> dict[str, Option]:
    """Every option of ``cls`` by its flat name, its parts' included (less what each part
    excludes, with the defaults it changes), in declaration order. A flat name must be
    unique in the tree: it is the option's flag, ``--config`` key and saved key."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Option] = {}
    for f in dataclasses.fields(cls):
        spec = _part_spec(f)
        if spec is None:
            found = {f.name: _plain_option(cls, f, hints)}
        else:
            found = {name: dataclasses.replace(opt, path=(f.name, *opt.path),
                                               default=spec["defaults"].get(name, opt.default),
                                               range=spec["ranges"].get(name, opt.range))
                     for name, opt in leaves(spec[PART]).items() if name not in spec["exclude"]}
        for name, opt in found.items():
            if name in out:
                raise TypeError(f"{cls.__name__}: option {name!r} is declared twice "
                                f"({'.'.join(out[name].path) or cls.__name__} and {'.'.join(opt.path) or cls.__name__})")
            out[name] = opt
    return out


def narrowed(cls: type, exclude: tuple[str, ...] = ()) -> dict[str, Option]:
    """The options of ``cls`` less ``exclude``, which names options or whole parts by their
    field name (``"validation"``): how a command, or a sub-step, narrows by exclusion."""
    return {name: opt for name, opt in leaves(cls).items()
            if name not in exclude and not any(p in exclude for p in opt.path)}


def execution_options(cls: type) -> frozenset[str]:
    """The flat names (and parameter names) of the options of ``cls`` marked ``execution``:
    what a resumed run, or an eval reusing saved rows, may change. Any other difference
    would mix two computations in one result and is refused."""
    return frozenset(n for opt in leaves(cls).values() if opt.execution for n in (opt.name, opt.param))


def choices_of(cls: type, name: str) -> tuple[str, ...]:
    """The values option ``name`` of ``cls`` accepts, as its field declares them (for library
    code that branches on them)."""
    rule = leaves(cls)[name].range
    if not isinstance(rule, Choices):
        raise TypeError(f"{cls.__name__}.{name} declares no choices")
    return rule.values


def from_flat(cls: type, values: dict[str, Any]) -> Any:
    """A ``cls`` (its parts nested) from flat option values; keys that are no option of
    ``cls`` are left out, and an option not given keeps its default (a part's own defaults
    first, as :func:`part` changed them)."""
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        spec = _part_spec(f)
        if spec is None:
            if f.name in values:
                kw[f.name] = values[f.name]
            continue
        sub = {k: v for k, v in values.items() if k not in spec["exclude"]}
        kw[f.name] = from_flat(spec[PART], {**spec["defaults"], **sub})
    return cls(**kw)


def to_flat(obj: Any) -> dict[str, Any]:
    """The options of ``obj`` by flat name (the inverse of :func:`from_flat`): what a command
    shows as flags, less what its parts exclude."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        spec = _part_spec(f)
        if spec is None:
            out[f.name] = value
        else:
            out.update({k: v for k, v in to_flat(value).items() if k not in spec["exclude"]})
    return out


def with_options(obj: Any, **values: Any) -> Any:
    """A copy of ``obj`` with options changed by flat name, wherever in its parts they sit
    (``with_options(cfg, topk=5)`` changes ``cfg.rollout.topk``)."""
    unknown = sorted(set(values) - set(leaves(type(obj))))
    if unknown:
        raise TypeError(f"{type(obj).__name__} has no option(s) {', '.join(unknown)}")
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        spec = _part_spec(f)
        if spec is None:
            if f.name in values:
                changes[f.name] = values[f.name]
            continue
        mine = {k: v for k, v in values.items() if k in leaves(spec[PART]) and k not in spec["exclude"]}
        if mine:
            changes[f.name] = with_options(getattr(obj, f.name), **mine)
    return dataclasses.replace(obj, **changes)


def option_value(obj: Any, opt: Option) -> Any:
    """The value of option ``opt`` (from :func:`leaves`) in ``obj``, through its parts."""
    for name in opt.path:
        obj = getattr(obj, name)
    return getattr(obj, opt.name)


def check_options(obj: Any) -> None:
    """Refuse a number outside the range its field declares, or a text option's value outside
    its declared choices (as the part holding it narrows them), naming the flag: the
    library's form of the CLI's check, from the same declaration, and the only check of a
    choice value."""
    from zsearch_cli.errors import ZsearchError

    for opt in leaves(type(obj)).values():
        value = option_value(obj, opt)
        if opt.range is not None and not opt.range.admits(value):
            raise ZsearchError(opt.range.refusal(opt.flag, value))


def build(cls: type, given: dict[str, Any], **fixed: Any) -> Any:
    """``cls`` from the values the user set and ``fixed`` ones (flat names; others left out)."""
    return from_flat(cls, {**given, **fixed})


class Options:
    """Base of a command's options: made from flat option values, as the flags give them."""

    @classmethod
    def from_flat(cls, **values: Any) -> Any:
        """The options from flat values (``EvalOptions.from_flat(model=…, topk=5)``); an
        unknown name is an error."""
        unknown = sorted(set(values) - set(leaves(cls)))
        if unknown:
            raise TypeError(f"{cls.__name__} has no option(s) {', '.join(unknown)}")
        return from_flat(cls, values)


class Record(Options):
    """Base of an options dataclass that is saved (checkpoints, metadata, lineage): flat, as
    the flags are, so files written before the parts nested read back unchanged."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly options by flat name (paths as strings), as a record keeps them: a
        secret in a value withheld (``errors.stored_config``), since every caller saves or
        compares with what was saved (a checkpoint, metadata, a tracker, a lineage). Live
        values are the dataclass's own (``to_flat``)."""
        from zsearch_cli.errors import stored_config

        return stored_config({k: (str(v) if isinstance(v, Path) else _plain(v)) for k, v in to_flat(self).items()})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """The options :meth:`to_dict` wrote (other keys are left out): a path field gets a
        Path back, a str field a str."""
        kw = {}
        for name, opt in leaves(cls).items():
            if name not in data:
                continue
            hint = typing.get_type_hints(opt.owner)[name]
            value, kinds = data[name], (hint, *typing.get_args(hint))
            if value is not None and Path in kinds:
                value = Path(value)
            elif isinstance(value, Path) and str in kinds:
                value = str(value)
            kw[name] = value
        return from_flat(cls, kw)


def _plain(value: Any) -> Any:
    """``dataclasses.asdict``'s deep copy of containers (a saved dict never aliases the config's)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value
