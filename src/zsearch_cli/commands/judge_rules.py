"""Rule judges for ``zsearch judge --judge-model rule:NAME``: a verdict computed from the row
itself, with no model.

``rule:answer`` says yes when one of the row's documents holds a gold answer (the project's
one containment test, :mod:`zsearch_cli.audit.answers`: FlashRAG normalisation, a whole-token
match, title and text matched separately). It stands in for a large judge where none can run:
on a CPU box the only local judge is smollm2, which answers the verdict prompt in prose and,
made to give a verdict (``--prefill-verdict``), says "no" to everything
(``stages/zerosearch-mini.sh`` measures both). For a short factoid answer, "the documents
contain enough information to answer the query" is close to "a document states the answer",
which is what the simulator's useful/noisy label must teach. It is a stand-in, not the
paper's LLM judge: it says yes to a passage that names the answer in passing, and no to one
that only paraphrases it ("the fourteenth of July" for "14 July").

The verdict is written as the judge's output text, a line saying what the rule found and then
``Verdict: yes|no``, so the row goes through the same strict parser as an LLM's output. A row
with no gold answer gets no verdict line: it is recorded as unparseable, never guessed.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from zsearch_cli.audit.answers import AnswerSet
from zsearch_cli.errors import ZsearchError, shown_name

RULE_PREFIX = "rule:"
RULES = ("answer",)


def is_rule(judge_model: str) -> bool:
    """Whether ``--judge-model`` names a rule judge (``rule:NAME``) rather than a model."""
    return judge_model.strip().startswith(RULE_PREFIX)


def answer_verdict(row: dict[str, Any]) -> str:
    """``rule:answer``'s output for one COLLECTED_QUERY row (documents are ``"title\\ntext"``)."""
    answers = AnswerSet(row.get("golden_answers") or [])
    if not answers:
        return "rule:answer: the row has no gold answer to look for"
    docs = row.get("documents") or []
    for i, doc in enumerate(docs, start=1):
        title, sep, text = doc.partition("\n")
        found = answers.found_in([title, text] if sep else [doc])
        if found:
            return f"rule:answer: Doc {i} holds {answers.raw[found[0]]!r}\nVerdict: yes"
    return f"rule:answer: none of the {len(docs)} documents holds a gold answer\nVerdict: no"


def rule_judge(judge_model: str) -> Callable[[Sequence[dict[str, Any]]], list[str]]:
    """The rule named by ``rule:NAME``: rows in, output texts out, in order."""
    name = judge_model.strip()[len(RULE_PREFIX):]
    if name not in RULES:
        raise ZsearchError(f"--judge-model: rule {shown_name(name)} is not a rule judge; use "
                           + " or ".join(RULE_PREFIX + r for r in RULES))
    return lambda rows: [answer_verdict(r) for r in rows]
