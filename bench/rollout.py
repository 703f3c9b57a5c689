"""Rollout engine overhead: wall time spent outside generate() and search().

A fake generator of known speed plays scripted tag sequences (think + search, search,
answer), so every engine path runs: parsing, batched search on a real BM25 index over
the bundled corpus, observation rendering/tokenization with limits, bookkeeping. The
engine's own share of wall time is what is left after generation and search.
Target: under 5 %.

With --real, also measures HFBackend tokens/s on the embedded smollm2 at batch 1 and 8;
with --backend vllm, the vLLM backend's beside it on the same prompts (informational: on
vLLM's CPU build it is expected to be slower than HF for jobs this small; run it with the
.venv-vllm python and VLLM_CPU_KVCACHE_SPACE=1).

    python bench/rollout.py [--rows 64] [--group 5] [--gen-tps 20000] [--real] [--backend hf|vllm]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from zsearch_cli.models.base import GenerationOutput
from zsearch_cli.retrieval.index import build_index
from zsearch_cli.rollout.engine import QARow, RolloutConfig, RolloutEngine
from zsearch_cli.rollout.protocols import TagsProtocol
from zsearch_cli.schemas import read_artifact, QA
from zsearch_cli.data.demo import demo_qa
from zsearch_cli.search.base import SearchBackend
from zsearch_cli.search.local import IndexSearch

# Reasoning of about 100 tokens per turn, as trained Search-R1 policies write; the
# observations after each search are real BM25 passages (about 150 tokens each at top-3).
THOUGHT = ("Let me think about what the question asks, which entity it names, and which fact "
           "about that entity I still need. The passages so far mention several related "
           "places and dates, but none of them states the fact directly, so I compare them "
           "carefully and decide what to look up next before I commit to an answer. ") * 2
TURNS = [
    "<think> " + THOUGHT + "</think>\n<search> {q} </search>",
    "<think> " + THOUGHT + "</think>\n<search> {q} history </search>",
    "<think> " + THOUGHT + "</think>\n<answer> {a} </answer>",
]


class FakeGenerator:
    """Emits the scripted turn for each context and sleeps as a generator of ``tps``
    tokens/s (over the whole batch) would."""

    def __init__(self, tokenizer, tps: float):
        self.tokenizer, self.tps, self.seconds, self.tokens = tokenizer, tps, 0.0, 0

    def generate(self, prompts, params, stop=()):
        t0 = time.perf_counter()
        outs = []
        for p in prompts:
            key = hash(tuple(p[:64]))  # the prompt identifies the row
            turn = self.tokenizer.decode(p).count("</information>")  # observations so far
            text = TURNS[min(turn, 2)].format(q=f"topic {key % 97}", a="Danube")
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            outs.append(GenerationOutput(ids, [-0.1] * len(ids), "stop"))
            self.tokens += len(ids)
        build = time.perf_counter() - t0
        time.sleep(max(0.0, sum(len(o.token_ids) for o in outs) / self.tps - build))
        self.seconds += time.perf_counter() - t0
        return outs


class TimedSearch(SearchBackend):
    def __init__(self, inner):
        self.inner, self.seconds, self.name = inner, 0.0, inner.name

    def search(self, requests, topk):
        t0 = time.perf_counter()
        out = self.inner.search(requests, topk)
        self.seconds += time.perf_counter() - t0
        return out


def overhead(rows: int, group: int, tps: float, work: Path) -> dict:
    from zsearch_cli.models.loading import load_tokenizer

    tokenizer = load_tokenizer("smollm2")  # a real BPE: observation lengths as in training
    index_dir = build_index(None, work / "index", {"kind": "bm25"})
    qa = read_artifact(demo_qa("train"), QA).slice(0, rows).to_pylist()
    batch = [QARow(r["id"], r["question"], r["golden_answers"]) for r in qa]
    gen, search = FakeGenerator(tokenizer, tps), TimedSearch(IndexSearch(index_dir))
    engine = RolloutEngine(gen, TagsProtocol(), search, RolloutConfig(max_turns=4, topk=3))
    engine.rollout(batch[:2], group_size=1)  # warm-up (imports, caches)
    gen.seconds = search.seconds = 0.0
    gen.tokens = 0
    t0 = time.perf_counter()
    trajs = engine.rollout(batch, group_size=group)
    wall = time.perf_counter() - t0
    return {"samples": len(trajs), "wall": wall, "generate": gen.seconds, "search": search.seconds,
            "engine": wall - gen.seconds - search.seconds, "tokens": sum(t.response_tokens for t in trajs)}


def _tps(backend, prompt, batch_sizes, new_tokens) -> list[float]:
    from zsearch_cli.models.base import SamplingParams

    out = []
    for bs in batch_sizes:
        params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
        backend.generate([prompt] * bs, SamplingParams(max_new_tokens=4, temperature=0.0))  # warm-up
        t0 = time.perf_counter()
        res = backend.generate([prompt] * bs, params)
        out.append(sum(len(r.token_ids) for r in res) / (time.perf_counter() - t0))
    return out


def real_tps(batch_sizes=(1, 8), new_tokens=64, vllm: bool = False) -> dict[str, list[float]]:
    """tokens/s per batch size of the HF backend (and the vLLM backend) on smollm2, CPU fp32."""
    import torch

    from zsearch_cli.models.hf import HFBackend
    from zsearch_cli.models.loading import apply_chat, load_model

    torch.set_num_threads(2)
    model, tok = load_model("smollm2", device="cpu")
    prompt = apply_chat(tok, "Tell me about the river Danube and the cities along it.")
    result = {"hf": _tps(HFBackend(model, tok, device="cpu"), prompt, batch_sizes, new_tokens)}
    if vllm:
        from zsearch_cli.models.vllm import VLLMBackend

        engine = VLLMBackend("smollm2", max_model_len=1024, tokenizer=tok)
        try:
            result["vllm"] = _tps(engine, prompt, batch_sizes, new_tokens)
        finally:
            engine.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--group", type=int, default=5)
    ap.add_argument("--gen-tps", type=float, default=20000.0, help="fake generator speed, tokens/s per batch")
    ap.add_argument("--real", action="store_true", help="also time HFBackend on smollm2 (CPU)")
    ap.add_argument("--backend", choices=("hf", "vllm"), default="hf",
                    help="vllm: also time the vLLM backend beside HF (implies --real)")
    args = ap.parse_args()
    args.real = args.real or args.backend == "vllm"
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        r = overhead(args.rows, args.group, args.gen_tps, Path(tmp))
    table = Table(title=f"rollout engine overhead ({r['samples']} samples, fake generator at {args.gen_tps:.0f} tok/s)")
    for col in ("part", "seconds", "share of wall"):
        table.add_column(col, justify="right")
    for part in ("generate", "search", "engine"):
        table.add_row(part, f"{r[part]:.3f}", f"{100 * r[part] / r['wall']:.1f} %")
    table.add_row("wall", f"{r['wall']:.3f}", "100 %")
    console.print(table)
    console.print(f"engine overhead {100 * r['engine'] / r['wall']:.1f} % (target < 5 %); "
                  f"{r['tokens']} response tokens")
    if args.real:
        batch_sizes = (1, 8)
        tps = real_tps(batch_sizes, vllm=args.backend == "vllm")
        t = Table(title="generation on smollm2, CPU fp32, greedy, 64 new tokens (informational)")
        t.add_column("batch", justify="right")
        for name in tps:
            t.add_column(f"{name} tokens/s", justify="right")
        for i, bs in enumerate(batch_sizes):
            t.add_row(str(bs), *(f"{v[i]:.1f}" for v in tps.values()))
        console.print(t)

if __name__ == "__main__":
    main()
