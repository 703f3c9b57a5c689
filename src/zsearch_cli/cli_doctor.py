"""The ``zsearch doctor`` command: the self-check before a training run (docs/commands/doctor.md).

Kept apart from ``cli.py`` only for length; ``cli.py`` registers it on the one app. Like every
command it parses options and calls a library function (``commands/doctor.py``).
"""

from __future__ import annotations

import typer

from zsearch_cli.cli_base import resolved_options
from zsearch_cli.cli_options import command
from zsearch_cli.config.commands import DoctorOptions
from zsearch_cli.config.fields import build


@command(DoctorOptions, name="doctor")
def doctor(ctx: typer.Context, given: dict) -> None:
    """Check this machine before training on it: versions and devices, the engine's logprobs against the
    trainer's forward, the weight sync, the chat template and the retriever under load; one table and
    OUT/doctor.json, and a non-zero exit with one line per failed check."""
    from zsearch_cli.commands.doctor import doctor as run_doctor

    status = run_doctor(build(DoctorOptions, given), resolved_options(ctx))
    if status:
        raise typer.Exit(status)
