"""The ``zsearch audit`` command: what a QA set can score on an index's corpus.

Kept apart from ``cli.py`` only for length; ``cli.py`` registers it on the one app. Like every
command it parses options and calls a library function (``commands/audit.py``).
"""

from __future__ import annotations

import typer

from zsearch_cli.cli_base import resolved_options
from zsearch_cli.cli_options import command
from zsearch_cli.config.commands import AuditOptions
from zsearch_cli.config.fields import build


@command(AuditOptions, name="audit")
def audit(ctx: typer.Context, given: dict) -> None:
    """Audit a QA set against an index's corpus: the share answerable (a gold answer in some passage),
    answer recall@1/3/5/10 of the index's retriever queried with the question, and support coverage;
    `zsearch eval` then prints this ceiling beside EM."""
    from zsearch_cli.commands.audit import run_audit

    run_audit(build(AuditOptions, given), resolved_options(ctx))
