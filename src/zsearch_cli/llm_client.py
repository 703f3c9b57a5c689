"""The one client zsearch has for an OpenAI-compatible text endpoint (vLLM, SGLang,
llama.cpp, OpenAI): ``zsearch judge --judge-url`` and the simulated search engine
(``--search sim+http://host:port/v1``) both use :class:`LLMClient`.

Why our own and not the ``openai`` package: we need a handful of fields and three
endpoints, and each call must be explicit: a total deadline on every request (``timeout``:
connect, head and body together, so a server trickling bytes cannot stall a run; see
:mod:`zsearch_cli.net`), *bounded* retries
(a dead endpoint must fail the stage with a clear error naming its URL, never hang it;
ZeroSearch's released simulator client retries forever), and bounded concurrency so a batch
of prompts does not open hundreds of connections.

Retried (with :func:`zsearch_cli.retry.with_retries`): connection errors, timeouts, HTTP 408,
429 and 5xx. Not retried: any other 4xx (the request itself is wrong: a bad model name, a
bad key) and a 2xx body that is not an OpenAI-style answer. The key is read from the
environment (``OPENAI_API_KEY`` by default) and only ever sent in the Authorization header.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

import requests

from zsearch_cli import net
from zsearch_cli.errors import ZsearchError
from zsearch_cli.retry import PermanentError, with_retries

APIS = ("chat", "completions")
_ENDPOINTS = ("/chat/completions", "/completions")
_RETRYABLE_STATUS = {408, 429}
log = logging.getLogger(__name__)

OPENAI_SAMPLING: dict[str, float] = {"top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
"""The neutral value of every sampling field of OpenAI's own API that a request may leave out."""
SERVER_SAMPLING: dict[str, float] = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
"""The same for the fields servers such as vLLM and SGLang add (-1: no top-k cut in both)."""
NEUTRAL_SAMPLING: dict[str, float] = {**OPENAI_SAMPLING, **SERVER_SAMPLING}
"""Sent under every completion request, so the server samples exactly as the request says.
Why: ``vllm serve`` fills each field a request leaves out from the model's
``generation_config.json`` (Qwen2.5-7B-Instruct's: top_p 0.8, top_k 20, repetition_penalty
1.05), so a request that names only its temperature would get another distribution than the
one asked for, and a greedy one another argmax (the repetition penalty applies even there)."""


