"""zsearch's options as plain dataclasses, importable without typer or torch.

- ``fields.py``: how an option is declared (:func:`~zsearch_cli.config.fields.option`) and
  the record base that saves a config;
- ``ranges.py``: the numeric ranges options accept (one check for the CLI and the library);
- ``parts.py``: the parts several commands share (model, search, rollout, optimizer, run …);
- ``commands.py``: each command's own options.

``cli_options.py`` turns these declarations into typer commands; nothing here imports it.
"""
