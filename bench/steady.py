"""The project's timing protocol for peers and for zsearch alike: warm up until two
consecutive calls agree within 10% (a JVM's JIT needs about 10 calls: Pyserini's first five
1000-query calls of a fresh searcher ran at 97 -> 417 QPS, against 800-1,200 afterwards),
then take the median of at least 5 timed calls. Plain Python, no imports from zsearch, so
that a peer's own venv can run it too (bench/pyserini.py sends this file's source there)."""

import statistics
import time

WARMUP_TOL = 0.10
MAX_WARMUP = 30
MIN_REPEATS = 5


def steady_median(fn, repeats=MIN_REPEATS, tol=WARMUP_TOL, max_warmup=MAX_WARMUP):
    """(median seconds of ``max(repeats, 5)`` calls after the warm-up, the last result, the
    number of warm-up calls). The warm-up ends when two consecutive calls agree within
    ``tol`` of the slower one, or after ``max_warmup`` calls."""
    prev, out, warmup = None, None, 0
    while warmup < max_warmup:
        t = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t
        warmup += 1
        if prev is not None and abs(dt - prev) <= tol * max(dt, prev):
            break
        prev = dt
    times = []
    for _ in range(max(repeats, MIN_REPEATS)):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out, warmup
