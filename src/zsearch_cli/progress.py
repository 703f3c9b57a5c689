"""Progress that reaches a log file, and stopping on SIGTERM / SIGINT.

rich's progress bars draw nothing when stderr is not a terminal (``nohup``, Slurm,
``> log 2>&1``) but their last frame (so every bar is made by :func:`progress_bar`, off in
that mode), and a long phase then looks dead. :class:`ProgressLines` prints plain lines
instead, in that mode only: one at the start of each phase, then at most one every
``ZSEARCH_LOG_EVERY`` seconds (default 30) with the counts, the elapsed time, the rate and
an ETA; a daemon thread prints ``still <phase> …`` when nothing was printed for that long
(a long model load or a long first step is visibly alive).

:class:`StopSignals` turns SIGTERM / SIGINT into :class:`Stopped` (immediately, or at the
next :meth:`StopSignals.check` for a loop that must finish its step first); the CLI prints
its one-line message and exits 128 + the signal number (143, 130).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.console import Console

err_console = Console(stderr=True)
"""The console for stderr that commands and library code share (errors, warnings, progress)."""

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def log_mode() -> bool:
    """Whether stderr is not a terminal: rich draws no bars, plain lines are printed."""
    isatty = getattr(sys.stderr, "isatty", None)
    return not (isatty is not None and not getattr(sys.stderr, "closed", False) and isatty())


def progress_bar(*columns: Any, disable: bool = False, **kwargs: Any) -> Any:
    """rich's ``Progress(*columns, **kwargs)``, disabled in :func:`log_mode`: there it draws
    no bar while running but prints its last frame when it stops, a bar line in the log
    file (:class:`ProgressLines` prints the plain lines there). Every command's bar is made
    here."""
    from rich.progress import Progress

    return Progress(*columns, disable=disable or log_mode(), **kwargs)


def log_every() -> float:
    """Seconds between two progress lines: ``ZSEARCH_LOG_EVERY`` (default 30)."""
    try:
        return max(0.05, float(os.environ.get("ZSEARCH_LOG_EVERY", "30")))
    except ValueError:
        return 30.0


def quiet_third_party() -> None:
    """In log mode, silence the tqdm bars of transformers / huggingface_hub / datasets: in a log
    file each redraw is another line."""
    if not log_mode():
        return
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def duration(seconds: float) -> str:
    """``75`` -> ``1m15s``; ``3700`` -> ``1h01m``."""
    s = int(seconds)
    if s < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    return f"{s // 60}m{s % 60:02d}s" if s < 3600 else f"{s // 3600}h{s % 3600 // 60:02d}m"


START_GRACE = 2.0
"""Seconds a phase runs before its "started" line prints: a phase that fails at once (a
missing file) then ends with its one-line error alone, and one that is quick says nothing
until its last line; anything long is announced within 2 s."""


class ProgressLines:
    """Plain progress lines for one phase (``with ProgressLines("eval nq/test", 100, "questions")``).

    :meth:`advance` counts (and sets shown fields such as ``em``) and prints when a line is due;
    :meth:`phase` names what is running now (``rollout step 3/10``), shown by the heartbeat.
    Prints nothing when stderr is a terminal (rich's bar shows there) unless ``enabled``."""

    def __init__(self, label: str, total: int | None = None, unit: str = "steps", done: int = 0,
                 enabled: bool | None = None, every: float | None = None):
        self.label, self.total, self.unit = label, total, unit
        self.count = self.start_count = self.shown = done
        self.fields: dict[str, Any] = {}
        self.current = ""
        self.enabled = log_mode() if enabled is None else enabled
        self.every = log_every() if every is None else every
        self.stream = sys.stderr
        self.lock = threading.Lock()
        self.t0 = self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.grace = min(self.every, START_GRACE)
        self._unstarted = True  # the "started" line waits out the grace (see START_GRACE)

    def __enter__(self) -> "ProgressLines":
        if self.enabled:
            self._thread = threading.Thread(target=self._beat, name="zsearch-heartbeat", daemon=True)
            self._thread.start()
        return self

    def _start_line(self) -> None:
        """The phase's "started" line, once: when it has lasted the grace, or before its first
        other line."""
        with self.lock:
            if not self._unstarted:
                return
            self._unstarted = False
        self.emit(self.line(started=True))

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop the heartbeat; a last line when the count moved since the last one."""
        if self.enabled and self._thread is not None and self.count != self.shown:
            self.emit(self.line())
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1)
        self._thread = None

    def phase(self, text: str) -> None:
        """What is running now (``rolling out step 3/10``): the heartbeat's lines show it."""
        self.current = text

    def advance(self, n: int = 1, **fields: Any) -> None:
        with self.lock:
            self.count += n
            self.fields.update(fields)
            due = time.monotonic() - self.last >= self.every
        if due and self.enabled:
            self._start_line()
            self.emit(self.line())

    def emit(self, text: str) -> None:
        with self.lock:
            self.last, self.shown = time.monotonic(), self.count
            try:
                self.stream.write(text + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # a closed log: progress is not worth a crash
                pass

    def line(self, started: bool = False, still: bool = False) -> str:
        elapsed = time.monotonic() - self.t0
        counts = (f"{self.count}/{self.total} {self.unit}" if self.total is not None
                  else f"{self.count} {self.unit}" if self.count else "").strip()
        fields = [f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in self.fields.items() if v is not None]
        counts = ", ".join(x for x in (counts, *fields) if x)
        if still:
            text = f"still {self.current or 'working'}" + (f" ({counts})" if counts else "")
        else:
            text = "; now ".join(x for x in (counts, self.current) if x)
        if started:
            return f"{self.label}: {text} | started".replace(":  |", ": |")
        parts = [f"elapsed {duration(elapsed)}"]
        made = self.count - self.start_count
        if made > 0 and elapsed > 0:
            rate = made / elapsed
            unit = self.unit or "items"
            parts.append(f"{rate:.3g} {unit}/s" if rate >= 1 else f"{1 / rate:.3g} s/{unit.rstrip('s')}")
            if self.total is not None and self.count < self.total:
                parts.append(f"ETA {duration((self.total - self.count) / rate)}")
        return f"{self.label}: {text} | {', '.join(parts)}".replace(":  |", ": |")

    def _beat(self) -> None:
        while not self._stop.wait(min(self.every, self.grace, 0.5)):
            if self._unstarted and time.monotonic() - self.t0 >= self.grace:
                self._start_line()
            elif time.monotonic() - self.last >= self.every:
                self.emit(self.line(still=self.count == self.shown))


@contextmanager
def heartbeat(label: str, what: str, enabled: bool | None = None) -> Iterator[ProgressLines]:
    """A phase without counts (``heartbeat("train", "loading the model")``): its start line,
    then ``still …`` lines while it lasts."""
    lines = ProgressLines(label, unit="", enabled=enabled)
    lines.current = what
    with lines:
        yield lines


class Stopped(BaseException):
    """A run stopped by a signal; ``str()`` is the one line to print, :attr:`code` the exit status.

    A ``BaseException``, like ``KeyboardInterrupt``: it may be raised anywhere in a step that is
    abandoned (a search call, a retry loop, a reward), and no ``except Exception`` on the way
    may swallow it. ``abandoned``: raised inside :meth:`StopSignals.abandonable` (the step's
    work is incomplete). ``hard_exit``: the command leaves with ``os._exit`` once the line is
    printed, because threads may still be blocked in calls that were abandoned."""

    def __init__(self, signum: int, message: str = "", *, abandoned: bool = False, hard_exit: bool = False):
        self.signum = signum
        self.abandoned = abandoned
        self.hard_exit = hard_exit
        super().__init__(message or f"stopped by {signal.Signals(signum).name}")

    name = property(lambda self: signal.Signals(self.signum).name)
    code = property(lambda self: 128 + self.signum)
    """The exit status: 128 + the signal's number (SIGTERM 143, SIGINT 130)."""


_ACTIVE: list["StopSignals"] = []


def active_stop() -> "StopSignals | None":
    """The :class:`StopSignals` a CLI command installed (None in library use: signals keep
    their usual meaning)."""
    return _ACTIVE[-1] if _ACTIVE else None


class StopSignals:
    """``with StopSignals(immediate) as stop:`` — SIGTERM / SIGINT raise :class:`Stopped` at
    once (``immediate``), or only set :attr:`signum` for :meth:`check` between steps (a second
    signal then raises at once). Inside :meth:`abandonable` (work that may be thrown away: a
    training step before its first optimizer step) a signal raises at once too; inside
    :meth:`deferred` (a file being written) it only sets the flag. ``announce(signum)``, when
    set, gives a line printed the moment the first signal arrives, so a log shows the stop at
    once even when writing the state takes a while. Installs nothing outside the main thread."""

    def __init__(self, immediate: bool = False):
        self.immediate = immediate
        self.signum: int | None = None
        self.announce: Callable[[int], str] | None = None
        self._defer = 0
        self._abandonable = 0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._old[sig] = signal.signal(sig, self._handle)
            _ACTIVE.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        if self._old:
            _ACTIVE.remove(self)
        self._old.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.signum is None
        self.signum = self.signum or signum
        if first and self.announce is not None:
            _write_now(self.announce(signum))
        if self._defer == 0 and (self.immediate or not first or self._abandonable):
            raise Stopped(self.signum, abandoned=bool(self._abandonable))

    requested = property(lambda self: self.signum is not None)
    name = property(lambda self: signal.Signals(self.signum).name if self.signum else "")
    abandoning = property(lambda self: self._abandonable > 0 and self._defer == 0)
    """Whether a signal now would abandon the work under way."""

    def check(self) -> None:
        if self.signum is not None:
            raise Stopped(self.signum)

    @contextmanager
    def deferred(self) -> Iterator[None]:
        self._defer += 1
        try:
            yield
        finally:
            self._defer -= 1
        if self.immediate and self._defer == 0:
            self.check()

    @contextmanager
    def abandonable(self) -> Iterator[None]:
        """Work a signal abandons at once: :class:`Stopped` (``abandoned``) is raised wherever
        the main thread is, and also on entry when a signal came before."""
        if self.signum is not None:
            raise Stopped(self.signum, abandoned=True)
        self._abandonable += 1
        try:
            yield
        finally:
            self._abandonable -= 1


def _write_now(line: str) -> None:
    """One line to stderr from a signal handler: a raw write, since the handler may run while
    the main thread is in the middle of another write to ``sys.stderr``."""
    try:
        os.write(2, (line.rstrip("\n") + "\n").encode("utf-8", "replace"))
    except OSError:
        pass
