"""HFBackend.generate against a raw ``model.generate`` with the same work, in one run.

Both sample (temperature 1, top-p 1) the same number of new tokens for the same batch of
real prompts (the bundled demo questions in the chat template, a few hundred tokens each,
as the agent's first turn sees them). EOS is disabled on both sides so that every row
generates exactly ``--tokens`` tokens: the work is identical, only the loop differs. Our
loop additionally keeps each token's logprob, checks stop strings (``</search>``,
``</answer>``, as the engine asks) and uses per-row seeded generators.

    python bench/generate.py [--model smollm2] [--batch 4] [--tokens 32] [--repeats 3]

Reports median wall seconds and tokens/s for each, and the ratio ours / raw (goal <= 1.1).
Timings are medians over alternating repeats; the machine's other load affects both.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table

from zsearch_cli.data.demo import demo_qa
from zsearch_cli.models.base import SamplingParams
from zsearch_cli.models.hf import HFBackend
from zsearch_cli.models.loading import load_model
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import QARow, RolloutEngine
from zsearch_cli.rollout.protocols import TagsProtocol
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import QA

STOPS = ("</search>", "</answer>")


def _prompts(backend: HFBackend, batch: int) -> list[list[int]]:
    """The engine's own first-turn prompts for the first ``batch`` demo test questions."""
    engine = RolloutEngine(backend, TagsProtocol(), None, RolloutOptions())
    rows = read_artifact(demo_qa("test"), QA).to_pylist()[:batch]
    return [engine.encode_prompt(QARow(r["id"], r["question"], r["golden_answers"])) for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    model, tok = load_model(args.model, device="cpu", dtype="float32")
    backend = HFBackend(model, tok, device="cpu")
    backend.eos_ids = set()  # same work as the raw loop below: exactly --tokens per row
    prompts = _prompts(backend, args.batch)
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding, as HFBackend does
        ids[i, width - len(p):] = torch.as_tensor(p)
        mask[i, width - len(p):] = 1
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0, top_p=1.0, seed=0)

    def ours() -> None:
        outs = backend.generate(prompts, params, stop=STOPS)
        assert all(len(o.token_ids) <= args.tokens for o in outs)

    def raw() -> None:
        with torch.inference_mode():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                           top_k=0, max_new_tokens=args.tokens, min_new_tokens=args.tokens, pad_token_id=pad)

    ours(), raw()  # warm-up
    times: dict[str, list[float]] = {"zsearch HFBackend": [], "raw model.generate": []}
    for _ in range(args.repeats):
        for name, fn in (("zsearch HFBackend", ours), ("raw model.generate", raw)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)

    table = Table(title=f"{args.model}: batch {args.batch} x {args.tokens} new tokens, prompts ~{width} tokens, "
                        f"{args.threads} threads, fp32")
    for col in ("generator", "median s", "tokens/s"):
        table.add_column(col)
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, m in med.items():
        table.add_row(name, f"{m:.3f}", f"{args.batch * args.tokens / m:.1f}")
    Console().print(table)
    print(f"ratio ours / raw = {med['zsearch HFBackend'] / med['raw model.generate']:.3f} (goal <= 1.1)")


if __name__ == "__main__":
    main()
