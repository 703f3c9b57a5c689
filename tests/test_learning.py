"""The trainer must *learn*: a toy search task on a tiny model, where RL raises the reward.

Task: "what is the code of item N?". The passage the search returns says "the code is
apple" (an oracle retriever that serves the asking row's document, so the query text does
not matter), and the gold answer is "apple". A short SFT warm-up teaches the output format —
think, search, then ``<answer> WORD </answer>`` — with WORD drawn uniformly from four code
words, so after it the policy follows the format but answers at chance (≈ 1/4). Each
algorithm then runs 30 seeded steps (< 60) through the real engine and ``Trainer``; the mean
reward of the last 5 steps must beat that of the first 5 by >= 0.3. A trainer with a sign
error, a broken mask/logprob alignment or no optimizer step stays at chance and fails.

Why the answer is the same for every item, not a per-item word copied from the passage: we
tried that first. The 2-layer, 64-dim tiny model did not learn to copy the word from the
~150-token context within 60 RL steps (nor in a 120-step SFT where a quarter of the answers
were copied), so that test could not tell a working trainer from a broken one on 2 CPU
cores. The rise measured here is RL moving probability mass to the rewarded answer through
the full multi-turn path: sampling, masked observation tokens, recomputed old logprobs,
the algorithm's advantages and loss, and the optimizer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Sequence

import pytest
import torch

from zsearch_cli.retrieval.base import Passage
from zsearch_cli.search.base import SearchRequest, SearchResult

CODES = ("apple", "river", "stone", "cloud")
N_ITEMS = 48
STEPS = 30
LR = 1e-4
SFT_STEPS = 60


class OracleSearch:
    """Returns the asking row's passage, whatever the query: a perfect retriever."""

    name = "oracle"

    def __init__(self) -> None:
        self.progress: list[tuple[int, int]] = []

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        return [SearchResult([Passage(f"doc-{r.row_id}", "code", f"the code is {r.golden_answers[0]} .", 1.0)])
                for r in requests]

    def set_progress(self, step: int, total_steps: int) -> None:
        self.progress.append((step, total_steps))


def _qa_rows() -> list[dict[str, Any]]:
    return [{"id": f"item-{i}", "question": f"what is the code of item {i}?", "golden_answers": [CODES[0]]}
            for i in range(N_ITEMS)]


def _sft(model_dir: Path, qa: list[dict[str, Any]], out: Path) -> Path:
    """Teacher-force the format with a random answer word (mask-0 observations, as in RL),
    through the trainer's own collate/logprob code."""
    from zsearch_cli.models.hf import HFBackend
    from zsearch_cli.models.loading import load_model
    from zsearch_cli.rollout.engine import QARow, RolloutEngine
    from zsearch_cli.rollout.protocols import TagsProtocol
    from zsearch_cli.train.logprobs import collate, policy_forward

    torch.manual_seed(0)
    model, tok = load_model(str(model_dir), device="cpu", trainable=True)
    engine = RolloutEngine(HFBackend(model, tok), TagsProtocol(), OracleSearch())
    rng = random.Random(1)
    search_ids = engine._encode("<think> find the code </think>\n<search> code </search>")
    examples = []
    for r in qa:
        prompt = engine.encode_prompt(QARow(r["id"], r["question"], r["golden_answers"]))
        obs = engine._encode(engine.protocol.render_observation([OracleSearch().search(
            [SearchRequest("code", r["id"], r["question"], tuple(r["golden_answers"]))], 1)[0].passages]))
        examples.append((prompt, obs))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(SFT_STEPS):
        batch = []
        for prompt, obs in rng.sample(examples, 16):
            answer = engine._encode(f"<answer> {rng.choice(CODES)} </answer>")
            batch.append({"prompt_ids": prompt, "response_ids": search_ids + obs + answer,
                          "loss_mask": [1] * len(search_ids) + [0] * len(obs) + [1] * len(answer)})
        b = collate(batch, tok.pad_token_id, "cpu")
        logp, _ = policy_forward(model, b, 1.0)
        loss = -(logp * b.mask).sum() / b.mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    """(SFT-warmed tiny model dir, QA file)."""
    from zsearch_cli.models.tiny import make_tiny_model

    torch.set_num_threads(2)
    root = tmp_path_factory.mktemp("learning")
    qa = _qa_rows()
    qa_path = root / "toy.jsonl"
    qa_path.write_text("".join(json.dumps(r) + "\n" for r in qa))
    words = " ".join(f"the code is {c} . <answer> {c} </answer>" for c in CODES * 20)
    base = make_tiny_model(root / "base", seed=0, corpus_text=words)
    return _sft(base, qa, root / "sft"), qa_path


def _run(algo: str, toy: tuple[Path, Path], tmp_path: Path, **overrides: Any) -> list[dict[str, Any]]:
    from zsearch_cli.train import TrainConfig
    from zsearch_cli.train.trainer import Trainer

    model, qa = toy
    options = dict(algo=algo, model=str(model), train_data=str(qa), out=tmp_path / algo, steps=STEPS,
                   batch_size=8, group_size=4, lr=LR, beta=0.0, max_turns=1, max_turn_tokens=12,
                   micro_batch_size=32, save_every=0, device="cpu", seed=0)
    cfg = TrainConfig(**{**options, **overrides})
    search = OracleSearch()
    trainer = Trainer(cfg, search=search)
    trainer.train()
    assert search.progress[0] == (0, STEPS) and search.progress[-1] == (STEPS - 1, STEPS)
    return trainer.metrics.rows


def _rise(rows: list[dict[str, Any]]) -> tuple[float, float]:
    first = sum(r["reward_mean"] for r in rows[:5]) / 5
    last = sum(r["reward_mean"] for r in rows[-5:]) / 5
    print(f"reward first 5 steps {first:.3f} -> last 5 steps {last:.3f}")
    return first, last


@pytest.mark.parametrize("algo, overrides", [
    ("reinforce", {}),
    ("grpo", {"beta": 0.001}),  # with a frozen reference and the k3 KL term
    ("dspo", {"max_gen_batches": 3}),
    ("ppo", {"group_size": None, "batch_size": 16, "critic_lr": 2e-3}),
])
def test_rl_raises_reward(algo, overrides, toy, tmp_path):
    rows = _run(algo, toy, tmp_path, **overrides)
    first, last = _rise(rows)
    assert first < 0.5, f"{algo}: the warm-up alone already solves the task ({first:.2f}); the test is void"
    assert last - first >= 0.3, f"{algo}: reward {first:.3f} -> {last:.3f}, rose by less than 0.3"
