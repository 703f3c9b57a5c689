"""Small real stand-ins shared by tests: a scripted policy and an in-memory search backend.

The scripted backend plays fixed turn texts, tokenized by a real tokenizer, so engine
paths that need a policy that already follows the format are deterministic; the tiny
random model covers real sampling elsewhere.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from zsearch_cli.models.base import GenerationOutput, SamplingParams
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.rollout.engine import QARow
from zsearch_cli.rollout.trajectory import Trajectory
from zsearch_cli.search.base import SearchBackend, SearchRequest, SearchResult

TORCH_THREADS = int(os.environ.get("ZSEARCH_TEST_THREADS") or (1 if os.environ.get("PYTEST_XDIST_WORKER") else 2))
"""Threads for torch in a test and in the processes it starts (OMP_NUM_THREADS, tests/conftest.py).
The CI box has 2 cores, and `make test` keeps both busy (two pytest-xdist workers, and the vLLM
suite beside them with ZSEARCH_TEST_THREADS=1): a second thread then only spins against the
other processes (measured: tests/test_learning.py took 178 CPU-seconds with 2 threads a worker,
59 with 1 and its two warm-ups made one). A plain ``pytest`` run uses both cores in one process."""


class ScriptedBackend:
    """Plays fixed turn texts per question (found in the prompt), with known logprobs.

    This is the deterministic stand-in for a policy that already follows the format; the
    tiny random model exercises the same paths with real sampling in the first test."""

    def __init__(self, tokenizer: Any, scripts: dict[str, list[str]]):
        self.tokenizer = tokenizer
        self.scripts = {q: list(turns) for q, turns in scripts.items()}
        self.calls: list[list[list[int]]] = []

    def generate(self, prompts, params: SamplingParams, stop: Sequence[str] = ()):
        self.calls.append([list(p) for p in prompts])
        outs = []
        for p in prompts:
            text = self.tokenizer.decode(p)
            question = next(q for q in self.scripts if q in text)
            turn = self.scripts[question].pop(0)
            ids = self.tokenizer.encode(turn, add_special_tokens=False)[: params.max_new_tokens]
            stopped = next((s for s in stop if turn.endswith(s)), None)
            outs.append(GenerationOutput(ids, [-0.01 * (i + 1) for i in range(len(ids))],
                                         "stop" if stopped else "length", stop_string=stopped))
        return outs


PROPOSER_TURNS = (
    '<think> Search the river. </think>\n<tool_call> {"name": "search", "arguments": {"query_list": ["Danube"]}} '
    "</tool_call>",
    "<think> Found it. </think>\n<question> Which sea does the river of Vienna reach? </question>\n"
    "<answer> Black Sea </answer>",
)
"""A Dr. Zero proposer's two turns: one valid search, then a question whose answer it does not contain."""


