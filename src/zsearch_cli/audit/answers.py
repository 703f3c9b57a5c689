"""Does a text hold an answer? FlashRAG's normalisation (``rewards.normalize_answer``:
lowercase, drop ASCII punctuation, drop the articles a/an/the, collapse whitespace) applied
to both, and the normalised answer looked for as a whole-token sequence of the normalised
text: "1990" is in "born in 1990 in", not in "19901"; "new york" is in "the new york times".

A passage's title and text are matched separately (a sequence running from the title into
the text is not a mention). Golds that normalise to "" are skipped, as the metrics skip them.
"""

from __future__ import annotations

import string
from typing import Iterable, Sequence

from zsearch_cli.rewards import normalize_answer

_DELETE_PUNCT = str.maketrans("", "", string.punctuation)


def normalized_golds(golds: Iterable[str]) -> list[str]:
    """Each gold normalised, in order; empty ones dropped (they would match every text)."""
    return [n for n in (normalize_answer(g) for g in golds) if n]


def holds(normalized_text: str, normalized_answer: str) -> bool:
    """Whether ``normalized_answer`` is a whole-token sequence of ``normalized_text`` (both
    normalised: single spaces, so padding both with a space makes token edges explicit)."""
    return f" {normalized_answer} " in f" {normalized_text} "


class AnswerSet:
    """The normalised golds of one question, with a cheap sound pre-filter.

    The pre-filter: every token of a normalised answer is a substring of the text lowercased
    with punctuation deleted (normalisation only removes whole article words and spaces from
    that string), so a text failing it cannot hold the answer; ~3x cheaper than normalising."""

    def __init__(self, golds: Sequence[str]):
        self.raw = [g for g in golds if normalize_answer(g)]
        self.normalized = normalized_golds(golds)
        self._tokens = [n.split() for n in self.normalized]

    def __bool__(self) -> bool:
        return bool(self.normalized)

    def found_in(self, texts: Sequence[str], which: Sequence[int] | None = None) -> list[int]:
        """Indices (into the golds) of the answers some text of ``texts`` holds; only
        ``which`` golds are tried when given."""
        todo = list(range(len(self.normalized))) if which is None else list(which)
        found: list[int] = []
        for text in texts:
            if not todo or not text:
                continue
            loose = text.lower().translate(_DELETE_PUNCT)
            maybe = [i for i in todo if all(tok in loose for tok in self._tokens[i])]
            if not maybe:
                continue
            norm = normalize_answer(text)
            for i in maybe:
                if holds(norm, self.normalized[i]):
                    found.append(i)
                    todo.remove(i)
        return sorted(found)


def text_holds_any(texts: Iterable[str], golds: Sequence[str]) -> bool:
    """Whether any of ``texts`` holds any gold (empty golds ignored)."""
    answers = AnswerSet(golds)
    return bool(answers) and bool(answers.found_in(list(texts)))
