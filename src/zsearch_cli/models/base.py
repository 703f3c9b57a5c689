"""The generation interface every backend implements: token ids in, token ids out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn."""

    max_new_tokens: int = 500
    """Tokens generated per call at most (Search-R1: 500 per turn)."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass; 1.0 disables it."""
    seed: int | None = None
    """Seed for this call's sampling; None leaves the generator's state as it is."""

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class GenerationOutput:
    """One sample: the ids the backend sampled, their logprobs under the sampler, and why it stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """``'stop'`` (a stop string), ``'eos'``, or ``'length'``."""
    stop_string: str | None = None
    """Which stop string ended the sample, when finish_reason is 'stop'."""
    extra: dict[str, Any] = field(default_factory=dict)


class GenerationBackend(Protocol):
    tokenizer: Any
    """A HF tokenizer (``encode``/``decode``, ``eos_token_id``, ``apply_chat_template``)."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        stop: Sequence[str] = (),
    ) -> list[GenerationOutput]:
        """Continue each prompt; the stop string's own ids stay in ``token_ids``."""
        ...
