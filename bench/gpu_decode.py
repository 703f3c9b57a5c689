"""What one decode step costs on a GPU as the batch grows: the generator model behind
``bench/rollout.py --modes --generator stream``.

A transformers Qwen2 of a real shape (random weights, bf16, SDPA attention, a KV cache of
``--context`` tokens per row) runs ``--steps`` one-token decode steps at each batch size;
the median step time and a least-squares fit ``step(B) = a + b*B`` are printed. Then
zsearch's own ``HFBackend.generate`` runs on the same model at a few batch sizes (tokens/s),
which is the HF rollout path on CUDA in bf16.

Why it matters for the rollout modes: a GPU decode step reads every weight once whatever the
batch, so ``a`` (weights / bandwidth) dominates ``b*B`` up to large batches. A generator
that pays per step, not per token, wastes time when a turn barrier leaves it decoding the
longest sample of a turn for a small remainder of the batch. No peer library to compare
against here: these are the constants the rollout benchmark's fake generator takes.

    python bench/gpu_decode.py [--shapes 1.5b,7b] [--batches 1,8,32,64,128,256] [--tiny]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import numpy as np
import torch

SHAPES = {  # Qwen2.5 configs (hidden, layers, heads, kv heads, intermediate, vocab)
    "tiny": (128, 2, 4, 2, 256, 1000),
    "1.5b": (1536, 28, 12, 2, 8960, 151936),
    "7b": (3584, 28, 28, 4, 18944, 152064),
}


def build(shape: str, device: str, dtype: torch.dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, heads, kv, inter, vocab = SHAPES[shape]
    cfg = Qwen2Config(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
                      max_position_embeddings=4096, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype)
    return model.eval(), vocab


@torch.no_grad()
def step_seconds(model, vocab: int, batch: int, context: int, steps: int, device: str) -> float:
    from transformers import DynamicCache

    ids = torch.randint(0, vocab, (batch, context), device=device)
    cache = DynamicCache()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    nxt = out.logits[:, -1:].argmax(-1)
    times = []
    for _ in range(steps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:] if len(times) > 4 else times)


def backend_tps(model, batch: int, new_tokens: int, device: str) -> float:
    from zsearch_cli.models.base import SamplingParams
    from zsearch_cli.models.hf import HFBackend

    tokenizer = SimpleNamespace(eos_token_id=None, pad_token_id=None)  # no stop strings: no decoding
    backend = HFBackend(model, tokenizer, max_batch_size=max(batch, 1))
    prompts = [list(range(10 + r, 138 + r)) for r in range(batch)]
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seeds=tuple(range(batch)))
    backend.generate(prompts[:1], SamplingParams(max_new_tokens=2, temperature=0.0))  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    outs = backend.generate(prompts, params)
    if device == "cuda":
        torch.cuda.synchronize()
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1.5b,7b")
    ap.add_argument("--batches", default="1,8,32,64,128,256")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--backend-batches", default="1,16,64")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--tiny", action="store_true", help="a CPU smoke run of this script (tiny shape, fp32)")
    args = ap.parse_args()
    device = "cpu" if args.tiny else "cuda"
    dtype = torch.float32 if args.tiny else torch.bfloat16
    shapes = ["tiny"] if args.tiny else args.shapes.split(",")
    if device == "cuda":
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    for shape in shapes:
        model, vocab = build(shape, device, dtype)
        batches = [int(b) for b in args.batches.split(",")]
        secs = [step_seconds(model, vocab, b, args.context, args.steps, device) for b in batches]
        b_fit, a_fit = np.polyfit(batches, secs, 1)
        print(f"\n{shape}: one decode step, context {args.context}, {dtype}")
        print(f"{'batch':>6} {'step ms':>9} {'tokens/s':>10} {'fit ms':>8}")
        for b, s in zip(batches, secs):
            print(f"{b:>6} {1e3 * s:>9.2f} {b / s:>10.0f} {1e3 * (a_fit + b_fit * b):>8.2f}")
        print(f"fit: step(B) = {1e3 * a_fit:.2f} ms + {1e6 * b_fit:.1f} us * B")
        print(f"zsearch HFBackend.generate, {args.new_tokens} new tokens, sampled:")
        for b in (int(x) for x in args.backend_batches.split(",")):
            print(f"  batch {b:>4}: {backend_tps(model, b, args.new_tokens, device):,.0f} tokens/s")
        if device == "cuda":
            print(f"  peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
        del model
        if device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
