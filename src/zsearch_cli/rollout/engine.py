"""The multi-turn search-agent rollout engine, shared by collect, train, propose/solve and eval.

Token-in/token-out: the response is the concatenation of the ids the backend sampled
(loss mask 1, with their sampler logprobs) and the ids of observation text tokenized on
its own (mask 0). A policy turn is never decoded and re-encoded; decoding happens only to
*parse* the action. Observations are inserted inline in the assistant turn, right after
the sampled stop string (``</search>``/``</tool_call>``), which is what Search-R1 and
ZeroSearch train on; the chat template is applied to the prompt only.

One loop serves every protocol: the protocol parses an action and renders an
observation, the engine does the rest (batching, limits, search calls, bookkeeping).
Two schedulers drive the same per-sample steps (:meth:`RolloutEngine.record_turns` and
:meth:`RolloutEngine.observe`): ``sync`` (here: a turn barrier) and ``async``
(``async_engine.py``: no barrier); per-sample seeds make them sample alike. The state they
share (the sample record, the finisher, the search side trips) is in ``state.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from zsearch_cli.errors import ZsearchError
from zsearch_cli.models.base import GenerationBackend, SamplingParams
from zsearch_cli.config.fields import check_options
from zsearch_cli.config.parts import RolloutOptions
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.rollout.state import Finisher, QARow, RowFinisher, SampleState, sample_seed
from zsearch_cli.rollout.trajectory import Trajectory
from zsearch_cli.search.base import SearchBackend, SearchBackendError, SearchRequest, SearchResult, search_grouped


class RolloutEngine:
    def __init__(
        self,
        backend: GenerationBackend,
        protocol: Any,
        search: SearchBackend | None,
        config: RolloutOptions | None = None,
        *,
        seed: int = 0,
        chat_template: bool = True,
    ):
        """``config``: the rollout part of the command's options, as it is (defaults: Search-R1's
        limits): ordinary turns (then one final turn in which no search runs), new tokens per
        turn, the observation cap (whole passages are cut so the closing tag survives) and the
        prompt + response budget (the prompt is never dropped: observations shrink to fit, and a
        sample that runs out ends with finish 'context'). ``seed``: every turn's sampling seed
        derives from it, the step, the sample and the turn index. ``chat_template``: wrap the
        prompt in the tokenizer's chat template when it has one."""
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.protocol = protocol
        self.search = search
        self.config = config or RolloutOptions()
        self.seed = seed
        self.chat_template = chat_template
        check_options(self.config)  # the part's declared ranges and choices (--rollout-mode ...)
        self._rust = getattr(self.tokenizer, "backend_tokenizer", None)
        self.policy_version = 0
        """Weight updates the backend has seen (the trainer sets it: steps done); recorded
        with every sampled token (``Trajectory.policy_version``)."""

    # ------------------------------------------------------------------ prompt

    def encode_prompt(self, row: QARow) -> list[int]:
        from zsearch_cli.models.loading import apply_chat

        text = row.prompt if row.prompt is not None else self.protocol.build_prompt(row.question)
        if self.chat_template:
            return list(apply_chat(self.tokenizer, text, system=self.protocol.system_prompt))
        return self._encode(text)

    def _encode(self, text: str) -> list[int]:
        return self._encode_many([text])[0]

    def _encode_many(self, texts: list[str]) -> list[list[int]]:
        """Observation/template text to ids, tokenized on its own (never merged with the
        sampled ids before it). Uses the Rust tokenizer directly when there is one: the
        transformers wrapper's per-id Python checks cost more than the tokenization."""
        if not texts:
            return []
        if self._rust is not None:
            return [e.ids for e in self._rust.encode_batch(texts, add_special_tokens=False)]
        return [list(self.tokenizer.encode(t, add_special_tokens=False)) for t in texts]

    def _decode_many(self, ids: list[list[int]]) -> list[str]:
        if self._rust is not None:
            return self._rust.decode_batch(ids, skip_special_tokens=False)
        return self.tokenizer.batch_decode(ids, skip_special_tokens=False)

    # ------------------------------------------------------------------ observation

    def _observation_ids(self, results: list[list[Passage]], budget: int) -> tuple[list[int], int]:
        """Render and tokenize an observation within ``budget`` tokens. Whole passages are
        dropped from the end of the longest result list (then the last one is shortened),
        so the frame and its closing tag always survive. Returns (ids, passages dropped)."""
        results = [list(r) for r in results]
        dropped = 0
        while True:
            ids = self._encode(self.protocol.render_observation(results))
            if len(ids) <= budget:
                return ids, dropped
            remaining = sum(map(len, results))
            if remaining == 0:
                return [], dropped  # not even the empty frame fits
            longest = max(range(len(results)), key=lambda i: len(results[i]))
            if remaining > 1:
                results[longest].pop()
                dropped += 1
                continue
            # One passage left: cut its text by the overshoot (plus one for merge slack).
            p = results[longest][0]
            text_ids = self._encode(p.text)
            keep = len(text_ids) - (len(ids) - budget) - 1
            if keep <= 0:
                results[longest] = []
                dropped += 1
            else:
                results[longest] = [Passage(p.id, p.title, self._decode_many([text_ids[:keep]])[0], p.score)]

    # ------------------------------------------------------------------ the loop

    def rollout(
        self,
        rows: Sequence[QARow],
        group_size: int = 1,
        step: int = 0,
        on_row_done: Callable[[int], None] | None = None,
    ) -> list[Trajectory]:
        """Roll out ``group_size`` samples per row; returns one :class:`Trajectory` per
        sample, ordered row-major. ``config.rollout_mode`` picks the scheduler: ``sync``
        (below: one turn of every sample, then that turn's searches) or ``async``
        (:mod:`zsearch_cli.rollout.async_engine`); both give the same trajectories."""
        samples = self.new_samples(rows, group_size, step)
        done = RowFinisher(rows, group_size, on_row_done)
        if self.config.rollout_mode == "async":
            from zsearch_cli.rollout.async_engine import rollout_async

            rollout_async(self, samples, step, done)
        else:
            for _ in range(self.config.max_turns + 1):
                active = [s for s in samples if s.finish is None]
                if not active:
                    break
                pending = self.generate_turn(active, done)
                if pending:
                    results = self._search_all(pending, samples, step)
                    self.observe(list(zip([s for s, _ in pending], results)), done)
        return self.trajectories(samples)

    def new_samples(self, rows: Sequence[QARow], group_size: int, step: int) -> list[SampleState]:
        """``group_size`` fresh samples per row of rollout step ``step``, row-major, each with
        its encoded prompt, group id and seed key."""
        cfg = self.config
        samples: list[SampleState] = []
        seen: dict[str, int] = {}
        for row in rows:
            prompt = self.encode_prompt(row)
            if len(prompt) >= cfg.max_context_tokens:
                raise ZsearchError(
                    f"row {row.id!r}: the prompt is {len(prompt)} tokens, over --max-context-tokens "
                    f"{cfg.max_context_tokens}"
                )
            group_id = f"{step}:{row.id}"
            # A repeated row id gets its own streams, as it would at another batch position.
            seen[row.id] = seen.get(row.id, -1) + 1
            key = row.id if seen[row.id] == 0 else f"{row.id}~{seen[row.id]}"
            samples += [SampleState(row, g, group_id, prompt, seed_key=key, step=step, version=self.policy_version)
                        for g in range(group_size)]
        return samples

    def turn_params(self, batch: Sequence[SampleState]) -> SamplingParams:
        """How to sample the next turn of each sample of ``batch``."""
        cfg = self.config
        # Each sample's seed names the sample and its turn, never its place in the batch, so
        # the scheduler (sync or async, which samples share a call) cannot change what it samples.
        return SamplingParams(
            max_new_tokens=cfg.max_turn_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            seeds=tuple(sample_seed(self.seed, s.step, s.seed_key, s.sample_index, len(s.turns)) for s in batch),
        )

    @staticmethod
    def contexts(batch: Sequence[SampleState]) -> list[list[int]]:
        """What the policy continues: the prompt and the response so far, as ids."""
        return [s.prompt_ids + s.response_ids for s in batch]

    def generate_turn(self, batch: Sequence[SampleState], done: Finisher) -> list[tuple[SampleState, Any]]:
        """Generate the next turn of every sample in ``batch`` (one backend call) and record it;
        returns the ``(sample, action)`` pairs whose search should run now."""
        outs = self.backend.generate(self.contexts(batch), self.turn_params(batch),
                                     stop=self.protocol.stop_strings)
        return self.record_turns(batch, outs, done)

    def record_turns(self, batch: Sequence[SampleState], outs: Sequence[Any],
                     done: Finisher) -> list[tuple[SampleState, Any]]:
        """Record one generated turn per sample (``outs[i]`` continues ``batch[i]``); returns the
        ``(sample, action)`` pairs whose search should run now."""
        cfg = self.config
        clipped = [list(o.token_ids)[: max(0, cfg.max_context_tokens - s.length)] for s, o in zip(batch, outs)]
        texts = self._decode_many(clipped)  # to parse the action only; the ids are kept as sampled
        pending: list[tuple[SampleState, Any]] = []
        for s, out, ids, text in zip(batch, outs, clipped, texts):
            action = self._record_turn(s, out, ids, text, done)
            if action is not None:
                pending.append((s, action))
        return pending

    def _record_turn(self, s: SampleState, out: Any, ids: list[int], text: str, done: Finisher) -> Any:
        """Append one generated turn to ``s`` and decide what follows: the episode ends, an
        invalid-action message is inserted, or (returned) the action whose search must run."""
        cfg = self.config
        turn = len(s.turns)
        final_turn = turn == cfg.max_turns
        over_budget = len(ids) < len(out.token_ids)
        s.extend(ids, list(out.logprobs)[: len(ids)])
        action = self.protocol.parse(text)
        s.turns.append({"turn": turn, "text": text, "action": action.kind, "queries": list(action.queries),
                        "error": action.error, "finish": out.finish_reason, "sampled_tokens": len(ids)})
        if over_budget:
            done.finish(s, "context")
        elif action.kind == "answer":
            s.prediction = action.answer
            done.finish(s, "answer")
        elif action.kind == "search" and not final_turn:
            if self.search is None:
                raise ZsearchError("the model issued a search but no search backend is configured")
            return action
        elif final_turn:
            done.finish(s, "max_turns" if action.kind == "search" else out.finish_reason)
        elif out.finish_reason == "eos":
            # The model closed its turn without an action. Search-R1 decodes with
            # skip_special_tokens and keeps going past the EOS; we end the episode.
            done.finish(s, "eos")
        elif self.protocol.end_on_invalid:
            s.invalid += 1
            done.finish(s, "invalid")  # Dr. Zero ends a tool-call trajectory on a malformed turn
        else:
            s.invalid += 1
            obs = self._encode(self.protocol.render_invalid(action))
            if s.length + len(obs) >= cfg.max_context_tokens:
                done.finish(s, "context")
            else:
                s.extend(obs, None)
        return None

    @staticmethod
    def search_requests(s: SampleState, action: Any) -> list[SearchRequest]:
        """One request per query of ``action``, each carrying the row that issued it."""
        return [SearchRequest(q, s.row.id, s.row.question, tuple(s.row.golden_answers), s.sample_index)
                for q in action.queries]

    def _search_all(self, pending, samples, step) -> list[list[SearchResult]]:
        """Every pending search of a turn in one backend call; the results per sample."""
        try:
            return search_grouped(self.search, [self.search_requests(s, a) for s, a in pending], self.config.topk)
        except ZsearchError as err:
            raise self.search_failed(err, samples, step) from None

    def search_failed(self, err: ZsearchError, samples: Sequence[SampleState], step: int) -> SearchBackendError:
        """The error to raise when the backend fails: it carries the trajectories already finished."""
        done = self.trajectories([s for s in samples if s.finish is not None])
        return SearchBackendError(f"search backend failed at step {step}: {err}", completed=done)

    def observe(self, found: Sequence[tuple[SampleState, list[SearchResult]]], done: Finisher) -> None:
        """Insert each sample's observation (its search results, rendered within budget)."""
        # Render every observation and tokenize them in one batched call; only the few that
        # exceed their budget go through the passage-dropping loop.
        texts = [self.protocol.render_observation([r.passages for r in res]) for _, res in found]
        encoded = self._encode_many(texts)
        for (s, res), obs in zip(found, encoded):
            s.searches += 1
            budget = min(self.config.max_obs_tokens, self.config.max_context_tokens - s.length - 1)
            dropped = 0
            if len(obs) > budget:
                obs, dropped = self._observation_ids([r.passages for r in res], budget)
            log = s.turns[-1]
            log["doc_ids"] = [[p.id for p in r.passages] for r in res]
            # The passages as the backend returned them (before the observation budget cut
            # any), so audits and `zsearch collect` need no second search to see them.
            log["docs"] = [[{"id": p.id, "title": p.title, "text": p.text} for p in r.passages] for r in res]
            log["obs_tokens"] = len(obs)
            log["passages_dropped"] = dropped
            if any(r.log for r in res):
                log["search_log"] = [r.log for r in res]
            if not obs:
                done.finish(s, "context")
                continue
            s.extend(obs, None)

    def trajectories(self, samples: Sequence[SampleState]) -> list[Trajectory]:
        """The samples as trajectories (their response text decoded in one batch)."""
        texts = self._decode_many([s.response_ids for s in samples])
        return [self._trajectory(s, text) for s, text in zip(samples, texts)]

    @staticmethod
    def _trajectory(s: SampleState, response_text: str) -> Trajectory:
        return Trajectory(
            id=f"{s.row.id}#{s.sample_index}",
            row_id=s.row.id,
            sample_index=s.sample_index,
            group_id=s.group_id,
            question=s.row.question,
            golden_answers=list(s.row.golden_answers),
            prompt_ids=s.prompt_ids,
            response_ids=s.response_ids,
            loss_mask=s.loss_mask,
            logprobs=s.logprobs,
            policy_version=s.versions,
            turns=s.turns,
            response_text=response_text,
            prediction=s.prediction,
            finish_reason=s.finish or "max_turns",
            num_turns=len(s.turns),
            num_searches=s.searches,
            num_invalid=s.invalid,
            prompt_tokens=len(s.prompt_ids),
            response_tokens=len(s.response_ids),
            policy_tokens=sum(s.loss_mask),
        )
