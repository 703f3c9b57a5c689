"""The trainer's side and the engine's side of one model, built by the trainer's own code.

Doctor must measure what ``zsearch train`` would run, so nothing here re-implements a
loader or a sync: the policy comes from :func:`~zsearch_cli.train.policy.load_policy`
(train mode, dropout off, the training dtype), the engine from
:func:`~zsearch_cli.train.policy.generation_backend`, and :meth:`Runtime.sync` is the
trainer's ``sync_generation`` without its guard (the guard is what doctor's checks replace):

* ``--backend vllm``: ``update_weights(merged_weights(policy))`` into the in-process engine;
* ``--backend hf``: the engine holds its own full copy, as under ``--rollout-overlap`` or
  FSDP / ZeRO-3, refreshed by ``sync_generation_copy``. (With one process and no overlap
  the trainer's HF engine *is* the policy object: nothing can go stale there, so doctor
  checks the layout that can.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from zsearch_cli.config.fields import to_flat


@dataclass
class Runtime:
    """The policy the trainer would train, and the generation engine it would sample from."""

    policy: Any
    tokenizer: Any
    engine_backend: Any
    """:class:`~zsearch_cli.models.hf.HFBackend` (over a copy) or ``VLLMBackend``."""
    kind: str
    """hf or vllm."""
    device: str
    dtype: torch.dtype
    accelerator: Any
    copy: Any = None
    """The HF engine's own model (None for vLLM)."""

    def sync(self) -> None:
        """Push the policy's current weights into the engine, as the trainer does after a step."""
        from zsearch_cli.train.policy import merged_weights, sync_generation_copy

        if self.kind == "vllm":
            self.engine_backend.update_weights(merged_weights(self.accelerator.unwrap_model(self.policy)))
        else:
            sync_generation_copy(self.accelerator, self.policy, self.copy)

    def close(self) -> None:
        close = getattr(self.engine_backend, "close", None)
        if callable(close):
            close()


def training_config(opts: Any, **changes: Any) -> Any:
    """The ``TrainConfig`` a ``zsearch train`` with doctor's model, rollout and seed options
    would hold (everything else at its default)."""
    from zsearch_cli.train.config import TrainConfig

    return TrainConfig.from_flat(**{**to_flat(opts.policy), **to_flat(opts.rollout), "seed": opts.seed, **changes})


def engine_kind(backend: str) -> str:
    """``auto`` as the trainer resolves it: vLLM when installed with CUDA, else HF."""
    from zsearch_cli.models.factory import vllm_available

    if backend == "auto":
        return "vllm" if vllm_available() else "hf"
    return backend


def load_runtime(opts: Any) -> Runtime:
    """The policy and the engine for ``opts`` (``opts.policy``: model, backend, device, dtype;
    ``opts.rollout.max_context_tokens``: the vLLM engine's context length)."""
    from accelerate import Accelerator

    from zsearch_cli.models.loading import resolve_device, resolve_dtype
    from zsearch_cli.train.policy import generation_backend, load_policy

    kind = engine_kind(opts.policy.backend)
    device = resolve_device(opts.policy.device)
    # --rollout-overlap 1 makes generation_backend give the HF engine a copy of its own (see
    # the module docstring); the vLLM engine always has its own weights.
    cfg = training_config(opts, backend=kind, rollout_overlap=1 if kind == "hf" else 0)
    accelerator = Accelerator(cpu=device == "cpu")
    policy, tokenizer = load_policy(cfg, device, cfg.policy.dtype)
    engine, copy = generation_backend(cfg, accelerator, policy, tokenizer, None)
    return Runtime(policy, tokenizer, engine, kind, device, resolve_dtype(cfg.policy.dtype, device), accelerator, copy)


@torch.no_grad()
def policy_sequence_logprobs(policy: Any, token_ids: Sequence[int], device: str) -> torch.Tensor:
    """``log p(token_ids[j] | token_ids[:j])`` for j >= 1 under the policy (raw log-softmax,
    fp32), as the trainer's sync probe computes it: [len - 1] on the CPU."""
    ids = torch.tensor([list(token_ids)], device=device)
    was_training = policy.training
    policy.eval()
    try:
        logp = policy(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
    finally:
        policy.train(was_training)
    return logp.gather(-1, ids[0, 1:, None]).squeeze(-1).cpu()


def engine_sequence_logprobs(rt: Runtime, token_ids: Sequence[int]) -> torch.Tensor:
    """The same numbers from the engine's weights: vLLM's prompt logprobs, or a forward of
    the HF engine's own model."""
    if rt.kind == "vllm":
        return torch.tensor(rt.engine_backend.sequence_logprobs(list(token_ids)))
    return policy_sequence_logprobs(rt.engine_backend.model, token_ids, rt.device)
