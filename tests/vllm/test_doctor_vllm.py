"""``zsearch doctor`` on the real vLLM engine (CPU build): parity, the weight sync and the
chat template pass on a sound engine and fail, with their lines, on the planted faults of
tests/test_doctor.py (a stale engine, a sync that does nothing, a template that drops
earlier turns, a retrieval server that drops one request in ten).

One engine for the module (~15 s to start); the checks themselves take seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from test_doctor import (DROPS_EARLIER_TURNS, assert_sync_carries_and_no_sync_fails, dropping_retrieval_server,
                         training_step_not_synced, with_template)
from zsearch_cli.config.commands import DoctorOptions
from zsearch_cli.config.fields import with_options
from zsearch_cli.doctor.parity import check_parity
from zsearch_cli.doctor.run import demo_rows, run_doctor
from zsearch_cli.doctor.template import check_chat_template

MAX_CONTEXT = 1024  # the engine fixture's max_model_len (tests/vllm/conftest.py): the KV cache stays small


@pytest.fixture(scope="module")
def opts(vllm_tiny_dir: Path, demo_index: Path, tmp_path_factory: pytest.TempPathFactory) -> DoctorOptions:
    return DoctorOptions.from_flat(model=str(vllm_tiny_dir), backend="vllm", device="cpu", index=demo_index,
                                   prompts=2, max_turn_tokens=12, max_context_tokens=MAX_CONTEXT,
                                   out=tmp_path_factory.mktemp("doctor"), concurrency=32, requests=100,
                                   batch_requests=2, batch_queries=64)


@pytest.fixture(scope="module")
def runtime(opts: DoctorOptions) -> Iterator[Any]:
    from zsearch_cli.doctor.runtime import load_runtime

    rt = load_runtime(opts)
    assert rt.kind == "vllm" and rt.engine_backend.platform == "cpu"
    yield rt
    rt.close()


def test_parity_passes_on_the_engine_and_a_stale_engine_fails_it(runtime: Any, opts: DoctorOptions) -> None:
    from zsearch_cli.rollout.build import make_search

    rows, search = demo_rows(opts.prompts), make_search(opts)
    good = check_parity(runtime, opts, rows, search)
    assert good.ok, good.failures
    overall = good.details["overall"]
    # fp32 on vLLM's CPU kernels vs torch's: rounding only (measured ~1e-5 max on this model)
    assert overall["tokens"] > 10 and len(good.details["turns"]) >= 2 and overall["max"] < 1e-4
    with training_step_not_synced(runtime.policy):
        stale = check_parity(runtime, opts, rows, search)
    assert not stale.ok and stale.failures[0].startswith("parity: |Δlogp| mean")
    assert "the vllm engine does not sample from the weights the trainer scores" in stale.failures[0]


def test_weight_sync_reaches_the_engine_and_a_missing_one_fails(runtime: Any) -> None:
    assert_sync_carries_and_no_sync_fails(runtime, 1e-3)  # vLLM's CPU kernels vs torch: ~2.5e-5 measured


def test_full_run_on_the_engine_with_planted_template_and_dropping_server(runtime: Any, opts: DoctorOptions,
                                                                          demo_index: Path) -> None:
    assert not check_chat_template(with_template(runtime.tokenizer, DROPS_EARLIER_TURNS), "tags").ok
    with dropping_retrieval_server(demo_index, every=10) as url:
        report = run_doctor(with_options(opts, search=url), runtime=runtime)
    verdicts = {r.name: r.ok for r in report.results}
    # parity's own searches go through the training client, whose retries absorb the drops;
    # the load check counts them at the wire
    assert verdicts == {"environment": True, "parity": True, "weight sync": True, "chat template": True,
                        "retrieval": False}, report.failures
    assert len(report.failures) == 1 and report.failures[0].startswith(f"retrieval: single {url}: ")
    assert "requests failed (HTTP 503 x" in report.failures[0]
