"""BM25 benchmark: zsearch (MaxScore/block-max and exhaustive) vs bm25s (plain, numba) vs rank-bm25.

    .venv/bin/python bench/bm25.py --docs 100000,1000000 [--corpus zipf|questions] [--queries 1000]

A printed table, never a timed test. Corpora are seeded and synthetic:

* ``zipf``: Zipf-distributed pseudo-words, 20-120 words per passage, queries of 2-6 words
  drawn from one passage (the generator the issue's numbers came from);
* ``questions``: a realistic vocabulary: 200k Zipf(1.0) pseudo-words with English
  function words at the head, ~100-word passages (80-120), queries of 5-10 terms shaped
  like questions (a wh-word, function words, and content words of one passage).

Each engine runs in a fresh subprocess so its peak RSS (``ru_maxrss``) is its own.
zsearch runs both search modes on the same index; "agree" is the share of queries whose
top-k rows equal zsearch's exhaustive (reference) rows, ties included (for bm25s: the
same top-k score multiset, since its argpartition breaks ties arbitrarily). bm25s with
numba runs from ``--numba-python`` (a separate venv: numba must never be installed in
zsearch's own, see README), and Pyserini (Lucene, block-max WAND) from ``--pyserini-python``
with the same k1, b and top-k (its analyzer differs, so only its speed is compared). rank-bm25 scores every passage in Python: a 20-query subset.
With several sizes, a least-squares fit (log-log for QPS, linear for the rest)
extrapolates zsearch to 21,015,324 passages (wiki-18).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from steady import steady_median  # bench/steady.py: bench/ is sys.path[0] here and in every worker

import numpy as np

K1, B = 1.2, 0.75
WIKI18 = 21_015_324
FUNCTION = ("the of and in to a is was for on as by with he from at that his it an were are which "
            "this be or has had first also its after but who their not one".split())
WH = ("what", "who", "when", "where", "which", "how many", "in what year", "who was the")


def _pseudo_words(rng: np.random.Generator, n: int) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab: list[str] = []
    seen: set[str] = set(FUNCTION)
    while len(vocab) < n:
        word = "".join(rng.choice(letters, size=rng.integers(3, 11)))
        if word not in seen:
            seen.add(word)
            vocab.append(word)
    return vocab


def make_data(root: Path, n_docs: int, n_queries: int, corpus: str, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    if corpus == "zipf":
        words = np.array(_pseudo_words(rng, 50_000))
        p = 1.0 / (np.arange(len(words)) + 2.7) ** 1.07  # Zipf-Mandelbrot, roughly English-like
        lengths = rng.integers(20, 121, size=n_docs)
    else:  # function words take the head of the Zipf curve, as in English text
        words = np.array(list(FUNCTION) + _pseudo_words(rng, 200_000))
        p = 1.0 / (np.arange(len(words)) + 1.0) ** 1.0
        lengths = rng.integers(80, 121, size=n_docs)
    p /= p.sum()
    bounds = np.r_[0, np.cumsum(lengths)]
    queries = []
    q_docs = set(rng.integers(0, n_docs, size=n_queries).tolist())
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for start in range(0, n_docs, 100_000):  # bounded memory at millions of passages
            stop = min(start + 100_000, n_docs)
            tokens = words[rng.choice(len(words), size=int(bounds[stop] - bounds[start]), p=p)]
            for i in range(start, stop):
                doc = tokens[bounds[i] - bounds[start] : bounds[i + 1] - bounds[start]]
                fh.write(json.dumps({"id": f"p{i}", "title": " ".join(doc[:3]), "text": " ".join(doc[3:])}) + "\n")
                if i in q_docs:
                    queries.append(_query(rng, doc, corpus))
    rng.shuffle(queries)
    while len(queries) < n_queries:
        queries.append(queries[len(queries) % max(len(q_docs), 1)])
    (root / "queries.json").write_text(json.dumps(queries[:n_queries]))


def _query(rng: np.random.Generator, doc: np.ndarray, corpus: str) -> str:
    if corpus == "zipf":
        return " ".join(rng.choice(doc, size=min(len(doc), int(rng.integers(2, 7))), replace=False))
    content = [w for w in dict.fromkeys(doc.tolist()) if w not in FUNCTION]
    n = int(rng.integers(5, 11))
    picked = list(rng.choice(content, size=min(len(content), max(n - 3, 2)), replace=False))
    glue = list(rng.choice(FUNCTION[:12], size=2))
    return f"{rng.choice(WH)} {picked[0]} {glue[0]} {' '.join(picked[1:])} {glue[1]}?"


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class AnonPeak:
    """Peak anonymous resident memory (``RssAnon`` of /proc/self/status, sampled every 20 ms
    on a thread) while the block runs: the build's own memory, without the memory-mapped
    index and corpus files that ``ru_maxrss`` also counts (page cache the kernel can drop)."""

    def __enter__(self) -> "AnonPeak":
        self.peak_mb, self._stop = self._now(), threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, self._now())

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            self.peak_mb = max(self.peak_mb, self._now())

    @staticmethod
    def _now() -> float:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
        return float("nan")


def _timed(fn, repeats: int) -> tuple[float, object]:
    """Seconds per call at steady state (bench/steady.py: warm up until two calls agree within
    10%, then the median of at least 5), and the last result."""
    secs, out, _ = steady_median(fn, repeats)
    return secs, out


def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def worker(engine: str, root: Path, topk: int, n_rank: int, repeats: int) -> dict:
    """Index once, then time the queries serially and on every core; returns one dict."""
    queries = json.loads((root / "queries.json").read_text())
    threads = len(os.sched_getaffinity(0))
    if engine == "zsearch":
        from zsearch_cli.retrieval.index import build_index, load_index

        base = _rss_mb()
        t = time.perf_counter()
        with AnonPeak() as anon:
            build_index(root / "corpus.jsonl", root / "zs_index", {"kind": "bm25", "k1": K1, "b": B})
        index_s, build_peak = time.perf_counter() - t, _rss_mb()
        runs = {}
        from zsearch_cli.retrieval.maxscore import KERNEL

        modes = ("maxscore", "maxscore-numpy", "exhaustive") if KERNEL else ("maxscore-numpy", "exhaustive")
        for mode in modes:
            for n in (0, threads):
                index = load_index(root / "zs_index", n_threads=n)
                index._bm25.mode = mode
                index._bm25.search(queries[:50], topk)  # warm up
                secs, (scores, rows) = _timed(lambda: index._bm25.search(queries, topk), repeats)
                runs[f"{mode}|{n}"] = {"query_s": secs, "top": rows.tolist(),
                                       "scores": [[round(float(x), 4) for x in r if x > 0] for r in scores]}
        return {"index_s": index_s, "n": len(queries), "base": base, "peak": max(build_peak, _rss_mb()),
                "build_anon": anon.peak_mb, "index_mb": _dir_mb(root / "zs_index" / "bm25"), "runs": runs}

    if engine == "pyserini":
        return _pyserini_worker(root, queries, topk, threads, repeats)

    import bm25s
    import Stemmer

    with open(root / "corpus.jsonl", encoding="utf-8") as fh:
        texts = [f"{r['title']} {r['text']}" for r in map(json.loads, fh)]
    stemmer = Stemmer.Stemmer("english")
    base = _rss_mb()
    if engine.startswith("bm25s"):
        backend = "numba" if engine == "bm25s-numba" else "numpy"
        t = time.perf_counter()
        model = bm25s.BM25(k1=K1, b=B, method="lucene", backend=backend)
        model.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False), show_progress=False)
        index_s = time.perf_counter() - t
        del texts
        runs = {}
        for n in (0, threads):
            def run():
                tokens = bm25s.tokenize(queries, stopwords="en", stemmer=stemmer, show_progress=False)
                return model.retrieve(tokens, k=topk, show_progress=False, n_threads=n)

            run()
            secs, res = _timed(run, repeats)
            runs[f"plain|{n}"] = {"query_s": secs, "top": res.documents.tolist(),
                                  "scores": [[round(float(x), 4) for x in r if x > 0] for r in res.scores]}
        return {"index_s": index_s, "n": len(queries), "base": base, "peak": _rss_mb(), "index_mb": float("nan"),
                "runs": runs}

    from rank_bm25 import BM25Okapi

    texts = texts[: min(len(texts), 100_000)]  # "on a small subset": Python lists per passage
    t = time.perf_counter()
    tokenized = bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)
    model = BM25Okapi(tokenized, k1=K1, b=B)
    index_s = time.perf_counter() - t
    subset = bm25s.tokenize(queries[:n_rank], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False)
    secs, _ = _timed(lambda: [np.argsort(-model.get_scores(q))[:topk] for q in subset], 1)
    return {"index_s": index_s, "n": n_rank, "base": base, "peak": _rss_mb(), "index_mb": float("nan"),
            "docs": len(texts), "runs": {"plain|0": {"query_s": secs}}}


def _pyserini_worker(root: Path, queries: list[str], topk: int, threads: int, repeats: int) -> dict:
    """Pyserini (Lucene 9, block-max WAND) in its own venv: index the same passages as a
    JsonCollection with as many indexing threads as cores, then ``batch_search`` with the
    same k1, b and top-k, serially and on every core. Lucene's English analyzer (stemming,
    stopwords) is not zsearch's default tokenizer, so the lists are not compared, only the
    speed of the same work: one BM25 top-k per query over the same passages."""
    import subprocess as sp

    # bench/pyserini.py sits beside this script, on sys.path[0]: it would shadow the package
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    from pyserini.search.lucene import LuceneSearcher

    docs = root / "pyserini-docs"
    docs.mkdir(exist_ok=True)
    with open(root / "corpus.jsonl", encoding="utf-8") as src, open(docs / "docs.jsonl", "w", encoding="utf-8") as dst:
        for r in map(json.loads, src):
            dst.write(json.dumps({"id": r["id"], "contents": f"{r['title']}\n{r['text']}"}) + "\n")
    base = _rss_mb()
    t = time.perf_counter()
    sp.run([sys.executable, "-m", "pyserini.index.lucene", "--collection", "JsonCollection", "--input", str(docs),
            "--index", str(root / "pyserini-index"), "--generator", "DefaultLuceneDocumentGenerator",
            "--threads", str(threads)], check=True, capture_output=True)
    index_s = time.perf_counter() - t
    searcher = LuceneSearcher(str(root / "pyserini-index"))
    searcher.set_bm25(K1, B)
    qids = [str(i) for i in range(len(queries))]
    runs = {}
    for n in (0, threads):
        def run():
            return searcher.batch_search(queries, qids, k=topk, threads=max(n, 1))

        secs, _ = _timed(run, repeats)  # the warm-up lets the JIT compile the hot loops (~10 calls)
        runs[f"plain|{n}"] = {"query_s": secs}
    return {"index_s": index_s, "n": len(queries), "base": base, "peak": _rss_mb(),
            "index_mb": _dir_mb(root / "pyserini-index"), "runs": runs}


def _agree(run: dict, ref: dict, exact: bool) -> float:
    if "top" not in run:
        return float("nan")
    if exact:
        return float(np.mean([a == b for a, b in zip(run["top"], ref["top"])]))
    return float(np.mean([sorted(a) == sorted(b) for a, b in zip(run["scores"], ref["scores"])]))


def _java_env() -> dict:
    """The environment with JAVA_HOME set (Pyserini's pyjnius needs it): the first JDK under
    /usr/lib/jvm, else the one ``java`` on PATH belongs to."""
    env = dict(os.environ)
    if not env.get("JAVA_HOME"):
        jdks = sorted(Path("/usr/lib/jvm").glob("java-*-openjdk-*")) if Path("/usr/lib/jvm").is_dir() else []
        java = shutil.which("java")
        home = next((str(j) for j in jdks if (j / "bin" / "java").exists()), None) or (
            str(Path(java).resolve().parent.parent) if java else None)
        if home:
            env["JAVA_HOME"] = home
    return env


def run_size(args, n_docs: int, console) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="zsearch-bench-", dir=args.tmp) as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        # Everything big happens in subprocesses: Linux carries a parent's peak RSS into a
        # forked child's ru_maxrss, so a fat parent would inflate every worker's number.
        subprocess.run([sys.executable, __file__, "--worker", "data", "--data", str(root), "--docs", str(n_docs),
                        "--queries", str(args.queries), "--corpus", args.corpus], check=True)
        console.print(f"data: {n_docs:,} passages ({args.corpus}), {args.queries:,} queries "
                      f"({time.perf_counter() - t:.0f}s)")
        wanted = args.engines.split(",")
        engines = [(e, sys.executable) for e in ("zsearch", "bm25s") if e in wanted]
        if "bm25s-numba" in wanted and args.numba_python and Path(args.numba_python).exists():
            engines.append(("bm25s-numba", args.numba_python))
        elif "bm25s-numba" in wanted:
            console.print("bm25s-numba: skipped (no --numba-python venv)")
        if "rank-bm25" in wanted and n_docs <= args.rank_bm25_max_docs:
            engines.append(("rank-bm25", sys.executable))
        if "pyserini" in wanted and args.pyserini_python and Path(args.pyserini_python).exists():
            engines.append(("pyserini", args.pyserini_python))
        elif "pyserini" in wanted:
            console.print("pyserini: skipped (no --pyserini-python venv with Java; see bench/pyserini.py)")
        results = {}
        for engine, python in engines:
            console.print(f"running {engine} ...")
            cmd = [python, __file__, "--worker", engine, "--data", str(root), "--topk", str(args.topk),
                   "--rank-bm25-queries", str(args.rank_bm25_queries), "--repeats", str(args.repeats)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=_java_env())
            if proc.returncode:
                console.print(f"{engine}: failed: {proc.stderr.strip().splitlines()[-1:]}")
                continue
            results[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
    ref = results["zsearch"]["runs"]["exhaustive|0"]
    for engine, r in results.items():
        for key, run in r["runs"].items():
            mode, n = key.split("|")
            rows.append({"docs": r.get("docs", n_docs), "engine": engine if mode == "plain" else f"zsearch {mode}",
                         "threads": int(n), "index_s": r["index_s"], "peak": r["peak"], "index_mb": r["index_mb"],
                         "build_anon": r.get("build_anon", float("nan")),
                         "qps": r["n"] / run["query_s"], "n": r["n"],
                         "agree": _agree(run, ref, exact=engine == "zsearch")})
    return rows


def extrapolate(rows: list[dict], console) -> None:
    zs = [r for r in rows if r["engine"] == "zsearch maxscore"]
    sizes = sorted({r["docs"] for r in zs})
    if len(sizes) < 2:
        console.print("extrapolation: needs at least two --docs sizes")
        return
    one = {r["docs"]: r for r in zs if r["threads"] == 0}
    par = {r["docs"]: r for r in zs if r["threads"] > 0}
    x = np.array(sizes, dtype=float)

    def lin(key):
        slope, icpt = np.polyfit(x, [one[d][key] for d in sizes], 1)
        return slope * WIKI18 + icpt

    def power(table):
        e, c = np.polyfit(np.log(x), np.log([table[d]["qps"] for d in sizes]), 1)
        return float(np.exp(c) * WIKI18**e), float(e)

    qps1, e1 = power(one)
    qpsn, _ = power(par)
    console.print(f"extrapolated to {WIKI18:,} passages (zsearch maxscore, fit over {', '.join(f'{d:,}' for d in sizes)}): "
                  f"build {lin('index_s') / 60:.0f} min, build anonymous memory {lin('build_anon') / 1024:.1f} GiB "
                  f"(peak RSS with mapped files {lin('peak') / 1024:.1f} GiB), BM25 index "
                  f"{lin('index_mb') / 1024:.1f} GiB on disk (+ corpus.arrow), QPS {qps1:,.0f} serial / {qpsn:,.0f} "
                  f"all threads (QPS ~ N^{e1:.2f}); a 2560-query step: {2560 / qpsn:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", default="100000", help="comma-separated corpus sizes")
    parser.add_argument("--corpus", choices=("zipf", "questions"), default="zipf")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed calls after the warm-up (at least 5; the median is reported)")
    parser.add_argument("--rank-bm25-queries", type=int, default=20)
    parser.add_argument("--rank-bm25-max-docs", type=int, default=100_000)
    parser.add_argument("--engines", default="zsearch,bm25s,bm25s-numba,pyserini,rank-bm25",
                        help="comma-separated subset of: zsearch, bm25s, bm25s-numba, pyserini, rank-bm25")
    parser.add_argument("--numba-python", default="/work/bench-venv/bin/python",
                        help="python of a separate venv with bm25s + numba (never zsearch's own)")
    parser.add_argument("--pyserini-python", default="/work/pyserini-venv/bin/python",
                        help="python of a separate venv with pyserini (needs Java 11+; bench/pyserini.py says how)")
    parser.add_argument("--tmp", default=None, help="where corpora and indexes go (default: system temp)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "data":
        make_data(args.data, int(args.docs), args.queries, args.corpus)
        return
    if args.worker:
        print(json.dumps(worker(args.worker, args.data, args.topk, args.rank_bm25_queries, args.repeats)))
        return

    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 140)  # a log file gets the whole table
    rows = []
    for n_docs in (int(d) for d in args.docs.split(",")):
        rows += run_size(args, n_docs, console)
    table = Table(title=f"BM25 top-{args.topk}, {args.corpus} corpus, {args.queries:,} queries (rank-bm25: "
                        f"{args.rank_bm25_queries}); {len(os.sched_getaffinity(0))} cores")
    for col in ("passages", "engine", "threads", "build s", "build anon MB", "peak RSS MB", "index MB", "QPS",
                "agree w/ exhaustive"):
        table.add_column(col, justify="left" if col == "engine" else "right")
    for r in rows:
        table.add_row(f"{r['docs']:,}", r["engine"], str(r["threads"]) if r["threads"] else "serial",
                      f"{r['index_s']:.1f}", "" if r["build_anon"] != r["build_anon"] else f"{r['build_anon']:,.0f}",
                      f"{r['peak']:,.0f}",
                      "" if r["index_mb"] != r["index_mb"] else f"{r['index_mb']:,.0f}",
                      f"{r['qps']:,.1f}", "" if r["agree"] != r["agree"] else f"{r['agree']:.1%}")
    console.print(table)
    extrapolate(rows, console)


if __name__ == "__main__":
    main()
