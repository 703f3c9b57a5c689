"""``zsearch agent serve``: the multi-turn search agent behind OpenAI's chat API.

    POST /v1/chat/completions  {"model": M, "messages": [..., {"role": "user", "content": Q}]}
    -> {"choices": [{"message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}],
        "usage": {...}, "zsearch": {"turns": [...], "queries": [...], "num_searches": 1, ...}}
    GET /v1/models, GET /health

Each request runs the rollout engine ``zsearch eval --method agent`` runs (same prompt
protocol, limits and search backend) on the last user message; the answer is the engine's
parsed prediction (else the last turn's text). Earlier messages are not shown to the model:
the protocol's own prompt is. Requests are served on threads, but one engine rollout runs
at a time (a lock: the HF backend is not thread-safe), so requests queue; at most
``max_concurrent`` may be in flight (running or queued), the rest get a 429. Streaming is
per turn, not per token: one chunk per finished turn (its text as ``reasoning_content``,
its queries and results under ``zsearch``), then the answer as ``content`` with the whole
trajectory. Model output is only ever parsed, never evaluated.
"""

from __future__ import annotations

from zsearch_cli.errors import shown_spec

import asyncio
import dataclasses
import threading
import time
import uuid
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from zsearch_cli.agent.api import (Job, RequestError, answer_of, failure, parse_request, trajectory_view, turn_view,
                                   usage_of)
from zsearch_cli.http_json import answer_http_errors_in_json, dumps, error_response, json_response, read_body
from zsearch_cli.models.base import mix_seed
from zsearch_cli.rollout.engine import QARow, RolloutEngine
from zsearch_cli.rollout.trajectory import Trajectory

DEFAULT_MAX_BODY_BYTES = 1 << 20
ROW_ID = "request"
"""Every request's row id: the sampling seeds name it, so a request's ``seed`` reproduces it."""


class _Cancelled(Exception):
    """A streaming client went away: the rollout stops at its next turn."""


class _TurnEngine(RolloutEngine):
    """The engine, reporting each turn once it is complete (with its search results, if any)."""

    on_turn: Callable[[dict[str, Any]], None] | None = None
    cancelled: threading.Event | None = None

    def _check(self) -> None:
        if self.cancelled is not None and self.cancelled.is_set():
            raise _Cancelled()

    def turn_params(self, batch):  # type: ignore[no-untyped-def]
        self._check()  # before each turn is generated
        return super().turn_params(batch)

    def record_turns(self, batch, outs, done):  # type: ignore[no-untyped-def]
        pending = super().record_turns(batch, outs, done)
        searching = {id(s) for s, _ in pending}
        for s in batch:
            if self.on_turn is not None and id(s) not in searching:
                self.on_turn(s.turns[-1])
        return pending

    def observe(self, found, done):  # type: ignore[no-untyped-def]
        self._check()
        super().observe(found, done)
        for s, _ in found:
            if self.on_turn is not None:
                self.on_turn(s.turns[-1])


class AgentService:
    """The engine and its lock; one rollout at a time, each with its request's sampling."""

    def __init__(self, engine: RolloutEngine, model_name: str, max_concurrent: int = 16, seed: int = 0):
        self.engine, self.model_name, self.seed = engine, model_name, seed
        self.lock = threading.Lock()
        self.slots = threading.BoundedSemaphore(max_concurrent)
        self.max_concurrent = max_concurrent
        self.count = 0
        """Requests taken (running, queued or done)."""
        self.count_lock = threading.Lock()
        self.created = int(time.time())

    def defaults(self) -> Job:
        c = self.engine.config
        return Job("", c.temperature, c.top_p, c.max_turn_tokens, None)

    def run(self, job: Job, on_turn: Callable[[dict], None] | None = None,
            cancelled: threading.Event | None = None) -> Trajectory:
        """Roll out ``job`` (under the lock). Without a request seed the seed derives from the
        server's ``--seed`` and a request counter: reproducible per server run, new per request."""
        with self.count_lock:
            self.count += 1
            seed = job.seed if job.seed is not None else mix_seed(self.seed, self.count)
        cfg = dataclasses.replace(self.engine.config, temperature=job.temperature, top_p=job.top_p,
                                  max_turn_tokens=job.max_turn_tokens)
        engine = _TurnEngine(self.engine.backend, self.engine.protocol, self.engine.search, cfg, seed=seed)
        engine.on_turn, engine.cancelled = on_turn, cancelled
        with self.lock:
            return engine.rollout([QARow(ROW_ID, job.question, [])])[0]

    def health(self) -> dict[str, Any]:
        c = self.engine.config
        return {"status": "ok", "model": self.model_name, "requests": self.count, "max_concurrent": self.max_concurrent,
                "search": type(self.engine.search).__name__ if self.engine.search is not None else None,
                "protocol": self.engine.protocol.name, "max_turns": c.max_turns, "max_turn_tokens": c.max_turn_tokens}


def check_length(length: str | None, limit: int, error: type[RequestError]) -> None:
    """The agent's refusal by ``Content-Length``: one 413 for a header that is no byte count
    or is over ``limit`` (the retrieval server tells the two apart, 400 and 413); kept as the
    agent has always answered."""
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise error(413, f"body too large or bad Content-Length {length[:20]!r} (limit {limit} bytes)")


