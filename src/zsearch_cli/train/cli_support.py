"""Turn ``zsearch train``'s parsed options into a :class:`TrainConfig` (presets included).

Which options did the user set? Those click reports as coming from the command line, the
environment, or the ``--config`` YAML (its ``default_map``). A preset fills only the rest,
so ``--preset search-r1 --lr 1e-5`` trains at 1e-5 with every other Search-R1 value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zsearch_cli.presets import apply_preset
from zsearch_cli.train.config import TrainConfig, parse_algo_args

_RENAMED = {"index_dir": "index", "algo_arg": "algo_args"}
"""CLI parameter name -> TrainConfig field, where they differ."""

_EXPLICIT = {"COMMANDLINE", "ENVIRONMENT", "DEFAULT_MAP"}
"""click ``ParameterSource`` names that mean "the user set it" (compared by name: typer may
bundle its own click, whose enum is a different class from ``click.core.ParameterSource``)."""


def explicit_options(ctx: Any) -> set[str]:
    """TrainConfig field names the user set (command line, environment or --config file)."""
    names = set()
    for name in ctx.params:
        if getattr(ctx.get_parameter_source(name), "name", None) in _EXPLICIT:
            names.add(_RENAMED.get(name, name))
    return names


def config_from_cli(ctx: Any, options: dict[str, Any]) -> TrainConfig:
    """Resolved CLI options -> TrainConfig, with ``--preset`` filling the unset ones."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the CLI shows its own progress; no per-load tqdm bars
    values = {_RENAMED.get(k, k): v for k, v in options.items()}
    values["algo_args"] = parse_algo_args(values.get("algo_args"))
    values = apply_preset(values.get("preset"), values, explicit_options(ctx))
    for key in ("out", "index"):
        if values.get(key) is not None:
            values[key] = Path(values[key])
    return TrainConfig.from_dict(values)
