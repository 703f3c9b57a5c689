"""The check of the simulator's options (``config.parts.SimOptions``) against a ``--search``
spec: which ``--noise-*`` values reach the simulator, and which combinations are refused.

Apart from ``simulated.py`` so that a config can be checked before anything heavy loads.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from zsearch_cli.config.parts import SimOptions
from zsearch_cli.errors import ZsearchError, shown_spec


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def sim_search_options(spec: str, sim: SimOptions, *, seed: int, topk: int) -> dict[str, Any]:
    """Keyword options for ``make_search_backend(spec, …)``: for the simulator, the
    ``--noise-*`` values that are set and the run's seed (unless the spec sets its own);
    nothing for a real engine, where setting ``--noise-*`` is an error. Checked in full here
    (values, ranges, spec options) so a bad combination fails before any model loads."""
    from zsearch_cli.search.factory import is_simulated

    set_fields = [f.name for f in dataclasses.fields(sim) if getattr(sim, f.name) is not None]
    if not is_simulated(spec):
        if set_fields:
            raise ZsearchError(f"{'/'.join(map(_flag, set_fields))} only applies to the simulated search "
                               f"(--search sim:MODEL or sim+http://HOST:PORT/v1), not --search {shown_spec(spec)}")
        return {}
    from zsearch_cli.search.curriculum import NoiseCurriculum
    from zsearch_cli.search.sim_text import SFT_DOCS
    from zsearch_cli.search.simulated import SimConfig, parse_sim_spec, spec_option_names

    _, spec_options = parse_sim_spec(spec.strip())
    in_spec = spec_option_names(spec.strip())
    both = [name for name in set_fields if name in in_spec]
    if both:
        raise ZsearchError(f"{_flag(both[0])} and --search …?{both[0]}= both set it: keep one")
    kwargs: dict[str, Any] = {name: getattr(sim, name) for name in set_fields}
    if "seed" not in in_spec:
        kwargs["seed"] = seed
    resolved = SimConfig.from_options({**spec_options, **kwargs})
    NoiseCurriculum(resolved.noise_start, resolved.noise_end, resolved.noise_base, resolved.noise_schedule)  # range checks
    if resolved.mode == "sft" and topk > SFT_DOCS:
        raise ZsearchError(f"--topk {topk}: the ZeroSearch simulator writes {SFT_DOCS} documents "
                           f"(use --topk <= {SFT_DOCS}, or mode=prompt)")
    return kwargs
