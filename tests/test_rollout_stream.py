"""Rollouts that overlap training steps (rollout/stream.py): each step's trajectories are the
engine's own, the staleness bound holds, a weight update waits for the running turns, and
every sampled token is labelled with the version whose weights sampled it."""

from __future__ import annotations

import copy
import time

import pytest
import torch

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.hf import HFBackend
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import RolloutEngine
from zsearch_cli.rollout.protocols import TagsProtocol
from zsearch_cli.rollout.stream import RolloutStream
from zsearch_cli.search.base import SearchBackend, SearchBackendError

from helpers import ROWS, RandomLatencySearch, SearchingTiny


class SteppedTiny:
    """The tiny model behind submit/step/abort (a StreamingBackend, as vLLM's): a turn is
    generated when submitted (alone, under its own seed) and comes back after as many
    steps as it has tokens, so turns end at different steps. ``running`` is what a weight
    update must never see non-empty."""

    def __init__(self, inner, step_s: float = 0.0):
        self.inner, self.tokenizer = SearchingTiny(inner, batched=False), inner.tokenizer
        self.step_s = step_s
        self.running: dict[str, list] = {}
        self.count = 0

    def submit(self, prompts, params, stop=()):
        ids = []
        for out in self.inner.generate(prompts, params, stop):
            self.count += 1
            self.running[str(self.count)] = [out, len(out.token_ids)]
            ids.append(str(self.count))
        return ids

    def step(self):
        time.sleep(self.step_s)
        done = []
        for rid, entry in list(self.running.items()):
            entry[1] -= 1
            if entry[1] <= 0:
                done.append((rid, self.running.pop(rid)[0]))
        return done

    def abort(self, request_ids):
        for rid in request_ids:
            self.running.pop(rid, None)


def _engine(backend, search, temperature=1.0):
    cfg = RolloutOptions(max_turns=3, max_turn_tokens=6, topk=2, temperature=temperature,
                        rollout_mode="async", search_concurrency=4)
    return RolloutEngine(backend, TagsProtocol(), search, cfg, seed=5)


def _backend(kind, hf, step_s: float = 0.0):
    return SteppedTiny(hf, step_s) if kind == "stepped" else SearchingTiny(hf, batched=False)


@pytest.mark.parametrize("kind", ["stepped", "batched"])
def test_each_step_gets_the_rollout_the_engine_gives_it(tiny_backend, kind):
    # Three steps in flight at once, answered in random order: each get() must return that
    # step's trajectories exactly as a rollout of the step alone (same seeds, same groups).
    engine = _engine(_backend(kind, tiny_backend), RandomLatencySearch(3, latencies=(0.0, 0.05)))
    with RolloutStream(engine, group_size=2) as stream:
        for step in (4, 5, 6):
            stream.put(ROWS[:3], step)
        got = [[t.to_row() for t in stream.get()] for _ in range(3)]
    alone = _engine(SearchingTiny(tiny_backend, batched=False), RandomLatencySearch(0), 1.0)
    alone.config.rollout_mode = "sync"
    for step, rows in zip((4, 5, 6), got):
        assert rows == [t.to_row() for t in alone.rollout(ROWS[:3], group_size=2, step=step)]
        assert {r["group_id"].split(":")[0] for r in rows} == {str(step)}
        for r in rows:  # no update: every sampled token is version 0, every other one -1
            assert r["policy_version"] == [0 if m else -1 for m in r["loss_mask"]]
    assert got[0] != got[1]  # other seeds per step


def _token_logprobs(model, traj) -> torch.Tensor:
    """log p(token) of every response token under ``model``, teacher-forced."""
    ids = torch.tensor([traj.prompt_ids + traj.response_ids])
    with torch.no_grad():
        logp = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
    return logp.gather(-1, ids[0, 1:, None])[:, 0][len(traj.prompt_ids) - 1:]


@pytest.mark.parametrize("kind", ["stepped", "batched"])
def test_versions_name_the_weights_that_sampled_each_token(tiny_model_and_tokenizer, kind):
    # Staleness bound 1 over three steps: step t may start at version t - 2. After step 1
    # is returned, steps 2 and 3 are queued, and an update pushes visibly different weights (version 1) while step 2 is
    # still rolling out: turns being generated (stepped) or searches in flight (batched).
    # The push must wait for the running turns; every sampled token's logprob must be that
    # of the model its version names (step 2 has both); step 3 must be all version 1 (it
    # could not start before).
    model, tokenizer = tiny_model_and_tokenizer
    old = copy.deepcopy(model)
    new = copy.deepcopy(model)
    with torch.no_grad():  # another policy: logprobs move by far more than the 1e-3 checked below
        for p in new.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * p.std())
    live = copy.deepcopy(model)
    backend = _backend(kind, HFBackend(live, tokenizer, device="cpu"), step_s=0.005)
    search = RandomLatencySearch(1, latencies=(0.05, 0.2))
    engine = _engine(backend, search)
    pushed_while_running = []

    def push():
        pushed_while_running.append(len(getattr(backend, "running", {})))
        live.load_state_dict(new.state_dict())

    with RolloutStream(engine, group_size=2) as stream:
        stream.put(ROWS[:4], 1, min_version=-1)
        steps = [stream.get()]
        for step in (2, 3):
            stream.put(ROWS[:4], step, min_version=step - 2)
        deadline = time.monotonic() + 30
        while not (backend.running if kind == "stepped" else search.in_flight) and time.monotonic() < deadline:
            time.sleep(0.001)
        stream.update(1, push)
        steps += [stream.get(), stream.get()]
    assert pushed_while_running == [0]
    versions = [{v for t in trajs for v, m in zip(t.policy_version, t.loss_mask) if m} for trajs in steps]
    assert versions == [{0}, {0, 1}, {1}]
    checked = sampled = 0
    for trajs in steps:
        for t in trajs:
            mask = torch.tensor(t.loss_mask, dtype=torch.bool)
            version = torch.tensor(t.policy_version)
            logprobs = torch.tensor(t.logprobs)
            assert bool((version[~mask] == -1).all())
            by_model = mask & (logprobs != -0.5)  # SearchingTiny's appended action tokens carry -0.5
            for v, weights in ((0, old), (1, new)):
                sel = by_model & (version == v)
                if sel.any():
                    assert torch.allclose(logprobs[sel], _token_logprobs(weights, t)[sel], atol=1e-3), (t.id, v)
                    checked += int(sel.sum())
            sampled += int(by_model.sum())
    assert checked == sampled > 0


class FailingSearch(SearchBackend):
    thread_safe = True
    name = "failing"

    def search(self, requests, topk):
        raise ZsearchError("the retriever is down")


@pytest.mark.parametrize("kind", ["stepped", "batched"])
def test_a_failure_on_the_rollout_thread_reaches_the_trainer(tiny_backend, kind):
    backend = _backend(kind, tiny_backend)
    engine = _engine(backend, FailingSearch(), temperature=0.0)
    stream = RolloutStream(engine, group_size=2)
    stream.put(ROWS, 1)
    with pytest.raises(SearchBackendError, match="the retriever is down"):
        stream.get()
    with pytest.raises(SearchBackendError):  # and every later call, instead of hanging
        stream.update(1)
    stream.close()
    assert not stream._thread.is_alive()
    assert not getattr(backend, "running", {})  # requests of other samples were aborted
