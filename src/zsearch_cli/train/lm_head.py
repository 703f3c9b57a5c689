"""A chunked LM head: response logprobs (and entropies) from the final hidden states, C rows
at a time, without ever holding the ``[M, V]`` logits (Liger's fused-linear-cross-entropy
idea, applied to the sampler's tempered, top-p distribution; docs/methods.md §8).

Why: the trainer needs, per policy token, log π(y) of the tempered (top-p renormalised)
distribution and, as a statistic, its entropy. The direct way materialises the logits of every
policy token, ``[M, V]`` in the model dtype, their fp32 copy, the log-softmax autograd keeps
for backward and its gradient: with Qwen2.5's 151,936-token vocabulary each fp32 ``[M, V]``
tensor is 2.5 GB per 4,096 tokens. Here the logits of C rows are computed, used and dropped;
backward recomputes them from the saved ``h``, ``W``, targets and per-row
log-normaliser. Peak extra memory: O(C × V) (a few ``[C, V]`` temporaries) plus, when the
head weight is trained, its gradient accumulated in fp32 (``[V, d]``).

The pieces:

- :func:`output_head`: the model's output projection, ``W [V, d]`` (+ bias) and any LoRA on
  it, through peft, DDP / accelerate and ``torch.compile`` wrappers, tied or untied; one-line
  :class:`~zsearch_cli.errors.ZsearchError` for heads it cannot reproduce.
- :func:`final_hidden`: the head's input (the final hidden states) from one forward of the
  model as given, the head itself run on zero rows (see there why this way).
- :func:`chunked_logprobs`: ``(logp [M], entropy [M] | None)`` from hidden states at the
  policy positions, what ``policy_forward`` computes from logits.

Numerics follow ``train/logprobs.py``: each chunk's logits come out of the head in the model
dtype (as ``lm_head`` gives them), are upcast (fp32; fp64 for an fp64 model, which
``policy_forward`` would round to fp32), divided by the temperature, filtered by
:func:`~zsearch_cli.models.nucleus.nucleus_mask` with the sampled token forced in when
``top_p < 1``, and normalised; the entropy is the full tempered distribution's, over the
whole vocabulary, whatever ``top_p``, with ``policy_forward``'s formula.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.nucleus import nucleus_mask

CHUNK_ELEMENTS = 1 << 26
"""Default chunk: rows such that one ``[C, V]`` fp32 temporary is ~256 MiB (C = 441 rows of a
151,936-token vocabulary, 1,365 of smollm2's 49,152). A chunk holds ~4 such temporaries."""

POST_HEAD_ATTRIBUTES = ("final_logit_softcapping", "logit_scale", "logits_scaling", "final_logits_bias")
"""Config (or model) attributes of architectures whose logits are not ``lm_head(h)``: Gemma 2/3's
tanh soft-capping, Cohere's logit scale, Granite's logit division, BART-style logit biases.
Llama and Qwen2 set none of them (their forward is ``self.lm_head(hidden[:, keep])``)."""

_WRAPPER_ATTRIBUTES = ("module", "_orig_mod")
"""DDP / accelerate wrappers hold the model in ``.module``, ``torch.compile`` in ``._orig_mod``."""


def default_chunk(vocab: int) -> int:
    """Rows per chunk for a ``vocab``-token head: :data:`CHUNK_ELEMENTS` / V, at least 1."""
    return max(1, CHUNK_ELEMENTS // max(1, vocab))


# ----------------------------------------------------------------------------- the head


@dataclass(frozen=True)
class LoraBranch:
    """One active LoRA adapter on the head: adds ``scaling * B(A(dropout(x)))`` to the logits."""

    lora_A: nn.Module  # nn.Linear d -> r
    lora_B: nn.Module  # nn.Linear r -> V (its bias, if any, is scaled too, as peft does)
    dropout: nn.Module
    scaling: float


@dataclass(frozen=True)
class OutputHead:
    """The output projection as the model applies it: ``logits = h W^T + b + Σ LoRA``."""

    module: nn.Module
    """What the CausalLM calls (``lm_head``, or peft's wrapper of it): :func:`final_hidden` hooks it."""
    weight: Tensor  # [V, d]
    bias: Tensor | None  # [V]
    loras: tuple[LoraBranch, ...] = ()

    @property
    def vocab(self) -> int:
        return self.weight.shape[0]

    def terms(self, hidden: Tensor) -> tuple[list[Tensor | None], list[float]]:
        """The head as a sum of linear terms ``Σ_k s_k · F.linear(X_k, W_k, b_k)``: the base
        ``(h, W, b)`` with s = 1, and per LoRA ``(A(dropout(h)), B, B's bias)`` with s = its
        scaling. The LoRA inputs ``A(dropout(h))`` (``[M, r]``) are ordinary autograd tensors, so
        the gradient reaches A and h through them. Returns (flat [X0, W0, b0, X1, ...], scales)."""
        flat: list[Tensor | None] = [hidden, self.weight, self.bias]
        scales = [1.0]
        for lora in self.loras:
            x = hidden.to(lora.lora_A.weight.dtype)  # peft's _cast_input_dtype
            flat += [lora.lora_A(lora.dropout(x)), lora.lora_B.weight, lora.lora_B.bias]
            scales.append(float(lora.scaling))
        return flat, scales


def _unwrap(model: Any) -> Any:
    """The model inside DDP / accelerate / ``torch.compile`` wrappers (peft models answer
    ``get_output_embeddings`` themselves); FSDP is refused: its head weight is a shard outside
    the forward, and the chunked head runs after it."""
    m = model
    for _ in range(16):
        name = type(m).__name__
        if name == "FullyShardedDataParallel" or name.startswith("FSDP"):
            raise ZsearchError(f"chunked LM head: {name} shards the head weight outside the forward; "
                               "use the whole-logits path under FSDP")
        if hasattr(m, "get_output_embeddings"):
            return m
        inner = next((getattr(m, a) for a in _WRAPPER_ATTRIBUTES if isinstance(getattr(m, a, None), nn.Module)), None)
        if inner is None:
            break
        m = inner
    raise ZsearchError(f"chunked LM head: {type(model).__name__} has no get_output_embeddings()")


def _refuse_post_head(model: Any) -> None:
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    neutral = {"final_logit_softcapping": (None, 0, 0.0), "logit_scale": (None, 1, 1.0),
               "logits_scaling": (None, 1, 1.0), "final_logits_bias": (None,)}
    for attr in POST_HEAD_ATTRIBUTES:
        for source in (text, config):
            value = getattr(source, attr, None) if source is not None else None
            if not isinstance(value, (int, float, type(None))) or value not in neutral[attr]:
                raise ZsearchError(f"chunked LM head: the model sets {attr}={value!r}, a transform after the "
                                   "head the chunked head does not apply; use the whole-logits path")
    for attr in POST_HEAD_ATTRIBUTES:  # a module attribute, e.g. BART's final_logits_bias buffer
        if isinstance(getattr(model, attr, None), Tensor):
            raise ZsearchError(f"chunked LM head: the model has {attr}, applied after the head; use the whole-logits path")


def _check_weight(weight: Any, where: str) -> Tensor:
    if not isinstance(weight, Tensor) or weight.dim() != 2 or weight.numel() == 0 or hasattr(weight, "ds_id"):
        raise ZsearchError(f"chunked LM head: {where} is not a whole [V, d] matrix here "
                           f"({type(weight).__name__}; FSDP / ZeRO-3 shards it); use the whole-logits path")
    if type(weight).__name__ == "DTensor" or "DTensor" in type(getattr(weight, "data", None)).__name__:
        raise ZsearchError(f"chunked LM head: {where} is a DTensor (FSDP2 / tensor parallel); use the whole-logits path")
    return weight


def _plain_linear(module: Any, where: str) -> nn.Linear:
    if type(module) is not nn.Linear:
        raise ZsearchError(f"chunked LM head: {where} is a {type(module).__name__}, not a torch.nn.Linear "
                           "(quantized or tensor-parallel heads are not supported); use the whole-logits path")
    return module


def output_head(model: Any) -> OutputHead:
    """The output projection of ``model`` as it is applied now (active adapter, adapters
    disabled or merged): a plain HF CausalLM, a peft ``PeftModel`` (LoRA on the head through
    ``target_modules``, or the head in ``modules_to_save``), inside DDP / accelerate /
    ``torch.compile`` wrappers; tied embeddings give the embedding matrix itself (the gradient
    reaches it from both uses). Found by ``get_output_embeddings()``, so the head's attribute
    name does not matter. Raises :class:`ZsearchError` (one line) for heads whose logits are not
    ``h W^T + b`` (+ LoRA): soft-capping or a logit scale after the head
    (:data:`POST_HEAD_ATTRIBUTES`), quantized or sharded weights, LoRA variants (DoRA, ...)."""
    inner = _unwrap(model)
    _refuse_post_head(inner)
    module = inner.get_output_embeddings()
    if module is None:
        raise ZsearchError(f"chunked LM head: {type(inner).__name__} has no output embeddings")
    loras: list[LoraBranch] = []
    linear: Any = module
    kind = type(module).__name__
    if kind == "ModulesToSaveWrapper":  # peft modules_to_save=["lm_head"]: a trained copy per adapter
        active = list(module.active_adapters)
        if module.disable_adapters or not active or any(a not in module.modules_to_save for a in active):
            linear = module.original_module
        else:
            linear = module.modules_to_save[active[0]]
        linear = _plain_linear(linear, "the output head (modules_to_save)")
    elif hasattr(module, "lora_A") and hasattr(module, "base_layer"):  # peft LoRA on the head
        base = _plain_linear(module.get_base_layer(), "the LoRA head's base layer")
        if module.disable_adapters:
            if module.merged:
                raise ZsearchError("chunked LM head: the head's LoRA is merged while adapters are disabled; unmerge it first")
        elif not module.merged:
            for name in module.active_adapters:
                if name not in module.lora_A:
                    continue
                if name in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(name, False):
                    raise ZsearchError(f"chunked LM head: adapter {name!r} on the head is a LoRA variant (DoRA, ...); "
                                       "only plain LoRA is supported")
                loras.append(LoraBranch(module.lora_A[name], module.lora_B[name], module.lora_dropout[name],
                                        float(module.scaling[name])))
        linear = base
    else:
        linear = _plain_linear(module, "the output head")
    weight = _check_weight(linear.weight, "the head weight")
    for lora in loras:
        _plain_linear(lora.lora_A, "a head LoRA's A")
        _plain_linear(lora.lora_B, "a head LoRA's B")
    return OutputHead(module=module, weight=weight, bias=linear.bias, loras=tuple(loras))


# ------------------------------------------------------------------- the final hidden states


@contextlib.contextmanager
def capture_head_input(model: Any) -> Iterator[list[Tensor]]:
    """While active, every call of the model's output head stores its input in the yielded list
    and runs on zero rows of it instead (``[..., 0, d]`` in, ``[..., 0, V]`` out): the forward
    returns empty logits and costs no head matmul."""
    head = output_head(model)
    captured: list[Tensor] = []

    def pre_hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            x, rest = args[0], args[1:]
            captured.append(x)
            return (x.narrow(-2, 0, 0), *rest), kwargs
        key = next(iter(kwargs))
        captured.append(kwargs[key])
        return args, {**kwargs, key: kwargs[key].narrow(-2, 0, 0)}

    handle = head.module.register_forward_pre_hook(pre_hook, with_kwargs=True)
    try:
        yield captured
    finally:
        handle.remove()


def final_hidden(model: Any, input_ids: Tensor, attention_mask: Tensor, logits_to_keep: int = 0, **kwargs: Any) -> Tensor:
    """The output head's input, ``[B, K, d]`` (K = ``logits_to_keep``, or L when 0), from one
    forward of ``model`` as given (the same call ``response_logits`` makes), with the head run
    on zero rows.

    Why this way, rather than the alternatives:

    - ``model.get_decoder()(...)`` / ``model.model(...)`` skips the wrappers' forwards: DDP's
      (its reducer's per-iteration bookkeeping), accelerate's (autocast), peft's; and it is
      the input of the head only for models that apply nothing between the decoder and it.
    - ``output_hidden_states=True`` still runs the head on every kept position (the
      ``[B, K, V]`` logits this module exists to avoid), and whether its last entry is the
      normed state depends on the transformers version (``tie_last_hidden_states``).

    The forward pre-hook on the head module sees exactly what the head would multiply (for
    Llama and Qwen2, ``norm(h)[:, -K:]``), through every wrapper, and the head's own forward
    still runs (on zero rows), so DDP sees its parameters used in the graph."""
    with capture_head_input(model) as captured:
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=logits_to_keep,
              **kwargs)
    if len(captured) != 1:
        raise ZsearchError(f"chunked LM head: the model called its head {len(captured)} times in one forward; "
                           "use the whole-logits path")
    return captured[0]


# ------------------------------------------------------------------ the chunked computation


def _chunk_logits(flat: tuple[Tensor | None, ...], scales: tuple[float, ...], start: int, end: int,
                  temperature: float, cdtype: torch.dtype) -> Tensor:
    """Rows [start, end) of the tempered logits, ``[C, V]`` in ``cdtype``: the head in the model
    dtype (peft's order: base, plus each LoRA term times its scaling, cast back to the base's
    dtype), then upcast, then divided by the temperature, as ``policy_forward``."""
    z = F.linear(flat[0][start:end], flat[1], flat[2])  # type: ignore[index]
    if len(scales) > 1:
        out_dtype = z.dtype
        for k in range(1, len(scales)):
            x, w, b = flat[3 * k: 3 * k + 3]
            z = z + F.linear(x[start:end], w, b) * scales[k]  # type: ignore[index]
        z = z.to(out_dtype)
    z = z.to(cdtype)
    if temperature != 1.0:
        z = z / temperature
    return z


def _nucleus_(zt: Tensor, targets: Tensor, top_p: float) -> Tensor:
    """``zt`` with every token outside the nucleus set to −inf, in place; the target always in."""
    keep = nucleus_mask(zt, top_p)
    keep.scatter_(-1, targets[:, None], True)
    return zt.masked_fill_(~keep, float("-inf"))


class ChunkedHeadLogprob(torch.autograd.Function):
    """``(logp [M], entropy [M])`` of the tempered (top-p) distribution of a head given as
    linear terms (:meth:`OutputHead.terms`), C rows at a time.

    Saved for backward: the terms' inputs and weights (references, no copies), the targets and
    the per-row log-normaliser ``lse`` (over the nucleus when top_p < 1). Backward recomputes
    each chunk's logits (and nucleus), and with p = softmax over the nucleus,
    ``∂logp/∂z = (onehot(y) − p) / T``; then ``grad_X_k = s_k · grad_z W_k``,
    ``grad_W_k += s_k · grad_zᵀ X_k`` (fp32 accumulator), ``grad_b_k += s_k · Σ_rows grad_z``.
    The entropy is not differentiated (an empty tensor when not asked for)."""

    @staticmethod
    def forward(ctx: Any, targets: Tensor, temperature: float, top_p: float, chunk: int, want_entropy: bool,
                scales: tuple[float, ...], *flat: Tensor | None) -> tuple[Tensor, Tensor]:
        weight = flat[1]
        assert weight is not None
        cdtype = torch.promote_types(weight.dtype, torch.float32)
        m = targets.shape[0]
        device = weight.device
        logp = torch.empty(m, dtype=cdtype, device=device)
        lse = torch.empty(m, dtype=cdtype, device=device)
        ent = torch.empty(m if want_entropy else 0, dtype=cdtype, device=device)
        for start in range(0, m, chunk):
            end = min(start + chunk, m)
            zt = _chunk_logits(flat, scales, start, end, temperature, cdtype)  # [C, V]
            tgt = targets[start:end]
            full = torch.logsumexp(zt, -1)  # [C]
            if want_entropy:
                lsm = zt - full[:, None]  # [C, V], the full tempered log-softmax
                p = lsm.exp()
                # H = -Σ p log p, a zero-probability token adding 0 (policy_forward's formula)
                ent[start:end] = -(p.mul_(lsm.clamp_min_(torch.finfo(cdtype).min))).sum(-1)
                del lsm, p
            if top_p < 1.0:
                _nucleus_(zt, tgt, top_p)
                full = torch.logsumexp(zt, -1)  # over the nucleus
            lse[start:end] = full
            logp[start:end] = zt.gather(-1, tgt[:, None]).squeeze(-1) - full
        ctx.save_for_backward(targets, lse, *flat)
        ctx.config = (temperature, top_p, chunk, scales)
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_logp: Tensor, _grad_ent: Tensor | None) -> tuple[Tensor | None, ...]:
        targets, lse, *flat = ctx.saved_tensors
        temperature, top_p, chunk, scales = ctx.config
        needs = ctx.needs_input_grad[6:]
        cdtype = lse.dtype
        m = targets.shape[0]
        grads: list[Tensor | None] = [None] * len(flat)
        for k in range(len(scales)):
            x, w, b = flat[3 * k: 3 * k + 3]
            if needs[3 * k]:
                grads[3 * k] = torch.empty_like(x)
            acc = torch.promote_types(w.dtype, torch.float32)  # accumulate the weight's gradient in fp32
            if needs[3 * k + 1]:
                grads[3 * k + 1] = torch.zeros(w.shape, dtype=acc, device=w.device)
            if b is not None and needs[3 * k + 2]:
                grads[3 * k + 2] = torch.zeros(b.shape, dtype=acc, device=b.device)
        g_all = grad_logp.to(cdtype)
        for start in range(0, m, chunk):
            end = min(start + chunk, m)
            zt = _chunk_logits(flat, scales, start, end, temperature, cdtype)  # [C, V]
            tgt = targets[start:end]
            if top_p < 1.0:
                _nucleus_(zt, tgt, top_p)  # the same support as forward: same logits, same rule
            g = g_all[start:end]
            gz = zt.sub_(lse[start:end, None]).exp_().mul_(-g[:, None])  # -g p, 0 off the nucleus
            gz.scatter_add_(-1, tgt[:, None], g[:, None])  # + g at the target: g (onehot - p)
            if temperature != 1.0:
                gz.div_(temperature)
            for k, s in enumerate(scales):
                x, w, b = flat[3 * k: 3 * k + 3]
                gk = gz.to(w.dtype)
                if s != 1.0:
                    gk = gk * s
                if grads[3 * k] is not None:
                    grads[3 * k][start:end] = gk @ w  # type: ignore[index]
                if grads[3 * k + 1] is not None:
                    grads[3 * k + 1].add_(gk.t() @ x[start:end])  # type: ignore[union-attr]
                if grads[3 * k + 2] is not None:
                    grads[3 * k + 2].add_(gk.sum(0))  # type: ignore[union-attr]
        for i in range(len(flat)):
            if grads[i] is not None and flat[i] is not None:
                grads[i] = grads[i].to(flat[i].dtype)  # type: ignore[union-attr]
        return (None, None, None, None, None, None, *grads)


