"""How much of the update's compute trains: padding share, update time, peak memory and tokens
trained per second of one GRPO update on a search agent's length mix, for each way of cutting
and running the batch (issue 35; docs/methods.md §8).

    .venv/bin/python bench/update_efficiency.py                               # CPU, fp32, both models
    python bench/update_efficiency.py --device cuda --dtype bfloat16         # a GPU
    .venv/bin/python bench/update_efficiency.py --models qwen-vocab --variants before

The length mix (a documented distribution, seeded): a prompt of 150-300 tokens; a response of
200-3,000 tokens made of k = 1..3 searches, i.e. k+1 policy turns around k retrieved-passage
blocks that hold 50-70% of the response (60% on average), all uniform. The ids are random (the
update's cost does not depend on them); every group of G samples gets rewards that vary.

Models (random weights of the real shapes: time and memory do not depend on the values):
- ``smollm2-lora``: SmolLM2-135M's config (Llama, 30 layers, d 576, V 49,152, tied), LoRA r 16
  on q/k/v/o;
- ``qwen-vocab``: a tiny Qwen2 (2 layers, d 64) with Qwen2.5's vocabulary (V 151,936) and an
  untied head, so the LM head dominates: the micro-batch memory of long contexts.

Variants are TrainConfig settings (``VARIANTS``): ``before`` is micro-batches of a fixed number of
rows, right-padded. Each variant runs in its own process (its own peak), warms up until two
updates agree within 10%, then takes the median of ``--reps`` (>= 5). Peak memory is
``torch.cuda.max_memory_allocated`` on CUDA and the process's peak RSS growth over the set-up on
CPU. The padding share is 1 - real tokens / token slots the forwards computed (every forward of
the update: each micro-batch's rows x its longest row).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"

MODELS = {
    # name: (architecture, config, LoRA rank, prompts B, group G, rows per micro-batch for `before`
    # (None: the whole batch in one micro-batch))
    "smollm2-lora": ("llama", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                                   rms_norm_eps=1e-5, rope_theta=100000.0), 16, 2, 4, 4),
    "qwen-vocab": ("qwen2", dict(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False), 0, 1, 4, None),
}
VARIANTS = {
    # rows per micro-batch (the model's) in arrival order, right-padded with the attention mask,
    # the whole LM head: the update as it was
    "before": dict(pack="off", logits_chunk=0, layout="masked", arrival_order=True),
    # a token budget (the model's) and packing, the whole head
    "packed": dict(pack="on", logits_chunk=0, budget=True),
    # the shipped defaults (--pack auto: packed for a varlen attention kernel, else right-padded
    # rows without the mask; the chunked LM head), with the model's token budget
    "after": dict(budget=True),
    # TRL's GRPOTrainer on the same batch (its own venv, CPU): rows per micro-batch, padded
    "trl": None,
}
BUDGET = {"smollm2-lora": 8192, "qwen-vocab": None}
"""--micro-batch-tokens of ``packed``/``after``: smollm2's ~ 4 rows x the mean length (as
``before``'s 4 rows); qwen-vocab's micro-batch is the whole batch (its memory is the point)."""


def length_mix(n: int, seed: int, prompt=(150, 300), response=(200, 3000), searches=(1, 3), passages=(0.5, 0.7)):
    """``n`` (prompt length, [(tokens, policy?), ...]) response layouts, seeded."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p, r, k = rng.randint(*prompt), rng.randint(*response), rng.randint(*searches)
        obs = round(r * rng.uniform(*passages))
        turns, blocks = _split(r - obs, k + 1, rng), _split(obs, k, rng)
        layout = [(turns[0], True)]
        for j in range(k):
            layout += [(blocks[j], False), (turns[j + 1], True)]
        out.append((p, [(n_, pol) for n_, pol in layout if n_ > 0]))
    return out


def _split(total: int, parts: int, rng: random.Random) -> list[int]:
    cuts = sorted(rng.randint(0, total) for _ in range(parts - 1))
    edges = [0, *cuts, total]
    return [b - a for a, b in zip(edges, edges[1:])]


