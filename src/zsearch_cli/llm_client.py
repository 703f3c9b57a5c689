"""A small client for any OpenAI-compatible text endpoint (vLLM, SGLang, llama.cpp, OpenAI).

Why our own and not the ``openai`` package: we need four things and nothing else, and each
must be explicit: greedy requests, a timeout on every call, *bounded* retries (a dead
endpoint must fail the stage with a clear error, never hang it), and bounded concurrency
so a batch of prompts does not open hundreds of connections.

Retried (with :func:`zsearch_cli.retry.with_retries`): connection errors, timeouts, HTTP 408,
429 and 5xx. Not retried: any other 4xx (the request itself is wrong: a bad model name, a
bad key) and a 2xx body that is not an OpenAI-style completion. The key is read from the
environment (``OPENAI_API_KEY`` by default) and only ever sent in the Authorization header.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import requests

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retry import PermanentError, with_retries

APIS = ("chat", "completions")
_RETRYABLE_STATUS = {408, 429}


class LLMClient:
    """Send prompts to ``{base_url}/chat/completions`` (``api='chat'``: the prompt is one
    user message, the server applies the chat template) or ``{base_url}/completions``
    (``api='completions'``: raw text). ``base_url`` is the API root, e.g.
    ``http://127.0.0.1:8000/v1``; a trailing endpoint path is tolerated.

    Safe to share between threads: each thread gets its own ``requests.Session``.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api: str = "chat",
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        concurrency: int = 8,
        sleep: Callable[[float], None] = time.sleep,
    ):
        base = base_url.strip().rstrip("/")
        for suffix in ("/chat/completions", "/completions"):
            if base.endswith(suffix):
                base = base[: -len(suffix)]
        if not base.startswith(("http://", "https://")):
            raise ZsearchError(f"LLM endpoint url must start with http:// or https://, got {base_url!r}")
        if api not in APIS:
            raise ZsearchError(f"unknown LLM api {api!r}: use chat or completions")
        if not model.strip():
            raise ZsearchError("an LLM endpoint needs a model name")
        if timeout <= 0 or retries < 0 or backoff < 0 or concurrency < 1:
            raise ZsearchError("LLM client needs timeout > 0, retries >= 0, backoff >= 0 and concurrency >= 1")
        self.base_url = base
        self.model = model
        self.api = api
        self.url = f"{base}/chat/completions" if api == "chat" else f"{base}/completions"
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.concurrency = concurrency
        self._sleep = sleep
        self._api_key = os.environ.get(api_key_env) or None
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            if self._api_key:
                session.headers["Authorization"] = f"Bearer {self._api_key}"
        return session

    def _payload(self, prompt: str, max_tokens: int, temperature: float, stop: Sequence[str] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "temperature": temperature}
        if stop:
            body["stop"] = list(stop)
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    def _once(self, body: dict[str, Any]) -> str:
        """One request; raises a plain exception for retryable failures, PermanentError else."""
        resp = self._session().post(self.url, json=body, timeout=self.timeout)
        if resp.status_code >= 500 or resp.status_code in _RETRYABLE_STATUS:
            raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        if resp.status_code >= 400:
            raise PermanentError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            choice = resp.json()["choices"][0]
            text = choice["message"]["content"] if self.api == "chat" else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise PermanentError(f"not an OpenAI-style {self.api} response: {resp.text[:200]!r}") from None
        return text or ""  # a null content (e.g. everything went to a reasoning field) is no text

    def complete_one(
        self, prompt: str, max_tokens: int, temperature: float = 0.0, stop: Sequence[str] | None = None
    ) -> str:
        """The generated text for one prompt (greedy by default)."""
        body = self._payload(prompt, max_tokens, temperature, stop)
        return with_retries(lambda: self._once(body), what=f"LLM endpoint {self.url}", retries=self.retries,
                            backoff=self.backoff, sleep=self._sleep)

    def complete(
        self, prompts: Sequence[str], max_tokens: int, temperature: float = 0.0, stop: Sequence[str] | None = None
    ) -> list[str]:
        """Texts for all ``prompts``, in order, at most ``concurrency`` requests in flight.
        The first prompt that fails after its retries raises :class:`ZsearchError`; prompts
        no worker has picked up by then are never sent."""
        if not prompts:
            return []
        pool = ThreadPoolExecutor(max_workers=min(self.concurrency, len(prompts)), thread_name_prefix="zsearch-llm")
        try:
            futures = [pool.submit(self.complete_one, p, max_tokens, temperature, stop) for p in prompts]
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
