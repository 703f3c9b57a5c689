"""The prompt of ``zsearch judge`` and the strict parser of its verdict.

What the judge decides (ZeroSearch §3.3): given one query an agent sent to a real search
engine and the documents that came back, do the documents contain enough information to
answer the query? "yes" labels the query-documents pair ``useful``, "no" labels it
``noisy``; those labels pick the ``useful``/``noisy`` word of the simulator prompt
(docs/methods.md §2.3; ZeroSearch Table 2) when the simulation LLM is fine-tuned on the pairs.

Choices that are ours (the paper publishes no judge prompt):

* The judge sees the **whole result list** of a query and gives one verdict for it. The
  paper says each "document" is assessed, but the simulator's output it trains is the whole
  set of documents for a query, so the set is the unit that gets a label.
* The user's **question and gold answers** are shown, as the paper does for the simulator,
  so the judge knows what information the agent is after; the prompt tells it to judge the
  documents only and not its own knowledge.
* The reply must be the single line ``Verdict: yes`` or ``Verdict: no``. A fixed format
  makes parsing strict: :func:`parse_verdict` never guesses, and an output it cannot read is
  recorded as unparseable (label null) rather than turned into a label.

Changing the wording changes the labels: bump :data:`JUDGE_PROMPT_VERSION` when you do (it
is written into the judgments' Parquet metadata).
"""

from __future__ import annotations

import re
from typing import Sequence

JUDGE_PROMPT_VERSION = "zsearch-judge-v1"

JUDGE_PROMPT = """\
You are checking the results of a search engine.

A user is trying to answer the question: "{question}"
The correct answer is: {answer}

To find it, the user searched for: "{query}"
The search engine returned these documents:
{documents}

Do these documents contain enough information to answer the search query? Judge only what the \
documents say, not what you know yourself. The question and its answer are given so that you \
know what information the user needs.

Reply with exactly one line and nothing else:
Verdict: yes
if the documents contain enough information to answer the query, or
Verdict: no
if they do not."""

VERDICT_PREFILL = "Verdict:"
"""``zsearch judge --prefill-verdict``: the start of a local judge's reply. smollm2 answers the
prompt above in prose ("The documents do not contain enough information to answer the query.":
none of 10 real outputs parsed); made to start with this, its next word is the verdict, and
the recorded output starts with it too, so the strict parser reads what the judge was made to
say. The user message is unchanged (the prompt version with it)."""

NO_DOCUMENTS = "(no documents)"

_VERDICT_LINE = re.compile(r"verdict\s*:\s*(yes|no)\s*\.?", re.IGNORECASE)
_BARE_WORD = re.compile(r"(yes|no)\s*\.?", re.IGNORECASE)

LABELS = {"yes": "useful", "no": "noisy"}
"""Verdict -> label of the judged query row."""


def render_answer(golden_answers: Sequence[str]) -> str:
    """The first gold answer, as in the simulator prompt, with any aliases after it."""
    golds = [g for g in golden_answers if g and g.strip()]
    if not golds:
        return "(unknown)"
    if len(golds) == 1:
        return golds[0]
    return f"{golds[0]} (also accepted: {'; '.join(golds[1:])})"


def render_documents(documents: Sequence[str]) -> str:
    """``Doc i (Title: T) text`` lines from COLLECTED_QUERY's ``"title\\ntext"`` strings."""
    lines = []
    for i, doc in enumerate(documents, start=1):
        title, sep, text = doc.partition("\n")
        if not sep:  # no title line: the whole string is the text
            title, text = "", doc
        head = f"Doc {i} (Title: {title.strip()})" if title.strip() else f"Doc {i}"
        lines.append(f"{head} {' '.join(text.split())}")
    return "\n".join(lines) if lines else NO_DOCUMENTS


def build_judge_prompt(question: str, golden_answers: Sequence[str], query: str, documents: Sequence[str]) -> str:
    """The user message the judge gets for one query row."""
    return JUDGE_PROMPT.format(
        question=question.strip(),
        answer=render_answer(golden_answers),
        query=query.strip(),
        documents=render_documents(documents),
    )


def parse_verdict(text: str | None) -> tuple[str | None, str | None]:
    """``(verdict, None)`` with verdict ``'yes'``/``'no'``, or ``(None, reason)``.

    Accepted, case-insensitively, with surrounding whitespace and one trailing period:

    * a line that is exactly ``Verdict: yes`` / ``Verdict: no`` (other lines, e.g. a
      reasoning model's preamble, are allowed; several verdict lines must agree), or
    * an output that is, as a whole, the bare word ``yes`` or ``no``.

    Everything else is unparseable: empty output, no verdict line ("I think yes but no"),
    a verdict line with more on it ("Verdict: yes, mostly"), or verdict lines that disagree.
    """
    if text is None or not text.strip():
        return None, "empty output"
    stripped = text.strip()
    bare = _BARE_WORD.fullmatch(stripped)
    if bare:
        return bare.group(1).lower(), None
    found = {m.group(1).lower() for line in stripped.splitlines() if (m := _VERDICT_LINE.fullmatch(line.strip()))}
    if not found:
        return None, "no 'Verdict: yes|no' line"
    if len(found) > 1:
        return None, "conflicting verdicts"
    return found.pop(), None
