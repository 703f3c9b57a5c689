"""Sync vs async rollouts with zsearch's real HF backend on a GPU (the other benches use a
fake generator): the engine, the HF sampling loop and per-sample seeds in bf16 on CUDA.

The policy is a Qwen2.5-1.5B-shaped model with random weights and the tiny BPE vocabulary
(so every sampled id decodes); after its real sampled ids each turn gets the action they
call for (an answer, a search or nothing, by their sum modulo 5, as the tests' tiny agent),
so turns and searches vary by sample. The search backend answers each query after a
constant or lognormal (sigma 1) latency whose mean is one turn's generation time, measured
first; a batched call lasts as long as its slowest query. Reported per latency: wall time,
samples/s, async vs sync, and how many trajectories are token for token the same in both
modes (bf16 rounds differently with the batch, so a sampled near-tie can flip).

    python bench/gpu_rollout.py [--rows 32] [--group 4] [--turn-tokens 48] [--tiny]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import SearchingTiny  # noqa: E402  (the tests' tiny agent: actions from sampled ids)

from zsearch_cli.models.base import SamplingParams  # noqa: E402
from zsearch_cli.models.hf import HFBackend  # noqa: E402
from zsearch_cli.retrieval.base import Passage  # noqa: E402
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.rollout.engine import QARow, RolloutEngine  # noqa: E402
from zsearch_cli.rollout.protocols import TagsProtocol  # noqa: E402
from zsearch_cli.search.base import SearchBackend, SearchResult  # noqa: E402


class LatencySearch(SearchBackend):
    thread_safe = True
    name = "latency"

    def __init__(self, dist: str, mean_s: float, seed: int = 0):
        self.dist, self.mean_s, self.rng, self.lock = dist, mean_s, random.Random(seed), threading.Lock()

    def search(self, requests, topk):
        with self.lock:
            draws = [self.mean_s if self.dist == "constant" else
                     self.mean_s * math.exp(self.rng.gauss(0.0, 1.0) - 0.5) for _ in requests]
        time.sleep(max(draws, default=0.0))
        return [SearchResult([Passage(f"{r.query}-{k}", r.query, f"text about {r.query} number {k}")
                              for k in range(topk)]) for r in requests]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=48)
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run: a tiny model, fp32")
    args = ap.parse_args()
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from zsearch_cli.models.tiny import make_tiny_model

    device, dtype = ("cpu", torch.float32) if args.tiny else ("cuda", torch.bfloat16)
    folder = make_tiny_model(Path(tempfile.mkdtemp()) / "tok")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    hidden, layers, heads, kv, inter = (64, 2, 4, 2, 128) if args.tiny else (1536, 28, 12, 2, 8960)
    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
                      max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype).eval()
    hf = HFBackend(model, tokenizer, max_batch_size=64)
    words = "river capital planet author war painting mountain city treaty king".split()
    rows = [QARow(f"q{i}", f"Which {words[i % 10]} is number {i}?", ["x"]) for i in range(args.rows)]
    if device == "cuda":
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, bf16, Qwen2.5-1.5B shape, "
              f"{len(tokenizer)}-token vocabulary")

    def run(mode: str, search: SearchBackend):
        cfg = RolloutOptions(max_turns=3, max_turn_tokens=args.turn_tokens, topk=2, temperature=1.0,
                            rollout_mode=mode, search_concurrency=16)
        agent = SearchingTiny(hf)
        agent.max_batch_size = hf.max_batch_size  # async calls take up to the HF batch, as on a real run
        engine = RolloutEngine(agent, TagsProtocol(), search, cfg, seed=7)
        t0 = time.perf_counter()
        trajs = engine.rollout(rows, group_size=args.group, step=1)
        return time.perf_counter() - t0, trajs

    run("sync", LatencySearch("constant", 0.0))  # warm-up (kernels, allocator)
    t0 = time.perf_counter()
    hf.generate([[5, 6, 7]] * min(64, args.rows * args.group),
                SamplingParams(max_new_tokens=args.turn_tokens, temperature=1.0, seed=0))
    per_call = time.perf_counter() - t0
    samples = args.rows * args.group
    turn_s = per_call * math.ceil(samples / 64)  # one turn of every sample (sync: chunks of 64)
    print(f"{samples} samples, one turn ({args.turn_tokens} tokens) of all of them: {turn_s:.2f} s")
    print(f"{'latency':>10} {'mode':>6} {'wall s':>7} {'samples/s':>10} {'vs sync':>8} {'same ids':>9} "
          f"{'searches':>9}")
    for dist in ("constant", "lognormal"):
        sync_wall, sync = run("sync", LatencySearch(dist, turn_s))
        async_wall, got = run("async", LatencySearch(dist, turn_s))
        same = sum(a.response_ids == b.response_ids for a, b in zip(sync, got))
        for mode, wall, trajs in (("sync", sync_wall, sync), ("async", async_wall, got)):
            print(f"{dist:>10} {mode:>6} {wall:>7.1f} {samples / wall:>10.2f} {sync_wall / wall:>7.2f}x "
                  f"{same:>4}/{samples:<4} {sum(t.num_searches for t in trajs):>9}")


if __name__ == "__main__":
    main()
