"""Answer metrics and rewards (docs/methods.md §1 and §5): pure functions of strings, no torch.

Gold answers may be one string or a list; every metric is the max over the golds. A gold
that normalizes to the empty string is skipped, since it would otherwise match (or be a
substring of) every prediction and reward anything.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from typing import Sequence

from zsearch_cli.rollout.protocols import get_protocol, validate_search_call

Golds = str | Sequence[str]

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_QUESTION = re.compile(r"<question>(.*?)</question>", re.DOTALL)
_SPECIAL_TAIL = re.compile(r"(?:\s*<\|[^|<>]*\|>)+\s*$")  # <|im_end|>, <|endoftext|> …
_YES_NO = ("yes", "no", "noanswer")

FORMAT_REWARD = 0.1  # the optional policy format bonus, see format_reward
PROPOSER_COMPONENT_MAX = 0.125  # each of Dr. Zero's four format components


# ---------------------------------------------------------------- §1 answer metrics


def normalize_answer(s: str) -> str:
    """docs/methods.md §1.1, in order: lowercase; drop string.punctuation; articles -> " ";
    collapse whitespace and strip."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _gold_list(golds: Golds) -> list[str]:
    """Normalized golds, empty ones dropped (see the module docstring)."""
    items = [golds] if isinstance(golds, str) else list(golds)
    return [g for g in (normalize_answer(x) for x in items) if g]


Response = str | Sequence[str]
"""What the extractors read: the model's own turns as the engine recorded them (a list:
the inserted observations, whose spans only the engine knows, are already left out), or
one response string that did not come from the engine (hand-written, external), which is
then split at observation blocks by text."""


def _segments(response: Response, protocol: str | None = None) -> list[str]:
    """The model's turns of ``response`` (see :data:`Response`)."""
    if not isinstance(response, str):
        return list(response)
    names = [protocol] if protocol else ["tags", "tool_call"]
    segments = [response]
    for name in names:
        segments = [part for seg in segments for part in get_protocol(name).assistant_segments(seg)]
    return segments


def _model_text(response: Response, protocol: str | None = None) -> str:
    """``response`` without inserted observations, so a retrieved passage that happens to
    contain ``<answer>`` can never be taken for the model's answer."""
    return "\n".join(_segments(response, protocol))


def extract_answer(response: Response) -> str | None:
    """Content of the last ``<answer>…</answer>`` in the response, stripped; None without one.

    Pass the response only, never the prompt: the prompt's example ``<answer> Beijing
    </answer>`` would otherwise count (Search-R1 works around that with "take the last of
    at least two tags"; we avoid it by construction). An engine trajectory needs none of
    this: the engine parsed its answer already (``Trajectory.prediction``).
    """
    found = _ANSWER.findall(_model_text(response))
    return found[-1].strip() if found else None


def em(pred: str, golds: Golds) -> float:
    """1.0 when normalize(pred) equals some normalized gold."""
    p = normalize_answer(pred)
    return float(any(p == g for g in _gold_list(golds)))


def subem(pred: str, golds: Golds) -> float:
    """1.0 when some normalized gold is a substring of normalize(pred) (DSPO; FlashRAG acc)."""
    p = normalize_answer(pred)
    return float(any(g in p for g in _gold_list(golds)))


def _f1_one(p: str, g: str) -> float:
    if (p in _YES_NO or g in _YES_NO) and p != g:  # FlashRAG's special case
        return 0.0
    p_tok, g_tok = p.split(), g.split()
    same = sum((Counter(p_tok) & Counter(g_tok)).values())  # IN
    if same == 0:
        return 0.0
    return 2.0 * same / (len(p_tok) + len(g_tok))  # 2·IN/(PN+RN)


def f1(pred: str, golds: Golds) -> float:
    """Token F1 (ZeroSearch's reward), max over golds."""
    p = normalize_answer(pred)
    return max((_f1_one(p, g) for g in _gold_list(golds)), default=0.0)


def score_answer(pred: str | None, golds: Golds) -> dict[str, float]:
    """``{"em", "f1", "subem"}`` for one prediction; None (no answer tag) scores all zeros."""
    if pred is None:
        return {"em": 0.0, "f1": 0.0, "subem": 0.0}
    return {"em": em(pred, golds), "f1": f1(pred, golds), "subem": subem(pred, golds)}


# ---------------------------------------------------------------- optional format reward


def _tags_balanced(segment: str, tags: Sequence[str]) -> bool:
    """Every opening tag in ``tags`` is closed before the next one opens (no nesting)."""
    pattern = re.compile(r"</?(" + "|".join(map(re.escape, tags)) + r")>")
    open_tag = None
    for m in pattern.finditer(segment):
        closing, tag = m.group(0).startswith("</"), m.group(1)
        if closing != (open_tag is not None) or (closing and tag != open_tag):
            return False
        open_tag = None if closing else tag
    return open_tag is None


