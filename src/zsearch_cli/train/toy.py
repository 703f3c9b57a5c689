"""RL that visibly learns in a minute on a CPU: a toy search task on a tiny model.

``python -m zsearch_cli.train.toy --algo grpo --out DIR`` is step 5 of ``make demo``;
``tests/test_learning.py`` runs the same functions for all four algorithms and the control.

Task: "item N code?". Each of N_ITEMS items has a code, one of four words, from a seeded
shuffle of a balanced list: the question says nothing about it and no word is a good
constant guess (a constant answer scores 0.25). The search is the only way to know it: an
oracle retriever serves the asking row's passage, "the code is WORD .", whatever the query,
and the reward is EM against the item's word (docs/methods.md §1). There are 512 items and
the 60 steps visit 60 x 8 = 480 prompts, so most prompts RL sees are new: remembering item
-> word cannot raise the reward, copying the word from the observation into ``<answer>``
can. The control (``--control``) serves a random word instead: the same run must not learn.

Warm-up (not RL): SFT_STEPS of teacher forcing through the trainer's own collate/logprob
code on ``<search> code </search>``, the observation (mask 0, as in RL), then ``<answer> WORD
</answer>``, where WORD is the passage's word with probability SFT_COPY = 0.3 and a uniformly
random code word otherwise. It teaches the format and starts a weak copy (the exact target
would be 0.3 + 0.7/4 = 0.475; after 200 steps the policy gets ~0.43 under sampling). RL then
runs STEPS = 60 seeded steps through the real rollout engine and ``Trainer``.

Why this shape (measured while building tests/test_learning.py): with Search-R1's ~150-token
prompt the 2-layer 64-dim model did not learn to copy within 60 steps, so each row carries a
~20-token prompt (``QARow.prompt``), the passage has no title and the search turn is 4
tokens (~45 tokens in all); actor lr 1e-3 with a 10% lr warmup, so the first 5 steps measure
the warm-up's policy; and the warm-up must leave a weak copy for all four words, or RL
stalls at 0.5 or 0.75 on the words it copies. With 48 items instead of 512 the control rose
by 0.1-0.14 (memorising items), hence the large item set.

Real-tokenizer variant (``--real-tokenizer``; ``warm_toy_model(root, tokenizer=smollm2_tokenizer())``,
issue 29): the same task on a random tiny Llama sized to smollm2's REAL tokenizer (49152 ids,
tied embeddings) with smollm2's REAL chat template (a default system turn, ``<|im_start|>``
headers) and the tags as plain text, 3 tokens each. Why: the tiny BPE above has the tags as
single special ids and a template of our own, so a loss mask shifted by one over real text, a
template boundary that retokenizes or multi-token stop strings cannot go wrong there. The
49k-wide LM head makes every step ~30x dearer on a CPU, and copying the passage needs far more
warm-up than a CI test can spend, so this variant learns the word, not the copy: every item's
code is REAL["code"], the warm-up (REAL's SFT settings, SFT_COPY 0) teaches the format with a
uniformly random word (~0.25), and RL runs REAL["rl"] (16 steps, 4 x 4 samples, lr 1e-3 ramped
over 8 steps so the first 5 steps measure the warm-up). Measured (seed 0): 0.350 -> 0.963; with
the advantage's sign flipped 0.212 -> 0.000.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

from zsearch_cli.retrieval.base import Passage
from zsearch_cli.search.base import SearchBackend, SearchRequest, SearchResult

CODES = ("apple", "river", "stone", "cloud")
N_ITEMS = 512
STEPS = 60
LR = 1e-3
WARMUP = 0.1
SFT_STEPS = 200
SFT_BATCH = 64
SFT_COPY = 0.3
REAL = {"code": "river", "sft_steps": 20, "sft_batch": 16, "sft_lr": 1e-2,  # the real-tokenizer variant
        "rl": {"steps": 16, "lr": 1e-3, "warmup_ratio": 0.5, "batch_size": 4}}  # run_toy overrides
ALGOS = {  # the overrides each algorithm's run adds to run_toy's defaults
    "reinforce": {},
    "grpo": {"beta": 0.001},  # with a frozen reference and the k3 KL term
    "dspo": {"max_gen_batches": 3},
    "ppo": {"group_size": None, "batch_size": 32, "critic_lr": 2e-3},
}
TASK = ("toy search task on a tiny 2-layer 64-dim model (not smollm2): 'item N code?' for 512 items, "
        "each coded by one of 4 words that only the search result names; reward EM, a constant answer scores 0.25")


def codes() -> list[str]:
    """Item i's code: a seeded shuffle of a balanced list (each word N_ITEMS / 4 times)."""
    out = [CODES[i % len(CODES)] for i in range(N_ITEMS)]
    random.Random(7).shuffle(out)
    return out


