"""Generation through an OpenAI-compatible completions server, token ids in and out.

Why: Dr. Zero's proposer reward needs n solver answers per proposed question; on a real
setup the frozen solver sits on its own GPU behind ``vllm serve``, not in the trainer's
process. The contract is the one every backend keeps (:mod:`zsearch_cli.models.base`), so
the rollout engine stays token-in/token-out across HTTP:

* the prompt goes out as **token ids** (``"prompt": [ids]``), never as text the server
  would re-tokenize;
* the sampled ids come back exactly: ``choices[0].token_ids`` (vLLM's ``return_token_ids``)
  or, from older servers, ``logprobs.tokens`` as ``"token_id:N"`` strings
  (``return_tokens_as_token_ids``); a server that gives neither is refused, never decoded;
* logprobs are ``logprobs.token_logprobs`` (``"logprobs": 0``: the sampled token's only).
  vLLM reports raw log-softmax logprobs unless started with
  ``--logprobs-mode processed_logprobs`` (the HF backend's semantics). The frozen solver
  only needs its answers, so either is fine there;
* the stop string stays in the output (``include_stop_str_in_output``), and special tokens
  are kept in the text (``skip_special_tokens: false``) so a stop string that is one still
  matches; ``finish_reason``/``stop_reason`` map to ``'stop'``/``'eos'``/``'length'``;
* each row is one request with its own seed (``params.seeds[row]``, else from
  ``(params.seed, row)``), as in the other backends; at most ``concurrency`` requests are in flight and the server batches them.

The tokenizer is local (the engine renders prompts and tool responses with it) and must be
the server's: :meth:`RemoteBackend.check_tokenizer` compares both on a probe text through
vLLM's ``/tokenize`` when the server has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zsearch_cli.errors import ZsearchError
from zsearch_cli.llm_client import NEUTRAL_SAMPLING, LLMClient
from zsearch_cli.models.base import GenerationOutput, SamplingParams, check_seeds, row_seed
from zsearch_cli.models.hf import _first_stop

TOKEN_ID_PREFIX = "token_id:"
PROBE = "Who wrote <search> the Iliad </search>? <answer> Homer </answer>"
"""Text whose ids must agree between the local and the served tokenizer (tags included)."""


def _token_ids(choice: dict[str, Any]) -> list[int]:
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        return [int(i) for i in ids]
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if isinstance(tokens, list) and all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        return [int(t[len(TOKEN_ID_PREFIX):]) for t in tokens]
    raise ZsearchError("the server returned no sampled token ids (neither choices[].token_ids nor "
                       "'token_id:N' tokens): serve the model with vLLM (>= 0.10) or another server that "
                       "supports return_token_ids / return_tokens_as_token_ids")


class RemoteBackend:
    """A :class:`~zsearch_cli.models.base.GenerationBackend` over ``{url}/completions``.

    ``url`` is the API root (``http://host:port/v1``; a bare ``http://host:port`` gets
    ``/v1``). ``model`` is the served name; by default the server's first listed model.
    ``tokenizer`` must be the served model's tokenizer. ``timeout`` is the total deadline of
    one request (head and body; a server that stalls or trickles fails it), with ``retries``
    bounded retries (:class:`~zsearch_cli.llm_client.LLMClient`).
    """

    def __init__(self, url: str, tokenizer: Any, model: str | None = None, *, concurrency: int = 32,
                 timeout: float = 300.0, retries: int = 3, check_tokenizer: bool = True):
        self.tokenizer = tokenizer
        self.client = LLMClient(url, model, api="completions", label="solver server", timeout=timeout,
                                retries=retries, concurrency=concurrency)
        if check_tokenizer:
            self.check_tokenizer()

    def __repr__(self) -> str:
        return f"RemoteBackend({self.client.url!r})"

    def check_tokenizer(self, probe: str = PROBE) -> bool:
        """Refuse a server whose tokenizer splits ``probe`` differently from ours; True when
        compared, False when the server has no ``/tokenize`` (vLLM has; others may not)."""
        root = self.client.base_url.removesuffix("/v1")
        try:
            answer = self.client.post({"prompt": probe, "add_special_tokens": False}, url=f"{root}/tokenize")
        except ZsearchError as err:
            if "HTTP 404" in str(err) or "HTTP 405" in str(err):
                return False
            raise
        served = answer.get("tokens")
        ours = self.tokenizer.encode(probe, add_special_tokens=False)
        if served != ours:
            raise ZsearchError(f"solver server {self.client.url}: its tokenizer differs from the local one "
                               f"(probe {probe!r}: server {served} vs local {ours}); pass the served model "
                               "as --solver-model so both tokenize alike")
        return True

    def _body(self, prompt: Sequence[int], params: SamplingParams, stop: Sequence[str], row: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            **NEUTRAL_SAMPLING,  # a server would fill what we leave out from the model's generation config
            "prompt": [int(i) for i in prompt],
            "max_tokens": params.max_new_tokens,
            "temperature": 0.0 if params.greedy else params.temperature,
            "top_p": 1.0 if params.greedy else params.top_p,
            "n": 1,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
        }
        if stop:
            body["stop"] = list(stop)
        seed = row_seed(params, row)
        if seed is not None:
            body["seed"] = seed
        return body

    def _output(self, answer: dict[str, Any], stop: Sequence[str]) -> GenerationOutput:
        try:
            choice = answer["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise ZsearchError(f"solver server {self.client.url}: no choices in {str(answer)[:200]!r}") from None
        ids = _token_ids(choice)
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs")
        if not isinstance(logprobs, list) or len(logprobs) != len(ids):
            raise ZsearchError(f"solver server {self.client.url}: {len(ids)} token ids but logprobs "
                               f"{type(logprobs).__name__} of length {len(logprobs or [])}")
        reason, stop_reason = choice.get("finish_reason"), choice.get("stop_reason")
        if reason == "length":
            return GenerationOutput(ids, [float(x) for x in logprobs], "length")
        if reason != "stop":
            raise ZsearchError(f"solver server {self.client.url}: finish_reason={reason!r}")
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        matched = stop_reason if isinstance(stop_reason, str) else _first_stop(text, stop)
        if matched is None:
            return GenerationOutput(ids, [float(x) for x in logprobs], "eos")
        if matched not in text:
            raise ZsearchError(f"solver server {self.client.url}: stopped at {matched!r} but left it out of the "
                               "output; the server must honour include_stop_str_in_output")
        return GenerationOutput(ids, [float(x) for x in logprobs], "stop", stop_string=matched)

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 stop: Sequence[str] = ()) -> list[GenerationOutput]:
        """Continue each prompt, one request per row (see the module docstring)."""
        check_seeds(params, len(prompts))
        if params.max_new_tokens == 0:
            return [GenerationOutput([], [], "length") for _ in prompts]
        bodies = [self._body(p, params, stop, row) for row, p in enumerate(prompts)]
        answers = self.client.map(self.client.post, bodies)
        return [self._output(a, stop) for a in answers]
