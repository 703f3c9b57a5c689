"""``python -m zsearch_cli …`` runs the ``zsearch`` command (e.g. under
``accelerate launch -m zsearch_cli train …``)."""

from zsearch_cli.cli import app

app()
