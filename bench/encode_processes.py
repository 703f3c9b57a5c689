"""Dense encoding on 1 and 2 processes: passages/s of `zsearch index --kind dense`, and the cores
each process used (torch threads). A printed table, never a timed test.

    .venv/bin/python bench/encode_processes.py [--passages 256] [--configs 1x2,2x1,1x1] [--repeats 5]

A config ``PxT`` is P processes of T torch threads each (``OMP_NUM_THREADS``): ``1x2`` is one
`zsearch index` using 2 cores, ``2x1`` is `accelerate launch --multi_gpu --num_processes 2
--num_cpu_threads_per_process 1 -m zsearch_cli index …` (2 processes over gloo, as
tests/test_encode_shards.py launches them) on the same 2 cores. Each run builds a fresh index
of the same seeded corpus with the bundled MiniLM on CPU; the rate is the encode phase's, from
the index's manifest (``dense.encode``: all processes' passages over the time from the slice
plan to the barrier after the last slice), so process start-up and model loading are left
out; the whole command's wall time is shown beside it.

Timing protocol (bench/steady.py's, on the measured encode time): runs are repeated until two
consecutive ones agree within 10% (at most ``--max-warmup``), then the median of
``--repeats`` (>= 5) runs. The bench also checks that every config wrote the same embedding
bytes. On a shared machine other processes take cores too: the numbers are noisy, and the
printed command reruns them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from steady import MIN_REPEATS, WARMUP_TOL  # bench/steady.py: bench/ is sys.path[0] here

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the of and river mountain city music science history war king language planet energy ocean "
         "forest bridge island engine painter").split()


def write_corpus(path: Path, n: int, seed: int = 0) -> None:
    """``n`` passages of 10 to 80 words (a spread of lengths, so length sorting matters)."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 80)))
            fh.write(json.dumps({"id": f"p{i}", "title": f"Passage {i}", "text": text}) + "\n")


def command(processes: int, threads: int, corpus: Path, out: Path, args: argparse.Namespace) -> list[str]:
    index = ["index", str(corpus), "--out", str(out), "--kind", "dense", "--device", "cpu",
             "--encode-slice", str(args.slice), "--batch-size", str(args.batch_size), "--max-length", "128"]
    if processes == 1:
        return [sys.executable, "-m", "zsearch_cli", *index]
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--num_cpu_threads_per_process", str(threads), "-m", "zsearch_cli", *index]


def run_once(processes: int, threads: int, corpus: Path, work: Path, args: argparse.Namespace) -> dict:
    out = work / f"idx-{processes}x{threads}"
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    done = subprocess.run(command(processes, threads, corpus, out, args), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{processes}x{threads} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    record = json.loads((out / "manifest.json").read_text())["dense"]["encode"]
    return {"seconds": record["seconds"], "threads": record["threads"], "wall": wall,
            "bytes": (out / "dense" / "embeddings.npy").read_bytes()}


def measure(processes: int, threads: int, corpus: Path, work: Path, args: argparse.Namespace) -> dict:
    """bench/steady.py's protocol on the encode time each run reports."""
    prev, warmup, last = None, 0, None
    while warmup < args.max_warmup:
        last = run_once(processes, threads, corpus, work, args)
        warmup += 1
        if prev is not None and abs(last["seconds"] - prev) <= WARMUP_TOL * max(last["seconds"], prev):
            break
        prev = last["seconds"]
    runs = [run_once(processes, threads, corpus, work, args) for _ in range(max(args.repeats, MIN_REPEATS))]
    seconds = [r["seconds"] for r in runs]
    return {"median": statistics.median(seconds), "all": seconds, "warmup": warmup, "threads": runs[-1]["threads"],
            "wall": statistics.median(r["wall"] for r in runs), "bytes": runs[-1]["bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=256)
    parser.add_argument("--configs", default="1x2,2x1", help="PxT: P processes of T torch threads each")
    parser.add_argument("--slice", type=int, default=32, help="--encode-slice")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS)
    parser.add_argument("--max-warmup", type=int, default=6)
    args = parser.parse_args()
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    print("command: " + " ".join([sys.executable, *sys.argv]))
    print(f"machine: {os.cpu_count()} cores visible; load average {os.getloadavg()[0]:.2f} at the start "
          "(other processes share these cores: noisy numbers)")
    with tempfile.TemporaryDirectory(prefix="encode-bench-") as tmp:
        work = Path(tmp)
        corpus = work / "corpus.jsonl"
        write_corpus(corpus, args.passages)
        results = {}
        for processes, threads in configs:
            results[(processes, threads)] = r = measure(processes, threads, corpus, work, args)
            print(f"  {processes}x{threads}: encode {r['median']:.2f} s median of {len(r['all'])} "
                  f"({', '.join(f'{s:.2f}' for s in r['all'])}), warm-up {r['warmup']} run(s)", flush=True)
    base = results[configs[0]]
    print(f"\n{args.passages} passages, MiniLM on CPU, --encode-slice {args.slice}, --batch-size {args.batch_size}; "
          f"load average {os.getloadavg()[0]:.2f} at the end")
    print(f"{'config':<8} {'processes':>9} {'threads each':>12} {'cores':>5} {'passages/s':>10} "
          f"{'vs ' + '%dx%d' % configs[0]:>8} {'per core':>8} {'command wall s':>14}")
    for (processes, threads), r in results.items():
        rate = args.passages / r["median"]
        print(f"{f'{processes}x{threads}':<8} {processes:>9} {'/'.join(map(str, r['threads'])):>12} "
              f"{processes * threads:>5} {rate:>10.1f} {base['median'] / r['median']:>7.2f}x "
              f"{rate / (processes * threads):>8.1f} {r['wall']:>14.1f}")
    same = len({r["bytes"] for r in results.values()}) == 1
    print(f"embeddings byte-identical across configs: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
