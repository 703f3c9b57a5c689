"""What the rollout engine returns: one :class:`Trajectory` per sample, the TRAJECTORY
artifact's columns as typed fields (``schemas.TRAJECTORY``; ``tests/test_engine.py`` checks
the two agree), and :meth:`Trajectory.to_row` for writing it.

Token-in/token-out: ``response_ids`` are the sampled ids (``loss_mask`` 1, with their sampler
``logprobs``) and the observation ids (mask 0, logprob 0.0), exactly as fed to the model; the
text fields are for humans and for parsing, never re-tokenized. The answer is parsed once, by
the engine (``prediction``): rewards, validation and eval all read it.

A trajectory is the engine's record and is not changed afterwards: what training adds
(reward, group key, kept, advantage) lives in :class:`~zsearch_cli.train.step_samples.Sample`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any


OPTIONAL = {"policy_version"}
"""Fields that files written by older versions lack (``schemas.TRAJECTORY.optional``)."""


@dataclass
class Trajectory:
    """One sampled episode (docs/architecture.md: rollout → reward)."""

    id: str
    """``"{row_id}#{sample_index}"``."""
    row_id: str
    sample_index: int
    group_id: str
    """Unique per prompt and rollout call (``"{step}:{row_id}"``): the G samples of a prompt share it."""
    question: str
    golden_answers: list[str]
    prompt_ids: list[int]
    """The chat-templated prompt, exactly as fed to the model."""
    response_ids: list[int]
    loss_mask: list[int]
    """1 where the policy sampled the token; 0 on observations and templates."""
    logprobs: list[float]
    """The sampler's logprob per response token; 0.0 where ``loss_mask`` is 0."""
    policy_version: list[int]
    """Per response token, the policy version that sampled it (weight updates applied
    before it: a training step's rollout samples with version step − 1, an overlapped one
    with an older version too); -1 where ``loss_mask`` is 0."""
    turns: list[dict[str, Any]]
    """Per turn: the model's text, parsed action, queries, doc ids, passages, search log."""
    response_text: str
    """The decoded response (observations included), for humans only."""
    prediction: str | None
    """The final answer as the engine parsed it; None without one."""
    finish_reason: str
    """answer | eos | length | max_turns | context | invalid."""
    num_turns: int
    num_searches: int
    num_invalid: int
    prompt_tokens: int
    response_tokens: int
    policy_tokens: int

    @property
    def truncated(self) -> bool:
        """A length budget ended the episode before the model did: its last turn hit
        ``--max-turn-tokens`` (``length``) or the sample ran out of ``--max-context-tokens``
        (``context``), without an answer. An unfinished text, not a wrong one (TRL's
        ``mask_truncated_completions``, DAPO's overlong filtering)."""
        return self.prediction is None and self.finish_reason in ("length", "context")

    @property
    def policy_texts(self) -> list[str]:
        """The model's own turn texts, never the inserted observations (what rewards parse)."""
        return [str(t["text"]) for t in self.turns]

    def to_row(self) -> dict[str, Any]:
        """The TRAJECTORY row: every field, ``turns`` as JSON text."""
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        row["turns"] = json.dumps(self.turns, ensure_ascii=False)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Trajectory":
        """The inverse of :meth:`to_row` (a TRAJECTORY / ROLLOUT row; extra columns are ignored)."""
        values = {f.name: row.get(f.name) if f.name in OPTIONAL else row[f.name] for f in fields(cls)}
        if values["policy_version"] is None:  # written before the column existed: unknown
            values["policy_version"] = [-1] * len(values["response_ids"])
        if isinstance(values["turns"], str):
            values["turns"] = json.loads(values["turns"])
        return cls(**values)
