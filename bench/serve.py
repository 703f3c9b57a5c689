"""Retrieval server latency and throughput: `zsearch serve` over a synthetic 100k-passage BM25 index.

What a rollout sees: each client thread sends batches of ``--batch`` queries through
:class:`RetrievalClient` (the same HTTP path the rollout engine uses) and the latency of each
request is timed end to end. Every query is new, so the index does real work (no cache hits),
except in the last row, which replays level-16 traffic to show what the cache buys.

    python bench/serve.py                      # 100k passages, 1/4/16 clients, 200 requests each
    python bench/serve.py --docs 20000 --requests 100

Target (2-core box): p50 under 20 ms for a 16-query BM25 batch on 100k passages.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

from zsearch_cli.retrieval.client import RetrievalClient

SYLLABLES = "ka to ri mu se na lo pe vi zu ta mo ki re su no ha li be go da fe ni ro".split()
console = Console()


def vocabulary(size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` distinct pseudo-words of 2-4 syllables (rank 0 is the most frequent)."""
    words: dict[str, None] = {}
    while len(words) < size:
        n = int(rng.integers(2, 5))
        words["".join(rng.choice(SYLLABLES, n))] = None
    return np.array(list(words), dtype=object)


def zipf_probs(size: int, exponent: float = 1.0) -> np.ndarray:
    p = 1.0 / np.arange(1, size + 1) ** exponent
    return p / p.sum()


def write_corpus(path: Path, docs: int, seed: int, vocab_size: int = 30_000) -> np.ndarray:
    """A seeded Zipfian corpus of 60-140-word passages (wiki-18's are 100 words) as Parquet.

    Lengths vary so BM25's length normalisation spreads the scores as on real text."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary(vocab_size, rng)
    probs = zipf_probs(vocab_size)
    ids, titles, texts = [], [], []
    chunk = 10_000
    for start in range(0, docs, chunk):
        n = min(chunk, docs - start)
        draws = vocab[rng.choice(vocab_size, size=(n, 140), p=probs)]
        lengths = rng.integers(60, 141, size=n)
        for i, (row, length) in enumerate(zip(draws, lengths)):
            ids.append(f"doc{start + i}")
            titles.append(" ".join(row[:2]).title())
            texts.append(" ".join(row[:length]))
    pq.write_table(pa.table({"id": ids, "title": titles, "text": texts}), path)
    return vocab


def make_queries(vocab: np.ndarray, n: int, seed: int) -> list[str]:
    """``n`` distinct queries of 3-6 words, drawn Zipf-like but skipping the 20 most common words."""
    rng = np.random.default_rng(seed)
    probs = zipf_probs(len(vocab) - 20, 0.8)
    out: dict[str, None] = {}
    while len(out) < n:
        k = int(rng.integers(3, 7))
        out[" ".join(vocab[20 + rng.choice(len(probs), size=k, p=probs)])] = None
    return list(out)


def build(workdir: Path, docs: int, seed: int) -> tuple[Path, np.ndarray]:
    """Corpus and index under ``workdir``, reused when a previous run left them there."""
    from zsearch_cli.retrieval.index import build_index

    corpus, index_dir = workdir / "corpus.parquet", workdir / "index"
    vocab_file = workdir / "vocab.json"
    if not (index_dir.exists() and vocab_file.exists()):
        t0 = time.perf_counter()
        vocab = write_corpus(corpus, docs, seed)
        vocab_file.write_text(json.dumps(list(vocab)))
        console.print(f"corpus: {docs} passages in {time.perf_counter() - t0:.1f}s")
        t0 = time.perf_counter()
        build_index(corpus, index_dir, {"kind": "bm25"})
        console.print(f"index:  built in {time.perf_counter() - t0:.1f}s")
    return index_dir, np.array(json.loads(vocab_file.read_text()), dtype=object)


def start_server(index_dir: Path) -> tuple[subprocess.Popen, str]:
    """`zsearch serve` on a free loopback port; returns the process and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zsearch_cli.cli", "serve", "--index", str(index_dir), "--port", "0"],
        stdout=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline()
    found = re.search(r"http://\S+", line)
    if not found:
        proc.kill()
        raise SystemExit(f"server did not start: {line!r}")
    url = found.group(0)
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # drain the rest
    return proc, url