def toy_rows(code: str | None = None) -> list[Any]:
    """The N_ITEMS rows, coded by :func:`codes`, or all by ``code`` (the real-tokenizer variant)."""
    from zsearch_cli.rollout.engine import QARow

    return [QARow(f"item-{i}", f"what is the code of item {i}?", [code or c], prompt=f"item {i} code?")
            for i, c in enumerate(codes())]


class OracleSearch(SearchBackend):
    """Returns the asking row's passage, whatever the query: a perfect retriever. With
    ``shuffle`` (the control) the passage names a random code word instead (seeded)."""

    name = "oracle"

    def __init__(self, shuffle: bool = False) -> None:
        self.shuffle = shuffle
        self.rng = random.Random(123)
        self.seen_progress: list[tuple[int, int]] = []

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        words = [self.rng.choice(CODES) if self.shuffle else r.golden_answers[0] for r in requests]
        return [SearchResult([Passage(f"doc-{r.row_id}", "", f"the code is {w} .", 1.0)])
                for r, w in zip(requests, words)]

    def progress(self, step: int, total: int) -> None:
        self.seen_progress.append((step, total))


def warm_toy_model(root: Path, tokenizer: Any = None) -> tuple[Path, list[Any]]:
    """(SFT-warmed tiny model folder ROOT/sft, QA rows): a fresh seeded tiny model, then the
    format warm-up. Teacher forcing goes through the trainer's own collate/logprob code, with
    mask-0 observations as in RL; the answer copies the passage's word with probability
    SFT_COPY, else it is a uniformly random code word. With ``tokenizer`` (a tokenizer or its
    folder, e.g. ``smollm2_tokenizer()``): the real-tokenizer variant (module docstring),
    a tiny model sized to that tokenizer, with its chat template, and the REAL settings."""
    import torch

    from zsearch_cli.models.hf import HFBackend
    from zsearch_cli.models.loading import load_model
    from zsearch_cli.models.tiny import make_tiny_model, make_tiny_model_with_tokenizer
    from zsearch_cli.rollout.engine import RolloutEngine
    from zsearch_cli.rollout.protocols import TagsProtocol
    from zsearch_cli.train.logprobs import collate, policy_forward

    real = tokenizer is not None
    rows = toy_rows(REAL["code"] if real else None)
    sft_steps, sft_batch, sft_lr, sft_copy = ((REAL["sft_steps"], REAL["sft_batch"], REAL["sft_lr"], 0.0) if real
                                              else (SFT_STEPS, SFT_BATCH, 3e-3, SFT_COPY))
    if not real:
        words = " ".join(f"the code is {c} . <answer> {c} </answer>" for c in CODES * 20)
        base = make_tiny_model(root / "base", seed=0, corpus_text=words)
    else:
        base = make_tiny_model_with_tokenizer(root / "base", tokenizer, seed=0)
    torch.manual_seed(0)
    model, tok = load_model(str(base), device="cpu", trainable=True)
    search = OracleSearch()
    engine = RolloutEngine(HFBackend(model, tok), TagsProtocol(), search)
    rng = random.Random(1)
    search_ids = engine._encode("<search> code </search>")
    answers = {c: engine._encode(f"<answer> {c} </answer>") for c in CODES}
    examples = []
    for r in rows:
        passages = search.search([SearchRequest("code", r.id, r.question, tuple(r.golden_answers))], 1)[0].passages
        examples.append((engine.encode_prompt(r), engine._encode(engine.protocol.render_observation([passages])),
                         r.golden_answers[0]))
    opt = torch.optim.Adam(model.parameters(), lr=sft_lr)
    for _ in range(sft_steps):
        batch = []
        for prompt, obs, gold in rng.sample(examples, sft_batch):
            answer = answers[gold if rng.random() < sft_copy else rng.choice(CODES)]
            batch.append(SimpleNamespace(prompt_ids=prompt, response_ids=search_ids + obs + answer,
                                         loss_mask=[1] * len(search_ids) + [0] * len(obs) + [1] * len(answer)))
        b = collate(batch, tok.pad_token_id, "cpu")
        logp, _ = policy_forward(model, b, 1.0)
        loss = -(logp * b.mask).sum() / b.mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = root / "sft"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out, rows