def normalize_base_url(url: str) -> str:
    """The API root of ``url``: ``http://host:port`` → ``http://host:port/v1``; a trailing
    endpoint (``…/chat/completions``, ``…/completions``) is dropped; any other path is kept."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ZsearchError(f"{url!r} is not an http(s) URL: use http://host:port/v1")
    path = parts.path.rstrip("/")
    for suffix in _ENDPOINTS:
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    else:
        path = path or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class LLMClient:
    """Texts from ``{base_url}/chat/completions`` (``api='chat'``: the prompt is the user
    message, after an optional system message; the server applies the chat template) or
    ``{base_url}/completions`` (``api='completions'``: raw text). ``base_url`` goes through
    :func:`normalize_base_url`. With no ``model`` the first id of ``GET {base_url}/models``
    is used, asked once. ``label`` starts every error message (then the URL).

    Safe to share between threads: a ``requests.Session`` is not thread-safe, so each
    request in flight borrows one of its own from a pool (and gives it back for reuse).
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api: str = "chat",
        label: str = "LLM endpoint",
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        concurrency: int = 8,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if api not in APIS:
            raise ZsearchError(f"unknown LLM api {api!r}: use chat or completions")
        if timeout <= 0 or retries < 0 or backoff < 0 or concurrency < 1:
            raise ZsearchError("LLM client needs timeout > 0, retries >= 0, backoff >= 0 and concurrency >= 1")
        self.base_url = normalize_base_url(base_url)
        self.api = api
        self.url = f"{self.base_url}/chat/completions" if api == "chat" else f"{self.base_url}/completions"
        self.label = label
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.concurrency = concurrency
        self._model = (model or "").strip() or None
        self._sleep = sleep
        self._api_key = os.environ.get(api_key_env) or None
        self._sessions: queue.SimpleQueue[requests.Session] = queue.SimpleQueue()
        self._model_lock = threading.Lock()
        self._server_sampling = True  # see _post_sampling

    # ------------------------------------------------------------------ plumbing

    def _retried(self, url: str, call: Callable[[], Any]) -> Any:
        return with_retries(call, what=f"{self.label} {url}", retries=self.retries, backoff=self.backoff,
                            sleep=self._sleep)

    def _send(self, method: str, url: str, body: dict[str, Any] | None = None) -> requests.Response:
        """One request; raises a plain exception for retryable failures, PermanentError else."""
        try:
            session = self._sessions.get_nowait()
        except queue.Empty:
            session = net.session()
            if self._api_key:
                session.headers["Authorization"] = f"Bearer {self._api_key}"
        try:
            resp = net.request(session, method, url, json=body, deadline=self.timeout)
        finally:
            self._sessions.put(session)
        if resp.status_code >= 500 or resp.status_code in _RETRYABLE_STATUS:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        if resp.status_code >= 400:
            raise PermanentError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        return resp

    def _models_once(self, url: str) -> str:
        resp = self._send("GET", url)
        try:
            return str(resp.json()["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise PermanentError(f"GET lists no model ({resp.text[:200]!r}); pass the model name") from None

    def _completion_once(self, body: dict[str, Any]) -> str:
        resp = self._post_sampling(body)
        try:
            choice = resp.json()["choices"][0]
            text = choice["message"]["content"] if self.api == "chat" else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise PermanentError(f"not an OpenAI-style {self.api} response: {resp.text[:200]!r}") from None
        return text or ""  # a null content (e.g. everything went to a reasoning field) is no text

    def _post_sampling(self, body: dict[str, Any]) -> requests.Response:
        """POST a completion with :data:`NEUTRAL_SAMPLING` under the caller's own fields. A
        server that rejects the fields OpenAI's own API lacks (:data:`SERVER_SAMPLING`) gets
        them dropped for the rest of this client's life, said once in the log."""
        if self._server_sampling:
            try:
                return self._send("POST", self.url, {**NEUTRAL_SAMPLING, **body})
            except PermanentError as err:
                if not (str(err).startswith("HTTP 400") and any(f in str(err) for f in SERVER_SAMPLING)):
                    raise
                self._server_sampling = False
                log.warning("%s %s rejects %s: sending OpenAI's sampling fields only", self.label, self.url,
                            "/".join(SERVER_SAMPLING))
        return self._send("POST", self.url, {**OPENAI_SAMPLING, **body})

    # ------------------------------------------------------------------ API

    @property
    def model(self) -> str:
        """The model name sent: the one given, else the first id of ``GET {base_url}/models``."""
        with self._model_lock:
            if self._model is None:
                url = f"{self.base_url}/models"
                self._model = self._retried(url, lambda: self._models_once(url))
            return self._model

    def complete_one(
        self,
        prompt: str,
        max_tokens: int,
        temperature: float = 0.0,
        *,
        top_p: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        system: str | None = None,
    ) -> str:
        """The generated text for one prompt (greedy by default). ``seed`` and ``stop`` are
        sent only when given, every other sampling field always (:data:`NEUTRAL_SAMPLING`);
        ``system`` needs ``api='chat'``."""
        if system and self.api != "chat":
            raise ZsearchError(f"{self.label} {self.url}: a system message needs the chat API")
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "temperature": temperature}
        if top_p is not None:
            body["top_p"] = top_p
        if seed is not None:
            body["seed"] = seed
        if stop:
            body["stop"] = list(stop)
        if self.api == "chat":
            body["messages"] = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return self._retried(self.url, lambda: self._completion_once(body))

    def complete(
        self,
        prompts: Sequence[str],
        max_tokens: int,
        temperature: float = 0.0,
        *,
        top_p: float | None = None,
        seeds: Sequence[int] | None = None,
        stop: Sequence[str] | None = None,
        system: str | None = None,
    ) -> list[str]:
        """Texts for all ``prompts``, in order, at most ``concurrency`` requests in flight;
        ``seeds`` gives each prompt its own. The first prompt that fails after its retries
        raises :class:`ZsearchError`; prompts no worker has picked up by then are never sent."""
        if seeds is not None and len(seeds) != len(prompts):
            raise ZsearchError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        per_prompt = seeds if seeds is not None else [None] * len(prompts)
        return self.map(lambda item: self.complete_one(item[0], max_tokens, temperature, top_p=top_p, seed=item[1],
                                                       stop=stop, system=system), list(zip(prompts, per_prompt)))

    def post(self, body: dict[str, Any], url: str | None = None) -> dict[str, Any]:
        """POST ``body`` (``model`` filled in when absent) to ``url`` (default: the
        endpoint), retried; the decoded JSON answer. For callers that need fields beyond the
        text (token ids, logprobs): :class:`~zsearch_cli.models.remote.RemoteBackend`."""
        body = {"model": self.model, **body}
        url = url or self.url

        def once() -> dict[str, Any]:
            resp = self._send("POST", url, body)
            try:
                answer = resp.json()
            except ValueError:
                raise PermanentError(f"not JSON: {resp.text[:200]!r}") from None
            if not isinstance(answer, dict):
                raise PermanentError(f"not a JSON object: {resp.text[:200]!r}")
            return answer

        return self._retried(url, once)

    def map(self, call: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        """``[call(item) for item in items]`` with at most ``concurrency`` calls in flight,
        in order. The first failure raises; items no worker has picked up by then are never
        sent."""
        if not items:
            return []
        _ = self.model  # resolve the name once, before the threads start
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(items)), thread_name_prefix="zsearch-llm")
        try:
            futures = [pool.submit(call, item) for item in items]
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
