"""Action protocols: how a policy asks for a search, how it answers, and what it is shown back.

A protocol is a small object the rollout engine consults; the engine loop never names a
tag. Adding a protocol means writing one subclass and registering it in :data:`PROTOCOLS`.

How an engine uses one (the contract every protocol keeps):

1. generate a turn with ``stop=protocol.stop_strings`` and keep the stop string in the
   output (vLLM ``include_stop_str_in_output=True``; HF ``stop_strings`` keeps it);
2. ``action = protocol.parse(turn_text)``;
3. ``answer`` -> done; ``search`` -> retrieve ``action.queries`` and append
   ``protocol.render_observation(docs, action)``, dropping whole passages to fit a token
   budget (the engine's ``_observation_ids``); ``invalid`` -> append
   ``protocol.render_invalid(action)``, or end the trajectory when
   ``protocol.end_on_invalid``; a search with no budget left -> end the trajectory as
   Search-R1 does, or append ``protocol.render_no_search_left()``.

**Which action wins when a turn holds several.** Generation stops at the first closing stop
string, so a turn holds at most one complete action and it ends the turn. :meth:`parse`
first cuts the text after the earliest stop string (an engine may overshoot by a few
tokens), so the *first complete action in text order* wins, e.g.
``<answer>a</answer><search>q</search>`` is an answer. Inside that action the content
starts at the *last* opening tag before the closing one, so ``<search> x <search> y
</search>`` searches ``y``: the model restarted its query. Search-R1 cuts at ``</search>``
before ``</answer>`` regardless of position; with both as stop strings that case cannot
arise during generation, and text order is the rule that matches what was generated.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Literal, Sequence

from zsearch_cli.errors import ZsearchError

from zsearch_cli.prompts import (
    DRZERO_SYSTEM_PROMPT,
    INVALID_ACTION_OBSERVATION,
    render_policy_prompt,
    render_solver_prompt,
)

if TYPE_CHECKING:  # only attributes are used; keeps this module free of pyarrow/numpy
    from zsearch_cli.retrieval.base import Passage

MAX_QUERY_CHARS = 512  # longer queries are cut, not rejected: the search still runs
MAX_QUERIES = 8  # per tool call; more is rejected as invalid

Docs = Sequence[Sequence["Passage"]]


@dataclass(frozen=True)
class Action:
    """One parsed turn. ``queries`` is non-empty only for ``search``; ``answer`` only for
    ``answer``; ``error`` (a one-line reason) only for ``invalid``."""

    kind: Literal["search", "answer", "invalid"]
    queries: list[str] = field(default_factory=list)
    answer: str | None = None
    error: str | None = None


def invalid(error: str) -> Action:
    return Action(kind="invalid", error=error)


def truncate_at_stop(text: str, stop_strings: Sequence[str]) -> str:
    """``text`` up to and including the earliest stop string; unchanged if none occurs."""
    hits = [(i, -len(s), s) for s in stop_strings if (i := text.find(s)) >= 0]
    if not hits:
        return text
    i, _, s = min(hits)
    return text[: i + len(s)]


def _block_content(text: str, tag: str) -> str | None:
    """Content of the ``<tag>…</tag>`` that ends ``text``, from the last opening tag; None
    when ``text`` does not end with ``</tag>`` or has no opening tag before it."""
    close = f"</{tag}>"
    if not text.endswith(close):
        return None
    start = text.rfind(f"<{tag}>", 0, len(text) - len(close))
    if start < 0:
        return None
    return text[start + len(tag) + 2 : len(text) - len(close)]


def _doc_head(i: int, p: "Passage", sep: str = "") -> str:
    """``Doc i(Title: "T")`` as Search-R1 prints it: its title is the first line of a wiki-18
    ``contents`` string, quotes included (paper Appendix: ``Doc 1(Title: "Empire…")``).
    Titleless passages (ZeroSearch's simulated documents) print as ZeroSearch's ``Doc i:``."""
    return f'Doc {i}{sep}(Title: "{p.title}")' if p.title else f"Doc {i}:"


def render_observation_parts(passages: Sequence["Passage"]) -> list[str]:
    """Search-R1's per-passage lines, ``Doc i(Title: "T") text\\n``, numbered from 1, so an
    engine can keep the first m whole passages and still close the tag."""
    return [f"{_doc_head(i, p)} {p.text}\n" for i, p in enumerate(passages, 1)]


def format_passages(passages: Sequence["Passage"]) -> str:
    """The body of an ``<information>`` block (Search-R1 strips the joined lines)."""
    return "".join(render_observation_parts(passages)).strip()


def wrap_information(parts: Sequence[str]) -> str:
    """``\\n\\n<information>{parts}</information>\\n\\n`` (docs/methods.md §2.2)."""
    return "\n\n<information>" + "".join(parts).strip() + "</information>\n\n"


class Protocol(ABC):
    """What the engine needs from an action format. Subclasses set the class attributes and
    implement the abstract methods; :meth:`parse` is shared."""

    name: ClassVar[str]
    action_tag: ClassVar[str]  # the tag that carries a search, e.g. "search"
    observation_tag: ClassVar[str]  # the tag results come back in, e.g. "information"
    _stops: ClassVar[tuple[str, ...]]
    system_prompt: ClassVar[str | None] = None  # a system message to send, if any
    end_on_invalid: ClassVar[bool] = False  # end the trajectory instead of render_invalid
    _observation_re: ClassVar[re.Pattern[str]]

    @property
    def stop_strings(self) -> list[str]:
        """Generation stops at these (a fresh list: callers may mutate it)."""
        return list(self._stops)

    def parse(self, turn_text: str) -> Action:
        """The action that ends ``turn_text`` (see the module docstring for the rules)."""
        text = truncate_at_stop(turn_text, self._stops).rstrip()
        answer = _block_content(text, "answer")
        if answer is not None:
            return Action(kind="answer", answer=answer.strip())
        payload = _block_content(text, self.action_tag)
        if payload is not None:
            return self._parse_search(payload)
        for tag in ("answer", self.action_tag):
            if text.endswith(f"</{tag}>"):
                return invalid(f"</{tag}> without an opening <{tag}>")
        return invalid(f"no complete <{self.action_tag}> or <answer> in the turn")

    @abstractmethod
    def _parse_search(self, payload: str) -> Action:
        """The action for the content of one complete search tag."""

    @abstractmethod
    def render_observation(self, docs: Docs | None, action: Action | None = None) -> str:
        """The text appended after a search turn; ``docs[j]`` are the passages for query
        j, best first. ``None`` means no search ran. The token budget is the engine's."""

    @abstractmethod
    def render_invalid(self, action: Action) -> str:
        """The text appended after an invalid turn."""

    @abstractmethod
    def render_no_search_left(self) -> str:
        """The text appended when the model searches after its budget is spent."""

    @abstractmethod
    def build_prompt(self, question: str) -> str:
        """The user-message content for ``question``."""

    @abstractmethod
    def render_search(self, queries: Sequence[str]) -> str:
        """The action text of a search for ``queries`` (what a well-formed turn ends with)."""

    def assistant_segments(self, response: str) -> list[str]:
        """``response`` (all turns plus inserted observations) split into the model's own
        turns, observations removed. A trailing unclosed observation is dropped too."""
        last = response.rfind(f"<{self.observation_tag}>")
        if last >= 0 and response.find(f"</{self.observation_tag}>", last) < 0:
            response = response[:last]
        return self._observation_re.split(response)


class TagsProtocol(Protocol):
    """Search-R1 / ZeroSearch: ``<search> q </search>`` and ``<answer> a </answer>``,
    results in ``<information>``."""

    name = "tags"
    action_tag = "search"
    observation_tag = "information"
    _stops = ("</search>", "</answer>")
    _observation_re = re.compile(
        r"<information>.*?</information>|" + re.escape(INVALID_ACTION_OBSERVATION.strip()), re.DOTALL
    )

    def _parse_search(self, payload: str) -> Action:
        query = payload.strip()
        if not query:
            return invalid("empty search query")
        return Action(kind="search", queries=[query[:MAX_QUERY_CHARS]])

    def render_observation(self, docs: Docs | None, action: Action | None = None) -> str:
        """docs/methods.md §2.2. Passages of several queries (not produced by this protocol) are
        numbered on. ``None`` gives Search-R1's empty block."""
        passages = [p for per_query in (docs or []) for p in per_query]
        return wrap_information(render_observation_parts(passages))

    def render_invalid(self, action: Action) -> str:
        """Search-R1's fixed text (docs/methods.md §2.2); the specific error is only logged."""
        return INVALID_ACTION_OBSERVATION

    def render_no_search_left(self) -> str:
        """Search-R1 itself inserts nothing here: after ``max_turns`` searches it runs one
        final turn with search disabled and ends the trajectory whatever the model wrote, so
        a search there goes unanswered and earns no answer reward (zsearch's engine does the
        same, finishing with 'max_turns'). An engine that answers such a search instead
        appends this block, in the shape of a result so it is loss-masked like one."""
        return (
            "\n\n<information>No more searches are allowed. I must now give the final answer "
            "between <answer> and </answer>.</information>\n\n"
        )

    def render_search(self, queries: Sequence[str]) -> str:
        return f"<search> {queries[0]} </search>"  # Search-R1 issues one query per turn

    def build_prompt(self, question: str) -> str:
        """As Search-R1's data scripts do: strip, end with '?', fill the template."""
        question = question.strip()
        if question and not question.endswith("?"):
            question += "?"
        return render_policy_prompt(question)


def validate_search_call(payload: str) -> list[str]:
    """The queries of one ``<tool_call>`` payload, or ValueError naming what is wrong.

    Expected: ``{"name": "search", "arguments": {"query_list": ["q1", …]}}`` (Figures 5-8).
    Parsed with json.loads only; queries are stripped and cut to MAX_QUERY_CHARS.
    """
    try:
        call = json.loads(payload)
    except (ValueError, RecursionError):
        raise ValueError("tool call is not valid JSON") from None
    if not isinstance(call, dict):
        raise ValueError("tool call must be a JSON object")
    name = call.get("name")
    if name != "search":
        raise ValueError(f"unknown tool {str(name)[:64]!r}; the only tool is 'search'")
    args = call.get("arguments")
    if not isinstance(args, dict):
        raise ValueError("tool call 'arguments' must be a JSON object")
    queries = args.get("query_list")
    if not isinstance(queries, list) or not queries:
        raise ValueError("'query_list' must be a non-empty list of strings")
    if len(queries) > MAX_QUERIES:
        raise ValueError(f"too many queries ({len(queries)} > {MAX_QUERIES})")
    out = []
    for j, q in enumerate(queries, 1):
        if not isinstance(q, str):
            raise ValueError(f"query {j} in 'query_list' is not a string")
        if not q.strip():
            raise ValueError(f"query {j} in 'query_list' is empty")
        out.append(q.strip()[:MAX_QUERY_CHARS])
    return out


def tool_response_payload(docs: Docs | None) -> str:
    """The tool message content Dr. Zero's search tool returns (verl
    ``search_r1_like_utils``): ``{"result": …}`` JSON, where each query's passages read
    ``Doc i (Title: "T")\\ntext`` joined by blank lines, and queries are joined by
    ``\\n---\\n``. Chat-template engines send this as a ``tool`` message."""
    if not docs:
        return json.dumps({"result": "No search results found."}, ensure_ascii=False)
    blocks = [
        "\n\n".join(f"{_doc_head(i, p, ' ')}\n{p.text}" for i, p in enumerate(ps, 1)).strip()
        for ps in docs
    ]
    return json.dumps({"result": "\n---\n".join(blocks)}, ensure_ascii=False)


def _tool_response(payload: str) -> str:
    """Inline form of a tool message, as Qwen2.5's chat template frames its body."""
    return f"\n<tool_response>\n{payload}\n</tool_response>\n"


class ToolCallProtocol(Protocol):
    """Dr. Zero / Qwen: ``<tool_call> {"name": "search", "arguments": {"query_list": […]}}
    </tool_call>`` and ``<answer>``, results in ``<tool_response>``.

    In Dr. Zero (verl + sglang) a turn without a parseable tool call ends the trajectory,
    hence ``end_on_invalid``; :meth:`render_invalid` serves engines that continue.
    """

    name = "tool_call"
    action_tag = "tool_call"
    observation_tag = "tool_response"
    _stops = ("</tool_call>", "</answer>")
    system_prompt = DRZERO_SYSTEM_PROMPT
    end_on_invalid = True
    # Also swallows Qwen chat scaffolding around a tool message, decoded with or without
    # special tokens ("<|im_end|>\n<|im_start|>user\n" or a bare "user\n").
    _observation_re = re.compile(
        r"(?:<\|im_end\|>)?\s*(?:<\|im_start\|>)?(?:user|tool)?\s*<tool_response>.*?</tool_response>"
        r"\s*(?:<\|im_end\|>)?\s*(?:<\|im_start\|>)?(?:assistant\b)?",
        re.DOTALL,
    )

    def _parse_search(self, payload: str) -> Action:
        try:
            return Action(kind="search", queries=validate_search_call(payload.strip()))
        except ValueError as err:
            return invalid(str(err))

    def render_observation(self, docs: Docs | None, action: Action | None = None) -> str:
        return _tool_response(tool_response_payload(docs))

    def render_invalid(self, action: Action) -> str:
        """Our text (Dr. Zero has none): the error, then Search-R1's hint in this format."""
        msg = (
            f"Error: {action.error or 'invalid action'}. If I want to search, I should put a "
            'JSON call {"name": "search", "arguments": {"query_list": ["..."]}} between '
            "<tool_call> and </tool_call>. If I want to give the final answer, I should put "
            "the answer between <answer> and </answer>."
        )
        return _tool_response(json.dumps({"result": msg}, ensure_ascii=False))

    def render_no_search_left(self) -> str:
        """Our text (see :meth:`TagsProtocol.render_no_search_left`)."""
        msg = "No more searches are allowed. Give the final answer between <answer> and </answer>."
        return _tool_response(json.dumps({"result": msg}, ensure_ascii=False))

    def render_search(self, queries: Sequence[str]) -> str:
        call = {"name": "search", "arguments": {"query_list": list(queries)}}
        return f"<tool_call> {json.dumps(call, ensure_ascii=False)} </tool_call>"

    def build_prompt(self, question: str) -> str:
        """Figure 6; Dr. Zero strips the question and adds nothing."""
        return render_solver_prompt(question.strip())


PROTOCOLS: dict[str, type[Protocol]] = {
    TagsProtocol.name: TagsProtocol,
    ToolCallProtocol.name: ToolCallProtocol,
}


def get_protocol(name: str) -> Protocol:
    """An instance of the protocol called ``name`` (``--protocol``): the one check of a
    protocol name, against this registry; an unknown one is a one-line error listing it."""
    try:
        return PROTOCOLS[name]()
    except KeyError:
        raise ZsearchError(f"unknown --protocol {name!r}: use one of {', '.join(PROTOCOLS)}") from None
