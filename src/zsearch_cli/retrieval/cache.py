"""The server's in-memory result cache: an LRU bounded in entries and in (estimated) bytes."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, Sequence

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage

DEFAULT_CACHE_BYTES = 512 << 20
"""512 MiB of cached results (estimated; see :func:`result_bytes`)."""


class LRUCache:
    """A thread-safe least-recently-used map with hit/miss counters, bounded in entries
    and in (estimated) bytes.

    One lock guards everything; operations are a few dict moves, so contention is
    negligible next to a search. ``capacity=0`` or ``max_bytes=0`` turns caching off.
    An entry's size is ``sizeof(key, value)``; a single entry larger than the whole
    byte budget is not stored at all (it would only evict everything else).
    """

    def __init__(self, capacity: int, max_bytes: int = DEFAULT_CACHE_BYTES,
                 sizeof: Callable[[Hashable, Any], int] | None = None):
        if capacity < 0:
            raise ZsearchError(f"cache size must be >= 0, got {capacity}")
        if max_bytes < 0:
            raise ZsearchError(f"cache bytes must be >= 0, got {max_bytes}")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._sizeof = sizeof or (lambda key, value: 0)
        self._data: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get_many(self, keys: Sequence[Hashable]) -> list[Any | None]:
        """The cached value for each key, or None; hits become most recently used."""
        out: list[Any | None] = []
        with self._lock:
            for key in keys:
                entry = self._data.get(key)
                if entry is None:
                    self.misses += 1
                    out.append(None)
                else:
                    self.hits += 1
                    self._data.move_to_end(key)
                    out.append(entry[0])
        return out

    def put_many(self, items: Sequence[tuple[Hashable, Any]]) -> None:
        if self.capacity == 0 or self.max_bytes == 0:
            return
        sized = [(key, value, self._sizeof(key, value)) for key, value in items]
        with self._lock:
            for key, value, size in sized:
                if size > self.max_bytes:
                    continue
                old = self._data.pop(key, None)
                if old is not None:
                    self.bytes -= old[1]
                self._data[key] = (value, size)
                self.bytes += size
            while len(self._data) > self.capacity or self.bytes > self.max_bytes:
                _, (_, size) = self._data.popitem(last=False)
                self.bytes -= size

    def __len__(self) -> int:
        return len(self._data)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "size": len(self._data), "capacity": self.capacity,
                    "bytes": self.bytes, "max_bytes": self.max_bytes}


def result_bytes(key: Hashable, hits: Sequence[Passage]) -> int:
    """An estimate of the memory one cached result holds: its strings plus per-object
    overhead (CPython: ~50 bytes per str, ~70 per Passage, ~60 per tuple/list)."""
    query = key[0] if isinstance(key, tuple) and key and isinstance(key[0], str) else ""
    size = 200 + len(query.encode("utf-8", "surrogatepass"))
    for p in hits:
        size += 220 + len(p.id) + len(p.title.encode("utf-8", "surrogatepass")) + len(p.text.encode("utf-8", "surrogatepass"))
    return size


