"""The simulator's text side: the prompts it sends and the parser for what comes back.

Two modes (ZeroSearch §3.3, Table 4):

* ``sft`` sends exactly the paper's Table 2 prompt (:func:`zsearch_cli.prompts.render_simulator_prompt`)
  as **raw text, without a chat template** (``SIM_CHAT_TEMPLATE``), to a model fine-tuned on
  that prompt (``zsearch simsft`` trains on the raw prompt text followed by the completion).
* ``prompt`` guides an untuned instruct model with our own one-shot example below, inside
  the model's chat template. As in ZeroSearch's prompt-only mode, a *useful* request shows
  the model the question and its answer, and a *noisy* one shows neither.

Whatever comes back is parsed by :func:`parse_documents` into at most k plain documents.
"""

from __future__ import annotations

import re
from typing import Sequence

from zsearch_cli.prompts import render_simulator_prompt
from zsearch_cli.prompts.simulator import (
    PROMPT_MODE_NOISY_EXAMPLE,
    PROMPT_MODE_NOISY_TEMPLATE,
    PROMPT_MODE_USEFUL_EXAMPLE,
    PROMPT_MODE_USEFUL_TEMPLATE,
)

SIM_CHAT_TEMPLATE = False
"""Whether ``sft`` mode wraps the Table 2 prompt in the simulator's chat template. False:
the prompt is the raw text the paper shows, and ``simsft`` trains on raw prompt + completion
with no template, so training and serving see identical text. (``prompt`` mode always uses
the chat template: it talks to an untuned instruct model.)"""

MODES = ("sft", "prompt")
SFT_DOCS = 5
"""Table 2 asks for "five" documents; an ``sft`` simulator can return no more."""

PLACEHOLDER_DOC = "No relevant information was found for this query."
"""The text of a padding document (when the simulator returned fewer than k)."""

def render_prompt_mode(quality: str, question: str, answer: str, query: str, k: int) -> str:
    """The user message of ``prompt`` mode (question and answer only for useful documents)."""
    if quality == "useful":
        return PROMPT_MODE_USEFUL_TEMPLATE.format(
            k=k, question=question, answer=answer, query=query, example=PROMPT_MODE_USEFUL_EXAMPLE
        )
    if quality == "noisy":
        return PROMPT_MODE_NOISY_TEMPLATE.format(k=k, query=query, example=PROMPT_MODE_NOISY_EXAMPLE)
    raise ValueError(f"simulator quality must be 'useful' or 'noisy', not {quality!r}")


def render_request_prompt(mode: str, quality: str, question: str, answers: Sequence[str], query: str, k: int) -> str:
    """The text one simulated search sends, for either mode (the first gold answer is used)."""
    if not answers:
        raise ValueError("the simulator prompt needs at least one gold answer")
    if mode == "sft":
        return render_simulator_prompt(quality, question, answers[0], query)
    return render_prompt_mode(quality, question, answers[0], query, k)


# --------------------------------------------------------------------------------------
# Parsing.
# --------------------------------------------------------------------------------------

# "Doc 1:", "Doc 1.", "Document 2)", "**Doc 3:**", "Doc 4 -" anywhere (models sometimes put
# several on one line), and "Doc 5(Title: ...)" as Search-R1 prints passages.
_DOC_MARKER = re.compile(r"(?:\*\*)?\bDoc(?:ument)?\s*#?\s*(\d{1,2})\s*(?:[:.)\-]|(?=\())\s*(?:\*\*)?", re.IGNORECASE)
# Bare numbered lines: "1.", "2)", "3:" , "[4]" at the start of a line.
_NUM_MARKER = re.compile(r"^[ \t]*(?:\*\*)?\[?(\d{1,2})(?:[.):\]])(?:\*\*)?[ \t]*", re.MULTILINE)
# Where a model that keeps going starts imitating the prompt again.
_TRAILER = re.compile(r"^\s*(?:Query:|(?:Useful|Noisy)?\s*Output:|You are the Google search engine)", re.IGNORECASE | re.MULTILINE)
_HAS_WORD = re.compile(r"\w")


def _clean(doc: str, max_chars: int) -> str:
    doc = " ".join(doc.split()).strip(" *-•")
    if len(doc) > max_chars:
        cut = doc[:max_chars]
        space = cut.rfind(" ")
        doc = (cut[:space] if space > max_chars // 2 else cut).rstrip(" ,;:")
    return doc


def _split_at(text: str, markers: list[re.Match]) -> list[str]:
    bounds = [m.end() for m in markers]
    starts = [m.start() for m in markers[1:]] + [len(text)]
    return [text[b:e] for b, e in zip(bounds, starts)]


def parse_documents(text: str, k: int, max_chars: int = 800) -> list[str]:
    """At most ``k`` documents out of a simulator's output, in order.

    Tolerates "Doc 1:" / "Doc 1." / "1." markers, several markers on one line, blank lines,
    a preamble before the first document and trailing junk (a model that goes on to write
    another "Query:" is cut there). With no markers at all, paragraphs (or, for a single
    paragraph, lines) count as documents. Whitespace is collapsed, documents without any
    word character are dropped, and each is capped at ``max_chars`` (at a word boundary).
    Returns fewer than ``k`` when fewer are there; the caller re-asks or pads.
    """
    if k <= 0 or not text:
        return []
    markers = list(_DOC_MARKER.finditer(text)) or list(_NUM_MARKER.finditer(text))
    # Junk after the documents: cut at the first prompt-like line past the first marker.
    trailer = _TRAILER.search(text, markers[0].end() if markers else 0)
    while trailer is not None and not markers and not text[: trailer.start()].strip():
        text = text[trailer.end() :]  # an echoed "Output:" before unmarked documents
        trailer = _TRAILER.search(text)
    if trailer is not None:
        text = text[: trailer.start()]
        markers = [m for m in markers if m.end() <= trailer.start()]
    if markers:
        pieces = _split_at(text, markers)
    else:
        paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
        pieces = paragraphs if len(paragraphs) > 1 else text.splitlines()
    docs = [_clean(p, max_chars) for p in pieces]
    return [d for d in docs if _HAS_WORD.search(d)][:k]
