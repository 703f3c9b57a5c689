"""`zsearch serve` under RL load: QPS, p50/p99 and failures at up to 256 concurrent clients,
with 1 and 2 workers, beside Search-R1's own `retrieval_server.py` on the same BM25 corpus.

Two request shapes, each for ``--seconds`` per (server, clients) cell:

* ``single``: one query per request, topk 3 (slime's ``search_concurrency`` 256, verl's tool);
* ``batch``: Search-R1's GRPO turn, 512 prompts x 5 samples = 2560 queries, topk 3.

Every query is new (a counter makes each one unique; an unknown token costs BM25 nothing),
so no server answers from a cache. The clients are asyncio keep-alive connections in this
process, one per client; a failure is a non-200 answer, a broken connection, a wrong number
of results, or no answer within ``--timeout``. Corpora: the bundled demo corpus (525
passages) and, with ``--big N`` (e.g. 1000000), N synthetic passages cut from its text
(bench/pyserini.py's generator; built once under ``--workdir``). Both sides index the same
passages with Lucene's BM25 settings (zsearch: ``--bm25-preset pyserini``).

Search-R1's server runs unchanged from a checkout (``--search-r1 DIR``, e.g. the ``fetch``ed
github:PeterGriffinJin/Search-R1) with a Python that has pyserini, fastapi, uvicorn,
datasets, faiss and torch (``--search-r1-python``; default /work/pyserini-venv/bin/python)
and Java; its ``uvicorn.run`` is pointed at 127.0.0.1 and a free port (it hard-codes
0.0.0.0:8000). Without those it prints one line saying so and goes on.

    python bench/serve.py --clients 64,256 --seconds 60 --workers 1,2 --big 1000000 \\
        --workdir /tmp/zsearch-bench-serve --search-r1 /path/to/Search-R1 --json serve.json
    python bench/serve.py --clients 16 --seconds 3 --shapes single      # a quick look

Goals: 0 failures at 256 clients; p99 < 2x p50 at 64 clients (single); --workers 2 >= 1.6x
one worker's single-query QPS (on 2 cores).

Each cell also reports the CPU it used, in cores (CPU seconds / wall seconds over the cell):
the server's (its process and every child, from /proc) and the load generator's (this
process). On a 2-core machine the load generator takes part of what a second worker needs,
so the workers' gain is shown per server core too.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from rich.console import Console
from rich.table import Table

console = Console(width=150)
BATCH = 512 * 5
TOPK = 3
HERE = Path(__file__).resolve().parent


def _bench_pyserini() -> Any:
    """bench/pyserini.py (its corpus generators and Java lookup), loaded by path: its module
    name would shadow the real pyserini package."""
    spec = importlib.util.spec_from_file_location("bench_pyserini", HERE / "pyserini.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- corpora


def prepare(name: str, rows: list[dict], queries: list[str], work: Path) -> dict[str, Any]:
    """The corpus as zsearch's input and as Pyserini's JsonCollection, and the zsearch index
    (kept under ``work`` and reused)."""
    from zsearch_cli.retrieval.index import build_index

    work.mkdir(parents=True, exist_ok=True)
    corpus, docs = work / "corpus.jsonl", work / "pyserini-docs" / "docs.jsonl"
    if not (work / "zsearch-index").exists():
        docs.parent.mkdir(exist_ok=True)
        with open(corpus, "w", encoding="utf-8") as a, open(docs, "w", encoding="utf-8") as b:
            for r in rows:
                a.write(json.dumps({"id": r["id"], "title": r["title"], "text": r["text"]}) + "\n")
                b.write(json.dumps({"id": r["id"], "contents": f'"{r["title"]}"\n{r["text"]}'}) + "\n")
        t0 = time.perf_counter()
        build_index(corpus, work / "zsearch-index", {"bm25_preset": "pyserini"})
        console.print(f"{name}: zsearch index built in {time.perf_counter() - t0:.0f}s")
    return {"name": name, "n_docs": len(rows), "queries": queries, "work": work}


def corpora(args: argparse.Namespace, root: Path) -> list[dict[str, Any]]:
    bp = _bench_pyserini()
    rows, questions = bp.demo_data()
    out = [] if args.no_demo else [prepare("demo corpus", rows, questions, root / "demo")]
    if args.big:
        work = root / f"synthetic-{args.big}"
        if (work / "zsearch-index").exists():  # reuse: only the queries are needed
            _, qs = bp.synthetic_data(1, 2000, seed=0)
            big = {"name": f"synthetic {args.big:,}", "n_docs": args.big, "queries": qs, "work": work}
        else:
            t0 = time.perf_counter()
            docs, qs = bp.synthetic_data(args.big, 2000, seed=0)
            console.print(f"synthetic corpus: {args.big:,} passages in {time.perf_counter() - t0:.0f}s")
            big = prepare(f"synthetic {args.big:,}", docs, qs, work)
        out.append(big)
    return out


# ----------------------------------------------------------------------------- servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, limit: float) -> None:
    import requests

    end = time.monotonic() + limit
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode}")
        try:
            # return_scores true: Search-R1's server crashes without it (retrieval_server.py, batch_search)
            r = requests.post(url + "/retrieve", json={"queries": ["warm up"], "topk": 1, "return_scores": True}, timeout=30)
            if r.ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer within {limit:.0f}s")


@contextmanager
def zsearch_server(index: Path, workers: int) -> Iterator[tuple[str, int]]:
    """`zsearch serve` without its result cache (every query is new anyway)."""
    proc = subprocess.Popen([sys.executable, "-m", "zsearch_cli.cli", "serve", "--index", str(index), "--port", "0",
                             "--workers", str(workers), "--cache-size", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        found = re.search(r"http://[\d.]+:\d+", proc.stdout.readline())
        if not found:
            raise RuntimeError(f"zsearch serve did not start (exit status {proc.wait()})")
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        _wait_up(found.group(0), proc, 120)
        yield found.group(0), proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


SEARCH_R1_SHIM = """import runpy, sys, uvicorn
port, run = int(sys.argv.pop(1)), uvicorn.run
def loopback_run(app, **kwargs):  # theirs binds 0.0.0.0:8000; nothing else changes
    run(app, **{**kwargs, "host": "127.0.0.1", "port": port, "log_level": "warning"})
