"""A small client for an OpenAI-compatible completion server (``vllm serve``, sglang, …)
serving the ZeroSearch simulator, for ``--search sim+http://host:port/v1``.

Why a client of our own rather than the ``openai`` package: four fields and two endpoints
are all we need, and every call must go through zsearch's bounded retries
(:func:`zsearch_cli.retry.with_retries`) with a timeout, so a dead server fails a run with
a message naming its URL instead of hanging it (the anchor's client retries forever).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import urlsplit, urlunsplit

import requests

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retry import PermanentError, with_retries


@dataclass(frozen=True)
class CompletionCall:
    """One completion to request. ``chat`` sends ``messages`` to /chat/completions (the
    server applies the model's chat template); otherwise ``prompt`` goes to /completions."""

    prompt: str
    seed: int
    chat: bool = False
    system: str | None = None


def normalize_base_url(url: str) -> str:
    """``http://host:port`` → ``http://host:port/v1``; a URL with a path is kept as given."""
    parts = urlsplit(url.strip())
    if not parts.scheme or not parts.netloc:
        raise ZsearchError(f"{url!r} is not a URL: use sim+http://host:port/v1")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


class OpenAICompletionsClient:
    """Completions from one server, ``concurrency`` requests in flight at most."""

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 1.0,
        concurrency: int = 16,
        api_key: str | None = None,
    ):
        self.base_url = normalize_base_url(base_url)
        self._model = model
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.concurrency = max(1, int(concurrency))
        self.session = requests.Session()
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        if key:
            self.session.headers["Authorization"] = f"Bearer {key}"

    # ------------------------------------------------------------------ plumbing

    def _check(self, resp: requests.Response) -> Any:
        # 4xx other than timeout/rate limit will not get better by retrying (bad model name, …).
        if 400 <= resp.status_code < 500 and resp.status_code not in (408, 429):
            raise PermanentError(f"HTTP {resp.status_code}: {resp.text[:300]}")
        resp.raise_for_status()
        try:
            return resp.json()
        except ValueError:
            raise PermanentError(f"the answer is not JSON: {resp.text[:200]!r}") from None

    def _retried(self, what: str, call: Any) -> Any:
        return with_retries(call, what=f"simulator {what}", retries=self.retries, backoff=self.backoff)

    # ------------------------------------------------------------------ API

    @property
    def model(self) -> str:
        """The model name to send: ``--sim-model``, else the first id of GET /v1/models."""
        if self._model is None:
            url = f"{self.base_url}/models"

            def call() -> str:
                data = self._check(self.session.get(url, timeout=self.timeout)).get("data") or []
                if not data or not isinstance(data[0], dict) or "id" not in data[0]:
                    raise PermanentError(f"GET {url} lists no model; pass the name with --sim-model")
                return str(data[0]["id"])

            self._model = self._retried(f"GET {url}", call)
        return self._model

    def complete(self, item: CompletionCall, max_tokens: int, temperature: float, top_p: float) -> str:
        """The text of one completion (retried, bounded)."""
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "temperature": temperature,
                                "top_p": top_p, "seed": item.seed}
        if item.chat:
            messages = [{"role": "system", "content": item.system}] if item.system else []
            body["messages"] = messages + [{"role": "user", "content": item.prompt}]
            url = f"{self.base_url}/chat/completions"
        else:
            body["prompt"] = item.prompt
            url = f"{self.base_url}/completions"

        def call() -> str:
            choices = self._check(self.session.post(url, json=body, timeout=self.timeout)).get("choices") or []
            if not choices:
                raise PermanentError(f"POST {url} returned no choices")
            first = choices[0]
            text = first.get("message", {}).get("content") if item.chat else first.get("text")
            return text or ""

        return self._retried(f"POST {url}", call)

    def complete_many(
        self, items: Sequence[CompletionCall], max_tokens: int, temperature: float, top_p: float
    ) -> list[str]:
        """All ``items``, in order, through a bounded thread pool."""
        if not items:
            return []
        _ = self.model  # resolve the name once, before the threads start
        if len(items) == 1 or self.concurrency == 1:
            return [self.complete(i, max_tokens, temperature, top_p) for i in items]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(items))) as pool:
            return list(pool.map(lambda i: self.complete(i, max_tokens, temperature, top_p), items))
