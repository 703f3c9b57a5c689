"""Rollout engine overhead (wall time outside generate() and search()), and the sync vs
async rollout modes on the same work.

A fake generator of known speed plays scripted tag sequences (think + search, search,
answer), so every engine path runs: parsing, batched search on a real BM25 index over
the bundled corpus, observation rendering/tokenization with limits, bookkeeping. The
engine's own share of wall time is what is left after generation and search.
Target: under 5 %.

--modes compares ``--rollout-mode sync`` and ``async`` on the same rows: the fake generator
(tokens/s over the whole batch; async calls take at most --gen-batch samples) and a search
backend whose every query takes a latency drawn from a stated distribution (constant,
lognormal with sigma 1, or none), a batched call lasting as long as its slowest query (a
server answering them in parallel). The mean latency defaults to one turn's generation time
for the whole batch. Reported: samples/s and the generator's idle share of wall time.

With --real, also measures HFBackend tokens/s on the embedded smollm2 at batch 1 and 8;
with --backend vllm, the vLLM backend's beside it on the same prompts (informational: on
vLLM's CPU build it is expected to be slower than HF for jobs this small; run it with the
.venv-vllm python and VLLM_CPU_KVCACHE_SPACE=1).

    python bench/rollout.py [--rows 64] [--group 5] [--gen-tps 20000] [--real] [--backend hf|vllm]
    python bench/rollout.py --modes [--rows 32] [--group 5] [--gen-batch 16] [--latency 0.9]
"""

from __future__ import annotations

import argparse
import math
import random
import tempfile
import threading
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
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.search.base import SearchBackend, SearchResult
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

    def __init__(self, tokenizer, tps: float, max_batch_size: int | None = None):
        self.tokenizer, self.tps, self.seconds, self.tokens = tokenizer, tps, 0.0, 0
        if max_batch_size:
            self.max_batch_size = max_batch_size  # the async mode's calls take at most this many

    def generate(self, prompts, params, stop=()):
        t0 = time.perf_counter()
        outs = []
        for p in prompts:
            key = hash(tuple(p[:64]))  # the prompt identifies the row
            # observations so far (the Search-R1 prompt names </information> once itself)
            turn = max(0, self.tokenizer.decode(p).count("</information>") - 1)
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


PASSAGE = ("The river rises in the hills and flows east through three countries, past old towns, "
           "bridges and vineyards, before it reaches the sea after a long journey. ") * 2


class LatencySearch(SearchBackend):
    """Fixed passages after a latency per query from ``dist`` (constant | lognormal | none)
    with mean ``mean_s``, drawn from a seeded RNG; a call lasts as long as its slowest query."""

    thread_safe = True
    name = "latency"

    def __init__(self, dist: str, mean_s: float, seed: int = 0):
        self.dist, self.mean_s, self.rng, self.lock = dist, mean_s, random.Random(seed), threading.Lock()

    def _draw(self) -> float:
        if self.dist == "none":
            return 0.0
        if self.dist == "constant":
            return self.mean_s
        sigma = 1.0  # lognormal: median mean_s·e^-0.5, p99 about 5x the mean
        return self.mean_s * math.exp(sigma * self.rng.gauss(0.0, 1.0) - sigma**2 / 2)

    def search(self, requests, topk):
        with self.lock:
            latency = max((self._draw() for _ in requests), default=0.0)
        time.sleep(latency)
        return [SearchResult([Passage(f"d{k}", f"{r.query} {k}", PASSAGE) for k in range(topk)]) for r in requests]


def compare_modes(rows: int, group: int, tps: float, gen_batch: int, latency: float | None,
                  concurrency: int) -> tuple[float, list[dict]]:
    """Both rollout modes on the same rows, for each latency distribution; returns the mean
    latency used and one result per (distribution, mode)."""
    from zsearch_cli.models.loading import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    qa = read_artifact(demo_qa("train"), QA).slice(0, rows).to_pylist()
    batch = [QARow(r["id"], r["question"], r["golden_answers"]) for r in qa]
    turn_tokens = len(tokenizer.encode(TURNS[0].format(q="topic 1"), add_special_tokens=False))
    if latency is None:  # one turn's generation time for the whole batch
        latency = len(batch) * group * turn_tokens / tps
    results = []
    for dist in ("none", "constant", "lognormal"):
        for mode in ("sync", "async"):
            gen, search = FakeGenerator(tokenizer, tps, gen_batch), LatencySearch(dist, latency, seed=0)
            cfg = RolloutConfig(max_turns=4, topk=3, rollout_mode=mode, search_concurrency=concurrency)
            engine = RolloutEngine(gen, TagsProtocol(), search, cfg)
            t0 = time.perf_counter()
            trajs = engine.rollout(batch, group_size=group)
            wall = time.perf_counter() - t0
            results.append({"dist": dist, "mode": mode, "samples": len(trajs), "wall": wall,
                            "idle": max(0.0, wall - gen.seconds) / wall})
    return latency, results


def _modes_table(latency: float, results: list[dict], args) -> Table:
    table = Table(title=f"rollout modes: {results[0]['samples']} samples x 3 turns, fake generator "
                        f"{args.gen_tps:.0f} tok/s (async calls <= {args.gen_batch}), search mean {latency:.2f} s "
                        f"per query, --search-concurrency {args.search_concurrency}")
    for col in ("search latency", "mode", "wall s", "samples/s", "generator idle", "vs sync"):
        table.add_column(col, justify="right")
    sync = {}
    for r in results:
        rate = r["samples"] / r["wall"]
        sync.setdefault(r["dist"], rate)
        table.add_row(r["dist"], r["mode"], f"{r['wall']:.2f}", f"{rate:.1f}", f"{100 * r['idle']:.0f} %",
                      f"{rate / sync[r['dist']]:.2f}x")
    return table


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
    ap.add_argument("--modes", action="store_true", help="compare --rollout-mode sync and async (only that)")
    ap.add_argument("--gen-batch", type=int, default=16, help="--modes: samples per async generate call")
    ap.add_argument("--latency", type=float, default=None,
                    help="--modes: mean search latency per query, seconds [one turn's generation time]")
    ap.add_argument("--search-concurrency", type=int, default=16, help="--modes: search calls in flight")
    args = ap.parse_args()
    args.real = args.real or args.backend == "vllm"
    console = Console()
    if args.modes:
        latency, results = compare_modes(args.rows, args.group, args.gen_tps, args.gen_batch, args.latency,
                                         args.search_concurrency)
        console.print(_modes_table(latency, results, args))
        return
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