uvicorn.run = loopback_run
sys.argv[0] = sys.argv[1]
runpy.run_path(sys.argv.pop(1), run_name="__main__")
"""


def search_r1_missing(args: argparse.Namespace) -> str | None:
    """Why Search-R1's server cannot run here, or None."""
    if not args.search_r1:
        return "no --search-r1 checkout given"
    script = Path(args.search_r1) / "search_r1" / "search" / "retrieval_server.py"
    if not script.exists():
        return f"{script} not found"
    if not Path(args.search_r1_python).exists():
        return f"{args.search_r1_python} not found"
    if _bench_pyserini().find_java_home() is None:
        return "no Java for pyserini"
    probe = subprocess.run([args.search_r1_python, "-c", "import pyserini, fastapi, uvicorn, datasets, faiss, torch"],
                           capture_output=True, text=True)
    if probe.returncode:
        return f"{args.search_r1_python} cannot import its dependencies ({probe.stderr.strip().splitlines()[-1]})"
    return None


@contextmanager
def search_r1_server(args: argparse.Namespace, corpus: dict[str, Any]) -> Iterator[tuple[str, int]]:
    """Search-R1's retrieval_server.py with its BM25 retriever over a Lucene index of the corpus."""
    env = {**os.environ, "JAVA_HOME": _bench_pyserini().find_java_home()}
    work = corpus["work"]
    lucene = work / "pyserini-index"
    if not lucene.exists():
        subprocess.run([args.search_r1_python, "-m", "pyserini.index.lucene", "--collection", "JsonCollection",
                        "--input", str(work / "pyserini-docs"), "--index", str(lucene), "--generator",
                        "DefaultLuceneDocumentGenerator", "--threads", "2", "--storeRaw"],
                       check=True, env=env, capture_output=True)
    shim = work / "search_r1_shim.py"
    shim.write_text(SEARCH_R1_SHIM)
    port = _free_port()
    script = Path(args.search_r1) / "search_r1" / "search" / "retrieval_server.py"
    proc = subprocess.Popen([args.search_r1_python, str(shim), str(port), str(script), "--index_path", str(lucene),
                             "--corpus_path", str(work / "corpus.jsonl"), "--topk", str(TOPK), "--retriever_name", "bm25"],
                            env=env, stdout=subprocess.DEVNULL, stderr=open(work / "search_r1.log", "w"), text=True)
    try:
        _wait_up(f"http://127.0.0.1:{port}", proc, 300)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


