"""``build_engine``: the one place a rollout engine is put together from a command's options.

Every stage that rolls out (train, validation, eval, collect, propose, solve, warm-up data)
needs the same four things: a generation backend, a search backend, an action protocol, and
a :class:`~zsearch_cli.rollout.engine.RolloutConfig` with the run's limits. The options
objects all carry the fields of ``options.RolloutOptions``, so the config is their
projection, never a hand copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zsearch_cli.config.fields import project
from zsearch_cli.errors import ZsearchError
from zsearch_cli.rollout.engine import RolloutConfig, RolloutEngine

MAKE: Any = object()
"""``search=MAKE`` (the default): make the backend that ``opts.search`` names."""


def rollout_config(opts: Any, **overrides: Any) -> RolloutConfig:
    """The engine's config: the rollout fields ``opts`` has, ``overrides`` on top, and the
    engine's defaults for the rest."""
    return project(opts, RolloutConfig, **overrides)


def make_search(opts: Any, **options: Any) -> Any:
    """The search backend ``opts.search`` names, over ``opts.index`` (default runs/index)."""
    from zsearch_cli.search.factory import make_search_backend

    return make_search_backend(opts.search, index_dir=getattr(opts, "index", None) or Path("runs/index"), **options)


def build_engine(opts: Any, *, backend: Any = None, search: Any = MAKE, protocol: str | None = None,
                 **overrides: Any) -> RolloutEngine:
    """A rollout engine for ``opts``: ``backend`` (default: load ``opts.model`` with its
    backend and device), ``search`` (default: :func:`make_search`; None: no search),
    ``protocol`` (default ``opts.protocol``) and the rollout config with ``overrides``."""
    from zsearch_cli.rollout.protocols import PROTOCOLS

    name = protocol or opts.protocol
    if name not in PROTOCOLS:
        raise ZsearchError(f"unknown --protocol {name!r}: use one of {', '.join(PROTOCOLS)}")
    if search is MAKE:
        search = make_search(opts)
    if backend is None:
        from zsearch_cli.models.factory import load_backend

        backend = load_backend(opts.model, backend=opts.backend, device=opts.device)
    return RolloutEngine(backend, PROTOCOLS[name](), search, rollout_config(opts, **overrides))