def chunked_logprobs(model_or_head: Any, hidden: Tensor, targets: Tensor, temperature: float = 1.0,
                     top_p: float = 1.0, entropy: bool = False,
                     chunk: int | None = None) -> tuple[Tensor, Tensor | None]:
    """``(logp [M], entropy [M] or None)`` of ``targets [M]`` under the head of ``model_or_head``
    (a model, resolved by :func:`output_head`, or an :class:`OutputHead`) applied to ``hidden
    [M, d]`` (the head's input at the policy positions, e.g. selected from :func:`final_hidden`):
    what ``policy_forward`` computes from the ``[M, V]`` logits, without them.

    ``logp`` is float32 (float64 for an fp64 head) and differentiable in ``hidden``, the head
    weight and bias and the head's LoRA parameters; ``entropy`` has no gradient. ``chunk``:
    rows per chunk (default :func:`default_chunk`); peak extra memory O(chunk × V)."""
    head = model_or_head if isinstance(model_or_head, OutputHead) else output_head(model_or_head)
    if hidden.dim() != 2 or targets.dim() != 1 or hidden.shape[0] != targets.shape[0]:
        raise ZsearchError(f"chunked LM head: hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} "
                           "must be [M, d] and [M]")
    c = default_chunk(head.vocab) if chunk is None else int(chunk)
    if c < 1:
        raise ZsearchError(f"chunked LM head: chunk must be >= 1, not {chunk}")
    flat, scales = head.terms(hidden)
    logp, ent = ChunkedHeadLogprob.apply(targets.to(torch.long), float(temperature), float(top_p), c, bool(entropy),
                                         tuple(scales), *flat)
    return logp, (ent if entropy else None)
