"""Time one RL training step, split into rollout / reward / update, and peak memory.

Runs each configuration in its own process (so the peak RSS is that configuration's), on
the bundled demo train split with an in-process BM25 index over the demo corpus:

    python bench/train_step.py                         # tiny (full) and smollm2 (LoRA), CPU
    python bench/train_step.py --configs tiny --steps 5 --device cuda

Per configuration: one warm-up step (first-call overheads), then ``--steps`` timed steps;
the table shows their means. Peak memory is the process's max RSS on CPU, and
``torch.cuda.max_memory_allocated`` on CUDA.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    # name: (model, TrainConfig overrides)
    "tiny": ("tiny", {"lora_r": 0, "max_turn_tokens": 32}),
    "smollm2-lora": ("smollm2", {"lora_r": 16, "max_turn_tokens": 48}),
}


def worker(spec: dict) -> dict:
    import torch

    from zsearch_cli.retrieval.index import build_index
    from zsearch_cli.train import TrainConfig
    from zsearch_cli.train.trainer import Trainer

    torch.set_num_threads(spec["threads"])
    root = Path(spec["root"])
    model = spec["model"]
    if model == "tiny":
        from zsearch_cli.models.tiny import make_tiny_model

        model = str(make_tiny_model(root / "tiny", seed=0))
    index = root / "index"
    if not index.exists():
        build_index(None, index, options={"kind": "bm25"})
    cfg = TrainConfig.from_flat(algo=spec["algo"], model=model, out=root / f"run-{spec['name']}", steps=spec["steps"] + 1,
                      batch_size=spec["batch_size"], group_size=spec["group_size"], index=index, max_turns=2,
                      max_obs_tokens=256, save_every=0, device=spec["device"], lr=1e-6, micro_batch_size=4,
                      **spec["overrides"])
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    setup = time.perf_counter() - t0
    rows = [trainer.train_step(s) for s in range(1, cfg.steps + 1)][1:]  # drop the warm-up step
    mean = lambda k: sum(r[k] or 0.0 for r in rows) / len(rows)  # noqa: E731
    if torch.cuda.is_available() and spec["device"] != "cpu":
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"name": spec["name"], "setup": setup, "step": mean("time/step"), "rollout": mean("time/rollout"),
            "reward": mean("time/reward"), "update": mean("time/update"), "tokens": mean("rollout/response_length"),
            "samples": cfg.batch_size * cfg.group_size,
            "peak_mb": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--algo", default="grpo")
    ap.add_argument("--steps", type=int, default=2, help="timed steps after one warm-up step")
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(json.loads(args.worker))))
        return

    from rich.console import Console
    from rich.table import Table

    results = []
    with tempfile.TemporaryDirectory(prefix="zsearch-bench-train-") as root:
        for name in args.configs.split(","):
            model, overrides = CONFIGS[name]
            spec = {"name": name, "model": model, "overrides": overrides, "root": root, "algo": args.algo,
                    "steps": args.steps, "batch_size": args.batch_size, "group_size": args.group_size,
                    "device": args.device, "threads": args.threads}
            proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True, text=True)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                print(f"{name}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            results.append(json.loads(line[len("RESULT "):]))
    table = Table(title=f"zsearch train step ({args.algo}, B={args.batch_size}, G={args.group_size}, "
                        f"{args.device}, {args.threads} threads; mean of {args.steps} steps after 1 warm-up)")
    for col in ("config", "samples", "resp tokens", "step s", "rollout s", "reward s", "update s", "setup s", "peak MB"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in results:
        table.add_row(r["name"], str(r["samples"]), f"{r['tokens']:.0f}", f"{r['step']:.2f}", f"{r['rollout']:.2f}",
                      f"{r['reward']:.3f}", f"{r['update']:.2f}", f"{r['setup']:.1f}", f"{r['peak_mb']:.0f}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