def is_well_formed(response: Response, protocol: str = "tags") -> bool:
    """zsearch's format rule (none of the papers defines one for the policy).

    With the response split into the model's turns at the inserted observations:
    (a) think/action/answer tags are balanced and never nested; (b) every turn starts
    with a ``<think>`` block; (c) every turn but the last ends with one action that the
    protocol parses as a valid search, and holds no answer; (d) the last turn holds no
    action and ends with the response's only ``<answer>``, which is non-empty. A turn that
    got the invalid-action observation therefore fails (c).
    """
    proto = get_protocol(protocol)
    action, tags = proto.action_tag, ("think", proto.action_tag, "answer")
    turns = [_SPECIAL_TAIL.sub("", t).strip() for t in _segments(response, protocol)]
    *searches, final = turns
    for turn in turns:
        if not (_tags_balanced(turn, tags) and turn.startswith("<think>")):
            return False
    for turn in searches:
        if "<answer>" in turn or not turn.endswith(f"</{action}>"):
            return False
        if turn.count(f"<{action}>") != 1 or proto.parse(turn).kind != "search":
            return False
    if f"<{action}>" in final or final.count("<answer>") != 1 or not final.endswith("</answer>"):
        return False
    return bool(_ANSWER.findall(final)[-1].strip())


def format_reward(response: Response, protocol: str = "tags", value: float = FORMAT_REWARD) -> float:
    """``value`` (default 0.1) when :func:`is_well_formed`, else 0. Added to the outcome
    reward only when a run asks for it; Search-R1 and ZeroSearch use none."""
    return value if is_well_formed(response, protocol) else 0.0


def outcome_reward(
    response: Response, golds: Golds, metric: str = "em", protocol: str = "tags", format_bonus: float = 0.0
) -> float:
    """The policy reward: em / f1 / subem of the extracted answer, plus ``format_bonus``
    times well-formedness (0 by default, as in the papers)."""
    if metric not in ("em", "f1", "subem"):
        raise ValueError(f"unknown reward metric {metric!r}; choose em, f1 or subem")
    reward = score_answer(extract_answer(response), golds)[metric]
    if format_bonus:
        reward += format_reward(response, protocol, format_bonus)
    return reward


def trajectory_reward(prediction: str | None, turns: Sequence[str], golds: Golds, metric: str = "em",
                      protocol: str = "tags", format_bonus: float = 0.0) -> float:
    """:func:`outcome_reward` of an engine trajectory: the answer the engine parsed
    (``Trajectory.prediction``) is scored as is, not extracted again; ``turns`` (the model's
    own turn texts) only feed the optional format bonus."""
    if metric not in ("em", "f1", "subem"):
        raise ValueError(f"unknown reward metric {metric!r}; choose em, f1 or subem")
    reward = score_answer(prediction, golds)[metric]
    if format_bonus:
        reward += format_reward(turns, protocol, format_bonus)
    return reward


# ---------------------------------------------------------------- §5 Dr. Zero


def difficulty_reward(k: int, n: int) -> float:
    """I(0<k<n)·(n−k)/(n−1) (Dr. Zero eq. 4): 1 when one of n solver tries is right,
    falling linearly to 1/(n−1) at n−1 right; 0 when none or all are right (and for
    n = 1, where no 0<k<1 exists)."""
    if not 0 <= k <= n:
        raise ValueError(f"k must be in [0, n], got k={k}, n={n}")
    return (n - k) / (n - 1) if 0 < k < n else 0.0


def extract_question_answer(response: Response) -> tuple[str | None, str | None]:
    """The proposer's last ``<question>`` and the last ``<answer>`` after it, stripped.

    None for a missing part; an answer that only precedes the question does not count.
    Observations are ignored, so a retrieved passage cannot supply either.
    """
    text = _model_text(response)
    questions = list(_QUESTION.finditer(text))
    if not questions:
        found = _ANSWER.findall(text)
        return None, (found[-1].strip() if found else None)
    q = questions[-1]
    answers = _ANSWER.findall(text, q.end())
    return q.group(1).strip(), (answers[-1].strip() if answers else None)


def answer_in_question(answer: str, question: str) -> bool:
    """True when the normalized answer occurs in the normalized question as whole words
    (an answer that normalizes to nothing counts as contained).

    Dr. Zero's code tests a raw substring of the normalized strings, so "rome" would be
    "in" "romeo"; whole words keep the gate to verbatim leaks (docs/methods.md §5.2).
    """
    a, q = normalize_answer(answer).split(), normalize_answer(question).split()
    return not a or any(q[i : i + len(a)] == a for i in range(len(q) - len(a) + 1))


