"""``zsearch serve`` at scale, as real processes on 127.0.0.1 over the bundled demo index:
replicas (one killed mid-run, then both) seen through ``RetrievalClient`` and through a
``--search http://a,http://b`` proxy, and ``--workers 2`` against one worker, byte for byte."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
import requests

from zsearch_cli.commands.serve import ServePlan, build_app
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.client import RetrievalClient
from zsearch_cli.retrieval.index import load_index
from zsearch_cli.retrieval.server import serving

WORDS = ("river capital france rhine danube germany city mountain lake king war empire music "
         "science bridge ocean island language painter novel").split()
DEADLINE = 6.0
"""Each request's whole budget (attempts, fail-over and backoff) in the replica tests."""


def queries(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.sample(WORDS, rng.randint(1, 3))) for _ in range(n)]


@contextmanager
def zsearch_serve(*args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``zsearch serve ARGS --port 0`` as a process; yields its URL once /health answers."""
    proc = subprocess.Popen([sys.executable, "-m", "zsearch_cli.cli", "serve", *args, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # printed once the socket is bound
        found = re.search(r"http://[\d.]+:\d+", line)
        assert found, line + (proc.stderr.read() if proc.poll() is not None else "")
        url = found.group(0)
        deadline = time.monotonic() + 60  # workers import and map the index after the line
        while True:
            try:
                if requests.get(url + "/health", timeout=5).ok:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, f"{url} never answered /health"
            time.sleep(0.1)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def servers(*arg_lists: tuple[str, ...]) -> Iterator[list[tuple[str, subprocess.Popen]]]:
    """Several ``zsearch serve`` processes, started side by side (each startup is seconds)."""
    with ExitStack() as stack, ThreadPoolExecutor(len(arg_lists)) as pool:
        started = [pool.submit(stack.enter_context, zsearch_serve(*args)) for args in arg_lists]
        yield [f.result() for f in started]


def passages(hits: list[list[Any]]) -> list[list[tuple]]:
    return [[(p.id, p.title, p.text, p.score) for p in h] for h in hits]


# ----------------------------------------------------------------------------- replicas


@pytest.fixture(scope="module")
def replicas(demo_index: Path) -> Iterator[list[tuple[str, subprocess.Popen]]]:
    with servers(("--index", str(demo_index)), ("--index", str(demo_index))) as both:
        yield both


def test_one_replica_killed_mid_run_every_request_succeeds_within_its_deadline(replicas, demo_index: Path) -> None:
    (url_a, proc_a), (url_b, proc_b) = replicas
    index = load_index(demo_index)
    client = RetrievalClient([url_a, url_b], timeout=2, retries=2, backoff=0.05, deadline=DEADLINE)
    with serving(build_app(ServePlan(search=f"{url_a},{url_b}"))) as proxy:
        before = requests.get(proxy + "/health", timeout=10).json()
        assert [(r["url"], r["up"]) for r in before["replicas"]] == [(url_a, True), (url_b, True)]
        assert before["index"] == index.name  # the replicas' index, passed on

        done, lock, killed = [], threading.Lock(), threading.Event()

        def worker(seed: int) -> list[tuple[list[str], Any, float]]:
            out = []
            for j in range(25):
                qs = queries(seed * 100 + j, 1 + j % 4)
                start = time.monotonic()
                got = client.retrieve(qs, 3)  # raises (and fails the test) if a request is lost
                out.append((qs, got, time.monotonic() - start))
                with lock:
                    done.append(1)
                    if len(done) == 40 and not killed.is_set():
                        proc_a.kill()  # SIGKILL, mid-run: its in-flight connections are cut
                        killed.set()
            return out

        with ThreadPoolExecutor(8) as pool:
            calls = [c for per in pool.map(worker, range(8)) for c in per]
        assert killed.is_set() and len(calls) == 200
        for qs, got, took in calls:
            assert took < DEADLINE
            assert passages(got) == passages(index.search(qs, 3))
        status = {r["url"]: r for r in client.replicas.status()}
        assert status[url_a]["ok"] > 0 and status[url_b]["ok"] > status[url_a]["ok"]  # spread, then B alone
        # The proxy fails over too, and its /health says which replica is down.
        assert passages(RetrievalClient(proxy).retrieve(["rhine river"], 3)) == passages(index.search(["rhine river"], 3))
        after = requests.get(proxy + "/health", timeout=10).json()
        assert [(r["url"], r["up"]) for r in after["replicas"]] == [(url_a, False), (url_b, True)]
        assert after["status"] == "ok" and "cannot connect" in after["replicas"][0]["last_error"]


def test_both_replicas_down_is_one_error_line_naming_both(replicas) -> None:
    (url_a, proc_a), (url_b, proc_b) = replicas
    for proc in (proc_a, proc_b):
        proc.kill()
        proc.wait()
    client = RetrievalClient(f"{url_a},{url_b}", timeout=1, retries=1, backoff=0.05, deadline=DEADLINE)
    start = time.monotonic()
    with pytest.raises(ZsearchError) as err:
        client.retrieve(["rhine"], 3)
    message = str(err.value)
    assert time.monotonic() - start < DEADLINE
    assert "\n" not in message and url_a in message and url_b in message, message
    assert "all failed, 4 attempt(s) in 2 round(s)" in message and message.count("cannot connect") == 2
    with serving(build_app(ServePlan(search=f"{url_a},{url_b}"))) as proxy:
        resp = requests.post(proxy + "/retrieve", json={"queries": ["rhine"]}, timeout=120)
        health = requests.get(proxy + "/health", timeout=10).json()
    # 502: the upstream failed (a client retries it); the error is one line naming both.
    assert resp.status_code == 502 and url_a in resp.json()["error"] and url_b in resp.json()["error"]
    assert health["status"] == "degraded" and health["replicas_up"] == 0


# ----------------------------------------------------------------------------- workers


def test_two_workers_answer_byte_identically_to_one(demo_index: Path) -> None:
    with servers(("--index", str(demo_index)), ("--index", str(demo_index), "--workers", "2")) as started:
        (one, _), (two, _) = started
        pids = set()
        deadline = time.monotonic() + 60  # the second worker may still be loading the index
        while len(pids) < 2 and time.monotonic() < deadline:
            # a fresh connection each time: the kernel hands it to either worker
            pids.add(requests.get(two + "/health", timeout=10).json()["worker_pid"])
            time.sleep(0.02)
        assert len(pids) == 2, "the second worker never answered"
        bodies = [
            {"queries": queries(1, 2560), "topk": 3, "return_scores": True},  # Search-R1's GRPO batch
            {"queries": queries(2, 16), "topk": 5},
            {"queries": ["rhine", "danube river", "capital of france"], "topk": 1, "return_scores": True},
            {"queries": ["x"], "topk": 0},  # an error answer is the same too
        ]
        for body in bodies:
            want = requests.post(one + "/retrieve", json=body, timeout=120)
            for _ in range(4):  # new connections: both workers get some of them
                got = requests.post(two + "/retrieve", json=body, timeout=120)
                assert (got.status_code, got.content) == (want.status_code, want.content)