def create_app(engine: RolloutEngine, model_name: str, max_concurrent: int = 16, seed: int = 0,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, aliases: tuple[str, ...] = ()) -> FastAPI:
    """The FastAPI app serving ``engine`` as ``model_name`` (``aliases``: other names it answers to)."""
    service = AgentService(engine, model_name, max_concurrent, seed)
    names = (model_name, *aliases)
    app = FastAPI(title="zsearch agent server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service

    def head(kind: str) -> dict[str, Any]:
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model_name}

    def complete(job: Job) -> dict[str, Any]:
        try:
            t = service.run(job)
        finally:
            service.slots.release()
        content, finish = answer_of(t)
        message = {"role": "assistant", "content": content}
        return {**head("chat.completion"), "choices": [{"index": 0, "message": message, "logprobs": None,
                                                        "finish_reason": finish}],
                "usage": usage_of(t), "zsearch": trajectory_view(t)}

    def stream(job: Job) -> AsyncIterator[bytes]:
        """Start the rollout now (its thread releases the slot) and return the SSE events. The
        events come through an asyncio queue, so a client that disconnects cancels the wait at
        once (and the rollout at its next turn), not when the next turn is done."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()
        base = head("chat.completion.chunk")

        def put(kind: str, item: Any) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, (kind, item))
            except RuntimeError:  # the event loop is gone (the server stopped)
                cancelled.set()

        def work() -> None:
            try:
                put("done", service.run(job, lambda turn: put("turn", turn), cancelled))
            except _Cancelled:
                pass
            except Exception as err:  # noqa: BLE001 (reported to the client in the stream)
                put("error", failure(err))
            finally:
                service.slots.release()

        def chunk(delta: dict, finish: str | None = None, **extra: Any) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            body = {**base, "choices": [choice], **extra}
            return b"data: " + dumps(body) + b"\n\n"

        async def sse() -> AsyncIterator[bytes]:
            try:
                yield chunk({"role": "assistant", "content": ""})
                while True:
                    kind, item = await events.get()
                    if kind == "turn":
                        yield chunk({"reasoning_content": item["text"]}, zsearch={"turn": turn_view(item)})
                    elif kind == "error":
                        yield b"data: " + dumps(item.body()) + b"\n\n"
                        break
                    else:
                        content, finish = answer_of(item)
                        yield chunk({"content": content}, finish, zsearch=trajectory_view(item))
                        if job.include_usage:
                            yield b"data: " + dumps({**base, "choices": [], "usage": usage_of(item)}) + b"\n\n"
                        break
                yield b"data: [DONE]\n\n"
            finally:
                cancelled.set()  # a client that left stops the rollout at its next turn

        threading.Thread(target=work, name="zsearch-agent-stream", daemon=True).start()
        return sse()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        try:
            body = await read_body(request, max_body_bytes, RequestError, check_length)
            job = parse_request(body, names, service.defaults())
        except RequestError as err:
            return error_response(err)
        if not service.slots.acquire(blocking=False):
            return error_response(RequestError(429, f"server busy: {max_concurrent} requests in flight",
                                               kind="rate_limit_exceeded"))
        if job.stream:  # the slot is released when the rollout ends
            return StreamingResponse(stream(job), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            return json_response(await run_in_threadpool(complete, job))
        except Exception as err:  # noqa: BLE001 (one JSON error, never a traceback)
            return error_response(failure(err))

    @app.get("/v1/models")
    async def models() -> Response:
        return json_response({"object": "list", "data": [{"id": model_name, "object": "model",
                                                          "created": service.created, "owned_by": "zsearch"}]})

    @app.get("/health")
    async def health() -> Response:
        return json_response(service.health())

    answer_http_errors_in_json(app, RequestError)
    return app


def run_agent_server(opts: Any) -> None:
    """Load the model and search backend ``opts`` names, print where we listen, serve until stopped."""
    from rich.console import Console

    from zsearch_cli.retrieval.server import bind_socket, is_loopback
    from zsearch_cli.rollout.build import build_engine

    if not is_loopback(opts.host):
        Console(stderr=True).print(f"[bold yellow]warning:[/] listening on {opts.host}, not loopback: the server "
                                   "has no authentication, anyone who can reach this port can run the model",
                                   highlight=False)
    sock = bind_socket(opts.host, opts.port)  # before the model loads: a busy port fails fast
    try:
        engine = build_engine(opts)
    except BaseException:
        sock.close()
        raise
    name = opts.served_model_name or opts.policy.model
    app = create_app(engine, name, max_concurrent=opts.max_concurrent, seed=opts.seed,
                     max_body_bytes=opts.max_body_kb << 10, aliases=(opts.policy.model,))
    shown = f"[{opts.host}]" if ":" in opts.host else opts.host
    print(f"serving agent {name} (search {shown_spec(opts.retrieval.search)}, protocol {opts.rollout.protocol}) on "
          f"http://{shown}:{sock.getsockname()[1]}/v1  (POST /v1/chat/completions, GET /v1/models, GET /health; "
          "Ctrl+C stops)", flush=True)
    from zsearch_cli.retrieval.server import serve_until_stopped

    serve_until_stopped(app, sock)
