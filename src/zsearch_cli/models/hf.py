"""Batched generation with plain transformers: our own sampling loop over a KV cache.

Why not ``model.generate``: RL training needs exactly what was sampled and its logprob
under the distribution it was sampled from, stop strings whose text stays in the output,
and reproducible per-row seeds. Owning the loop makes each of those explicit.

Logprob semantics (same as vLLM with ``logprobs_mode='processed_logprobs'``):

* sampling: log-probability of the chosen token under the distribution actually sampled,
  i.e. ``log_softmax(logits / temperature)`` after the top-p filter (tokens outside the
  nucleus have probability 0, the rest are renormalised);
* greedy (``temperature <= 0``): ``log_softmax`` of the raw logits at the argmax.

Seeding: with ``params.seeds`` set, row ``i`` of a call draws its uniforms from its own
``torch.Generator`` seeded with ``seeds[i]`` on the model's device; with only ``params.seed``,
from ``(seed, i)``. A row's samples
therefore depend only on the seed, its index, its prompt and the model: not on how many
other rows there are, what they contain, or when they finish. Not guaranteed: equality
across devices, dtypes or torch versions (CPU and CUDA generators differ), and batched vs
unbatched runs can differ when padding changes the floating-point result enough to move a
draw across a token boundary (rare in fp32, more likely in bf16). With ``seed=None`` the
draws come from torch's global generator (both None).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import GenerationOutput, SamplingParams, check_seeds, row_seed
from zsearch_cli.models.nucleus import filter_top_p


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """The tokenizer's EOS plus any extra end ids in the model's generation config."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(int(i) for i in extra)
    return ids


def _first_stop(text: str, stop: Sequence[str]) -> str | None:
    """The stop string that occurs earliest in ``text`` (longest on a tie), if any."""
    best: tuple[int, int, str] | None = None
    for s in stop:
        at = text.find(s)
        if at >= 0 and (best is None or (at, -len(s)) < best[:2]):
            best = (at, -len(s), s)
    return best[2] if best else None