def make_samples(model: str, seed: int, prompts: int | None = None) -> list[dict]:
    _, config, _, b, g, _ = MODELS[model]
    b = prompts or b
    rng = random.Random(seed + 1)
    vocab = config["vocab_size"]
    out = []
    fixed = {} if model != "qwen-vocab" else dict(prompt=(256, 256), response=(1792, 1792))  # 4 x 2,048 tokens
    for i, (p, layout) in enumerate(length_mix(b * g, seed, **fixed)):
        mask = [int(pol) for n, pol in layout for _ in range(n)]
        out.append({"prompt": [rng.randrange(100, vocab) for _ in range(p)],
                    "response": [rng.randrange(100, vocab) for _ in range(len(mask))], "mask": mask,
                    "group": f"q{i // g}", "row": f"q{i // g}", "sample": i % g, "reward": float((i * 7) % 3 == 0)})
    for i in range(0, len(out), g):  # every group mixed, so every sample has an advantage
        out[i]["reward"], out[i + 1]["reward"] = 1.0, 0.0
    return out


def build_model(model: str, out: Path) -> Path:
    """A random model of ``model``'s shape with the tiny tokenizer (the update reads no text)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from zsearch_cli.models.tiny import make_tiny_model

    arch, config, *_ = MODELS[model]
    tiny = make_tiny_model(out, seed=0)  # the tokenizer and generation config; the weights are replaced
    cls, cfg_cls = (LlamaForCausalLM, LlamaConfig) if arch == "llama" else (Qwen2ForCausalLM, Qwen2Config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = cls(cfg_cls(**config, max_position_embeddings=8192, pad_token_id=1, eos_token_id=0, bos_token_id=None))
    m.save_pretrained(tiny, safe_serialization=True)
    return tiny


# ------------------------------------------------------------------ the worker (one variant)


def _rss_kib(field: str) -> int:
    """VmRSS / VmHWM of this process, KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _measure(update, spec: dict, cuda: bool) -> tuple[float, object, int, float]:
    """(median s, last result, warm-up calls, peak MiB above the state before the first call):
    CUDA's allocator peak, or on CPU the resident set's high-water mark, reset first
    (``/proc/self/clear_refs``), above the resident set at rest."""
    import torch

    from steady import steady_median

    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    median, out, warmup = steady_median(update, repeats=spec["reps"], max_warmup=spec["max_warmup"])
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else (_rss_kib("VmHWM") - base) / 1024
    return median, out, warmup, peak


