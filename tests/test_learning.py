"""The trainer must *learn*: a toy search task on a tiny model, where RL raises the reward
and the rise needs the search result. The task, the warm-up and the runs live in
``zsearch_cli.train.toy`` (its docstring says why the task has this shape), so ``make demo``
runs the very same code without pytest.

Each algorithm runs STEPS = 60 seeded steps through the real engine and ``Trainer``: the mean
reward of the last 5 steps must beat that of the first 5 by >= 0.3 and reach 0.7. The control
reruns REINFORCE with a retriever that names a random word: the same trainer must not pass
that bar there, so the rise comes from reading the search result, not from a word prior or
from memorising items.

Measured (seed 0, first 5 -> last 5 steps, with per-sample sampling seeds): reinforce
0.463 -> 1.000, grpo 0.450 -> 0.988, dspo 0.478 -> 0.994, ppo 0.525 -> 0.981; control
0.194 -> 0.219 (per-step reward swinging around 0.25 as it collapses onto one word). The whole file: ~55 s wall, ~95 s CPU on
2 threads (each RL run ~5-10 s, the SFT warm-up ~15 s).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import TORCH_THREADS
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.train.toy import ALGOS, STEPS, OracleSearch, rise, run_toy, warm_toy_model


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, list[Any]]:
    """(SFT-warmed tiny model dir, QA rows)."""
    torch.set_num_threads(TORCH_THREADS)
    return warm_toy_model(tmp_path_factory.mktemp("learning"))


def _run(algo: str, toy: tuple[Path, list[Any]], tmp_path: Path, search: OracleSearch) -> list[dict[str, Any]]:
    model, rows = toy
    metrics = run_toy(algo, model, rows, tmp_path / algo, search)
    assert search.seen_progress[0] == (0, STEPS) and search.seen_progress[-1] == (STEPS - 1, STEPS)
    assert (tmp_path / algo / "metrics.parquet").is_file()  # what the demo plots
    return metrics


def _rise(rows: list[dict[str, Any]]) -> tuple[float, float]:
    first, last = rise(rows)
    print(f"reward first 5 steps {first:.3f} -> last 5 steps {last:.3f}")
    return first, last


def _check(algo: str, first: float, last: float) -> None:
    # The warm-up must leave room to learn: it reads the passage about half the time (a
    # constant answer scores 0.25, reading every passage ~1.0); at 0.6 or more the rise
    # below could not reach 0.3 from what RL adds.
    assert first < 0.6, f"{algo}: the warm-up alone already solves the task ({first:.2f}); the test is void"
    assert last - first >= 0.3, f"{algo}: reward {first:.3f} -> {last:.3f}, rose by less than 0.3"
    assert last >= 0.7, f"{algo}: reward ends at {last:.3f}; without reading the passage it stays near 0.25"


@pytest.mark.parametrize("algo", sorted(set(ALGOS) - {"grpo"}))
def test_rl_raises_reward(algo, toy, tmp_path):
    _check(algo, *_rise(_run(algo, toy, tmp_path, OracleSearch())))


def test_grpo_raises_reward_as_the_demo_runs_it(toy, tmp_path, capsys, monkeypatch):
    """GRPO (with a frozen reference and the k3 KL term) through `python -m
    zsearch_cli.train.toy`, `make demo` step 5: it says what it trains, and the rise it
    prints is the one in the metrics.parquet the demo plots. Its warm-up is the module's:
    the same seeded function on the same rows, which a second run would only repeat."""
    import pyarrow.parquet as pq

    import zsearch_cli.train.toy as toy_module
    from zsearch_cli.train.toy import main

    monkeypatch.setattr(toy_module, "warm_toy_model", lambda root, tokenizer=None: toy)
    torch.set_num_threads(TORCH_THREADS)
    assert main(["--algo", "grpo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "tiny 2-layer" in out and "not smollm2" in out
    printed = re.search(r"first 5 steps ([\d.]+) -> last 5 steps ([\d.]+)", out)
    first, last = rise(pq.read_table(tmp_path / "grpo" / "metrics.parquet").to_pylist())
    assert printed and (float(printed[1]), float(printed[2])) == (round(first, 3), round(last, 3))
    _check("grpo", first, last)


def test_no_rise_without_the_search_result(toy, tmp_path):
    """Control: the passage names a random word, so copying it is right only by chance and
    nothing about the item can be learned from it. The same REINFORCE run must fail the bar
    the real runs pass. (It collapses onto one word, so its per-step reward swings with how
    many of the 8 prompts have that word: ~0.1 noise on a 5-step mean; hence no tighter bar.)"""
    first, last = _rise(_run("reinforce", toy, tmp_path, OracleSearch(shuffle=True)))
    assert last - first < 0.3 and last < 0.45, f"control: reward {first:.3f} -> {last:.3f} rose without the passage"


@pytest.mark.slow
def test_grpo_raises_reward_on_the_real_smollm2_tokenizer(tmp_path):
    """Issue 29: the same check on text that goes through a real tokenizer and chat template.
    The toy's variant with smollm2's tokenizer (toy.py docstring): a random tiny Llama sized to
    its 49152-token vocabulary, smollm2's template (a default system turn, ``<|im_start|>``
    headers), and the tags as plain text, 3 tokens each ('<', 'search', '>'), so the stop
    strings end multi-token spans and the parser reads decoded text. Every item's code is
    'river': the run learns the word, not the copy (copying the passage takes too many SFT
    steps on a 49k-vocabulary head for a CI test). A flipped advantage sign fails it (measured,
    below); a prompt or observation that is not the template's or the tokenizer's own ids
    fails the token checks at the end.

    Hand reasoning: the warm-up answers a uniformly random code word, so the first steps score
    ~0.25-0.4 (the lr ramps up over 8 of the 16 steps, so the first 5 steps barely move the
    policy); one update at lr 3e-3 already took 0.375 -> 0.75 while tuning, so by the last 5
    steps the word is ~certain (~0.94). Measured (seed 0): 0.350 -> 0.963; with the sign of
    GRPO's advantages flipped 0.212 -> 0.000 (fails). ~85-95 s wall on the 2-core box under
    load (tokenizer ~3 s, warm-up ~30 s, 16 RL steps ~55 s), ~84 s CPU."""
    from zsearch_cli.models.tiny import smollm2_tokenizer
    from zsearch_cli.train.toy import REAL

    torch.set_num_threads(TORCH_THREADS)
    tok = smollm2_tokenizer()
    model, rows = warm_toy_model(tmp_path, tokenizer=tok)
    search = OracleSearch()
    metrics = run_toy("grpo", model, rows, tmp_path / "grpo", search, save_rollouts=True, **REAL["rl"])
    assert search.seen_progress[-1] == (REAL["rl"]["steps"] - 1, REAL["rl"]["steps"])
    _check("grpo", *_rise(metrics))

    # It went through the real template, token-in/token-out: a rollout sample's prompt is
    # smollm2's chat template (its default system turn first, the assistant header last), and
    # the response is the sampled ids (mask 1, each with its sampler logprob < 0) around the
    # observation's ids tokenized on their own (mask 0), not a re-encoding of the whole text.
    import pyarrow.parquet as pq

    from zsearch_cli.models.loading import apply_chat
    from zsearch_cli.rollout.protocols import TagsProtocol

    start, header = tok.convert_tokens_to_ids("<|im_start|>"), tok.encode("<|im_start|>assistant\n")
    sample = pq.read_table(sorted((tmp_path / "grpo" / "rollouts").glob("*.parquet"))[-1]).to_pylist()[0]
    prompt, response, mask = sample["prompt_ids"], sample["response_ids"], sample["loss_mask"]
    item = int(sample["row_id"].removeprefix("item-"))
    assert prompt[0] == start and prompt[-len(header):] == header
    assert prompt == apply_chat(tok, f"item {item} code?") and "You are a helpful AI assistant" in tok.decode(prompt)
    obs = [i for i, m in enumerate(mask) if m == 0]
    assert obs and obs == list(range(obs[0], obs[-1] + 1)), "one observation span, masked out"
    passage = [Passage(f"doc-{sample['row_id']}", "", f"the code is {REAL['code']} .", 1.0)]
    assert response[obs[0]:obs[-1] + 1] == tok.encode(TagsProtocol().render_observation([passage]),
                                                       add_special_tokens=False)
    assert all(lp < 0 for lp, m in zip(sample["logprobs"], mask) if m), "a sampled token without its logprob"
    sampled = tok.decode(response[:obs[0]]) + "|" + tok.decode(response[obs[-1] + 1:])
    assert sampled.startswith("<search>") and sampled.endswith("</answer>"), sampled