def answer_grounding(answer: str, evidence: str) -> float:
    """Dr. Zero's code's answer part, as a fraction (``--answer-reward grounded``; docs/methods.md
    §5.2): 1 when the normalised answer occurs as whole words in ``evidence`` (the source passage
    and the tool responses) and is at most 5 words long, 1/2 at most 10, else 0.

    Why zsearch has it (issue 38): real smollm2 proposers copy the prompt's example question and
    answer, which the paper's "extractable" pays in full; an answer that is in no passage the
    proposer saw is not Hop n of a chain that starts in the document."""
    words = normalize_answer(answer).split()
    if not words or not answer_in_question(answer, evidence):
        return 0.0
    return 1.0 if len(words) <= 5 else 0.5 if len(words) <= 10 else 0.0


def _tool_score(valid: int, invalid_calls: int, hops: int) -> float:
    """Fraction of the tool component: exact hops−1 valid searches score 1.

    Following Dr. Zero's code: any invalid call scores 0; for hops>1 no search scores 0,
    and too few score (1+valid)/hops. Too many is ours (docs/methods.md §5.2): the paper
    says "exactly n−1", while the code gives full marks; we score hops/(1+valid).
    """
    if invalid_calls:
        return 0.0
    if valid == hops - 1:
        return 1.0
    if valid == 0:
        return 0.0
    return min(1 + valid, hops) / max(1 + valid, hops)


def proposer_format_reward(response: Response, hops: int, evidence: str | None = None) -> dict[str, float | bool | int]:
    """Dr. Zero's format reward r_f (Appendix A; docs/methods.md §5.2): four components, each in
    [0, 0.125], and the integrity gate.

    ``response`` is the proposer's whole trajectory (its turns plus inserted
    ``<tool_response>`` blocks, optionally with Qwen chat scaffolding).

    - think: 0.125 × the fraction of turns that open with ``<think>…</think>``;
    - tool: 0.125 × :func:`_tool_score` of the complete ``<tool_call>`` blocks, a call
      being valid when named 'search' with a non-empty list of query strings;
    - question / answer: 0.125 each when a non-empty ``<question>`` / ``<answer>`` can be
      extracted. (The paper says "extractable". Dr. Zero's code instead always
      grants the question part once the gate passes, and grants the answer part only when
      the answer occurs in the source document or the tool responses and is ≤5 words,
      half for ≤10; that needs the document, which this reward sees only when ``evidence``,
      the source passage and the tool responses, is given: then the answer part is
      :func:`answer_grounding`'s, Dr. Zero's code's rule.)

    ``integrity`` is False when the question or answer is missing/empty or the answer
    appears in the question (:func:`answer_in_question`); then ``total`` is 0, and the
    whole proposer reward is 0 (:func:`proposer_reward`). Components are still reported.
    """
    if not isinstance(hops, int) or hops < 1:
        raise ValueError(f"hops must be a positive integer, not {hops!r}")
    turns = [t for t in _segments(response, "tool_call") if t.strip()]
    think = sum(1 for t in turns if re.match(r"\s*<think>.*?</think>", t, re.DOTALL))
    valid = invalid_calls = 0
    for payload in re.findall(r"<tool_call>(.*?)</tool_call>", "".join(turns), re.DOTALL):
        try:
            validate_search_call(payload.strip())
            valid += 1
        except ValueError:
            invalid_calls += 1
    question, answer = extract_question_answer(response)
    parts = {
        "think": PROPOSER_COMPONENT_MAX * think / max(1, len(turns)),
        "tool": PROPOSER_COMPONENT_MAX * _tool_score(valid, invalid_calls, hops),
        "question": PROPOSER_COMPONENT_MAX * bool(question),
        "answer": PROPOSER_COMPONENT_MAX * (bool(answer) if evidence is None else answer_grounding(answer or "", evidence)),
    }
    integrity = bool(question) and bool(answer) and not answer_in_question(answer or "", question or "")
    total = sum(parts.values()) if integrity else 0.0
    counts = {"searches": valid, "invalid_calls": invalid_calls}
    return {**parts, "integrity": integrity, "total": total, **counts}


def proposer_reward(k: int, n: int, fmt: dict) -> float:
    """r = I(0<k<n)·(n−k)/(n−1) + r_f, and 0 outright when the integrity gate fails."""
    if not fmt["integrity"]:
        return 0.0
    return difficulty_reward(k, n) + float(fmt["total"])
