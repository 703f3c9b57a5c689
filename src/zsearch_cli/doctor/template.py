"""Chat template: the token stream the engine builds for a short conversation, against
``tokenizer.apply_chat_template`` of the same messages, turn by turn.

The real :class:`~zsearch_cli.rollout.engine.RolloutEngine` is driven through a fixed
N-turn episode (think, search, observation, ..., answer): a scripted backend hands it the
turns' ids and a fixed search backend the passages, so the stream is exactly what the engine
appends. Two comparisons per turn k:

* **inline**: the engine's text after turn k against the template's rendering of
  ``[system?, user, assistant(turns and observations so far)]`` left open
  (``continue_final_message``). zsearch's engine keeps observations inside the assistant
  turn (Search-R1's framing), so this is the conversation it trains on; any difference
  means the prompt or the framing is not what the template says.
* **history**: the chat form ``[..., assistant(t1), tool|user(o1), assistant(t2), ...]``
  rendered with k and with k + 1 turns. An append-only template renders the first as a
  prefix of the second. One that rewrites earlier turns (Qwen3 drops ``<think>`` from
  assistant turns before the last user message) breaks every trainer that re-templates
  the conversation each turn: the tokens trained on are not those sampled.
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from zsearch_cli.doctor.results import CheckResult
from zsearch_cli.models.base import GenerationOutput, SamplingParams
from zsearch_cli.retrieval.base import Passage
from zsearch_cli.search.base import SearchBackend, SearchRequest, SearchResult

QUESTION = "who wrote the novel pride and prejudice"
THOUGHTS = ("I need to find the author of the novel.", "The first result names the author; check the year.",
            "The second result agrees.", "Enough evidence.")
QUERIES = ("author of pride and prejudice", "pride and prejudice 1813 novel", "jane austen novels")
PASSAGE = Passage("doctor-1", "Pride and Prejudice", "Pride and Prejudice is an 1813 novel of manners written by Jane Austen.")
SAFE_PROTOCOL = ("keep one append-only token stream: template the prompt once and append each turn's sampled ids "
                 "and each observation's ids (what zsearch's engine does), never re-template earlier turns; serve "
                 "the trained agent with the same framing (zsearch agent serve)")


def script(protocol: Any, turns: int) -> list[str]:
    """The assistant's text of each turn: a thought and a search, the last one an answer."""
    out = []
    for k in range(turns):
        action = (protocol.render_search([QUERIES[k % len(QUERIES)]]) if k < turns - 1
                  else "<answer> Jane Austen </answer>")
        out.append(f"<think> {THOUGHTS[k % len(THOUGHTS)]} </think>\n{action}")
    return out


class ScriptedBackend:
    """A generation backend that answers call k with turn k's ids (one sample at a time)."""

    def __init__(self, tokenizer: Any, turns: Sequence[str]):
        self.tokenizer = tokenizer
        self.texts = list(turns)
        self.turns = [list(tokenizer.encode(t, add_special_tokens=False)) for t in turns]
        self.calls = 0

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 stop: Sequence[str] = ()) -> list[GenerationOutput]:
        ids, text = self.turns[self.calls], self.texts[self.calls]
        self.calls += 1
        ended = next((s for s in stop if text.endswith(s)), None)  # each scripted turn ends with its action's stop
        return [GenerationOutput(list(ids), [0.0] * len(ids), "stop", ended) for _ in prompts]


class FixedSearch(SearchBackend):
    """Every query finds :data:`PASSAGE`."""

    name = "doctor-fixed"

    def search(self, requests: Sequence[SearchRequest], topk: int) -> list[SearchResult]:
        return [SearchResult([PASSAGE]) for _ in requests]


def _first_difference(a: str, b: str) -> int | None:
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return at if at is not None or len(a) == len(b) else min(len(a), len(b))


def _around(text: str, at: int) -> str:
    return repr(text[max(0, at - 20): at + 30])