class PlayedProposer:
    """A backend that plays PROPOSER_TURNS: the search turn, then (after a tool response) the
    question turn. A random tiny proposer never passes the format gate; this one always does."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def generate(self, prompts, params, stop=()):
        outs = []
        for p in prompts:
            after_search = self.tokenizer.decode(p).rstrip().endswith("</tool_response>")
            ids = self.tokenizer.encode(PROPOSER_TURNS[int(after_search)], add_special_tokens=False)
            outs.append(GenerationOutput(ids, [0.0] * len(ids), "stop"))
        return outs


@dataclass
class RecordingSearch(SearchBackend):
    """A real in-memory search backend that records what it was asked."""

    docs: dict[str, list[Passage]] = field(default_factory=dict)
    requests: list[list[SearchRequest]] = field(default_factory=list)
    name: str = "recording"

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        self.requests.append(list(requests))
        return [SearchResult(self.docs.get(r.query, [Passage("d0", "Nothing", "no result")])[:topk]) for r in requests]


def vllm_style_app(backend: Any, *, ids_as: str = "token_ids", tokenize: bool = True, model_name: str = "solver-1") -> Any:
    """A real OpenAI-compatible completions server over a real (tiny) HF backend, answering
    the way ``vllm serve`` does: token-id prompts, ``stop_reason``, the stop string kept,
    and the sampled ids as ``choices[].token_ids`` (``ids_as='token_ids'``), as
    ``'token_id:N'`` strings (``'token_strings'``), or not at all (``'none'``: a plain
    OpenAI-style server). ``tokenize`` adds vLLM's ``/tokenize``. Requests are recorded in
    ``app.state.seen``. One lock around the model: the HF backend is not thread-safe."""
    import threading

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI()
    app.state.seen = []
    lock = threading.Lock()
    tok = backend.tokenizer

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model_name}]}

    if tokenize:
        @app.post("/tokenize")
        def tokenize_(body: dict) -> dict:
            return {"tokens": tok.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))}

    @app.post("/v1/completions")
    def completions(body: dict):
        app.state.seen.append(body)
        if body["model"] != model_name:
            return JSONResponse({"error": "unknown model"}, status_code=404)
        params = SamplingParams(max_new_tokens=body["max_tokens"], temperature=body["temperature"],
                                top_p=body.get("top_p", 1.0), seed=body.get("seed"))
        with lock:
            out = backend.generate([body["prompt"]], params, stop=body.get("stop") or ())[0]
        choice: dict[str, Any] = {"index": 0, "text": tok.decode(out.token_ids),
                                  "finish_reason": "length" if out.finish_reason == "length" else "stop",
                                  "stop_reason": out.stop_string,
                                  "logprobs": {"token_logprobs": out.logprobs}}
        if ids_as == "token_ids":
            choice["token_ids"] = out.token_ids
        elif ids_as == "token_strings":
            choice["logprobs"]["tokens"] = [f"token_id:{i}" for i in out.token_ids]
        return {"id": "cmpl-1", "object": "text_completion", "model": model_name, "choices": [choice]}

    return app


def make_trajectory(tid: str = "r#0", **fields: Any) -> Trajectory:
    """A hand-made :class:`Trajectory` (``tid`` = "row#sample"): token fields from
    ``response_ids``/``loss_mask`` when given, every other field a plain default."""
    row_id, sample = tid.split("#")
    response = list(fields.pop("response_ids", []))
    prompt = list(fields.pop("prompt_ids", [1]))
    mask = list(fields.pop("loss_mask", [1] * len(response)))
    turns = fields.pop("turns", [])
    values: dict[str, Any] = dict(
        id=tid, row_id=row_id, sample_index=int(sample), group_id=f"0:{row_id}", question=f"Question {row_id}?",
        golden_answers=[], prompt_ids=prompt, response_ids=response, loss_mask=mask,
        logprobs=[0.0] * len(response), policy_version=[0 if m else -1 for m in mask], turns=turns, response_text="", prediction=None, finish_reason="answer",
        num_turns=len(turns), num_searches=0, num_invalid=0, prompt_tokens=len(prompt),
        response_tokens=len(response), policy_tokens=sum(mask))
    values.update(fields)
    return Trajectory(**values)


class SearchingTiny:
    """The tiny random model, made to act: after its real sampled ids, a turn gets an
    ``<answer>``, a ``<search>`` block whose query comes from those ids, or nothing (an invalid
    action), by the sum of the ids modulo 5. The decision depends only on what was sampled, so the same
    samples give the same trajectory; ``max_batch_size`` is small so async batches vary.
    ``batched=False`` generates each prompt alone (a batch of one, whatever the engine sends)."""

    max_batch_size = 3

    def __init__(self, inner: Any, batched: bool = True):
        self.inner, self.tokenizer, self.batched, self.calls = inner, inner.tokenizer, batched, []

    def generate(self, prompts, params, stop=()):
        self.calls.append(len(prompts))
        if self.batched:
            outs = self.inner.generate(prompts, params, stop)
        else:
            outs = [self.inner.generate([p], replace(params, seeds=(seed,)), stop)[0]
                    for p, seed in zip(prompts, params.seeds)]
        return self.act(outs)

    def act(self, outs: list[GenerationOutput]) -> list[GenerationOutput]:
        """Append the action the sampled ids call for (in place)."""
        for out in outs:
            key = sum(out.token_ids)
            if key % 5 < 4:
                action = " <answer> x </answer>" if key % 5 == 0 else f" <search> topic {key % 7} </search>"
                tail = self.tokenizer.encode(action, add_special_tokens=False)
                out.token_ids, out.logprobs = list(out.token_ids) + tail, list(out.logprobs) + [-0.5] * len(tail)
                out.finish_reason, out.stop_string = "stop", action.split()[-1]
        return outs


class RandomLatencySearch(SearchBackend):
    """Answers after a random per-call latency (a seeded RNG's choice of ``latencies``), on
    real threads, so calls finish in another order than they were made. Passages depend on
    the query only."""

    thread_safe = True
    name = "random-latency"

    def __init__(self, seed: int = 0, latencies: tuple[float, ...] = (0.0, 0.2), overtake: bool = False):
        self.rng, self.latencies, self.lock = random.Random(seed), latencies, threading.Lock()
        # overtake: the first call also waits (up to 10 s) until a later call has finished, so
        # answers come back out of order however slow the machine is.
        self.overtake, self.overtaken = overtake, threading.Event()
        self.started: list[str] = []
        self.finished: list[str] = []
        self.in_flight = self.peak = 0

    @staticmethod
    def _who(requests: Sequence[SearchRequest]) -> list[tuple[str, int]]:
        return [(r.row_id, r.sample_index) for r in requests]

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        with self.lock:
            first = not self.started
            latency = self.rng.choice(self.latencies)
            self.started.append(self._who(requests))
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        time.sleep(latency)
        if first and self.overtake:
            self.overtaken.wait(timeout=10)
        with self.lock:
            self.in_flight -= 1
            self.finished.append(self._who(requests))
            if not first:
                self.overtaken.set()
        return [SearchResult([Passage(f"{r.query}-{k}", r.query, f"text about {r.query} number {k}")
                              for k in range(topk)]) for r in requests]


ROWS = [QARow(f"r{i}", q, ["x"]) for i, q in enumerate(
    ["Which river flows through Vienna?", "Who wrote Hamlet?", "What is the capital of Peru?",
     "When did the Berlin wall fall?", "Which planet is largest?"])]
