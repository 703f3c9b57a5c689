"""Data for ``zsearch sft``: examples as token ids plus labels, a seeded eval split and order.

Two inputs, told apart by their columns:

* **pairs** (``SFT_EXAMPLE``: ``prompt``, ``completion``): the prompt is tokenized with the
  chat template (``apply_chat``, assistant header included) or, without it, as raw text
  with the tokenizer's own special tokens (``tokenizer.encode``, exactly what the ``sft``
  simulator sends); the completion is tokenized on its own and EOS is appended, so the model
  learns to stop. Prompt and completion are tokenized separately because that is how the
  model sees them at inference: prompt ids, then the ids it generates.
* **trajectories** (``TRAJECTORY``/``ROLLOUT``: ``prompt_ids``, ``response_ids``,
  ``loss_mask``): the ids are used as stored; only mask-1 tokens (what the policy sampled)
  are targets, so retrieved documents and template tokens are context, never targets.

Labels are the target id where the loss applies and ``-100`` everywhere else (prompt,
masked tokens, padding). ``--max-length`` never cuts a completion: a sequence too long
loses tokens from the **left of its prompt**; an example whose targets alone do not fit is
dropped (and counted), because cutting the end of a completion would teach the model to
stop mid-answer, or never to emit EOS.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zsearch_cli.errors import ZsearchError
from zsearch_cli.artifacts import file_kind, iter_jsonl, read_artifact
from zsearch_cli.schemas import SFT_EXAMPLE, TRAJECTORY

IGNORE = -100
"""Label of a position without loss (torch's cross-entropy ``ignore_index``)."""

PAIR_COLUMNS = ("prompt", "completion")
TRAJECTORY_COLUMNS = ("prompt_ids", "response_ids", "loss_mask")


@dataclass
class SFTItem:
    """One tokenized example: ``labels[i]`` is ``input_ids[i]`` or ``IGNORE``."""

    input_ids: list[int]
    labels: list[int]

    @property
    def n_targets(self) -> int:
        return sum(1 for x in self.labels if x != IGNORE)


@dataclass
class DataStats:
    """What loading did to the rows (printed once, and stored in the checkpoint config)."""

    kind: str = ""
    rows: int = 0
    kept: int = 0
    prompt_truncated: int = 0
    too_long: int = 0
    """Dropped: the targets alone exceed --max-length."""
    no_targets: int = 0
    """Dropped: nothing to learn (an empty completion, or a trajectory with no mask-1 token)."""
    incorrect: int = 0
    """Dropped by --only-correct."""
    notes: list[str] = field(default_factory=list)

    def summary(self, name: str) -> str:
        parts = [f"{name}: {self.kept}/{self.rows} {self.kind} examples"]
        for key, what in (("prompt_truncated", "prompts cut from the left"), ("too_long", "dropped: too long"),
                          ("no_targets", "dropped: no target tokens"), ("incorrect", "dropped: not EM-correct")):
            if getattr(self, key):
                parts.append(f"{getattr(self, key)} {what}")
        return ", ".join(parts)


def detect_kind(path: Path) -> str:
    """``'pairs'`` or ``'trajectories'`` from the file's columns (a clear error otherwise)."""
    path = Path(path)
    if file_kind(path) == "parquet":
        import pyarrow.parquet as pq

        try:
            columns = set(pq.read_schema(path).names)
        except Exception as err:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise ZsearchError(f"{path}: not a readable Parquet file ({err})") from None
    else:
        first = next(iter_jsonl(path), None)
        if first is None:
            raise ZsearchError(f"{path}: file has no rows")
        columns = set(first[1])
    if all(c in columns for c in TRAJECTORY_COLUMNS):
        return "trajectories"
    if all(c in columns for c in PAIR_COLUMNS):
        return "pairs"
    raise ZsearchError(f"{path}: not SFT data: expected columns prompt + completion (sft_example) or prompt_ids + "
                       f"response_ids + loss_mask (trajectories); found {', '.join(sorted(columns))}")


def fit(prompt: list[int], targets: list[int], target_labels: list[int], max_length: int,
        stats: DataStats) -> SFTItem | None:
    """``prompt + targets`` within ``max_length``: the prompt loses tokens on its left; None
    (counted) when the targets alone are longer than ``max_length``."""
    if len(targets) > max_length:
        stats.too_long += 1
        return None
    room = max_length - len(targets)
    if len(prompt) > room:
        prompt = prompt[len(prompt) - room:] if room > 0 else []
        stats.prompt_truncated += 1
    return SFTItem(list(prompt) + list(targets), [IGNORE] * len(prompt) + list(target_labels))


def pair_ids(tokenizer: Any, prompt: str, completion: str, chat_template: bool) -> tuple[list[int], list[int]]:
    """(prompt ids, completion ids + EOS) as the model sees them at inference."""
    if chat_template:
        from zsearch_cli.models.loading import apply_chat

        prompt_ids = apply_chat(tokenizer, prompt)
    else:
        prompt_ids = list(tokenizer.encode(prompt)) if prompt else []
    completion_ids = list(tokenizer.encode(completion, add_special_tokens=False))
    if tokenizer.eos_token_id is None:
        raise ZsearchError("the tokenizer has no EOS token: the completion could not learn to stop")
    return [int(i) for i in prompt_ids], [int(i) for i in completion_ids] + [int(tokenizer.eos_token_id)]


def trajectory_targets(response_ids: list[int], loss_mask: list[int]) -> list[int]:
    """Labels of a response: the id where the policy sampled it (mask 1), else IGNORE."""
    return [int(t) if m else IGNORE for t, m in zip(response_ids, loss_mask, strict=True)]


def _load_pairs(path: Path, tokenizer: Any, chat_template: bool, max_length: int, stats: DataStats) -> list[SFTItem]:
    items = []
    for row in read_artifact(path, SFT_EXAMPLE).select(list(PAIR_COLUMNS)).to_pylist():
        prompt_ids, completion_ids = pair_ids(tokenizer, row["prompt"] or "", row["completion"], chat_template)
        item = fit(prompt_ids, completion_ids, completion_ids, max_length, stats)
        if item is not None:
            items.append(item)
    return items


def _load_trajectories(path: Path, max_length: int, only_correct: bool, stats: DataStats) -> list[SFTItem]:
    from zsearch_cli.rewards import em

    table = read_artifact(path, TRAJECTORY)
    items = []
    cols = ["prompt_ids", "response_ids", "loss_mask", "prediction", "golden_answers"]
    for i, row in enumerate(table.select(cols).to_pylist()):
        response, mask = row["response_ids"] or [], row["loss_mask"] or []
        if len(response) != len(mask):
            raise ZsearchError(f"{path}: row {i}: loss_mask has {len(mask)} entries for {len(response)} response ids")
        if only_correct and not (row["prediction"] is not None and em(row["prediction"], row["golden_answers"] or [])):
            stats.incorrect += 1
            continue
        labels = trajectory_targets(response, mask)
        if not any(x != IGNORE for x in labels):
            stats.no_targets += 1
            continue
        item = fit(row["prompt_ids"] or [], response, labels, max_length, stats)
        if item is not None:
            items.append(item)
    return items


def load_sft_items(path: str | Path, tokenizer: Any, *, chat_template: bool, max_length: int,
                   only_correct: bool = False) -> tuple[list[SFTItem], DataStats]:
    """Tokenized examples from a pairs or trajectories file, and what was dropped."""
    path = Path(path)
    kind = detect_kind(path)
    stats = DataStats(kind=kind)
    if kind == "pairs":
        if only_correct:
            raise ZsearchError("--only-correct filters trajectories by EM; "
                               f"{path} holds prompt/completion pairs (filter them before training)")
        items = _load_pairs(path, tokenizer, chat_template, max_length, stats)
        stats.rows = len(items) + stats.too_long
    else:
        items = _load_trajectories(path, max_length, only_correct, stats)
        stats.rows = len(items) + stats.too_long + stats.no_targets + stats.incorrect
    stats.kept = len(items)
    return items, stats


def split_eval(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train indices, eval indices): a seeded ``fraction`` held out (at least one example,
    and never all of them); ``fraction`` 0 holds out nothing."""
    if fraction <= 0 or n < 2:
        return list(range(n)), []
    n_eval = min(n - 1, max(1, round(fraction * n)))
    perm = np.random.default_rng([seed, 0x5F7]).permutation(n)
    held = set(perm[:n_eval].tolist())
    return [i for i in range(n) if i not in held], sorted(held)


class StepOrder:
    """Which examples a step trains on: a pure function of (seed, step), so resuming needs
    no data cursor. The examples form one stream of seeded per-epoch permutations; step
    ``s`` takes positions ``[s·E, (s+1)·E)`` of it (E = the global batch), so a batch may
    straddle two epochs (harmless for SFT, and every example is seen once per epoch)."""

    def __init__(self, n: int, global_batch: int, seed: int):
        if n < 1:
            raise ZsearchError("no training examples left (see the counts above)")
        self.n, self.global_batch, self.seed = n, global_batch, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(self.n)}
        return self._perms[epoch]

    def indices(self, step: int) -> list[int]:
        start = step * self.global_batch
        return [int(self._perm(k // self.n)[k % self.n]) for k in range(start, start + self.global_batch)]

    def epoch(self, step: int) -> float:
        """Epochs completed after ``step`` (0-based) has run."""
        return (step + 1) * self.global_batch / self.n


def collate(items: list[SFTItem], pad_id: int) -> dict[str, Any]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (IGNORE on padding)."""
    import torch

    width = max(len(it.input_ids) for it in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    labels = torch.full((len(items), width), IGNORE, dtype=torch.long)
    attn = torch.zeros((len(items), width), dtype=torch.long)
    for r, it in enumerate(items):
        n = len(it.input_ids)
        ids[r, :n] = torch.tensor(it.input_ids, dtype=torch.long)
        labels[r, :n] = torch.tensor(it.labels, dtype=torch.long)
        attn[r, :n] = 1
    return {"input_ids": ids, "attention_mask": attn, "labels": labels}

