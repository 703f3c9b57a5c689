"""Rollout engine overhead (wall time outside generate() and search()), and the sync vs
async rollout modes on the same work.

A fake generator of known speed plays scripted tag sequences (think + search, search,
answer), so every engine path runs: parsing, batched search on a real BM25 index over
the bundled corpus, observation rendering/tokenization with limits, bookkeeping. The
engine's own share of wall time is what is left after generation and search.
Target: under 5 %.

--modes compares ``--rollout-mode sync`` and ``async`` on the same rows, with one of two
fake generators of known speed:

* ``--generator stream`` (default): a continuous-batching engine, vLLM on a GPU. A decode
  step costs ``--step-ms`` plus ``--per-request-us`` per running request, whatever the
  tokens: a GPU step reads every weight once for the whole batch (bench/gpu_decode.py
  measured HF on an H200: ~50 ms a step, flat from batch 1 to 256). The async mode drives
  it step by step (requests join and leave between steps); the sync mode calls generate,
  which lasts as long as the longest turn of the call;
* ``--generator batch``: compute-bound, ``--gen-tps`` tokens/s over the batch (a CPU);
  async calls take at most ``--gen-batch`` ready samples.

Turn lengths vary by a lognormal factor (``--length-sigma``, drawn from each turn's own
sampling seed, so both modes see the same lengths). The search backend answers every query
after a latency drawn from a stated distribution (``--dists``: none, constant, lognormal
with sigma 1, and ``simulator``: a ZeroSearch simulator LLM writing documents of lognormal
length), a batched call lasting as long as its slowest query (a server answering them in
parallel). The mean latency defaults to one turn's generation time for the whole batch.
Reported: samples/s and the generator's idle share of wall time.

With --real, also measures HFBackend tokens/s on the embedded smollm2 at batch 1 and 8;
with --backend vllm, the vLLM backend's beside it on the same prompts (informational: on
vLLM's CPU build it is expected to be slower than HF for jobs this small; run it with the
.venv-vllm python and VLLM_CPU_KVCACHE_SPACE=1).

    python bench/rollout.py [--rows 64] [--group 5] [--gen-tps 20000] [--real] [--backend hf|vllm]
    python bench/rollout.py --modes [--rows 32] [--group 5] [--generator stream|batch] [--latency S]
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
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import QARow, RolloutEngine
from zsearch_cli.rollout.protocols import TagsProtocol
from zsearch_cli.artifacts import read_artifact
from zsearch_cli.schemas import QA
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
SEARCH_TURN = "<think> " + THOUGHT + "</think>\n<search> {q} </search>"
ANSWER_TURN = "<think> " + THOUGHT + "</think>\n<answer> {a} </answer>"


class FakeGenerator:
    """Emits the scripted turn for each context and sleeps as a generator of ``tps``
    tokens/s (over the whole batch) would: compute-bound, a token costs the same in any
    batch (a CPU). ``length_sigma`` > 0 varies each turn's thinking length by a lognormal
    factor (mean 1) drawn from the turn's own sampling seed, so both modes see the same
    lengths; 0 gives every turn the same length."""

    def __init__(self, tokenizer, tps: float, max_batch_size: int | None = None, length_sigma: float = 0.0,
                 searches: int = 2):
        self.tokenizer, self.tps, self.seconds, self.tokens = tokenizer, tps, 0.0, 0
        self.length_sigma, self.searches = length_sigma, searches
        if max_batch_size:
            self.max_batch_size = max_batch_size  # the async mode's calls take at most this many

    def script(self, prompt, seed: int | None) -> GenerationOutput:
        key = hash(tuple(prompt[:64]))  # the prompt identifies the row
        # observations so far (the Search-R1 prompt names </information> once itself)
        turn = max(0, self.tokenizer.decode(prompt).count("</information>") - 1)
        script = SEARCH_TURN if turn < self.searches else ANSWER_TURN
        text = script.format(q=f"topic {key % 97} " + "history " * turn, a="Danube")
        if self.length_sigma > 0:
            words = THOUGHT.split()
            rng = random.Random(seed)
            factor = math.exp(self.length_sigma * rng.gauss(0.0, 1.0) - self.length_sigma**2 / 2)
            n = max(5, round(len(words) * factor))
            text = text.replace(THOUGHT, " ".join(words[i % len(words)] for i in range(n)) + " ")
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        self.tokens += len(ids)
        return GenerationOutput(ids, [-0.1] * len(ids), "stop")

    def generate(self, prompts, params, stop=()):
        t0 = time.perf_counter()
        seeds = params.seeds or (None,) * len(prompts)
        outs = [self.script(p, seed) for p, seed in zip(prompts, seeds)]
        build = time.perf_counter() - t0
        time.sleep(max(0.0, sum(len(o.token_ids) for o in outs) / self.tps - build))
        self.seconds += time.perf_counter() - t0
        return outs


class FakeStreamingGenerator(FakeGenerator):
    """A continuous-batching engine (vLLM on a GPU): one engine step decodes one token of
    every running request and costs ``step_s + per_request_s * running`` whatever the
    tokens are, because a decode step reads every weight once for the whole batch
    (``bench/gpu_decode.py`` measures both constants on a GPU). Requests join and leave the
    running batch between steps (``submit``/``step``, the StreamingBackend interface the
    async mode drives); ``generate`` (the sync mode's call) submits a batch and steps until
    all of it is done, so a call lasts as long as its longest request. Each ``step`` call
    advances ``tick`` tokens, to keep sleeps long enough to be accurate."""

    def __init__(self, tokenizer, step_s: float, per_request_s: float = 0.0, tick: int = 8,
                 length_sigma: float = 0.0, searches: int = 2, capacity: int | None = None):
        super().__init__(tokenizer, tps=1.0, length_sigma=length_sigma, searches=searches)
        self.step_s, self.per_request_s, self.tick = step_s, per_request_s, tick
        self.capacity = capacity  # vLLM's max_num_seqs: later requests wait, first come first served
        self.waiting: dict[str, list] = {}  # request id -> [output, tokens left], in submission order
        self.running: dict[str, list] = {}
        self.counter = 0

    def submit(self, prompts, params, stop=()):
        seeds = params.seeds or (None,) * len(prompts)
        ids = []
        for p, seed in zip(prompts, seeds):
            out = self.script(p, seed)
            self.counter += 1
            self.waiting[str(self.counter)] = [out, len(out.token_ids)]
            ids.append(str(self.counter))
        return ids

    def step(self):
        while self.waiting and (self.capacity is None or len(self.running) < self.capacity):
            rid = next(iter(self.waiting))
            self.running[rid] = self.waiting.pop(rid)
        if not self.running:
            return []
        t0 = time.perf_counter()
        time.sleep(self.tick * (self.step_s + self.per_request_s * len(self.running)))
        done = []
        for rid, entry in list(self.running.items()):
            entry[1] -= self.tick
            if entry[1] <= 0:
                done.append((rid, entry[0]))
                del self.running[rid]
        self.seconds += time.perf_counter() - t0
        return done

    def abort(self, request_ids):
        for rid in request_ids:
            self.running.pop(rid, None)
            self.waiting.pop(rid, None)

    def generate(self, prompts, params, stop=()):
        ids = self.submit(prompts, params, stop)
        got: dict = {}
        while len(got) < len(ids):
            got.update(self.step())
        return [got[rid] for rid in ids]


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
    engine = RolloutEngine(gen, TagsProtocol(), search, RolloutOptions(max_turns=4, topk=3))
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
    """Fixed passages after a latency per query from ``dist`` with mean ``mean_s``, drawn
    from a seeded RNG; a call lasts as long as its slowest query (a server answering its
    queries in parallel). ``dist``: ``none``; ``constant``; ``lognormal`` (sigma 1: median
    0.61x the mean, p99 about 6x); ``simulator``: ZeroSearch's simulator LLM on its own
    server, each query a generated document of a lognormal length (sigma 0.5) at a fixed
    per-token speed, so the slowest document of a call sets its latency."""

    thread_safe = True
    name = "latency"

    def __init__(self, dist: str, mean_s: float, seed: int = 0):
        self.dist, self.mean_s, self.rng, self.lock = dist, mean_s, random.Random(seed), threading.Lock()

    def _draw(self) -> float:
        if self.dist == "none":
            return 0.0
        if self.dist == "constant":
            return self.mean_s
        sigma = 0.5 if self.dist == "simulator" else 1.0  # lognormal, mean mean_s
        return self.mean_s * math.exp(sigma * self.rng.gauss(0.0, 1.0) - sigma**2 / 2)

    def search(self, requests, topk):
        with self.lock:
            latency = max((self._draw() for _ in requests), default=0.0)
        time.sleep(latency)
        return [SearchResult([Passage(f"d{k}", f"{r.query} {k}", PASSAGE) for k in range(topk)]) for r in requests]


def run_steps(engine: RolloutEngine, batch: list[QARow], args, overlap: int | None) -> list:
    """``args.steps`` training steps on the same rows: each a rollout, then ``--train-ms`` of
    (fake) training and a version bump. ``overlap`` K: through a RolloutStream, step t's
    rollout may start at version t - 1 - K (the trainer's loop, without the model)."""
    from zsearch_cli.rollout.stream import RolloutStream

    trajs: list = []
    if overlap is None:
        for step in range(1, args.steps + 1):
            trajs += engine.rollout(batch, group_size=args.group, step=step)
            time.sleep(args.train_ms / 1e3)
            engine.policy_version = step
        return trajs
    with RolloutStream(engine, group_size=args.group) as stream:
        queued = 0
        for step in range(1, args.steps + 1):
            while queued < min(args.steps, step + overlap):  # the data loader draws K steps ahead
                queued += 1
                stream.put(batch, queued, min_version=queued - 1 - overlap)
            trajs += stream.get()
            time.sleep(args.train_ms / 1e3)
            stream.update(step)
    return trajs


def compare_modes(args) -> tuple[float, list[dict]]:
    """Both rollout modes on the same rows, for each latency distribution; returns the mean
    latency used and one result per (distribution, mode)."""
    from zsearch_cli.models.loading import load_tokenizer

    tokenizer = load_tokenizer("smollm2")
    qa = read_artifact(demo_qa("train"), QA).slice(0, args.rows).to_pylist()
    batch = [QARow(r["id"], r["question"], r["golden_answers"]) for r in qa]
    samples = len(batch) * args.group
    turn_tokens = len(tokenizer.encode(SEARCH_TURN.format(q="topic 1"), add_special_tokens=False))

    def generator():
        if args.generator == "stream":
            return FakeStreamingGenerator(tokenizer, args.step_ms / 1e3, args.per_request_us / 1e6,
                                          length_sigma=args.length_sigma, searches=args.searches,
                                          capacity=args.max_running)
        return FakeGenerator(tokenizer, args.gen_tps, args.gen_batch, length_sigma=args.length_sigma,
                             searches=args.searches)

    latency = args.latency
    if latency is None:  # one turn's generation time for the whole batch (at the mean turn length)
        if args.generator == "stream":
            running = min(samples, args.max_running or samples)  # waves of `running` requests at a time
            latency = turn_tokens * samples / running * (args.step_ms / 1e3 + running * args.per_request_us / 1e6)
        else:
            latency = samples * turn_tokens / args.gen_tps
    modes = ["sync", "async"] + ([f"overlap {args.overlap}"] if args.overlap else [])
    results = []
    for dist in args.dists.split(","):
        for mode in modes:
            gen, search = generator(), LatencySearch(dist, latency, seed=0)
            cfg = RolloutOptions(max_turns=max(4, args.searches), topk=3, rollout_mode=mode.split()[0].replace(
                "overlap", "async"), search_concurrency=args.search_concurrency)
            engine = RolloutEngine(gen, TagsProtocol(), search, cfg)
            t0 = time.perf_counter()
            trajs = run_steps(engine, batch, args, overlap=args.overlap if mode.startswith("overlap") else None)
            wall = time.perf_counter() - t0
            results.append({"dist": dist, "mode": mode, "samples": len(trajs), "wall": wall,
                            "idle": max(0.0, wall - gen.seconds) / wall,
                            "tokens": sum(t.policy_tokens for t in trajs)})
    return latency, results


def _modes_table(latency: float, results: list[dict], args) -> Table:
    if args.generator == "stream":
        gen = (f"continuous batching, a step {args.step_ms:g} ms + {args.per_request_us:g} us per running "
               f"request" + (f", at most {args.max_running} running" if args.max_running else ""))
    else:
        gen = f"{args.gen_tps:.0f} tok/s over the batch (async calls <= {args.gen_batch})"
    per_step = results[0]["samples"] // args.steps
    steps = f"{args.steps} steps x " if args.steps > 1 else ""
    train = f", training {args.train_ms:g} ms per step" if args.train_ms else ""
    table = Table(title=f"rollout modes: {steps}{per_step} samples x {args.searches + 1} turns{train}, turn lengths lognormal "
                        f"sigma {args.length_sigma:g}; fake generator: {gen}; search mean {latency:.2f} s per "
                        f"query (one turn's generation), --search-concurrency {args.search_concurrency}")
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
    ap.add_argument("--generator", choices=("batch", "stream"), default="stream",
                    help="--modes: stream = a continuous-batching GPU engine (cost per step), batch = tokens/s "
                         "over the batch (cost per token, a CPU)")
    ap.add_argument("--step-ms", type=float, default=10.0,
                    help="--modes, stream: one decode step of the whole batch, ms (bench/gpu_decode.py)")
    ap.add_argument("--per-request-us", type=float, default=20.0,
                    help="--modes, stream: what each running request adds to a step, microseconds")
    ap.add_argument("--max-running", type=int, default=None,
                    help="--modes, stream: requests decoded at once (vLLM's max_num_seqs; later ones wait) "
                         "[no limit]")
    ap.add_argument("--searches", type=int, default=2,
                    help="--modes: searches per sample before its answer (turns = searches + 1)")
    ap.add_argument("--steps", type=int, default=1, help="--modes: training steps, each a rollout of the rows")
    ap.add_argument("--overlap", type=int, default=0,
                    help="--modes: also run --rollout-overlap K (rollouts of later steps start K versions ahead)")
    ap.add_argument("--train-ms", type=float, default=0.0,
                    help="--modes: (fake) training time per step, between rollouts, ms")
    ap.add_argument("--length-sigma", type=float, default=0.6,
                    help="--modes: lognormal sigma of each turn's length (0 = all turns alike)")
    ap.add_argument("--dists", default="none,constant,lognormal,simulator",
                    help="--modes: search latency distributions to run")
    args = ap.parse_args()
    args.real = args.real or args.backend == "vllm"
    console = Console()
    if args.modes:
        latency, results = compare_modes(args)
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
