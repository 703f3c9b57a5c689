"""The generation interface every backend implements: token ids in, token ids out."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from zsearch_cli.errors import ZsearchError


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
    """Seed for this call's sampling; row ``i`` samples from ``(seed, i)``. None leaves the
    generator's state as it is."""
    seeds: tuple[int, ...] | None = None
    """One seed per prompt, used as given (it overrides ``seed``): a row's sample then depends
    on its own seed only, never on its place in the batch. The rollout engine sets it from
    each sample's identity, so the sync and async modes sample alike."""

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


def row_seed(params: SamplingParams, row: int) -> int | None:
    """The seed of row ``row`` of a call: ``params.seeds[row]``, else one mixed from
    ``(params.seed, row)``, else None (the backend's own random state)."""
    if params.seeds is not None:
        return int(params.seeds[row])
    if params.seed is None:
        return None
    return mix_seed(params.seed, row)


def mix_seed(*parts: object) -> int:
    """A well-mixed 63-bit seed from any parts, so nearby inputs give unrelated streams."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def check_seeds(params: SamplingParams, prompts: int) -> None:
    """Per-prompt seeds must match the prompts one to one."""
    if params.seeds is not None and len(params.seeds) != prompts:
        raise ZsearchError(f"{len(params.seeds)} seeds for {prompts} prompts: give one seed per prompt")


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


class StreamingBackend(GenerationBackend, Protocol):
    """A backend with continuous batching (vLLM), driven one engine step at a time: requests
    join and leave the running batch between steps, so the async rollout mode hands a
    sample back to generation the moment its search returns, and a sample whose turn ended
    goes to search while the rest keep decoding. Same contract per request as ``generate``
    (ids and logprobs as sampled, ``params.seeds[i]`` for prompt ``i``)."""

    def submit(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
               stop: Sequence[str] = ()) -> list[str]:
        """Queue each prompt; returns one request id per prompt. Nothing runs until ``step``."""
        ...

    def step(self) -> list[tuple[str, GenerationOutput]]:
        """Run one engine step; returns the requests that finished in it."""
        ...

    def abort(self, request_ids: Sequence[str]) -> None:
        """Drop requests that are no longer wanted (a failed rollout), so that they never
        come back from a later step or ``generate`` call."""
        ...


def streams(backend: Any) -> bool:
    """Whether ``backend`` offers :class:`StreamingBackend`'s step-at-a-time interface."""
    return all(callable(getattr(backend, name, None)) for name in ("submit", "step", "abort"))


LOGP_TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 2e-2}
"""How far the generation backend's logprob of a token may be from the training model's
forward for the same weights, in nats, by compute dtype (see :func:`logp_tolerance`).

Why these values: both sides compute ``log_softmax`` of the same logits, so the only
legitimate gap is rounding in different kernels (vLLM's attention and GEMMs vs. torch's,
a KV cache vs. one padded forward). In fp32 that is ~1e-7 relative per operation; measured
on vLLM's CPU build it is ~1e-6 nats on the tiny test model and ~1e-5 on smollm2-135M
(tests/vllm/), so 1e-3 leaves two orders of magnitude for deeper models while still far
below any real disagreement: one optimizer step the engine missed moves logprobs by
1e-2 and more at RL learning rates, and a wrong or partial sync by whole nats. In bf16
(8 bits of mantissa) published vLLM-vs-trainer comparisons report per-token gaps of 1e-2
and above, hence 5e-2; fp16 (11 bits) in between. The bf16/fp16 values are NOT measured
here (no GPU in CI): treat them as a starting point.
"""


def logp_tolerance(dtype: Any) -> float:
    """:data:`LOGP_TOLERANCE` for a dtype name or ``torch.dtype`` (fp32's for anything else)."""
    return LOGP_TOLERANCE.get(str(dtype).removeprefix("torch."), LOGP_TOLERANCE["float32"])