def run_toy(algo: str, model: Path, rows: list[Any], out: Path, search: OracleSearch,
            **overrides: Any) -> list[dict[str, Any]]:
    """STEPS seeded RL steps of ``algo`` (with its ALGOS overrides, then ``overrides``) from
    ``model``; writes OUT (metrics.parquet, for ``zsearch plot``) and returns the metric rows."""
    from zsearch_cli.train import TrainConfig
    from zsearch_cli.train.sampler import PromptSampler
    from zsearch_cli.train.trainer import Trainer

    options = dict(algo=algo, model=str(model), out=out, steps=STEPS, batch_size=8, group_size=4,
                   lr=LR, warmup_ratio=WARMUP, beta=0.0, max_turns=1, max_turn_tokens=12, micro_batch_size=32,
                   save_every=0, device="cpu", seed=0)
    cfg = TrainConfig.from_flat(**{**options, **ALGOS[algo], **overrides})
    # The rows carry their own short prompt, which a QA file cannot: hand them over as data.
    trainer = Trainer(cfg, search=search, data=PromptSampler(rows, cfg.batch_size, cfg.seed))
    trainer.train()
    return trainer.metrics.rows


def rise(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(mean reward of the first 5 steps, of the last 5 steps)."""
    first = sum(r["rollout/reward_mean"] for r in rows[:5]) / 5
    last = sum(r["rollout/reward_mean"] for r in rows[-5:]) / 5
    return first, last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zsearch_cli.train.toy",
                                     description="RL on the toy search task (tiny model); prints the reward rise.")
    parser.add_argument("--algo", choices=sorted(ALGOS), default="grpo")
    parser.add_argument("--out", type=Path, default=Path("runs/toy"), help="OUT/sft (warm-up), OUT/ALGO (the RL run)")
    parser.add_argument("--control", action="store_true", help="the passage names a random word: no rise expected")
    parser.add_argument("--real-tokenizer", action="store_true",
                        help="the real-tokenizer variant: smollm2's tokenizer and chat template, one code word (GRPO)")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(min(2, torch.get_num_threads()))
    print(f"task: {TASK}{' [CONTROL: the passage names a random word]' if args.control else ''}")
    start = time.monotonic()
    tokenizer = None
    if args.real_tokenizer:
        from zsearch_cli.models.tiny import smollm2_tokenizer

        tokenizer = smollm2_tokenizer()
        print(f"real-tokenizer variant: smollm2's tokenizer and chat template; every code is {REAL['code']!r}")
    model, rows = warm_toy_model(args.out, tokenizer=tokenizer)
    sft_steps = REAL["sft_steps"] if tokenizer is not None else SFT_STEPS
    print(f"format warm-up: {sft_steps} SFT steps -> {model} ({time.monotonic() - start:.0f} s)")
    start = time.monotonic()
    overrides = REAL["rl"] if tokenizer is not None else {}
    metrics = run_toy(args.algo, model, rows, args.out / args.algo, OracleSearch(shuffle=args.control), **overrides)
    first, last = rise(metrics)
    print(f"{args.algo}: {len(metrics)} steps in {time.monotonic() - start:.0f} s; "
          f"mean reward first 5 steps {first:.3f} -> last 5 steps {last:.3f} (rise {last - first:+.3f})")
    print(f"metrics: {args.out / args.algo / 'metrics.parquet'} (zsearch plot {args.out / args.algo})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
