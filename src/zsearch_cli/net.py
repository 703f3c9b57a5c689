"""HTTP requests with a *total* deadline, for every remote call zsearch makes (retriever,
simulator, judge, solver, SerpAPI).

Why not ``requests``' ``timeout``: it bounds each socket read, not the request. A server
that trickles one byte every few seconds never trips it, and a training run waits forever.
Here each request runs under a watchdog: when its deadline passes, the socket the request
is using is shut down, the blocked read returns at once, and the caller gets
:class:`DeadlineExceeded` (which :func:`zsearch_cli.retry.with_retries` retries, boundedly).

The watchdog finds the socket through the connection classes of the sessions made by
:func:`session`: each connection, when it connects or sends, registers with the deadline
of the request running in its thread.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

_local = threading.local()


class DeadlineExceeded(Exception):
    """The whole request (connect, headers, body) took longer than its deadline."""


class _Deadline:
    """A timer that shuts down the socket of the connection attached to it when it fires."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.expired = False
        self._conn: Any = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def attach(self, conn: Any) -> None:
        with self._lock:
            self._conn = conn
            if self.expired:
                _shutdown(conn)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            if self._conn is not None:
                _shutdown(self._conn)

    def __enter__(self) -> "_Deadline":
        _local.deadline = self
        self._timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._timer.cancel()
        _local.deadline = None


def _shutdown(conn: Any) -> None:
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)  # a blocked recv() returns now, in the request's thread
        except OSError:
            pass


class _Watched:
    """Mixin for urllib3 connections: register with the current request's deadline."""

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        _register(self)

    def request(self, *args: Any, **kwargs: Any) -> Any:
        _register(self)
        return super().request(*args, **kwargs)  # type: ignore[misc]


def _register(conn: Any) -> None:
    deadline = getattr(_local, "deadline", None)
    if deadline is not None:
        deadline.attach(conn)


class _HTTPConnection(_Watched, HTTPConnection):
    pass


class _HTTPSConnection(_Watched, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class _Adapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOLS)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if hasattr(manager, "pool_classes_by_scheme"):
            manager.pool_classes_by_scheme = dict(_POOLS)
        return manager


def session() -> requests.Session:
    """A ``requests.Session`` whose requests :func:`request` can hold to a deadline."""
    s = requests.Session()
    s.mount("http://", _Adapter())
    s.mount("https://", _Adapter())
    return s


def request(sess: requests.Session, method: str, url: str, *, deadline: float, **kwargs: Any) -> requests.Response:
    """``sess.request(method, url, **kwargs)`` with its body read, all within ``deadline``
    seconds; raises :class:`DeadlineExceeded` otherwise. ``sess`` must come from
    :func:`session`. Connect and per-read timeouts are the deadline too, so a silent server
    fails as fast as a trickling one."""
    if deadline <= 0:
        raise ValueError("deadline must be > 0")
    with _Deadline(deadline) as watch:
        try:
            resp = sess.request(method, url, timeout=(deadline, deadline), stream=True, **kwargs)
            try:
                _ = resp.content  # the whole body, under the watchdog
            finally:
                resp.close()
        except Exception as err:
            if watch.expired or isinstance(err, requests.Timeout):
                raise DeadlineExceeded(_late(deadline)) from None
            raise
    if watch.expired:  # finished with the socket already shut: the body may be cut
        raise DeadlineExceeded(_late(deadline))
    return resp


def _late(deadline: float) -> str:
    return f"timed out after {deadline:g}s (the deadline of the whole request)"
