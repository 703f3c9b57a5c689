"""The trainer must *learn*: a toy search task on a tiny model, where RL raises the reward.

Task: "what is the code of item N?". The answer is one of four code words; the only place it
appears is the passage the search returns (an oracle retriever that serves the asking row's
document, so the query text does not matter but searching does). A short SFT warm-up
teaches the output format — think, search, then ``<answer> WORD </answer>`` — with the
answer word drawn at random, independent of the passage. After it the policy follows the
format but answers at chance (≈ 1/4): copying the word from the retrieved information is
what RL has to discover. Each algorithm runs 60 seeded steps through the real engine and
``Trainer``; the mean reward of the last 5 steps must beat that of the first 5 by >= 0.3.
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
COPY_FRACTION = 0.0
PER_ITEM_CODES = False
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
    rng = random.Random(0)
    return [{"id": f"item-{i}", "question": f"what is the code of item {i}?",
             "golden_answers": [rng.choice(CODES) if PER_ITEM_CODES else CODES[0]]} for i in range(N_ITEMS)]


def _sft(model_dir: Path, qa: list[dict[str, Any]], out: Path) -> Path:
    """Teacher-force the format with a random answer word (mask-0 observations, as in RL)."""
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
        examples.append((prompt, obs, r["golden_answers"][0]))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(SFT_STEPS):
        batch = []
        for prompt, obs, r_gold in rng.sample(examples, 16):
            word = r_gold if rng.random() < COPY_FRACTION else rng.choice(CODES)
            answer = engine._encode(f"<answer> {word} </answer>")
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
    cfg = TrainConfig(algo=algo, model=str(model), train_data=str(qa), out=tmp_path / algo, steps=STEPS,
                      batch_size=8, group_size=4, lr=LR, beta=0.0, max_turns=1, max_turn_tokens=12,
                      micro_batch_size=32, save_every=0, device="cpu", seed=0, **overrides)
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
    ("grpo", {}),
    ("dspo", {"max_gen_batches": 3}),
    ("ppo", {"group_size": None, "batch_size": 16, "critic_lr": 2e-3}),
])
def test_rl_raises_reward(algo, overrides, toy, tmp_path):
    rows = _run(algo, toy, tmp_path, **overrides)
    first, last = _rise(rows)
    assert first < 0.5, f"{algo}: the warm-up alone already solves the task ({first:.2f}); the test is void"
    assert last - first >= 0.3, f"{algo}: reward {first:.3f} -> {last:.3f}, rose by less than 0.3"
