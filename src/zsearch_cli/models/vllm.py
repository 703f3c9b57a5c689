"""Generation through vLLM's offline engine, with the same contract as :class:`HFBackend`.

Why: on a GPU, vLLM is an order of magnitude faster for rollouts. The contract matches the
HF backend so stages never care which one they hold:

* prompts go in as token ids and token ids come out, the stop string's ids included
  (``include_stop_str_in_output=True``); text is detokenized with special tokens kept so a
  stop string that is a special token (``</search>`` in some vocabularies) still matches;
* logprobs are of the sampled token under the sampling distribution: the engine runs with
  ``logprobs_mode='processed_logprobs'`` (after temperature and top-p; for greedy vLLM
  uses temperature 1, i.e. raw log-softmax, as the HF backend does);
* finish reasons map to ``'stop'`` (a stop string), ``'eos'`` (EOS or a generation-config
  end id) and ``'length'``;
* per-row seeds come from ``(params.seed, row)`` exactly as in the HF backend, so a row's
  sample does not depend on the rest of the batch (the streams differ from HF's, of course).

vLLM is an optional dependency (``zsearch[gpu]``); nothing here imports it until a backend
is built. Written against the vLLM 0.32 offline API but NOT run in CI (no GPU there):
treat ``update_weights`` in particular as GPU-unverified.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import GenerationOutput, SamplingParams
from zsearch_cli.models.hf import _row_seed
from zsearch_cli.models.loading import load_tokenizer, resolve_dtype, resolve_model_path

VLLM_MISSING = "vLLM is not installed: pip install 'zsearch[gpu]' (needs a CUDA torch 2.13.0 first)"


def import_vllm() -> Any:
    """The ``vllm`` module, or the one-line install hint as a :class:`ZsearchError`."""
    try:
        import vllm
    except ImportError:
        raise ZsearchError(VLLM_MISSING) from None
    return vllm


def _finish(completion: Any) -> tuple[str, str | None]:
    """Map vLLM's ``(finish_reason, stop_reason)`` to ours plus the matched stop string."""
    reason, stop_reason = completion.finish_reason, getattr(completion, "stop_reason", None)
    if reason == "length":
        return "length", None
    if reason == "stop":
        if isinstance(stop_reason, str):
            return "stop", stop_reason
        return "eos", None  # None: the tokenizer's EOS; an int: a generation-config end id
    raise ZsearchError(f"vLLM ended a request with finish_reason={reason!r} (aborted?)")


def _sampled_logprobs(completion: Any) -> list[float]:
    """The logprob of each sampled token from vLLM's per-position ``{id: Logprob}`` maps."""
    entries = completion.logprobs
    if entries is None:
        raise ZsearchError("vLLM returned no logprobs although logprobs=0 was requested")
    return [float(entry[tok].logprob) for tok, entry in zip(completion.token_ids, entries)]


class VLLMBackend:
    """A :class:`~zsearch_cli.models.base.GenerationBackend` over ``vllm.LLM``.

    ``llm_kwargs`` go straight to ``vllm.LLM`` (e.g. ``max_model_len``, ``enable_sleep_mode``,
    ``tensor_parallel_size``). The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``
    unless the caller set it) so :meth:`update_weights` can reach the model directly.
    """

    def __init__(
        self,
        name_or_path: str,
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.5,  # leaves room for a trainer on the same GPU
        enable_prefix_caching: bool = True,
        tokenizer: Any = None,
        **llm_kwargs: Any,
    ):
        vllm = import_vllm()
        import torch

        if not torch.cuda.is_available():
            raise ZsearchError("the vLLM backend needs a CUDA GPU; use the hf backend on this machine")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self._vllm = vllm
        self.path = resolve_model_path(name_or_path)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.path)
        torch_dtype = resolve_dtype(dtype, "cuda")
        self.llm = vllm.LLM(
            model=self.path,
            tokenizer=self.path,
            dtype=str(torch_dtype).removeprefix("torch."),
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )

    def _sampling_params(self, params: SamplingParams, stop: Sequence[str], row: int) -> Any:
        return self._vllm.SamplingParams(
            n=1,
            temperature=0.0 if params.greedy else params.temperature,
            top_p=1.0 if params.greedy else params.top_p,
            max_tokens=params.max_new_tokens,
            stop=list(stop) or None,
            include_stop_str_in_output=True,
            skip_special_tokens=False,
            spaces_between_special_tokens=False,
            logprobs=0,
            seed=None if params.seed is None else _row_seed(params.seed, row),
        )

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        stop: Sequence[str] = (),
    ) -> list[GenerationOutput]:
        """Continue each prompt (see the module docstring for the contract)."""
        if params.max_new_tokens < 0:
            raise ZsearchError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ZsearchError(f"prompt {i} is empty: a prompt needs at least one token")
        if params.max_new_tokens == 0:  # vLLM rejects max_tokens=0
            return [GenerationOutput(token_ids=[], logprobs=[], finish_reason="length") for _ in prompts]
        stop = [s for s in stop if s]
        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        sampling = [self._sampling_params(params, stop, row) for row in range(len(prompts))]
        results = self.llm.generate(requests, sampling_params=sampling, use_tqdm=False)
        outputs = []
        for request in results:
            completion = request.outputs[0]
            reason, stop_string = _finish(completion)
            outputs.append(
                GenerationOutput(
                    token_ids=list(completion.token_ids),
                    logprobs=_sampled_logprobs(completion),
                    finish_reason=reason,
                    stop_string=stop_string,
                )
            )
        return outputs

    def _local_model(self) -> Any:
        """The engine's ``nn.Module`` when the engine runs in this process, else None."""
        engine = self.llm.llm_engine
        executors = (
            getattr(engine, "model_executor", None),  # V1 in-process (and V0) engines
            getattr(getattr(getattr(engine, "engine_core", None), "engine_core", None), "model_executor", None),
        )
        for executor in executors:
            worker = getattr(executor, "driver_worker", None)
            for path in (("worker", "model_runner", "model"), ("model_runner", "model")):
                obj = worker
                for attr in path:
                    obj = getattr(obj, attr, None)
                if obj is not None and hasattr(obj, "load_weights"):
                    return obj
        return None

    def update_weights(self, state_dict_iter: Iterable[tuple[str, Any]]) -> None:
        """Copy trained weights into the engine: ``(hf_name, tensor)`` pairs, e.g.
        ``model.state_dict().items()`` of a plain (PEFT-merged) HF model.

        In-process engines load directly through the model's ``load_weights`` (which maps HF
        names to vLLM's fused layers); otherwise the tensors are sent to each worker through
        ``collective_rpc``, which pickles them (slow, but correct). The prefix cache is reset
        because its KV entries were computed with the old weights. GPU-unverified.
        """
        import torch

        model = self._local_model()
        with torch.no_grad():
            if model is not None:
                model.load_weights(iter(state_dict_iter))
            else:
                weights = [(name, tensor.detach().cpu()) for name, tensor in state_dict_iter]
                self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
        self.llm.reset_prefix_cache()


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, Any]]) -> None:
    """Runs inside a vLLM worker process (module-level so it pickles by reference)."""
    worker.model_runner.model.load_weights(iter(weights))