def _filter_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches ``top_p`` (>= 1 token):
    :func:`zsearch_cli.models.nucleus.filter_top_p`, the rule the trainer replays."""
    return filter_top_p(logits, top_p)


def pick_tokens(
    logits: torch.Tensor, params: SamplingParams, uniforms: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row and return ``(tokens, logprobs)`` (see module docstring).

    Sampling is inverse-CDF with one uniform per row, so each row's randomness can come
    from its own generator without drawing a vocabulary-sized noise tensor per step.
    """
    logits = logits.float()
    if params.greedy:
        tokens = logits.argmax(dim=-1)
        logprobs = logits.log_softmax(dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
        return tokens, logprobs
    scaled = logits / params.temperature
    if params.top_p < 1.0:
        scaled = _filter_top_p(scaled, params.top_p)
    logp = scaled.log_softmax(dim=-1)
    cdf = logp.double().exp().cumsum(dim=-1)
    assert uniforms is not None
    target = uniforms.to(cdf.dtype)[:, None] * cdf[:, -1:]
    # right=True: the first index whose cumulative mass exceeds the draw, never a p=0 token.
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class HFBackend:
    """A :class:`~zsearch_cli.models.base.GenerationBackend` over a transformers causal LM.

    It shares the model object with whoever passed it in (e.g. a trainer), so generation
    always sees the current weights. Rows are processed ``max_batch_size`` at a time.
    """

    def __init__(self, model: Any, tokenizer: Any, device: str | torch.device | None = None, max_batch_size: int = 64):
        self.model = model
        self.tokenizer = tokenizer
        if device is not None:
            self.device = torch.device(device)
            model.to(self.device)
        else:
            self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        self.eos_ids = _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        # Any id works for padding (the attention mask hides it); pick a real one.
        self.pad_id = int(pad) if pad is not None else min(self.eos_ids, default=0)

    def update_weights(self, state_dict_iter: Iterable[tuple[str, torch.Tensor]] | None = None) -> None:
        """No-op: this backend holds the very model object being trained, so it is current.

        Accepts the same argument as :meth:`VLLMBackend.update_weights` so callers need not
        care which backend they hold.
        """

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        stop: Sequence[str] = (),
    ) -> list[GenerationOutput]:
        """Continue each prompt; see the module docstring for logprob and seed semantics."""
        if params.max_new_tokens < 0:
            raise ZsearchError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
        if not params.greedy and not 0.0 < params.top_p <= 1.0:
            raise ZsearchError(f"top_p must be in (0, 1], got {params.top_p}")
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ZsearchError(f"prompt {i} is empty: a prompt needs at least one token")
        check_seeds(params, len(prompts))
        stop = [s for s in stop if s]
        outputs: list[GenerationOutput] = []
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for start in range(0, len(prompts), self.max_batch_size):
                    chunk = prompts[start : start + self.max_batch_size]
                    outputs.extend(self._generate_batch(chunk, params, stop, row_offset=start))
        finally:
            self.model.train(was_training)
        return outputs

    def _uniforms(self, rows: int, steps: int, params: SamplingParams, row_offset: int) -> torch.Tensor:
        """All the uniform draws a batch can use, ``[rows, steps]``, one generator per row."""
        if params.seed is None and params.seeds is None:
            return torch.rand(rows, steps, device=self.device, dtype=torch.float64)
        draws = []
        for i in range(rows):
            gen = torch.Generator(device=self.device)
            gen.manual_seed(row_seed(params, row_offset + i))
            draws.append(torch.rand(steps, generator=gen, device=self.device, dtype=torch.float64))
        return torch.stack(draws)

    def _generate_batch(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams, stop: Sequence[str], row_offset: int
    ) -> list[GenerationOutput]:
        n = len(prompts)
        results = [GenerationOutput(token_ids=[], logprobs=[], finish_reason="length") for _ in range(n)]
        if n == 0 or params.max_new_tokens == 0:
            return results
        steps = params.max_new_tokens
        width = max(len(p) for p in prompts)
        # Left padding: every row's next token lands in the last column.
        input_ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)  # real tokens count from 0 in every row
        uniforms = None if params.greedy else self._uniforms(n, steps, params, row_offset)
        # Enough trailing tokens to cover any stop string even at one byte per token.
        window = 4 * max((len(s) for s in stop), default=0) + 8

        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
        )
        cache, logits = out.past_key_values, out.logits[:, -1, :]
        next_pos = positions[:, -1] + 1
        # Finished rows leave the batch when the cache supports it (less work per step);
        # otherwise they keep being computed and their outputs are ignored.
        compact = hasattr(cache, "batch_select_indices")
        active: list[int | None] = list(range(n))  # batch row -> result index, None = done
        for step in range(steps):
            tokens, logprobs = pick_tokens(logits, params, None if uniforms is None else uniforms[:, step])
            for b, (tok, lp) in enumerate(zip(tokens.tolist(), logprobs.tolist())):
                row = active[b]
                if row is None:
                    continue
                if self._append(results[row], tok, lp, stop, window):
                    active[b] = None  # still 'length' if this was the last step
            keep = [b for b, row in enumerate(active) if row is not None]
            if not keep or step == steps - 1:
                break
            if compact and len(keep) < len(active):
                idx = torch.as_tensor(keep, device=self.device)
                cache.batch_select_indices(idx)
                tokens, mask, next_pos = tokens[idx], mask[idx], next_pos[idx]
                if uniforms is not None:
                    uniforms = uniforms[idx]
                active = [active[b] for b in keep]
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=-1)
            out = self.model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=next_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits = out.past_key_values, out.logits[:, -1, :]
            next_pos = next_pos + 1
        return results

    def _append(self, res: GenerationOutput, tok: int, logprob: float, stop: Sequence[str], window: int) -> bool:
        """Record one sampled token; return True when it ends the row (EOS or a stop string).

        The stop check decodes only the last ``window`` new tokens: a stop string that was not
        there one step ago must end in the newest token, so it lies inside that tail.
        """
        res.token_ids.append(tok)
        res.logprobs.append(logprob)
        if tok in self.eos_ids:
            res.finish_reason = "eos"
            return True
        if stop:
            tail = self.tokenizer.decode(
                res.token_ids[-window:], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            hit = _first_stop(tail, stop)
            if hit is not None:
                res.finish_reason, res.stop_string = "stop", hit
                return True
        return False
