"""zsearch ``--bm25-preset pyserini`` against Pyserini itself: top-k agreement and QPS.

    .venv/bin/python bench/pyserini.py [--pyserini-python /work/pyserini-venv/bin/python]
                                       [--docs 20000] [--queries 1000] [--topk 10]

Timing: bench/steady.py on both sides (warm-up until two calls agree within 10%, then the
median of 5). Two data sets: the bundled demo corpus with its 180 questions (train + test), and a
seeded synthetic corpus whose passages are runs of whitespace-separated pieces of the
demo corpus's own text (so possessives, numbers, punctuation and inflections occur),
with queries cut from passages. Pyserini indexes the same passages as JsonCollection
documents ``{"id", "contents": '"Title"\\ntext'}`` (its wiki-18 form; the quotes are not
tokens) and searches with its defaults (BM25 k1 0.9, b 0.4, Lucene's English analyzer).

Pyserini needs Java 11+ and its own venv (it pins its own numpy/transformers):

    apt-get install -y openjdk-17-jdk-headless
    python3 -m venv /work/pyserini-venv
    /work/pyserini-venv/bin/pip install torch==2.13.0   # CPU torch first: no CUDA pulled
    /work/pyserini-venv/bin/pip install pyserini==0.22.1

Without it the bench says so and exits 0. Reported per data set: identical top-3 lists
(the goal: >= 99% of queries), identical top-k lists, mean overlap@k, and single-thread
QPS of each engine (search only, index loaded, at steady state; Pyserini's
``batch_search`` with threads=1, zsearch's ``SearchIndex.search`` with n_threads=0).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PYSERINI_SIDE = r'''
import json, sys, time
from pyserini.search.lucene import LuceneSearcher
index, queries_path, topk, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
queries = [json.loads(l) for l in open(queries_path, encoding="utf-8")]
searcher = LuceneSearcher(index)  # defaults: BM25 k1=0.9 b=0.4, Lucene's English analyzer
qids = [str(i) for i in range(len(queries))]
elapsed, hits, _ = steady_median(lambda: searcher.batch_search(queries, qids, k=topk, threads=1))
json.dump({"seconds": elapsed, "hits": [[(h.docid, h.score) for h in hits[q]] for q in qids]},
          open(out, "w"))
'''
PYSERINI_SIDE = (Path(__file__).with_name("steady.py").read_text(encoding="utf-8") + "\n" + PYSERINI_SIDE)
"""The same timing protocol on both sides: steady.py's source runs in Pyserini's venv too."""


def find_java_home() -> str | None:
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    jvm = Path("/usr/lib/jvm")
    for cand in sorted(jvm.glob("java-*-openjdk-*")) if jvm.is_dir() else []:
        if (cand / "bin" / "java").exists():
            return str(cand)
    java = shutil.which("java")
    return str(Path(java).resolve().parent.parent) if java else None


def demo_data() -> tuple[list[dict], list[str]]:
    from zsearch_cli.data.demo import demo_corpus, demo_qa

    rows = [json.loads(line) for line in open(demo_corpus(), encoding="utf-8")]
    questions = [json.loads(line)["question"] for split in ("train", "test")
                 for line in open(demo_qa(split), encoding="utf-8")]
    return rows, questions


def synthetic_data(n_docs: int, n_queries: int, seed: int = 0) -> tuple[list[dict], list[str]]:
    rows, _ = demo_data()
    pieces = np.array([w for r in rows for w in (r["title"] + " " + r["text"]).split()])
    rng = np.random.default_rng(seed)
    # Zipf-like reuse: a few pieces are frequent, most rare, as in real text.
    weights = 1.0 / np.arange(1, len(pieces) + 1) ** 0.8
    weights = weights[rng.permutation(len(pieces))]
    weights /= weights.sum()
    docs = []
    for i in range(n_docs):
        words = rng.choice(pieces, size=int(rng.integers(8, 120)), p=weights)
        docs.append({"id": f"s{i}", "title": str(words[0]).strip(".,;:"), "text": " ".join(words[1:])})
    queries = []
    for _ in range(n_queries):
        doc = docs[int(rng.integers(n_docs))]["text"].split()
        start = int(rng.integers(max(1, len(doc) - 6)))
        queries.append(" ".join(doc[start : start + int(rng.integers(2, 7))]))
    return docs, queries


def run_zsearch(rows: list[dict], queries: list[str], topk: int, work: Path) -> tuple[list[list[str]], float]:
    from zsearch_cli.retrieval.index import build_index, load_index

    corpus = work / "corpus.jsonl"
    with open(corpus, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps({"id": r["id"], "title": r["title"], "text": r["text"]}) + "\n")
    index = load_index(build_index(corpus, work / "zsearch-index", {"bm25_preset": "pyserini"}), n_threads=0)
    from steady import steady_median  # bench/ is sys.path[0]

    elapsed, hits, _ = steady_median(lambda: index.search(queries, topk, "bm25"))
    return [[p.id for p in h] for h in hits], elapsed


def run_pyserini(python: str, rows: list[dict], queries: list[str], topk: int, work: Path,
                 env: dict) -> tuple[list[list[str]], float]:
    docs = work / "pyserini-docs"
    docs.mkdir()
    with open(docs / "docs.jsonl", "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps({"id": r["id"], "contents": f'"{r["title"]}"\n{r["text"]}'}) + "\n")
    index = work / "pyserini-index"
    subprocess.run([python, "-m", "pyserini.index.lucene", "--collection", "JsonCollection", "--input", str(docs),
                    "--index", str(index), "--generator", "DefaultLuceneDocumentGenerator", "--threads", "1",
                    "--storeRaw"], check=True, env=env, capture_output=True)
    qpath = work / "queries.jsonl"
    qpath.write_text("".join(json.dumps(q) + "\n" for q in queries), encoding="utf-8")
    script = work / "pyserini_side.py"
    script.write_text(PYSERINI_SIDE)
    out = work / "pyserini-hits.json"
    proc = subprocess.run([python, str(script), str(index), str(qpath), str(topk), str(out)], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"pyserini search failed: {proc.stderr.strip().splitlines()[-1:]}")
    result = json.loads(out.read_text())
    return [[docid for docid, _ in h] for h in result["hits"]], result["seconds"]


def compare(name: str, rows: list[dict], queries: list[str], topk: int, python: str, env: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="zsearch-pyserini-") as tmp:
        work = Path(tmp)
        ours, t_ours = run_zsearch(rows, queries, topk, work)
        theirs, t_theirs = run_pyserini(python, rows, queries, topk, work, env)
    n = len(queries)
    top3 = sum(a[:3] == b[:3] for a, b in zip(ours, theirs))
    topk_same = sum(a == b for a, b in zip(ours, theirs))
    overlap = np.mean([len(set(a) & set(b)) / len(b) if b else float(not a) for a, b in zip(ours, theirs)])
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a[:3] != b[:3]]
    report = {
        "data": name, "passages": len(rows), "queries": n, "topk": topk,
        "identical_top3": f"{top3}/{n} ({100 * top3 / n:.1f}%)",
        f"identical_top{topk}": f"{topk_same}/{n} ({100 * topk_same / n:.1f}%)",
        f"mean_overlap@{topk}": round(float(overlap), 4),
        "qps_zsearch": round(n / t_ours, 1), "qps_pyserini": round(n / t_theirs, 1),
        "first_differing": [{"query": queries[i], "zsearch": ours[i][:3], "pyserini": theirs[i][:3]}
                            for i in differ[:3]],
    }
    print(json.dumps(report, ensure_ascii=False), flush=True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pyserini-python", default=os.environ.get("PYSERINI_PYTHON", "/work/pyserini-venv/bin/python"))
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--topk", type=int, default=10)
    args = parser.parse_args()
    java_home = find_java_home()
    python = args.pyserini_python
    ok = java_home is not None and Path(python).exists() and subprocess.run(
        [python, "-c", "import pyserini"], capture_output=True).returncode == 0
    if not ok:
        print(f"skipped: needs Java (found: {java_home}) and pyserini importable by {python}; "
              "see this file's docstring for the install", flush=True)
        return 0
    env = {**os.environ, "JAVA_HOME": java_home}
    compare("demo corpus, 180 bundled questions", *demo_data(), args.topk, python, env)
    compare(f"synthetic ({args.docs} passages)", *synthetic_data(args.docs, args.queries), args.topk, python, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
