"""The async rollout mode on the real vLLM engine (CPU build): continuous batching through
VLLMBackend's submit/step, with the same trajectories as the sync engine's generate calls."""

from __future__ import annotations

import time

from typing import Any

import pytest

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import SamplingParams, streams
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import RolloutEngine
from zsearch_cli.rollout.protocols import TagsProtocol
from zsearch_cli.search.base import SearchBackend, SearchBackendError

from helpers import ROWS, RandomLatencySearch, SearchingTiny

SAMPLED = SamplingParams(max_new_tokens=10, temperature=1.0, seeds=(11, 12, 13, 14))


class StreamingTiny(SearchingTiny):
    """:class:`SearchingTiny` over the vLLM engine's step-at-a-time interface too. Records,
    at each submit, how many requests were still decoding (> 0: a turn joined a running
    batch, which a turn barrier never allows)."""

    def __init__(self, inner: Any):
        super().__init__(inner)
        self.running_at_submit: list[int] = []

    def submit(self, prompts, params, stop=()):
        self.calls.append(len(prompts))
        self.running_at_submit.append(len(self.inner._running))
        return self.inner.submit(prompts, params, stop)

    def step(self):
        # A decode step as slow as a GPU's at a real batch size (~20 ms): on a fast CPU the tiny
        # model decodes a 6-token turn in a few ms, before even a 50 ms search returns, and the
        # test would then see no turn join a running batch although the engine allows it.
        time.sleep(0.02)
        finished = self.inner.step()
        self.act([out for _, out in finished])
        return finished

    def abort(self, request_ids):
        self.inner.abort(request_ids)


@pytest.fixture(scope="module")
def prompts(engine):
    return [engine.tokenizer.encode(r.question) for r in ROWS[:4]]


def _drain(engine, ids: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    while len(out) < len(ids):
        out.update(engine.step())
    return out


def test_submit_and_step_give_generates_outputs(engine, prompts):
    # The same requests through the step interface, submitted in two waves (the second
    # while the first decodes): the same ids and logprobs as one generate call, because
    # each request's seed is its own and greedy has no randomness.
    assert streams(engine)
    for params in (SamplingParams(max_new_tokens=10, temperature=0.0), SAMPLED):
        want = engine.generate(prompts, params)
        first = engine.submit(prompts[:2], SamplingParams(**{**params.__dict__, "seeds": params.seeds and params.seeds[:2]}))
        engine.step()
        second = engine.submit(prompts[2:], SamplingParams(**{**params.__dict__, "seeds": params.seeds and params.seeds[2:]}))
        got = _drain(engine, first + second)
        for rid, w in zip(first + second, want):
            assert got[rid].token_ids == w.token_ids and got[rid].finish_reason == w.finish_reason
            assert got[rid].logprobs == pytest.approx(w.logprobs, abs=1e-5)
    # Not vacuous: the prompts give different continuations.
    assert len({tuple(w.token_ids) for w in want}) == len(prompts)


def test_nothing_to_generate_and_misuse(engine, prompts):
    ids = engine.submit(prompts[:2], SamplingParams(max_new_tokens=0))
    assert [(rid in ids, o.token_ids, o.finish_reason) for rid, o in engine.step()] == [(True, [], "length")] * 2
    running = engine.submit(prompts[:1], SamplingParams(max_new_tokens=50, temperature=0.0))
    with pytest.raises(ZsearchError, match="1 submitted requests are unfinished"):
        engine.generate(prompts[:1], SamplingParams(max_new_tokens=2))
    with pytest.raises(ZsearchError, match="unfinished"):
        engine.update_weights(iter(()))
    engine.abort(running)
    assert engine.step() == []  # aborted: it never comes back
    assert len(engine.generate(prompts[:1], SamplingParams(max_new_tokens=3, temperature=0.0))[0].token_ids) == 3


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_async_on_vllm_gives_the_sync_trajectories(engine, temperature):
    # Sync: one generate call per turn (the barrier). Async: continuous batching, with a
    # search backend answering in random order on real threads. Every trajectory must
    # match: ids, masks, texts and turn logs exactly; logprobs to kernel rounding (a
    # request decoded in another batch shape rounds differently, ~1e-6 here).
    def run(mode: str, search_seed: int):
        backend = StreamingTiny(engine)
        search = RandomLatencySearch(search_seed, latencies=(0.0, 0.05, 0.3), overtake=mode == "async")
        cfg = RolloutOptions(max_turns=3, max_turn_tokens=6, topk=2, temperature=temperature,
                            rollout_mode=mode, search_concurrency=4)
        trajs = RolloutEngine(backend, TagsProtocol(), search, cfg, seed=5).rollout(ROWS[:4], group_size=2, step=2)
        return [t.to_row() for t in trajs], backend, search

    sync, sync_backend, _ = run("sync", 0)
    assert sum(t["num_searches"] for t in sync) >= 6 and len({t["num_turns"] for t in sync}) > 1
    assert sync_backend.running_at_submit == []  # the sync engine calls generate only
    for search_seed in (1, 2):
        got, backend, search = run("async", search_seed)
        assert search.started != search.finished and search.peak > 1  # concurrent, out of order
        assert max(backend.running_at_submit) > 0  # a turn joined while others decoded: no barrier
        assert [{**t, "logprobs": None} for t in got] == [{**t, "logprobs": None} for t in sync]
        for a, b in zip(got, sync):
            assert a["logprobs"] == pytest.approx(b["logprobs"], abs=1e-5, rel=0)
    assert not engine._running


class FailingSearch(SearchBackend):
    name = "failing"

    def search(self, requests, topk):
        raise ZsearchError("the retriever is down")


def test_a_failed_async_rollout_leaves_no_request_in_the_engine(engine, prompts):
    cfg = RolloutOptions(max_turns=3, max_turn_tokens=6, topk=2, temperature=0.0, rollout_mode="async")
    with pytest.raises(SearchBackendError, match="the retriever is down"):
        RolloutEngine(StreamingTiny(engine), TagsProtocol(), FailingSearch(), cfg).rollout(ROWS[:4], group_size=2)
    assert not engine._running
    # The engine is usable at once: nothing left over surfaces in the next call.
    out = engine.generate(prompts[:2], SamplingParams(max_new_tokens=4, temperature=0.0))
    assert [len(o.token_ids) for o in out] == [4, 4]
