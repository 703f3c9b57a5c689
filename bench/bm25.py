"""BM25 benchmark: zsearch (through SearchIndex) vs raw bm25s vs rank-bm25.

    .venv/bin/python bench/bm25.py [--docs 100000] [--queries 1000] [--topk 3]

A seeded synthetic corpus (Zipf-distributed pseudo-words, 20-120 words per passage) and
queries drawn from passages' own words. Each engine runs in a fresh subprocess so its
peak RSS (``ru_maxrss``) is its own. Raw bm25s and zsearch use the same stopwords and
Snowball stemmer and the Lucene BM25 variant, and every pseudo-word has >= 3 letters, so
their top-k must agree (reported) up to ties: zsearch breaks equal scores by lower row,
bm25s's ``argpartition`` picks arbitrarily among passages tied with the k-th best.
rank-bm25 (BM25Okapi, its usual form) scores every passage in Python per query term, so
it runs a 50-query subset and reports per-query time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

K1, B = 1.2, 0.75


def make_data(root: Path, n_docs: int, n_queries: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab: list[str] = []
    seen: set[str] = set()
    while len(vocab) < 50_000:
        word = "".join(rng.choice(letters, size=rng.integers(3, 11)))
        if word not in seen:
            seen.add(word)
            vocab.append(word)
    words = np.array(vocab)
    p = 1.0 / (np.arange(len(words)) + 2.7) ** 1.07  # Zipf-Mandelbrot, roughly English-like
    p /= p.sum()
    lengths = rng.integers(20, 121, size=n_docs)
    tokens = words[rng.choice(len(words), size=int(lengths.sum()), p=p)]
    bounds = np.r_[0, np.cumsum(lengths)]
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for i in range(n_docs):
            doc = tokens[bounds[i] : bounds[i + 1]]
            fh.write(json.dumps({"id": f"p{i}", "title": " ".join(doc[:3]), "text": " ".join(doc[3:])}) + "\n")
    queries = []
    for doc in rng.integers(0, n_docs, size=n_queries):
        span = tokens[bounds[doc] : bounds[doc + 1]]
        queries.append(" ".join(rng.choice(span, size=rng.integers(2, 7), replace=False)))
    (root / "queries.json").write_text(json.dumps(queries))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _timed_queries(fn, repeats: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def worker(engine: str, root: Path, topk: int, n_rank: int) -> dict:
    """Index once, then time the queries serially and on every core; returns one dict per run."""
    queries = json.loads((root / "queries.json").read_text())
    threads = os.cpu_count() or 1
    if engine == "zsearch":
        import bm25s  # noqa: F401  (imported before the baseline, as in the other workers)

        from zsearch_cli.retrieval.index import build_index, load_index

        base = _rss_mb()
        t = time.perf_counter()
        build_index(root / "corpus.jsonl", root / "zs_index", {"kind": "bm25", "k1": K1, "b": B})
        index_s = time.perf_counter() - t
        runs = {}
        for n in (0, threads):
            index = load_index(root / "zs_index", n_threads=n)
            index.search(queries[:50], topk, "bm25")  # warm up
            secs, hits = _timed_queries(lambda: index.search(queries, topk, "bm25"))
            runs[n] = {"query_s": secs, "top": [[int(p.id[1:]) for p in h] for h in hits],
                       "scores": [[round(p.score, 4) for p in h] for h in hits]}
        return {"index_s": index_s, "n": len(queries), "base": base, "peak": _rss_mb(), "runs": runs}

    import bm25s
    import Stemmer

    with open(root / "corpus.jsonl", encoding="utf-8") as fh:
        texts = [f"{r['title']} {r['text']}" for r in map(json.loads, fh)]
    stemmer = Stemmer.Stemmer("english")
    base = _rss_mb()
    if engine == "bm25s":
        t = time.perf_counter()
        model = bm25s.BM25(k1=K1, b=B, method="lucene")
        model.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
        index_s = time.perf_counter() - t
        runs = {}
        for n in (0, threads):
            def run():
                tokens = bm25s.tokenize(queries, stopwords="en", stemmer=stemmer, show_progress=False)
                return model.retrieve(tokens, k=topk, show_progress=False, n_threads=n)

            run()
            secs, res = _timed_queries(run)
            runs[n] = {"query_s": secs, "top": res.documents.tolist(),
                       "scores": [[round(float(s), 4) for s in row if s > 0] for row in res.scores]}
        return {"index_s": index_s, "n": len(queries), "base": base, "peak": _rss_mb(), "runs": runs}

    from rank_bm25 import BM25Okapi

    t = time.perf_counter()
    tokenized = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)
    model = BM25Okapi(tokenized, k1=K1, b=B)
    index_s = time.perf_counter() - t
    subset = bm25s.tokenize(queries[:n_rank], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)
    secs, _ = _timed_queries(lambda: [np.argsort(-model.get_scores(q))[:topk] for q in subset], repeats=1)
    return {"index_s": index_s, "n": n_rank, "base": base, "peak": _rss_mb(), "runs": {0: {"query_s": secs}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--rank-bm25-queries", type=int, default=50)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "data":
        make_data(args.data, args.docs, args.queries)
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.data, args.topk, args.rank_bm25_queries)))
        return

    from rich.console import Console
    from rich.table import Table

    console = Console()
    with tempfile.TemporaryDirectory(prefix="zsearch-bench-") as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        # Everything big happens in subprocesses: Linux carries a parent's peak RSS into a
        # forked child's ru_maxrss, so a fat parent would inflate every worker's number.
        subprocess.run([sys.executable, __file__, "--worker", "data", "--data", str(root), "--docs", str(args.docs),
                        "--queries", str(args.queries)], check=True)
        console.print(f"data: {args.docs:,} passages, {args.queries:,} queries ({time.perf_counter() - t:.1f}s)")
        results = {}
        for engine in ("zsearch", "bm25s", "rank-bm25"):
            console.print(f"running {engine} ...")
            cmd = [sys.executable, __file__, "--worker", engine, "--data", str(root), "--topk", str(args.topk),
                   "--rank-bm25-queries", str(args.rank_bm25_queries)]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results[engine] = json.loads(proc.stdout.strip().splitlines()[-1])

    table = Table(title=f"BM25 top-{args.topk}: {args.docs:,} passages, {args.queries:,} queries (rank-bm25: "
                        f"{args.rank_bm25_queries})")
    for col in ("engine", "threads", "index s", "QPS", "ms/query", "peak RSS MB", "RSS for index MB"):
        table.add_column(col, justify="left" if col == "engine" else "right")
    qps = {}
    for engine, r in results.items():
        for n, run in r["runs"].items():
            qps[engine, n] = r["n"] / run["query_s"]
            table.add_row(engine, str(n) if int(n) else "serial", f"{r['index_s']:.1f}", f"{qps[engine, n]:,.1f}",
                          f"{1000 / qps[engine, n]:.2f}", f"{r['peak']:,.0f}", f"{r['peak'] - r['base']:,.0f}")
    console.print(table)
    zs, raw = results["zsearch"], results["bm25s"]
    for n in zs["runs"]:
        zs_run, raw_run = zs["runs"][n], raw["runs"][n]
        agree = np.mean([sorted(a) == sorted(b) for a, b in zip(zs_run["top"], raw_run["top"])])
        # The rest should differ only among passages tied at equal scores: same score lists.
        tied = np.mean([sorted(a) == sorted(b) or sorted(sa) == sorted(sb) for a, b, sa, sb in
                        zip(zs_run["top"], raw_run["top"], zs_run["scores"], raw_run["scores"])])
        console.print(f"zsearch / bm25s, {'serial' if not int(n) else f'{n} threads'}: QPS x{qps['zsearch', n] / qps['bm25s', n]:.2f} "
                      f"(target >= 0.95); same top-{args.topk} passages on {agree:.1%} of queries, "
                      f"same top-{args.topk} scores (differing only among ties) on {tied:.1%}")
    console.print(f"zsearch / bm25s: index time x{zs['index_s'] / raw['index_s']:.2f}, peak RSS x{zs['peak'] / raw['peak']:.2f}")

if __name__ == "__main__":
    main()