def worker(spec: dict) -> dict:
    if spec["variant"] == "trl":
        return trl_worker(spec)
    import torch
    from accelerate import Accelerator

    from zsearch_cli.train import microbatch
    from zsearch_cli.train.config import TrainConfig, algo_config, get_spec, resolve_config
    from zsearch_cli.train.logprobs import resolve_layout
    from zsearch_cli.train.optim import make_optimizer
    from zsearch_cli.train.policy import load_policy
    from zsearch_cli.train.update import (StepModels, advantages, micro_settings, optimize, rollout_tensors,
                                          step_batch)

    from update_vs_trl import as_samples

    torch.set_num_threads(spec["threads"])
    cuda = spec["device"] == "cuda"
    _, config, lora_r, b, g, rows = MODELS[spec["model"]]
    samples_spec = spec["samples"]
    variant = dict(VARIANTS[spec["variant"]])
    forced_layout = variant.pop("layout", None)
    if variant.pop("arrival_order", False):  # as it was: R rows at a time in the batch's order
        planned = microbatch.plan
        microbatch.plan = lambda idx, lengths, rows, tokens, packed: (  # noqa: E731
            [list(idx)[i : i + rows] for i in range(0, len(idx), rows)] if tokens is None
            else planned(idx, lengths, rows, tokens, packed))
    budget = BUDGET[spec["model"]] or sum(len(s["prompt"]) + len(s["response"]) for s in samples_spec)
    options = dict(micro_batch_size=rows or len(samples_spec), gradient_checkpointing=spec.get("checkpointing", False),
                   **variant)
    if options.pop("budget", False):
        options["micro_batch_tokens"] = budget
    cfg = resolve_config(TrainConfig.from_flat(
        algo="grpo", model=spec["model_dir"], batch_size=len(samples_spec) // g, group_size=g, lr=1e-6, beta=0.0,
        seed=0, temperature=1.0, lora_r=lora_r, lora_alpha=16, steps=1000, **options))
    gspec, acfg = get_spec(cfg.algo), algo_config(cfg)
    torch.manual_seed(0)
    policy, tokenizer = load_policy(cfg, spec["device"], spec["dtype"])
    optimizer, _ = make_optimizer(policy.parameters(), cfg.optim.lr, cfg.optim.weight_decay, cfg.steps, 0.0,
                                  "constant", 0.0)
    acc = Accelerator(cpu=not cuda)
    policy, optimizer = acc.prepare(policy, optimizer)
    layout, why = resolve_layout(cfg.batch.pack, policy, config["vocab_size"], acc.device, getattr(torch, spec["dtype"]),
                                 getattr(acc.unwrap_model(policy).config, "_attn_implementation", None))
    if forced_layout:
        layout, why = forced_layout, f"{forced_layout} (the update as it was)"
    print(why, file=sys.stderr)
    m = StepModels(policy, None, None, optimizer, None, acc, int(tokenizer.pad_token_id), acc.device, layout=layout)

    def samples() -> list:
        return as_samples(samples_spec)

    done = [0]


    def update() -> dict:
        train = samples()
        if cuda:
            torch.cuda.synchronize()
        batch = rollout_tensors(m, step_batch(train, m.pad_id), cfg, version=done[0])
        batch = advantages(gspec, acfg, batch, acc)
        stats = optimize(m, gspec, acfg, cfg, batch, done[0])
        if cuda:
            torch.cuda.synchronize()
        done[0] += 1
        return stats

    settings = micro_settings(cfg, m)
    lengths = [len(s["prompt"]) + len(s["response"]) for s in samples_spec]
    micros = microbatch.plan(range(len(lengths)), lengths, settings.rows, settings.tokens, settings.packed)
    slots = sum(microbatch.cost(mb, lengths, settings.packed) for mb in micros)
    median, stats, warmup, peak = _measure(update, spec, cuda)
    return _result(median, warmup, peak, samples_spec, slots, len(micros),
                   {"loss": stats.get("actor/loss"), "grad_norm": stats.get("actor/grad_norm"), "layout": layout,
                    "why": why,
                    "logits_chunk": cfg.batch.logits_chunk})


def _result(median: float, warmup: int, peak: float, samples: list[dict], slots: int, micros: int, extra: dict) -> dict:
    real = sum(len(s["prompt"]) + len(s["response"]) for s in samples)
    return {"median_s": median, "warmup": warmup, "peak_mib": peak, "real_tokens": real, "slots": slots,
            "micro_batches": micros, "padding": 1 - real / slots, "tokens_per_s": real / median, **extra}


