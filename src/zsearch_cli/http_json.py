"""JSON over HTTP for zsearch's two FastAPI apps (``zsearch serve``'s retrieval server and
``zsearch agent serve``): a request body read within a size limit and decoded as a JSON
object, and every answer, refusals included, sent as compact JSON.

Both apps check their bodies by hand instead of through pydantic, so that every refusal is
one JSON error in the app's own shape: never a 422 with a nested pydantic report, never a
500 with a traceback. Only that shape differs between them: :class:`RequestError` answers
``{"error": message}`` (Search-R1's retriever), and the agent's subclass answers OpenAI's
``{"error": {"message", "type", "param", "code"}}``. Each helper that refuses takes the
class to raise, so a refusal is in the right shape where it is raised.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException


class RequestError(Exception):
    """A refused request: answered with ``status`` and :meth:`body`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": self.message}


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON. A lone surrogate (decoded model text, or a remote server's JSON,
    can hold one) becomes '?' instead of failing the whole response."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "replace")


def json_response(obj: Any, status: int = 200) -> Response:
    return Response(dumps(obj), status_code=status, media_type="application/json")


def error_response(err: RequestError) -> Response:
    return json_response(err.body(), err.status)


def parse_object(body: bytes, error: type[RequestError] = RequestError) -> dict[str, Any]:
    """A request body's JSON object, or an ``error`` (400)."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise error(400, f"body is not valid JSON ({err})") from None
    except RecursionError:  # e.g. [[[[...]]]] 2000 deep: the stdlib parser recurses per level
        raise error(400, "body is not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise error(400, f"body must be a JSON object, got {type(data).__name__}")
    return data


def check_content_length(length: str | None, limit: int, error: type[RequestError] = RequestError) -> None:
    """Refuse a body by its ``Content-Length`` header, before reading it: 400 for a header
    that is no byte count, 413 for one over ``limit``."""
    if length is None:
        return
    if not length.isdigit():
        raise error(400, f"invalid Content-Length {length!r}")
    if int(length) > limit:
        raise error(413, f"body too large: {length} bytes (limit {limit})")


CheckLength = Callable[[str | None, int, type[RequestError]], None]
"""``(Content-Length header or None, limit, error class)``: raises to refuse the body."""


async def read_body(request: Request, limit: int, error: type[RequestError] = RequestError,
                    check_length: CheckLength = check_content_length) -> bytes:
    """The body, at most ``limit`` bytes: refused by its header first (``check_length``), and
    while it streams in (413) for a chunked body or one that outgrows its header, so an
    oversized body is never held whole."""
    check_length(request.headers.get("content-length"), limit, error)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise error(413, f"body too large: over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def answer_http_errors_in_json(app: FastAPI, error: type[RequestError] = RequestError) -> None:
    """Starlette's own refusals (404 unknown path, 405 wrong verb) in the app's error shape,
    not FastAPI's ``{"detail": ...}``."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return error_response(error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}"))
