"""``zsearch doctor``: run the checks, print the table, write OUT/doctor.json; the return
value is the exit status (0 when every check passed)."""

from __future__ import annotations

from zsearch_cli.errors import shown_spec

from typing import Any

from zsearch_cli.progress import err_console


def doctor(opts: Any, options: dict[str, Any]) -> int:
    """Run ``zsearch doctor`` for ``opts`` (``DoctorOptions``); ``options`` are recorded in doctor.json."""
    from rich.console import Console

    from zsearch_cli.doctor.run import render, run_doctor, write_json

    report = run_doctor(opts)
    title = f"zsearch doctor: {opts.policy.model}, --backend {opts.policy.backend}, --search {shown_spec(opts.retrieval.search)}"
    console = Console()
    render(report, Console(width=max(console.width, 150)), title)
    path = write_json(report, opts.out, options)
    for line in report.failures:
        err_console.print(line, soft_wrap=True, markup=False, highlight=False)
    print(f"doctor: {'all checks passed' if report.ok else f'{len(report.failures)} failed'}; {path}")
    return 0 if report.ok else 1
