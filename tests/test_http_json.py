"""``http_json``: the request-body and JSON-error plumbing both FastAPI apps share, over real
HTTP on 127.0.0.1, in both error shapes: the retrieval server's ``{"error": message}`` and
the agent server's OpenAI-shaped one (its own error class and Content-Length wording)."""

from __future__ import annotations

from typing import Iterator

import pytest
import requests
from fastapi import FastAPI, Request
from fastapi.responses import Response

from zsearch_cli.agent.api import RequestError as AgentError
from zsearch_cli.agent.server import check_length as agent_check_length
from zsearch_cli.http_json import (RequestError, answer_http_errors_in_json, check_content_length, dumps,
                                   error_response, json_response, parse_object, read_body)
from zsearch_cli.retrieval.server import serving

LIMIT = 64


def echo_app(error: type[RequestError], check_length=check_content_length) -> FastAPI:
    """POST /echo answers the body's JSON object, as both servers read theirs."""
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> Response:
        try:
            return json_response(parse_object(await read_body(request, LIMIT, error, check_length), error))
        except RequestError as err:
            return error_response(err)

    @app.get("/health")
    async def health() -> Response:
        return json_response({"status": "ok"})

    answer_http_errors_in_json(app, error)
    return app


@pytest.fixture(scope="module")
def plain() -> Iterator[str]:
    with serving(echo_app(RequestError)) as url:
        yield url


@pytest.fixture(scope="module")
def agent_shaped() -> Iterator[str]:
    with serving(echo_app(AgentError, agent_check_length)) as url:
        yield url


def openai(message: str) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}}


def test_a_json_object_comes_back_compact_and_utf8(plain: str) -> None:
    resp = requests.post(plain + "/echo", data='{"q": "Zürich", "n": [1, 2]}'.encode(), timeout=10)
    assert resp.status_code == 200 and resp.content == '{"q":"Zürich","n":[1,2]}'.encode()
    assert resp.headers["content-type"] == "application/json"


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "body is not valid JSON (Expecting property name enclosed in double quotes: "
                        "line 1 column 2 (char 1))"),
    (b"[1, 2]", 400, "body must be a JSON object, got list"),
    (b"[" * 5000 + b"]" * 5000, 413, "body too large: 10000 bytes (limit 64)"),
])
def test_refusals_in_both_shapes(plain: str, agent_shaped: str, body: bytes, status: int, message: str) -> None:
    resp = requests.post(plain + "/echo", data=body, timeout=10)
    assert (resp.status_code, resp.json()) == (status, {"error": message})
    resp = requests.post(agent_shaped + "/echo", data=body, timeout=10)
    if status == 413:  # the agent words a refusal by Content-Length its own way
        message = f"body too large or bad Content-Length '{len(body)}' (limit {LIMIT} bytes)"
    assert (resp.status_code, resp.json()) == (status, openai(message))


def test_a_chunked_body_is_cut_off_at_the_limit(plain: str, agent_shaped: str) -> None:
    for url, shape in ((plain, lambda m: {"error": m}), (agent_shaped, openai)):
        chunks = iter([b'{"a": "' + b"x" * 40, b"x" * 40 + b'"}'])  # no Content-Length: sent chunked
        resp = requests.post(url + "/echo", data=chunks, timeout=10)
        assert (resp.status_code, resp.json()) == (413, shape(f"body too large: over {LIMIT} bytes"))


def test_unknown_path_and_wrong_verb_in_the_app_shape(plain: str, agent_shaped: str) -> None:
    resp = requests.get(plain + "/nope", timeout=10)
    assert (resp.status_code, resp.json()) == (404, {"error": "GET /nope: Not Found"})
    resp = requests.get(agent_shaped + "/echo", timeout=10)
    assert (resp.status_code, resp.json()) == (405, openai("GET /echo: Method Not Allowed"))


def test_content_length_header_checks() -> None:
    check_content_length(None, LIMIT)  # chunked: checked while it streams in
    check_content_length(str(LIMIT), LIMIT)
    with pytest.raises(RequestError) as err:
        check_content_length("12x", LIMIT)  # uvicorn refuses such a header itself; a library caller may not
    assert (err.value.status, err.value.message) == (400, "invalid Content-Length '12x'")
    with pytest.raises(AgentError) as err:
        agent_check_length("12x", LIMIT, AgentError)
    assert err.value.status == 413 and err.value.body() == openai(
        f"body too large or bad Content-Length '12x' (limit {LIMIT} bytes)")


def test_a_lone_surrogate_is_sent_as_a_question_mark() -> None:
    # decoded model text (or a remote server's JSON) can hold one; it must not fail the response
    assert dumps({"text": "a\ud800b"}) == b'{"text":"a?b"}'
