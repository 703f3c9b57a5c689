"""Several copies of one retriever behind one client: the URL list, whose turn it is, and
which copies are down.

Search-R1 tells users to start a retriever on every node; a rollout that spreads its calls
over them must survive one of them dying. The policy, and why:

* **Round-robin** over the replicas that are up: a shared counter, so many rollout threads
  spread evenly without talking to each other.
* **Down for a while, not forever:** a replica that fails (connection refused, timeout, 5xx)
  is skipped for ``cooldown`` seconds, then tried again by the next request that reaches it:
  a restarted replica comes back on its own, without a health-check thread.
* **Never nothing to try:** when every replica is marked down, all are tried anyway (in
  turn order): the marks are a hint about where to go first, not a reason to fail.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from zsearch_cli.errors import ZsearchError

DEFAULT_COOLDOWN = 2.0
"""Seconds a failed replica is skipped before it is tried again."""


def parse_urls(urls: str | Sequence[str]) -> list[str]:
    """``"http://a:8000,http://b:8000"`` or a list of URLs -> base URLs without a trailing
    ``/retrieve`` or ``/health`` (duplicates kept once, order kept)."""
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    out: dict[str, None] = {}
    for raw in items:
        base = str(raw).strip().rstrip("/")
        if not base:
            continue
        for suffix in ("/retrieve", "/health"):
            if base.endswith(suffix):
                base = base[: -len(suffix)]
        if not base.startswith(("http://", "https://")):
            raise ZsearchError(f"retrieval url must start with http:// or https://, got {raw.strip()!r}")
        out[base] = None
    if not out:
        raise ZsearchError(f"no retrieval url in {urls!r}")
    return list(out)


@dataclass
class _Replica:
    url: str
    down_until: float = 0.0
    last_error: str | None = None
    ok: int = 0
    failed: int = field(default=0)


class ReplicaSet:
    """The replicas of one retriever; thread-safe."""

    def __init__(self, urls: Sequence[str], cooldown: float = DEFAULT_COOLDOWN):
        if cooldown < 0:
            raise ZsearchError(f"replica cooldown must be >= 0, got {cooldown}")
        self.replicas = [_Replica(u) for u in urls]
        self.cooldown = cooldown
        self._turn = 0
        self._lock = threading.Lock()

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def order(self) -> list[str]:
        """This request's try order: from the next replica in turn, the ones up first, then
        the ones down (so a request always has somewhere to go)."""
        with self._lock:
            start = self._turn
            self._turn = (self._turn + 1) % len(self.replicas)
            now = time.monotonic()
            turn = self.replicas[start:] + self.replicas[:start]
            return [r.url for r in turn if r.down_until <= now] + [r.url for r in turn if r.down_until > now]

    def _get(self, url: str) -> _Replica:
        return next(r for r in self.replicas if r.url == url)

    def succeeded(self, url: str) -> None:
        with self._lock:
            replica = self._get(url)
            replica.ok += 1
            replica.down_until, replica.last_error = 0.0, None

    def failed(self, url: str, reason: str) -> None:
        with self._lock:
            replica = self._get(url)
            replica.failed += 1
            replica.down_until, replica.last_error = time.monotonic() + self.cooldown, reason

    def status(self) -> list[dict[str, Any]]:
        """Per replica: ``url``, ``up`` (not in its cooldown), answers ``ok`` and ``failed``,
        and the ``last_error`` while it is down."""
        now = time.monotonic()
        with self._lock:
            return [{"url": r.url, "up": r.down_until <= now, "ok": r.ok, "failed": r.failed,
                     "last_error": r.last_error if r.down_until > now else None} for r in self.replicas]
