"""``zsearch doctor`` on the HF backend alone (the vLLM suite repeats it on the real engine):
each check passes on a sound setup and fails, with its line, on a planted fault.

The planted faults (also imported by tests/vllm/test_doctor_vllm.py):

* a stale engine: the policy takes a "training step" (one decoder weight scaled by 1.5) that
  is never synced, so the engine samples from the old weights;
* a sync that does nothing;
* chat templates that rewrite history (one drops the text of earlier assistant turns, one
  drops their ``<think>`` as Qwen3's does) and one that frames the assistant turn unlike
  the engine (an extra newline after the header);
* a real retrieval server (``zsearch serve``'s app over the demo index on 127.0.0.1) that
  answers one request in ten with a 503.
"""

from __future__ import annotations

import copy
import json
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from typer.testing import CliRunner

from zsearch_cli.config.commands import DoctorOptions
from zsearch_cli.doctor.load import check_retrieval_load
from zsearch_cli.doctor.parity import check_parity, delta_stats, suggested_is_cap, turn_index
from zsearch_cli.doctor.run import demo_rows, run_doctor
from zsearch_cli.doctor.sync import check_weight_sync
from zsearch_cli.doctor.template import check_chat_template

# ----------------------------------------------------------------------------- planted faults

DROPS_EARLIER_TURNS = (  # renders only the last assistant message's text: earlier turns vanish
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] != 'assistant' or loop.last %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DROPS_EARLIER_THINK = (  # Qwen3's rule: <think>…</think> kept in the last assistant message only
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last and '</think>' in m['content'] %}"
    "{{ m['content'].split('</think>')[-1].lstrip() }}{% else %}{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