def engine_stream(tokenizer: Any, protocol: Any, texts: Sequence[str]) -> list[str]:
    """Drive the real engine through the scripted episode ``texts``; its text after each
    turn (prompt, turns and observations so far, special tokens kept)."""
    from zsearch_cli.config.parts import RolloutOptions
    from zsearch_cli.rollout.engine import RolloutEngine
    from zsearch_cli.rollout.state import QARow

    backend = ScriptedBackend(tokenizer, texts)
    engine = RolloutEngine(backend, protocol, FixedSearch(), RolloutOptions(max_turns=len(texts) - 1, topk=1), seed=0)
    traj = engine.rollout([QARow("doctor", QUESTION, ["Jane Austen"])])[0]
    mask = traj.loss_mask
    ends = [j + 1 for j, m in enumerate(mask) if m and (j + 1 == len(mask) or not mask[j + 1])]
    ids = list(traj.prompt_ids) + list(traj.response_ids)
    return [tokenizer.decode(ids[: len(traj.prompt_ids) + e], skip_special_tokens=False) for e in ends]


def _render(tokenizer: Any, messages: list[dict[str, str]], **kwargs: Any) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def check_chat_template(tokenizer: Any, protocol_name: str = "tags", turns: int = 3) -> CheckResult:
    """The engine's stream against the template, turn by turn (see the module docstring)."""
    from zsearch_cli.rollout.protocols import PROTOCOLS

    t0 = time.perf_counter()
    res = CheckResult("chat template", "")
    protocol = PROTOCOLS[protocol_name]()
    texts = script(protocol, turns)
    observation = protocol.render_observation([[PASSAGE]])
    head = ([{"role": "system", "content": protocol.system_prompt}] if protocol.system_prompt else [])
    head.append({"role": "user", "content": protocol.build_prompt(QUESTION)})
    if not getattr(tokenizer, "chat_template", None):
        res.summary = "no chat template: the engine encodes prompts as plain text"
        res.notes.append(res.summary)
        return res
    engine = engine_stream(tokenizer, protocol, texts)
    per_turn: list[dict[str, Any]] = []
    obs_role = "tool" if protocol_name == "tool_call" else "user"
    chat = list(head)
    previous = None
    for k in range(1, turns + 1):
        row: dict[str, Any] = {"turn": k}
        inline = [*head, {"role": "assistant", "content": observation.join(texts[:k])}]
        try:
            want = _render(tokenizer, inline, continue_final_message=True)
        except Exception as err:  # noqa: BLE001 - a template raises what it likes; one line names it
            want = None
            row["inline"] = f"the template cannot continue the assistant turn: {type(err).__name__}: {err}"
            res.fail(f"turn {k}: {row['inline']} (it rewrites the assistant's own text)")
        if want is not None:
            at = _first_difference(engine[k - 1], want)
            row["inline"] = None if at is None else {"char": at, "engine": _around(engine[k - 1], at),
                                                     "template": _around(want, at)}
            if at is not None and res.ok:
                res.fail(f"turn {k}: the engine's stream differs from apply_chat_template at char {at}: engine "
                         f"{_around(engine[k - 1], at)} vs template {_around(want, at)}")
        if k > 1:
            chat.append({"role": obs_role, "content": observation.strip()})
        chat.append({"role": "assistant", "content": texts[k - 1]})
        try:
            rendered = _render(tokenizer, chat)
        except Exception as err:  # noqa: BLE001
            row["history"] = f"cannot render the chat form: {type(err).__name__}: {err}"
            res.notes.append(f"turn {k}: {row['history']}")
            rendered = None
        if rendered is not None and previous is not None:
            kept = rendered.startswith(previous)
            row["history"] = "kept" if kept else "rewritten"
            if not kept:
                at = _first_difference(previous, rendered) or 0
                row["history_change"] = {"char": at, "before": _around(previous, at), "after": _around(rendered, at)}
                res.fail(f"rewrites history: adding turn {k} changes the rendering of the turns before it at char "
                         f"{at} ({_around(previous, at)} -> {_around(rendered, at)}); safe protocol: {SAFE_PROTOCOL}")
        previous = rendered
        per_turn.append(row)
    res.details = {"protocol": protocol_name, "observation_role": obs_role, "turns": per_turn}
    inline_ok = all(r.get("inline") is None for r in per_turn)
    history = [r.get("history") for r in per_turn if "history" in r]
    res.summary = (f"{turns} turns ({protocol_name}): engine = template inline {'yes' if inline_ok else 'NO'}; "
                   f"history {'append-only' if history and all(h == 'kept' for h in history) else 'REWRITTEN' if 'rewritten' in history else 'not rendered'}")
    res.seconds = time.perf_counter() - t0
    return res
