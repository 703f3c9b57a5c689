"""The wire format of ``zsearch agent serve``: OpenAI chat requests in (checked by hand, so
every refusal is one OpenAI-shaped JSON error, never a traceback), and a trajectory out as a
chat completion with a ``zsearch`` field."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from typing import Any

from zsearch_cli import http_json
from zsearch_cli.text_check import text_problem
from zsearch_cli.errors import ZsearchError
from zsearch_cli.rollout.trajectory import Trajectory
from zsearch_cli.search.base import SearchBackendError

log = logging.getLogger("zsearch.agent")

MAX_QUESTION_CHARS = 32_000
ROLES = {"system", "developer", "user", "assistant", "tool", "function"}
NEUTRAL = {"n": 1, "logprobs": False, "frequency_penalty": 0, "presence_penalty": 0, "top_logprobs": 0}
"""Parameters accepted only at the value that changes nothing."""
KNOWN = {"user", "metadata", "store", "stream_options", "model", "messages", "temperature", "top_p", "max_tokens",
         "max_completion_tokens", "seed", "stream"}
"""Parameters read below, or (user, metadata, store) accepted and ignored; any other is a 400."""


class RequestError(http_json.RequestError):
    """Answered with ``status`` and OpenAI's ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(status, message)
        self.param, self.code, self.kind = param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass
class Job:
    """One chat request, checked: the question and how to sample it."""

    question: str
    temperature: float
    top_p: float
    max_turn_tokens: int
    seed: int | None
    stream: bool = False
    include_usage: bool = False


def _show(value: Any) -> str:
    """A short rendering of a bad value for an error message."""
    scalar = value is None or isinstance(value, (str, int, float, bool))
    return json.dumps(value)[:40] if scalar else type(value).__name__


def _number(data: dict, key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(400, f"'{key}' must be a number, got {_show(value)}", key)
    if value < lo or value > hi or (lo_open and value == lo):
        raise RequestError(400, f"'{key}' must be in {'(' if lo_open else '['}{lo}, {hi}], got {value}", key)
    return float(value)


def _content(message: dict, i: int) -> str:
    content = message.get("content")
    if isinstance(content, list):  # [{"type": "text", "text": "..."}, ...]
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise RequestError(400, f"'messages'[{i}].content: only text parts are supported", "messages")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise RequestError(400, f"'messages'[{i}].content must be a string or a list of text parts", "messages")
    problem = text_problem(content)  # a lone surrogate would fail the tokenizer: 500 and a traceback
    if problem:
        raise RequestError(400, f"'messages'[{i}].content {problem}: send valid Unicode text", "messages")
    return content


def parse_request(body: bytes, model_names: tuple[str, ...], defaults: Job) -> Job:
    """A :class:`Job` from a /v1/chat/completions body, or a :class:`RequestError`.
    ``defaults`` holds the server's sampling and its per-turn token cap."""
    data = http_json.parse_object(body, RequestError)
    for key, value in data.items():
        if key in KNOWN or value is None or (key in NEUTRAL and value == NEUTRAL[key]
                                                  and isinstance(value, bool) == isinstance(NEUTRAL[key], bool)):
            continue
        raise RequestError(400, f"unsupported parameter {key!r}" + (f" (only {NEUTRAL[key]!r})" if key in NEUTRAL
                                                                     else ""), key)
    model = data.get("model")
    if model is not None and model not in model_names:
        raise RequestError(404, f"The model {str(model)[:200]!r} does not exist: this server serves "
                                f"{model_names[0]!r}", "model", "model_not_found")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list of messages", "messages")
    question = None
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise RequestError(400, f"'messages'[{i}] must be an object with a role in {sorted(ROLES)}", "messages")
        if m["role"] == "user":
            question = _content(m, i)
    if question is None or not question.strip():
        raise RequestError(400, "'messages' must hold a user message with a non-empty question", "messages")
    if len(question) > MAX_QUESTION_CHARS:
        raise RequestError(400, f"the question is {len(question)} characters (at most {MAX_QUESTION_CHARS})",
                           "messages")
    cap = defaults.max_turn_tokens
    max_tokens = data.get("max_completion_tokens", data.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError(400, f"'max_tokens' must be a positive integer, got {_show(max_tokens)}",
                           "max_tokens")
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or abs(seed) >= 2**63):
        raise RequestError(400, f"'seed' must be a 64-bit integer, got {_show(seed)}", "seed")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "'stream' must be true or false", "stream")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise RequestError(400, "'stream_options' must be {\"include_usage\": true|false}", "stream_options")
    return Job(question=question,
               temperature=_number(data, "temperature", defaults.temperature, 0.0, 2.0),
               top_p=_number(data, "top_p", defaults.top_p, 0.0, 1.0, lo_open=True),
               max_turn_tokens=cap if max_tokens is None else min(max_tokens, cap),
               seed=seed, stream=stream, include_usage=bool(options.get("include_usage", False)))


# ----------------------------------------------------------------------------- responses


def turn_view(turn: dict[str, Any]) -> dict[str, Any]:
    """One turn for the API: its text, action and queries, and per query the ids and titles found."""
    out = {k: turn.get(k) for k in ("turn", "text", "action", "queries", "finish")}
    if "docs" in turn:
        out["results"] = [[{"id": d["id"], "title": d["title"]} for d in docs] for docs in turn["docs"]]
    return out


def trajectory_view(t: Trajectory) -> dict[str, Any]:
    """The ``zsearch`` field: the whole search trajectory behind an answer."""
    return {"prediction": t.prediction, "finish_reason": t.finish_reason, "num_turns": t.num_turns,
            "num_searches": t.num_searches, "num_invalid": t.num_invalid,
            "queries": [q for turn in t.turns if "docs" in turn for q in turn["queries"]],
            "turns": [turn_view(turn) for turn in t.turns], "prompt_tokens": t.prompt_tokens,
            "policy_tokens": t.policy_tokens, "response_tokens": t.response_tokens}


def answer_of(t: Trajectory) -> tuple[str, str]:
    """(content, OpenAI finish_reason): the prediction, else the last turn's text."""
    content = t.prediction if t.prediction is not None else (t.turns[-1]["text"] if t.turns else "")
    return content, "length" if t.truncated else "stop"


def usage_of(t: Trajectory) -> dict[str, int]:
    """Prompt tokens, and the tokens the model sampled (observations are not completion)."""
    return {"prompt_tokens": t.prompt_tokens, "completion_tokens": t.policy_tokens,
            "total_tokens": t.prompt_tokens + t.policy_tokens}


def failure(err: Exception) -> RequestError:
    """The error a failed rollout answers with (an unexpected one is logged with its traceback)."""
    if isinstance(err, RequestError):
        return err
    if isinstance(err, SearchBackendError):
        return RequestError(502, str(err), kind="server_error", code="search_failed")
    if isinstance(err, ZsearchError):  # e.g. a prompt over --max-context-tokens
        return RequestError(400, str(err))
    log.exception("rollout failed", exc_info=err)
    return RequestError(500, f"internal error: {type(err).__name__}: {err}", kind="server_error")