EXTRA_NEWLINE = (  # the assistant's content starts one newline later than the generation prompt
    # (a newline as an expression: transformers renders templates with trim_blocks, which would
    # drop a literal one right after a block tag)
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{{ '\\n' }}{% endif %}"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def with_template(tokenizer: Any, template: str) -> Any:
    planted = copy.deepcopy(tokenizer)
    planted.chat_template = template
    return planted


@contextmanager
def training_step_not_synced(policy: Any) -> Iterator[None]:
    """The policy's weights change (one MLP weight x1.5) and the engine is not told."""
    weight = policy.model.layers[0].mlp.down_proj.weight
    saved = weight.detach().clone()
    with torch.no_grad():
        weight.mul_(1.5)
    try:
        yield
    finally:
        with torch.no_grad():
            weight.copy_(saved)


@contextmanager
def dropping_retrieval_server(index: Path, every: int = 10) -> Iterator[str]:
    """The real retrieval app over ``index`` on 127.0.0.1, answering every ``every``-th
    /retrieve with a 503 (requests 10, 20, … when every=10)."""
    from fastapi.responses import Response

    from zsearch_cli.retrieval.index import load_index
    from zsearch_cli.retrieval.server import create_app, serving

    app = create_app(load_index(index), cache_size=0)
    count, lock = [0], threading.Lock()

    @app.middleware("http")
    async def drop(request: Any, call_next: Any) -> Any:
        if request.url.path == "/retrieve":
            with lock:
                count[0] += 1
                n = count[0]
            if n % every == 0:
                return Response(b'{"error": "dropped"}', status_code=503, media_type="application/json")
        return await call_next(request)

    with serving(app) as url:
        yield url


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def opts(tiny_model_dir: Path, demo_index: Path, tmp_path_factory: pytest.TempPathFactory) -> DoctorOptions:
    # 2 prompts x 3 turns (max_turns 2) x <= 12 tokens: a few seconds on 2 cores
    return DoctorOptions.from_flat(model=str(tiny_model_dir), backend="hf", device="cpu", index=demo_index,
                                   prompts=2, max_turn_tokens=12, out=tmp_path_factory.mktemp("doctor"),
                                   concurrency=32, requests=100, batch_requests=2, batch_queries=64)


@pytest.fixture(scope="module")
def runtime(opts: DoctorOptions) -> Any:
    from zsearch_cli.doctor.runtime import load_runtime

    rt = load_runtime(opts)
    assert rt.kind == "hf" and rt.copy is not None and rt.copy is not rt.policy  # the engine's own weights
    return rt


@pytest.fixture(scope="module")
def search(opts: DoctorOptions) -> Any:
    from zsearch_cli.rollout.build import make_search

    return make_search(opts)


# ----------------------------------------------------------------------------- the statistics, by hand


def test_turn_index_and_statistics_by_hand() -> None:
    # mask 1 1 0 0 1 0 1: three sampled runs; observation tokens take the turn they follow
    assert turn_index([1, 1, 0, 0, 1, 0, 1]) == [0, 0, 0, 0, 1, 1, 2]
    # Δ = ln 2 on one token, 0 on the other: r = (2, 1); |Δ| mean = ln2/2, max = ln 2;
    # k3 = mean(r - 1 - ln r) = (1 - ln 2)/2 ≈ 0.1534; χ² = mean((r - 1)²) = 1/2
    s = delta_stats(torch.tensor([0.6931471805599453, 0.0]).numpy())
    assert s["mean"] == pytest.approx(0.34657, abs=1e-5) and s["max"] == pytest.approx(0.693147, abs=1e-6)
    assert s["k3"] == pytest.approx((1 - 0.6931471805599453) / 2) and s["chi2"] == pytest.approx(0.5)
    # cap: 99.9% quantile of r; all ≈ 1 -> the floor 2; r = e^1.2 ≈ 3.32 on every token -> 3.5
    assert suggested_is_cap(torch.zeros(10).numpy()) == 2.0
    assert suggested_is_cap(torch.full((10,), 1.2).numpy()) == 3.5


# ----------------------------------------------------------------------------- parity and sync


def test_parity_passes_and_a_stale_engine_fails_it(runtime: Any, opts: DoctorOptions, search: Any) -> None:
    rows = demo_rows(opts.prompts)
    good = check_parity(runtime, opts, rows, search)
    assert good.ok, good.failures
    d = good.details
    assert d["overall"]["tokens"] > 10 and len(d["turns"]) >= 2  # several turns really compared
    assert d["overall"]["max"] < 1e-4  # fp32 CPU: rounding only (measured ~1e-5)
    assert all(g["first_divergence"] is None for g in d["greedy"])
    with training_step_not_synced(runtime.policy):
        stale = check_parity(runtime, opts, rows, search)
    assert not stale.ok
    assert stale.failures[0].startswith("parity: |Δlogp| mean") and "missed weight sync" in stale.failures[0]
    assert stale.details["overall"]["mean"] > 100 * good.details["overall"]["mean"]


def test_nucleus_replay_at_top_p(runtime: Any, opts: DoctorOptions, search: Any) -> None:
    # top_p 0.5 on a near-uniform tiny model: the nucleus holds about half the mass, so the
    # bias the replay removes is about -log(0.5) ≈ 0.7 nats per token; parity still holds
    from zsearch_cli.config.fields import with_options

    nucleus = with_options(opts, top_p=0.5, prompts=1)
    res = check_parity(runtime, nucleus, demo_rows(1), search)
    assert res.ok, res.failures
    assert 0.3 < res.details["nucleus_bias_nats_per_token"] < 1.5


def assert_sync_carries_and_no_sync_fails(runtime: Any, close: float) -> None:
    """The real sync: the engine ends within ``close`` nats of the perturbed policy and whole
    nats from the old one; a sync that does nothing fails with its line."""
    good = check_weight_sync(runtime)
    assert good.ok, good.failures
    assert good.details["engine_vs_perturbed_after"] < close < 1.0 < good.details["engine_vs_old_after"]
    missing = check_weight_sync(runtime, sync=lambda: None)
    assert not missing.ok and "did not take the new weights" in missing.failures[0]


def test_weight_sync_carries_a_perturbation_and_a_missing_sync_fails(runtime: Any) -> None:
    assert_sync_carries_and_no_sync_fails(runtime, 1e-5)  # the HF copy: load_state_dict, exact
    # the check put everything back: the engine scores like the policy again
    assert check_weight_sync(runtime).details["engine_vs_policy_before"] < 1e-5


# ----------------------------------------------------------------------------- chat template


def test_chat_template_passes_on_an_append_only_template(runtime: Any) -> None:
    for protocol in ("tags", "tool_call"):
        res = check_chat_template(runtime.tokenizer, protocol, turns=3)
        assert res.ok, res.failures
        assert [r.get("history") for r in res.details["turns"]][1:] == ["kept", "kept"]


@pytest.mark.parametrize("template, expected", [
    (DROPS_EARLIER_TURNS, "chat template: rewrites history: adding turn 2"),
    (DROPS_EARLIER_THINK, "chat template: rewrites history: adding turn 2"),
    (EXTRA_NEWLINE, "chat template: turn 1: the engine's stream differs from apply_chat_template"),
])
def test_planted_templates_fail(runtime: Any, template: str, expected: str) -> None:
    res = check_chat_template(with_template(runtime.tokenizer, template), "tags", turns=3)
    assert not res.ok
    assert res.failures[0].startswith(expected), res.failures


# ----------------------------------------------------------------------------- retrieval under load


def test_retrieval_load_passes_and_a_dropping_server_fails(opts: DoctorOptions, demo_index: Path) -> None:
    from zsearch_cli.config.fields import with_options

    inprocess = check_retrieval_load(opts)  # --search bm25 over the demo index
    assert inprocess.ok, inprocess.failures
    with dropping_retrieval_server(demo_index, every=10**9) as url:  # never drops
        clean = check_retrieval_load(with_options(opts, search=url))
    assert clean.ok, clean.failures
    assert clean.details["results"][f"single {url}"]["requests"] == 100
    with dropping_retrieval_server(demo_index, every=10) as url:
        res = check_retrieval_load(with_options(opts, search=url))
    assert not res.ok
    # the single shape runs first: requests 10, 20, ..., 100 of its 100 are the dropped ones
    assert res.failures == [f"retrieval: single {url}: 10 of 100 requests failed (HTTP 503 x10) with 32 in flight; "
                            "a training run needs 0"]


# ----------------------------------------------------------------------------- the command


def test_cli_table_json_and_exit_status(opts: DoctorOptions, demo_index: Path, tmp_path: Path) -> None:
    from zsearch_cli.cli import app

    base = ["doctor", "--model", opts.policy.model, "--backend", "hf", "--device", "cpu", "--index", str(demo_index),
            "--prompts", "1", "--max-turn-tokens", "8", "--requests", "50", "--concurrency", "16",
            "--batch-queries", "32"]
    ok = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "ok")])
    assert ok.exit_code == 0, ok.output
    report = json.loads((tmp_path / "ok" / "doctor.json").read_text())
    assert report["ok"] and [c["name"] for c in report["checks"]] == [
        "environment", "parity", "weight sync", "chat template", "retrieval"]
    assert "all checks passed" in ok.output
    with dropping_retrieval_server(demo_index, every=10) as url:
        bad = CliRunner().invoke(app, [*base, "--search", url, "--checks", "retrieval", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 1
    lines = [line for line in bad.output.splitlines() if line.startswith("retrieval: ")]
    assert len(lines) == 1 and "5 of 50 requests failed (HTTP 503 x5)" in lines[0]
    assert json.loads((tmp_path / "bad" / "doctor.json").read_text())["failures"] == lines


def test_run_doctor_reports_a_model_that_does_not_load(opts: DoctorOptions, tmp_path: Path) -> None:
    from zsearch_cli.config.fields import with_options

    report = run_doctor(with_options(opts, model=str(tmp_path / "nowhere"), checks="parity,sync"))
    assert [r.name for r in report.results] == ["parity", "weight sync"] and not report.ok
    assert all("not run, the model did not load" in line for line in report.failures)
