"""``build_engine``: the one place a rollout engine is put together from a command's options.

Every stage that rolls out (train, validation, eval, collect, propose, solve, warm-up data,
agent serve) needs the same four things: a generation backend, a search backend, an action
protocol, and the command's ``rollout`` part (``config.parts.RolloutOptions``), which the
engine takes as it is: an option added to the part reaches every one of them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from zsearch_cli.rollout.engine import RolloutEngine

MAKE: Any = object()
"""``search=MAKE`` (the default): make the backend that ``opts.retrieval.search`` names."""


def make_search(opts: Any, spec: str | None = None, **options: Any) -> Any:
    """The search backend ``spec`` (default ``opts.retrieval.search``) names, over
    ``opts.retrieval.index`` (default runs/index)."""
    from zsearch_cli.search.factory import make_search_backend

    return make_search_backend(spec or opts.retrieval.search, index_dir=opts.retrieval.index or Path("runs/index"),
                               **options)


def build_engine(opts: Any, *, backend: Any = None, search: Any = MAKE, protocol: str | None = None,
                 seed: int | None = None, **rollout_changes: Any) -> RolloutEngine:
    """A rollout engine for ``opts``: ``backend`` (default: load ``opts.policy.model`` with its
    backend and device), ``search`` (default: :func:`make_search`; None: no search),
    ``protocol`` (default ``opts.rollout.protocol``), ``seed`` (default ``opts.seed``) and
    ``opts.rollout`` with ``rollout_changes`` (validation's greedy decoding, eval's one-turn
    baselines)."""
    from zsearch_cli.rollout.protocols import get_protocol

    chosen = get_protocol(protocol or opts.rollout.protocol)
    if search is MAKE:
        search = make_search(opts)
    if backend is None:
        from zsearch_cli.models.factory import load_backend

        backend = load_backend(opts.policy.model, backend=opts.policy.backend, device=opts.policy.device)
    rollout = dataclasses.replace(opts.rollout, **rollout_changes) if rollout_changes else opts.rollout
    return RolloutEngine(backend, chosen, search, rollout, seed=opts.seed if seed is None else seed)