def trl_worker(spec: dict) -> dict:
    """TRL 1.16's GRPOTrainer on the same batch (bench/update_vs_trl.py drives it as its
    ``_generate_and_score_completions`` would give the batch): rows per micro-batch, padded
    (prompts left, completions right); TRL's GRPO has no padding-free mode, and its
    ``use_liger_kernel`` needs Liger's Triton kernels (a GPU)."""
    import torch

    from update_vs_trl import _trl_worker

    torch.set_num_threads(spec["threads"])
    _, _, lora_r, b, g, rows = MODELS[spec["model"]]
    samples = spec["samples"]
    micro = rows or len(samples)
    step, _, version = _trl_worker({**spec, "beta": 0.0, "out": spec["out"],
                                    "gradient_checkpointing": spec.get("checkpointing", False),
                                    "config": {"B": len(samples) // g, "G": g, "micro": micro, "lora_r": lora_r}})
    median, _, warmup, peak = _measure(lambda: step()[0], spec, False)
    p_max = max(len(s["prompt"]) for s in samples)
    t_max = max(len(s["response"]) for s in samples)
    slots = len(samples) * (p_max + t_max)  # every micro-batch is padded to the batch's longest prompt and completion
    return _result(median, warmup, peak, samples, slots, -(-len(samples) // micro), {"trl": version})


# ------------------------------------------------------------------ the driver


def run_variant(spec: dict, log: Path, trl_python: Path) -> dict:
    trl = spec["variant"] == "trl"
    if trl and (spec["device"] != "cpu" or not trl_python.exists()):
        why = "TRL is run on CPU only here" if spec["device"] != "cpu" else f"no TRL interpreter at {trl_python}"
        return {"skipped": why}
    src = "" if trl else str(ROOT / "src") + os.pathsep  # TRL's venv has its own transformers, no zsearch
    env = {**os.environ, "PYTHONPATH": src + os.environ.get("PYTHONPATH", ""),
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    if spec["device"] == "cpu":
        env["OMP_NUM_THREADS"] = str(spec["threads"])
    spec_file = log.with_suffix(".spec.json")  # a file, not argv: the token ids pass Linux's 128 KiB argument cap
    spec_file.write_text(json.dumps(spec))
    with open(log, "w") as f:
        done = subprocess.run([str(trl_python) if trl else sys.executable, __file__, "--worker", str(spec_file)],
                              stdout=subprocess.PIPE,
                              stderr=f, text=True, env=env)
    for line in done.stdout.splitlines():
        if line.startswith("@@RESULT "):
            return json.loads(line[9:])
    tail = log.read_text()[-2000:]
    return {"error": f"exit {done.returncode}: " + (tail.strip().splitlines() or ["(no output)"])[-1], "log": str(log)}


def table(results: list[dict], title: str) -> str:
    """The README's table: each variant's numbers, and its time and peak memory as ratios of
    ``before`` (and time of ``trl``) for the same model."""
    lines = [title, f"{'model':<14} {'variant':<8} {'tokens':>7} {'micro':>5} {'padding':>8} {'update s':>9} "
                    f"{'x before':>8} {'x trl':>6} {'peak MiB':>9} {'x before':>8} {'tok/s':>8}"]
    by = {(r["model"], r["variant"]): r for r in results if "median_s" in r}
    for r in results:
        head = f"{r['model']:<14} {r['variant']:<8}"
        if "median_s" not in r:
            lines.append(f"{head} {r.get('error') or 'skipped: ' + r.get('skipped', '?')}")
            continue
        before, trl = by.get((r["model"], "before")), by.get((r["model"], "trl"))
        ratio = lambda a, b, k: f"{a[k] / b[k]:.2f}" if b and b[k] > 0 else "-"  # noqa: E731
        lines.append(f"{head} {r['real_tokens']:>7} {r['micro_batches']:>5} {r['padding']:>8.1%} {r['median_s']:>9.3f} "
                     f"{ratio(r, before, 'median_s'):>8} {ratio(r, trl, 'median_s'):>6} {r['peak_mib']:>9.0f} "
                     f"{ratio(r, before, 'peak_mib'):>8} {r['tokens_per_s']:>8.0f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per update (default: the model's)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="every variant recomputes activations in backward (TRL too): smollm2 on the length mix "
                         "needs it in 24 GiB on CPU, where attention holds [heads, L, L] scores per layer")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--trl-python", type=Path, default=TRL_PYTHON,
                    help="TRL's venv: python3.11 -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 "
                         "'trl==1.16.*' peft")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("@@RESULT " + json.dumps(worker(json.loads(Path(args.worker).read_text()))), flush=True)
        return
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    results = []
    with tempfile.TemporaryDirectory(prefix="zsearch-bench-update-") as tmp:
        root = Path(tmp)
        for model in args.models.split(","):
            model_dir = build_model(model, root / model)
            samples = make_samples(model, args.seed, args.prompts)
            for variant in args.variants.split(","):
                spec = {"model": model, "variant": variant, "model_dir": str(model_dir), "samples": samples,
                        "device": args.device, "dtype": dtype, "threads": args.threads, "reps": args.reps,
                        "max_warmup": args.max_warmup, "out": str(root / f"trl-{model}"),
                        "checkpointing": args.gradient_checkpointing}
                t = time.perf_counter()
                r = {"model": model, "variant": variant, "samples": len(samples),
                     **run_variant(spec, root / f"{model}-{variant}.log", args.trl_python)}
                r["wall_s"] = time.perf_counter() - t
                results.append(r)
                print(json.dumps(r), flush=True)
                if "error" in r:
                    print(Path(r["log"]).read_text()[-3000:], file=sys.stderr)
    print(table(results, f"update efficiency, {args.device} {dtype}, seed {args.seed}, {args.threads} threads "
                         f"(median of >= {args.reps} after warm-up)"))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