# ----------------------------------------------------------------------------- load


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and every process below it, from
    /proc (nan where there is none). A worker that already exited is not counted."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, cpu seconds)
    for entry in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = entry.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        stats[int(entry.parent.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    if pid not in stats:
        return float("nan")
    tree, grew = {pid}, True
    while grew:
        below = {p for p, (parent, _) in stats.items() if parent in tree} - tree
        tree |= below
        grew = bool(below)
    return sum(stats[p][1] for p in tree)


def _own_cpu_s() -> float:
    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


def run_load(url: str, pid: int, shape: str, clients: int, seconds: float, queries: list[str], timeout: float,
             warmup: float) -> dict[str, Any]:
    """``clients`` connections sending ``shape`` requests for ``warmup`` + ``seconds``;
    latencies and failures are counted for requests sent after the warm-up (the load
    generator is ``zsearch doctor``'s: zsearch_cli/doctor/load.py). ``server_cores`` and
    ``client_cores``: CPU seconds per wall second over the whole cell, warm-up included."""
    from zsearch_cli.doctor.load import run_load as load

    server0, client0, t0 = tree_cpu_s(pid), _own_cpu_s(), time.monotonic()
    row = load(url, clients=clients, queries=queries, per_request=BATCH if shape == "batch" else 1, topk=TOPK,
               seconds=seconds, timeout=timeout, warmup=warmup)
    wall = time.monotonic() - t0
    return {"shape": shape, "clients": clients, **row, "server_cores": (tree_cpu_s(pid) - server0) / wall,
            "client_cores": (_own_cpu_s() - client0) / wall}


# ----------------------------------------------------------------------------- report


def report(rows: list[dict[str, Any]]) -> None:
    table = Table(title=f"/retrieve under load: topk {TOPK}; batch = {BATCH} queries per request; qps = queries/s")
    for col in ("corpus", "server", "shape", "clients", "requests", "qps", "p50 ms", "p99 ms", "p99/p50", "failures",
                "server cores", "client cores"):
        table.add_column(col, justify="left" if col in ("corpus", "server", "shape") else "right")
    for r in rows:
        table.add_row(r["corpus"], r["server"], r["shape"], str(r["clients"]), str(r["requests"]), f"{r['qps']:.0f}",
                      f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['p99_ms'] / r['p50_ms']:.2f}",
                      str(r["failures"]) + (f" {r['failure_kinds']}" if r["failures"] else ""),
                      f"{r['server_cores']:.2f}", f"{r['client_cores']:.2f}")
    console.print(table)


def goals(rows: list[dict[str, Any]]) -> None:
    def verdict(ok: bool) -> str:
        return "[green]met[/]" if ok else "[red]missed[/]"

    ours = [r for r in rows if r["server"].startswith("zsearch")]
    at256 = [r for r in ours if r["clients"] >= 256]
    if at256:
        bad = sum(r["failures"] for r in at256)
        console.print(f"0 failures at 256 clients (zsearch, all cells): {bad} failures, {verdict(bad == 0)}")
    for r in (r for r in ours if r["clients"] == 64 and r["shape"] == "single"):
        ratio = r["p99_ms"] / r["p50_ms"]
        console.print(f"p99 < 2x p50 at 64 clients ({r['corpus']}, {r['server']}): {ratio:.2f}x, {verdict(ratio < 2)}")
    for r2 in (r for r in ours if r["server"] == "zsearch w2"):
        r1 = next((r for r in ours if r["server"] == "zsearch w1" and all(r[k] == r2[k] for k in ("corpus", "shape", "clients"))), None)
        if r1:
            gain = r2["qps"] / r1["qps"]
            per_core = (r2["qps"] / r2["server_cores"]) / (r1["qps"] / r1["server_cores"])
            console.print(f"--workers 2 vs 1 ({r2['corpus']}, {r2['shape']}, {r2['clients']} clients, "
                          f"{os.cpu_count()} cores): {gain:.2f}x, {verdict(gain >= 1.6)}; the servers used "
                          f"{r1['server_cores']:.2f} and {r2['server_cores']:.2f} cores while the load generator used "
                          f"{r2['client_cores']:.2f}; per server core w2 gives {per_core:.2f}x w1's queries")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", default="64,256", help="comma list of concurrent clients")
    ap.add_argument("--seconds", type=float, default=60.0, help="measured seconds per cell")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each cell")
    ap.add_argument("--shapes", default="single,batch", help="single, batch or both")
    ap.add_argument("--workers", default="1,2", help="comma list of zsearch serve --workers")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds before a request counts as failed")
    ap.add_argument("--big", type=int, default=0, help="also a synthetic corpus of this many passages (e.g. 1000000)")
    ap.add_argument("--no-demo", action="store_true", help="skip the bundled demo corpus (with --big: only that one)")
    ap.add_argument("--workdir", type=Path, default=None, help="keep corpora and indexes here (reused on rerun)")
    ap.add_argument("--search-r1", default=None, help="a Search-R1 checkout, to run its retrieval_server.py too")
    ap.add_argument("--search-r1-python", default=os.environ.get("SEARCH_R1_PYTHON", "/work/pyserini-venv/bin/python"))
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args()

    tmp = None if args.workdir else tempfile.TemporaryDirectory(prefix="zsearch-bench-serve-")
    root = args.workdir or Path(tmp.name)
    levels = [int(x) for x in args.clients.split(",")]
    shapes = args.shapes.split(",")
    missing = search_r1_missing(args)
    if missing:
        console.print(f"Search-R1's retrieval_server.py: not run ({missing})")
    rows = []
    for corpus in corpora(args, root):
        servers = [(f"zsearch w{w}", lambda w=w: zsearch_server(corpus["work"] / "zsearch-index", w))
                   for w in map(int, args.workers.split(","))]
        if not missing:
            servers.append(("Search-R1", lambda: search_r1_server(args, corpus)))
        for label, start in servers:
            with start() as (url, pid):
                for shape in shapes:
                    for clients in levels:
                        row = run_load(url, pid, shape, clients, args.seconds, corpus["queries"], args.timeout,
                                       args.warmup)
                        rows.append({"corpus": corpus["name"], "server": label, **row})
                        console.print(f"  {corpus['name']} / {label} / {shape} / {clients} clients: "
                                      f"{row['qps']:.0f} q/s, p50 {row['p50_ms']:.1f} ms, p99 {row['p99_ms']:.1f} ms, "
                                      f"{row['failures']} failures; cores: server {row['server_cores']:.2f}, "
                                      f"load generator {row['client_cores']:.2f}")
    report(rows)
    goals(rows)
    if args.json:
        args.json.write_text(json.dumps({"cores": os.cpu_count(), "seconds": args.seconds, "rows": rows}, indent=1))
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
