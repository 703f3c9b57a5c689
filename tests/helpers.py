"""Small real stand-ins shared by tests: a scripted policy and an in-memory search backend.

The scripted backend plays fixed turn texts, tokenized by a real tokenizer, so engine
paths that need a policy that already follows the format are deterministic; the tiny
random model covers real sampling elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from zsearch_cli.models.base import GenerationOutput, SamplingParams
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.search.base import SearchRequest, SearchResult


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
            stopped = any(turn.endswith(s) for s in stop)
            outs.append(GenerationOutput(ids, [-0.01 * (i + 1) for i in range(len(ids))],
                                         "stop" if stopped else "length"))
        return outs


@dataclass
class RecordingSearch:
    """A real in-memory search backend that records what it was asked."""

    docs: dict[str, list[Passage]] = field(default_factory=dict)
    requests: list[list[SearchRequest]] = field(default_factory=list)
    name: str = "recording"

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        self.requests.append(list(requests))
        return [SearchResult(self.docs.get(r.query, [Passage("d0", "Nothing", "no result")])[:topk]) for r in requests]

    def set_progress(self, step: int, total_steps: int) -> None:
        pass
