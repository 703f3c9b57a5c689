"""``zsearch doctor``'s order of work: each check as a library call, one table, doctor.json.

The checks that need a model share one :class:`~zsearch_cli.doctor.runtime.Runtime` (one
policy, one engine); a check that cannot run (vLLM missing, the model not loadable) fails
with its reason and the others still run.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from zsearch_cli.doctor.results import CheckResult
from zsearch_cli.errors import ZsearchError, stored_config
from zsearch_cli.progress import heartbeat

CHECKS = ("environment", "parity", "sync", "template", "retrieval")
TITLES = {"sync": "weight sync", "template": "chat template"}
"""The table's name of a check, where it differs from its --checks name."""


@dataclass
class DoctorReport:
    results: list[CheckResult] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        return [line for r in self.results for line in r.failures]

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "failures": self.failures, "checks": [r.to_dict() for r in self.results]}


def selected_checks(spec: str) -> list[str]:
    names = [c.strip() for c in spec.split(",") if c.strip()]
    unknown = [c for c in names if c not in CHECKS]
    if unknown or not names:
        raise ZsearchError(f"--checks {spec!r}: use a comma list of {', '.join(CHECKS)}")
    return [c for c in CHECKS if c in names]


def guarded(name: str, run: Callable[[], CheckResult]) -> CheckResult:
    """``run()``, or a failed result naming the error when it raises (a doctor reports a
    crash of the thing it checks; it does not become one)."""
    t0 = time.perf_counter()
    with heartbeat("doctor", name):
        try:
            return run()
        except ZsearchError as err:
            res = CheckResult(name, "did not run")
            res.fail(one_line(err))
        except Exception as err:  # noqa: BLE001 - e.g. a CUDA or vLLM error: one line, the check fails
            res = CheckResult(name, "crashed")
            res.fail(one_line(err))
    res.seconds = time.perf_counter() - t0
    return res


def one_line(err: BaseException) -> str:
    """An error as one line: a ZsearchError's own text, else its type and first line."""
    text = str(err) if isinstance(err, ZsearchError) else f"{type(err).__name__}: {err}"
    return (text.splitlines() or [type(err).__name__])[0]


def demo_rows(k: int) -> list[Any]:
    """The first ``k`` questions of the bundled demo train split."""
    from zsearch_cli.train.sampler import load_rows

    return load_rows(None)[:k]


def run_doctor(opts: Any, runtime: Any = None) -> DoctorReport:
    """Every check ``opts.checks`` names, in order. ``runtime`` (tests; a planted stale
    engine) replaces the one loaded from ``opts``; one loaded here is closed at the end."""
    from zsearch_cli.doctor.environment import check_environment
    from zsearch_cli.doctor.load import check_retrieval_load
    from zsearch_cli.doctor.parity import check_parity
    from zsearch_cli.doctor.sync import check_weight_sync
    from zsearch_cli.doctor.template import check_chat_template

    checks = selected_checks(opts.checks)
    report = DoctorReport()
    if "environment" in checks:
        report.results.append(guarded("environment", lambda: check_environment(opts)))
    owned, rt = False, runtime
    needs_model = [c for c in ("parity", "sync") if c in checks]
    try:
        if needs_model and rt is None:
            from zsearch_cli.doctor.runtime import load_runtime

            try:
                with heartbeat("doctor", f"loading {opts.policy.model} (policy and engine)"):
                    rt, owned = load_runtime(opts), True
            except Exception as err:  # noqa: BLE001 - the checks that need it fail with the reason
                for name in needs_model:
                    skipped = CheckResult(TITLES.get(name, name), "not run: the model did not load")
                    skipped.fail(f"not run, the model did not load ({one_line(err)})")
                    report.results.append(skipped)
                needs_model = []
        if "parity" in needs_model:
            from zsearch_cli.rollout.build import make_search

            report.results.append(guarded("parity", lambda: check_parity(rt, opts, demo_rows(opts.prompts),
                                                                          make_search(opts))))
        if "sync" in needs_model:
            report.results.append(guarded(TITLES["sync"], lambda: check_weight_sync(rt)))
        if "template" in checks:
            report.results.append(guarded(TITLES["template"], lambda: check_chat_template(
                rt.tokenizer if rt is not None else _tokenizer(opts), opts.rollout.protocol, opts.template_turns)))
    finally:
        if owned and rt is not None:
            rt.close()
    if "retrieval" in checks:
        report.results.append(guarded("retrieval", lambda: check_retrieval_load(opts)))
    return report


def _tokenizer(opts: Any) -> Any:
    from zsearch_cli.models.loading import load_tokenizer, loadable_model_path

    return load_tokenizer(loadable_model_path(opts.policy.model))


def render(report: DoctorReport, console: Console, title: str) -> None:
    """The one table: a row per check (verdict, seconds, the numbers), then notes and failures."""
    table = Table(title=title, show_lines=True)
    table.add_column("check", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("s", justify="right")
    table.add_column("measured")
    for r in report.results:
        table.add_row(r.name, "[green]ok[/]" if r.ok else "[red]FAIL[/]", f"{r.seconds:.1f}", r.summary)
    console.print(table)
    for r in report.results:
        for note in r.notes:
            console.print(f"[dim]{r.name}:[/] {note}", soft_wrap=True)


def write_json(report: DoctorReport, out: Path, options: dict[str, Any]) -> Path:
    """OUT/doctor.json, atomically (a temp file in OUT, then a rename)."""
    from zsearch_cli.files import mkstemp_like_open

    out.mkdir(parents=True, exist_ok=True)
    path = out / "doctor.json"
    fd, tmp = mkstemp_like_open(prefix=".doctor.json.", suffix=".tmp", dir=out)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            # a shared report: no key of a probed URL or spec in it (errors.stored_config)
            json.dump(stored_config({**report.to_dict(), "options": options}), f, indent=1, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
