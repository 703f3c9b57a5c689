"""SerpAPI answers on disk, keyed by (query, k, engine), so a rerun does not pay twice.

SQLite, because it gives what the cache needs without a server: each write is one atomic
transaction (a crash never leaves half an entry), several processes (``zsearch serve
--workers N``, or a collect run beside an eval) share one file safely (WAL mode; a writer
waits up to ``busy_timeout`` for another), and a lookup is one indexed read. Only
successful answers are stored; the API key is never part of a key or a value.

Hit and miss counts are this process's (each worker counts its own); the entries are
shared by every process using the file.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from zsearch_cli.errors import ZsearchError
from zsearch_cli.retrieval.base import Passage

SCHEMA = """CREATE TABLE IF NOT EXISTS serpapi (
    query TEXT NOT NULL, k INTEGER NOT NULL, engine TEXT NOT NULL,
    passages TEXT NOT NULL, created REAL NOT NULL DEFAULT (julianday('now')),
    PRIMARY KEY (query, k, engine))"""


def default_cache_path() -> Path:
    """``$ZSEARCH_CACHE/serpapi.sqlite`` (else ``~/.cache/zsearch/serpapi.sqlite``)."""
    from zsearch_cli.models.loading import cache_dir

    return cache_dir() / "serpapi.sqlite"


class SerpAPICache:
    """A thread-safe view of one cache file (one connection, one lock: SQLite calls are
    short next to a web request)."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA busy_timeout=30000")
            self._db.execute(SCHEMA)
        except (OSError, sqlite3.Error) as err:
            raise ZsearchError(f"SerpAPI cache {self.path}: cannot open it ({err})") from None
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, query: str, k: int, engine: str) -> list[Passage] | None:
        with self._lock:
            row = self._db.execute("SELECT passages FROM serpapi WHERE query = ? AND k = ? AND engine = ?",
                                   (query, k, engine)).fetchone()
            if row is None:
                self.misses += 1
                return None
            self.hits += 1
        return [Passage(id=i, title=t, text=x) for i, t, x in json.loads(row[0])]

    def put(self, query: str, k: int, engine: str, passages: list[Passage]) -> None:
        value = json.dumps([[p.id, p.title, p.text] for p in passages], ensure_ascii=False)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO serpapi (query, k, engine, passages) VALUES (?, ?, ?, ?)",
                             (query, k, engine, value))

    def stats(self) -> dict[str, object]:
        with self._lock:
            entries = self._db.execute("SELECT COUNT(*) FROM serpapi").fetchone()[0]
            looked = self.hits + self.misses
            return {"path": str(self.path), "entries": entries, "hits": self.hits, "misses": self.misses,
                    "hit_rate": round(self.hits / looked, 4) if looked else None, "scope": "counts per worker"}

    def close(self) -> None:
        with self._lock:
            self._db.close()
