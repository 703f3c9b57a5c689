"""What the collapse guard (train/guard.py) adds to one training step: ``garbage_frac`` over
the step's texts, ``repeat_frac`` over its token ids and ``CollapseGuard.observe`` on the
metrics row, at the scale of a large step (default 512 prompts x 5 samples = 2560 samples of
500 tokens, ~4 characters per token, one sample in 20 a degenerate loop, some CJK text).
The budget is < 1% of a step; a step of that size takes minutes (rollout + update).

    python bench/guard_overhead.py [--samples 2560] [--tokens 500] [--steps 5]
"""

from __future__ import annotations

import argparse
import random
import time

from zsearch_cli.train.guard import CollapseGuard, garbage_frac, repeat_frac


def make_step(rng: random.Random, samples: int, tokens: int) -> tuple[list[str], list[list[int]]]:
    words = ["search", "the", "answer", "<search>", "</search>", "Paris", "被", "中国", "river", "1987", "\n"]
    texts, ids = [], []
    for i in range(samples):
        if i % 20 == 0:  # a degenerate loop
            ids.append([17, 4, 99, 4] * (tokens // 4))
        else:
            ids.append([rng.randrange(32000) for _ in range(tokens)])
        texts.append(" ".join(rng.choice(words) for _ in range(tokens * 4 // 6)))
    return texts, ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=2560)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(0)
    texts, ids = make_step(rng, args.samples, args.tokens)
    chars = sum(len(t) for t in texts)
    t0 = time.perf_counter()
    garbage_frac(["warm-up"])  # builds the character class once per process
    build = time.perf_counter() - t0
    guard = CollapseGuard()
    timings = {"garbage_frac": 0.0, "repeat_frac": 0.0, "observe": 0.0}
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        g = garbage_frac(texts)
        t1 = time.perf_counter()
        r = repeat_frac(ids)
        t2 = time.perf_counter()
        row = {"rollout/reward_mean": 0.3 + 0.01 * rng.random(), "rollout/response_length": 500.0,
               "actor/entropy": 0.9, "actor/kl_ref": 0.01, "actor/grad_norm": 0.5, "actor/loss": 0.01,
               "rollout/garbage_frac": g, "rollout/repeat_frac": r, "rollout/invalid": 0.1, "rollout/answered": 0.9}
        guard.observe(step, row)
        t3 = time.perf_counter()
        timings["garbage_frac"] += t1 - t0
        timings["repeat_frac"] += t2 - t1
        timings["observe"] += t3 - t2
    total = sum(timings.values()) / args.steps
    print(f"{args.samples} samples x {args.tokens} tokens ({chars / 1e6:.1f}M characters), {args.steps} steps; "
          f"garbage_frac={g:.4f} repeat_frac={r:.4f}")
    print(f"one-off character-class build: {build * 1e3:.0f} ms")
    for name, t in timings.items():
        print(f"  {name:13s} {t / args.steps * 1e3:8.2f} ms per step")
    print(f"  {'total':13s} {total * 1e3:8.2f} ms per step "
          f"(1% of a step: the step must take > {total * 100:.1f} s)")


if __name__ == "__main__":
    main()