def run_level(url: str, clients: int, batches: list[list[str]], topk: int) -> dict[str, float]:
    """Send ``batches`` from ``clients`` threads; latency per request, throughput overall."""
    client = RetrievalClient(url, timeout=60, retries=0)
    client.retrieve(batches[0], topk)  # open each thread's connection lazily; warm this one
    latencies: list[float] = []
    lock = threading.Lock()
    it = iter(batches)

    def worker() -> None:
        mine = []
        while True:
            with lock:
                batch = next(it, None)
            if batch is None:
                break
            t0 = time.perf_counter()
            result = client.retrieve(batch, topk)
            mine.append(time.perf_counter() - t0)
            assert len(result) == len(batch)
        with lock:
            latencies.extend(mine)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(worker) for _ in range(clients)]:
            f.result()
    wall = time.perf_counter() - start
    ms = sorted(1000 * x for x in latencies)
    return {
        "clients": clients, "requests": len(ms),
        "p50_ms": statistics.median(ms), "p95_ms": ms[min(len(ms) - 1, int(0.95 * len(ms)))],
        "req_s": len(ms) / wall, "q_s": len(ms) * len(batches[0]) / wall,
    }


def in_process_ms(index_dir: Path, batches: list[list[str]], topk: int) -> float:
    """Median time of one batched ``SearchIndex.search`` call: the floor under HTTP latency."""
    from zsearch_cli.retrieval.index import load_index

    index = load_index(index_dir)
    index.search(batches[0], topk)
    times = []
    for batch in batches:
        t0 = time.perf_counter()
        index.search(batch, topk)
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=200, help="requests per concurrency level")
    ap.add_argument("--batch", type=int, default=16, help="queries per request")
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--levels", default="1,4,16", help="comma list of concurrent clients")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", type=Path, default=None, help="keep corpus+index here (reused on rerun)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()

    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="zsearch-bench-serve-")
    workdir = args.workdir or Path(tmp.name)
    workdir.mkdir(parents=True, exist_ok=True)
    levels = [int(x) for x in args.levels.split(",")]
    index_dir, vocab = build(workdir, args.docs, args.seed)
    n = args.requests * args.batch
    queries = make_queries(vocab, n * (len(levels) + 1), args.seed + 1)
    batched = [queries[i : i + args.batch] for i in range(0, len(queries), args.batch)]
    floor = in_process_ms(index_dir, batched[-args.requests // 4 :], args.topk)

    proc, url = start_server(index_dir)
    rows = []
    try:
        for k, clients in enumerate(levels):
            rows.append(run_level(url, clients, batched[k * args.requests : (k + 1) * args.requests], args.topk))
        replay = batched[(len(levels) - 1) * args.requests : len(levels) * args.requests]
        rows.append({**run_level(url, levels[-1], replay, args.topk), "note": "all cache hits"})
    finally:
        proc.terminate()
        proc.wait(15)
        if tmp:
            tmp.cleanup()

    table = Table(title=f"zsearch serve: BM25, {args.docs:,} passages, {args.batch} queries/request, topk {args.topk}")
    for col in ("clients", "requests", "p50 ms", "p95 ms", "requests/s", "queries/s", "note"):
        table.add_column(col, justify="left" if col == "note" else "right")
    for r in rows:
        table.add_row(str(r["clients"]), str(r["requests"]), f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}",
                      f"{r['req_s']:.0f}", f"{r['q_s']:.0f}", r.get("note", ""))
    console.print(table)
    console.print(f"in-process SearchIndex.search of one {args.batch}-query batch: median {floor:.1f} ms")
    single = rows[0]["p50_ms"]
    verdict = "[green]met[/]" if single < 20 else "[red]missed[/]"
    console.print(f"target p50 < 20 ms (1 client): {single:.1f} ms, {verdict}")
    if args.json:
        args.json.write_text(json.dumps({"docs": args.docs, "batch": args.batch, "in_process_ms": floor, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
