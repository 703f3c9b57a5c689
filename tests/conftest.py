"""Shared fixtures: a tiny random model for fast tests, and the real default model for slow ones.

Everything is offline. torch is imported lazily inside fixtures so test modules that need
no model do not pay for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import TORCH_THREADS

# every process a test starts, unless it says otherwise: no thread that would only spin
os.environ.setdefault("OMP_NUM_THREADS", str(TORCH_THREADS))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _limit_torch_threads() -> None:
    import torch

    if torch.get_num_threads() != TORCH_THREADS:
        torch.set_num_threads(TORCH_THREADS)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a random tiny Qwen2 model + BPE tokenizer (see ``models/tiny.py``).

    Shared by the whole session: treat it as read-only.
    """
    from zsearch_cli.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer(tiny_model_dir: Path) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for the tiny model, fp32 on CPU, eval mode.

    Shared by the whole session: do not train it in place (load your own copy with
    ``load_model(str(tiny_model_dir), trainable=True)`` for that).
    """
    from zsearch_cli.models.loading import load_model

    _limit_torch_threads()
    return load_model(str(tiny_model_dir), device="cpu")


@pytest.fixture(scope="session")
def tiny_backend(tiny_model_and_tokenizer: tuple[Any, Any]) -> Any:
    """An :class:`HFBackend` on CPU over the session's tiny model."""
    from zsearch_cli.models.hf import HFBackend

    model, tokenizer = tiny_model_and_tokenizer
    return HFBackend(model, tokenizer, device="cpu")


@pytest.fixture(scope="session")
def zsearch_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``$ZSEARCH_CACHE`` for the session: the caller's, if set (so CI can keep the
    dequantized default model between runs), else a fresh temporary folder."""
    preset = os.environ.get("ZSEARCH_CACHE")
    if preset:
        yield Path(preset)
        return
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one folder for the workers: smollm2 is dequantized once
        path = tmp_path_factory.getbasetemp().parent / "zsearch_cache"
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("zsearch_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ZSEARCH_CACHE", str(path))
        yield path


@pytest.fixture(scope="session")
def smollm2_model_and_tokenizer(zsearch_cache: Path) -> tuple[Any, Any]:
    """The real default model via the ``smollm2`` alias (fp32, CPU). The first use in a
    session without a warm ``$ZSEARCH_CACHE`` dequantizes the GGUF (~20-30 s); mark tests
    that use it ``@pytest.mark.slow``."""
    import fcntl

    from zsearch_cli.models.loading import load_model

    _limit_torch_threads()
    # under xdist the other worker may be building the shared cache: wait for it instead of
    # building a second copy (the build is atomic either way; this saves its ~20 s of CPU)
    with open(zsearch_cache / ".smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return load_model("smollm2", device="cpu")


@pytest.fixture(scope="session")
def demo_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A BM25 index over the bundled demo corpus, built once by ``zsearch index`` (read-only:
    tests that change an index build their own)."""
    from typer.testing import CliRunner

    from zsearch_cli.cli import app

    out = tmp_path_factory.mktemp("demo_index") / "index"
    result = CliRunner().invoke(app, ["index", "--out", str(out), "--kind", "bm25"])
    assert result.exit_code == 0, result.output
    return out


# ----------------------------------------------------------------------------- the order files run in
# `make test` deals whole files to its two xdist workers in collection order (with
# --no-loadscope-reorder; xdist's own reorder puts the files with the most tests first, which
# left the few-test, minute-long recipe files to the end, on one worker, while the other sat
# idle). The heaviest files go first, longest-processing-time first, so the workers finish
# together. The numbers are rough seconds per file, rounded from the measurements of 2026-11-28
# taken before and during that day's cuts: they only set the order, and this order is the one
# `make test` was timed with (558-565 s with WAITING_FILES below; ordered by the seconds each
# file held its worker instead, one run took 625 s). A stale one only costs time, never a check.
HEAVY_FILES = {
    "test_drzero_mini.py": 105, "test_learning.py": 140, "test_zerosearch_mini.py": 63, "test_resume.py": 56,
    "test_distributed.py": 90, "test_encode_shards.py": 47, "test_progress_and_replay.py": 46,
    "test_adopt_faiss.py": 40, "test_export_alias.py": 39, "test_sigterm_abandon.py": 35,
    "test_zerosearch_chain.py": 33, "test_overfit_recipe.py": 30, "test_search_r1_recipe.py": 28,
    "test_sigterm_ddp.py": 47, "test_offline_kit.py": 26, "test_drzero.py": 25, "test_models.py": 18,
    "test_guard_train.py": 15, "test_lm_head.py": 13, "test_progress_log_file.py": 12, "test_hardening_cli.py": 11,
}
"""test_sigterm_ddp's number is its wall time: it waits on a launcher's grace period, idle."""

