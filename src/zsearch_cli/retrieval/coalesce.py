"""Micro-batching for the retrieval server: small requests that arrive while a search runs
ride the next batched search together, first come first served.

Why: under RL load a server sees hundreds of one-query requests at once (slime's
``search_concurrency`` 256, verl's search tool). Searched one request per thread, they fight
over the GIL and finish in whatever order the scheduler picks, so the slowest wait several
times as long as the median. Queued and searched in batches, in arrival order, every request
waits at most for the batch ahead of it and its own: the tail stays near the median, and a
batched BM25 search costs less per query than the same queries one by one.

Only requests of at most :data:`COALESCE_MAX_QUERIES` queries are queued; a bigger one (a
GRPO turn's 2560) is a batch already and is searched on its own, beside the queue.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Callable, Sequence

from starlette.concurrency import run_in_threadpool

COALESCE_MAX_QUERIES = 64
"""Requests with more queries than this are searched on their own."""
MAX_BATCH_QUERIES = 1024
"""Queries one coalesced search takes at most (the rest wait for the next)."""


class Coalescer:
    """Queues small requests and drains them, oldest first, into batched calls of
    ``search(queries, topk, fields)`` (the service's: its cache sits inside), one at a time
    in the threadpool. Requests with different ``topk`` never share a call."""

    def __init__(self, search: Callable[..., tuple[list[list[Any]], Any]], max_batch: int = MAX_BATCH_QUERIES):
        self._search = search
        self.max_batch = max_batch
        self._queue: deque[tuple[Sequence[str], int, asyncio.Future]] = deque()
        self._drainer: asyncio.Task | None = None
        self.requests = 0
        """Requests that went through the queue."""
        self.calls = 0
        """Batched searches made for them."""

    async def search(self, queries: Sequence[str], topk: int) -> list[list[Any]]:
        future = asyncio.get_running_loop().create_future()
        self._queue.append((queries, topk, future))
        self.requests += 1
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(self._drain())
        return await future

    def _next_batch(self) -> tuple[int, list[tuple[Sequence[str], int, asyncio.Future]]]:
        """The oldest request's topk and the oldest requests with it, up to ``max_batch``
        queries (always at least one request); the others keep their places."""
        topk = self._queue[0][1]
        batch, skipped, size = [], [], 0
        while self._queue and (not batch or size + len(self._queue[0][0]) <= self.max_batch):
            item = self._queue.popleft()
            if item[1] == topk:
                batch.append(item)
                size += len(item[0])
            else:
                skipped.append(item)
        self._queue.extendleft(reversed(skipped))
        return topk, batch

    async def _drain(self) -> None:
        while self._queue:
            topk, batch = self._next_batch()
            queries = [q for qs, _, _ in batch for q in qs]
            self.calls += 1
            try:
                results, _ = await run_in_threadpool(self._search, queries, topk, {})
            except Exception as err:  # every request of the batch gets the source's error
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(err)
                continue
            at = 0
            for qs, _, future in batch:
                if not future.done():  # a client that went away cancelled its future
                    future.set_result(results[at : at + len(qs)])
                at += len(qs)
