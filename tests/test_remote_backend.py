"""The OpenAI-compatible server backend (the Dr. Zero solver behind ``vllm serve``): real
HTTP on 127.0.0.1 to a server that answers as vLLM does, over the real tiny model."""

from __future__ import annotations

import pytest

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import SamplingParams
from zsearch_cli.models.remote import RemoteBackend
from zsearch_cli.retrieval.server import serving
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import QARow, RolloutEngine
from zsearch_cli.rollout.protocols import TagsProtocol

from helpers import RecordingSearch, ScriptedBackend, vllm_style_app


def _prompts(tok) -> list[list[int]]:
    return [tok.encode(t, add_special_tokens=False) for t in ("Question: who wrote it?", "The river", "a b c d e")]


@pytest.mark.parametrize("ids_as", ["token_ids", "token_strings"])
def test_greedy_over_http_equals_the_in_process_backend(tiny_backend, ids_as):
    # Greedy decoding is deterministic, so the ids sent back over HTTP must be the very ids
    # the same model picks in process, whichever way the server spells the ids. The logprobs
    # agree to float32 rounding: the server runs one row per forward, the local call a padded
    # batch of three (JSON itself round-trips floats exactly).
    tok = tiny_backend.tokenizer
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    local = tiny_backend.generate(_prompts(tok), params)
    app = vllm_style_app(tiny_backend, ids_as=ids_as)
    with serving(app) as url:
        remote = RemoteBackend(f"{url}/v1", tok).generate(_prompts(tok), params)
    assert [o.token_ids for o in remote] == [o.token_ids for o in local]
    for r, loc in zip(remote, local):
        assert r.logprobs == pytest.approx(loc.logprobs, abs=1e-5)
    assert [o.finish_reason for o in remote] == [o.finish_reason for o in local]
    # token ids go out, never text (one request per row, answered in any order); the server
    # is asked for the ids, the stop text and the sampled token's logprob
    assert sorted(b["prompt"] for b in app.state.seen) == sorted(_prompts(tok))
    body = app.state.seen[0]
    assert body["model"] == "solver-1"
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"] and body["include_stop_str_in_output"]
    assert body["logprobs"] == 0 and body["skip_special_tokens"] is False and "seed" not in body


def test_seeded_sampling_is_per_row_and_reproducible(tiny_backend):
    # Each row is its own request with a seed from (call seed, row index): a row's sample
    # depends on its seed and index only, not on the other rows in the call.
    tok = tiny_backend.tokenizer
    params = SamplingParams(max_new_tokens=10, temperature=1.0, seed=7)
    with serving(vllm_style_app(tiny_backend)) as url:
        backend = RemoteBackend(f"{url}/v1", tok)
        first = backend.generate(_prompts(tok), params)
        again = backend.generate(_prompts(tok), params)
        alone = backend.generate(_prompts(tok)[:1], params)
        other_seed = backend.generate(_prompts(tok), SamplingParams(max_new_tokens=10, temperature=1.0, seed=8))
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert alone[0].token_ids == first[0].token_ids
    assert [o.token_ids for o in other_seed] != [o.token_ids for o in first]
    assert all(len(o.token_ids) == len(o.logprobs) for o in first)


def test_stop_strings_and_an_engine_rollout_through_the_server(tiny_backend):
    # A scripted policy behind the server: the stop string comes back in the ids with
    # finish 'stop', and the engine runs a full search turn through HTTP with the
    # observation masked (mask 0) and every policy id carried over as sent.
    tok = tiny_backend.tokenizer
    question = "Which river flows through Vienna?"
    scripted = ScriptedBackend(tok, {question: ["<search> vienna river </search>", "<answer> Danube </answer>"]})
    with serving(vllm_style_app(scripted)) as url:
        remote = RemoteBackend(f"{url}/v1", tok)
        engine = RolloutEngine(remote, TagsProtocol(), RecordingSearch(), RolloutOptions(max_turns=2), seed=3)
        traj = engine.rollout([QARow("q0", question, ["Danube"])])[0]
    assert traj.prediction == "Danube" and traj.num_searches == 1
    assert [t["finish"] for t in traj.turns] == ["stop", "stop"]
    ids, mask = traj.response_ids, traj.loss_mask
    policy_ids = [i for i, m in zip(ids, mask) if m]
    expected = tok.encode("<search> vienna river </search>", add_special_tokens=False) + tok.encode(
        "<answer> Danube </answer>", add_special_tokens=False)
    assert policy_ids == expected and 0 in mask


def test_a_server_without_token_ids_is_refused(tiny_backend):
    tok = tiny_backend.tokenizer
    with serving(vllm_style_app(tiny_backend, ids_as="none")) as url:
        with pytest.raises(ZsearchError, match="no sampled token ids"):
            RemoteBackend(f"{url}/v1", tok).generate(_prompts(tok)[:1], SamplingParams(max_new_tokens=3))


def test_a_different_tokenizer_is_refused_and_a_missing_tokenize_is_tolerated(tiny_backend):
    tok = tiny_backend.tokenizer

    class Shifted:  # a local tokenizer that splits text differently from the server's
        def encode(self, text, add_special_tokens=True):
            return [i + 1 for i in tok.encode(text, add_special_tokens=add_special_tokens)]

    with serving(vllm_style_app(tiny_backend)) as url:
        with pytest.raises(ZsearchError, match="tokenizer differs from the local one"):
            RemoteBackend(f"{url}/v1", Shifted())
        assert RemoteBackend(f"{url}/v1", tok).check_tokenizer() is True
    with serving(vllm_style_app(tiny_backend, tokenize=False)) as url:
        assert RemoteBackend(f"{url}/v1", tok, check_tokenizer=False).check_tokenizer() is False


def test_a_dead_server_fails_with_its_url():
    with pytest.raises(ZsearchError, match=r"solver server http://127.0.0.1:9/tokenize: failed after 2"):
        RemoteBackend("http://127.0.0.1:9/v1", None, model="m", retries=1, timeout=2)