WAITING_FILES = {
    "test_http_deadlines.py", "test_search_r1_recipe.py", "test_rollout_stream.py", "test_server.py",
    "test_async_rollout.py", "test_simulated.py", "test_search_backends.py", "test_remote_backend.py",
    "test_serve_backends.py", "test_judge.py",
}
"""Files whose tests wait more than they compute (a deadline that must expire, a server's
reply, a polling loop): 42 of their seconds were idle cores when they ran last, after the
vLLM suite had ended (measured 2026-11-28, per test: wall time minus CPU time). They go first, while the vLLM suite still runs
beside the two workers and fills their waits."""


def _file_order(item: pytest.Item) -> tuple[int, int]:
    name = Path(str(item.fspath)).name
    return (0 if name in WAITING_FILES else 1, -HEAVY_FILES.get(name, 0))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_file_order)  # stable: a file keeps its order


# ----------------------------------------------------------------------------- the collapse guard's false alarms
# Issue 24: with the guard on at its defaults, no training run of the suite (the learning
# tests, DDP, resume, the vLLM suite's training runs) may raise an event, except the runs
# that plant a collapse on purpose (their run folder is named planted-collapse). At the end
# of the session every run's metrics.parquet under the session's tmp folder is read: an event
# in any other run fails the session, and the closest each check came to firing (1 = fires)
# over all the runs is printed (and written to GUARD_MARGINS in the tmp folder).

GUARD_MARGINS = "guard-margins.json"


def _guard_report(base: Path) -> dict[str, Any]:
    from zsearch_cli.artifacts import read_metadata

    report: dict[str, Any] = {"runs": 0, "steps": 0, "closest": {}, "false_alarms": []}
    for path in sorted(base.rglob("metrics.parquet")):
        try:
            guard = read_metadata(path).get("config", {}).get("collapse_guard")
        except Exception:  # noqa: BLE001 - a file some test damaged on purpose
            continue
        if not guard or "planted-collapse" in str(path):
            continue
        report["runs"] += 1
        report["steps"] += int(guard.get("steps_observed", 0))
        for event in guard.get("events", []):
            report["false_alarms"].append(f"{path.parent}: {event.get('message')}")
        for name, value in (guard.get("closest") or {}).items():
            if value > report["closest"].get(name, (float("-inf"), ""))[0]:
                report["closest"][name] = (value, str(path.parent.relative_to(base)))
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    try:
        base = factory.getbasetemp()
    except (OSError, ValueError):
        return
    report = _guard_report(Path(base))
    (Path(base) / GUARD_MARGINS).write_text(__import__("json").dumps(report, indent=1))
    session.config.stash[_GUARD_KEY] = report
    if report["false_alarms"] and session.exitstatus == 0:
        session.exitstatus = 1


_GUARD_KEY = pytest.StashKey[dict]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    report = config.stash.get(_GUARD_KEY, None)
    if not report or not report["runs"]:
        return
    write = terminalreporter.write_line
    write(f"collapse guard: {report['runs']} training runs, {report['steps']} steps, "
          f"{len(report['false_alarms'])} false alarms; closest approach per check (1 = fires):")
    for name, (value, run) in sorted(report["closest"].items(), key=lambda kv: -kv[1][0]):
        write(f"  {name:<45} {value:7.3f}  ({run})")
    for alarm in report["false_alarms"]:
        write(f"  FALSE ALARM {alarm}")
