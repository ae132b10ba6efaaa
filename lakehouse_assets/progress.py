"""Progress of long operations: stage lines on one logger, Spark's task counts.

Every long operation (flush, export, make, compact, optimize, mapping, crawl)
says what it is doing on the ``lakehouse_assets.progress`` logger: a stage
name and its counts (``flush acme: batch 2/4: 512,300 journal rows``). The
CLI shows that logger on stderr (its other loggers only with ``-v``); Dagster
runs show it in the run's log. Where a Spark job runs, :func:`~lakehouse_assets.spark.session.watch_spark`
adds the tasks done of the running stages, from Spark's status tracker (in
process) or the progress handler of a Spark Connect session.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("lakehouse_assets.progress")


def stage(message: str, *args: object) -> None:
    """One progress line (``%``-style arguments, formatted only when shown)."""
    log.info(message, *args)


class Parts:
    """Where a command's time went, by named part (``spark start``, ``flush``,
    ``graph``, ``exports``, ``index``): what ``make`` reports with its wall time.

    A part's seconds are its own: a part that runs inside another (the Spark
    start inside the flush) is taken out of the outer one, so the parts never
    add up to more than the time they were collected over. Only the thread that
    started collecting is timed (the parts are one command's steps in order).
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.thread = threading.get_ident()
        self._inner: list[float] = []  # per open part: seconds of the parts inside it

    def rounded(self) -> dict[str, float]:
        return {name: round(s, 3) for name, s in self.seconds.items()}


_parts: list[Parts] = []


@contextlib.contextmanager
def collect() -> Iterator[Parts]:
    """Collect the :func:`part` timings of what runs inside (nested: an inner
    collection's parts count in the outer one too)."""
    parts = Parts()
    _parts.append(parts)
    try:
        yield parts
    finally:
        _parts.remove(parts)


@contextlib.contextmanager
def part(name: str) -> Iterator[None]:
    """Time a named part of the running command (a no-op when nothing collects)."""
    active = [p for p in _parts if p.thread == threading.get_ident()]
    if not active:
        yield
        return
    for p in active:
        p._inner.append(0.0)
    clock = time.monotonic()
    try:
        yield
    finally:
        took = time.monotonic() - clock
        for p in active:
            inner = p._inner.pop()
            p.seconds[name] = p.seconds.get(name, 0.0) + took - inner
            if p._inner:
                p._inner[-1] += took


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No progress lines from what runs inside (a step the person did not ask
    for, e.g. the Spark server's warm-up, says what it does in one line of its
    own instead); warnings still show."""
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def parts_line(parts: dict[str, float]) -> str:
    """``spark start 12.3 s, flush 4.0 s, ...``: the parts in the order they ran."""
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in parts.items())


class Steps:
    """Logs how long each step of an operation took, on the operation's own
    logger at INFO (the CLI's ``-v``): the timings to profile from, wall time
    and this process's CPU time (all its threads: DuckDB's, Arrow's; not other
    processes'), which a loaded machine inflates far less than wall time."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what
        self.clock = time.monotonic()
        self.cpu = time.process_time()

    def __call__(self, message: str, *args: object) -> None:
        now, cpu = time.monotonic(), time.process_time()
        self.logger.info(
            "%s: " + message + " (%.2f s, CPU %.2f s)",
            self.what,
            *args,
            now - self.clock,
            cpu - self.cpu,
        )
        self.clock, self.cpu = now, cpu


class Formatter(logging.Formatter):
    """``  12.3s message``: seconds since the command started, then the line."""

    def __init__(self) -> None:
        super().__init__()
        self.start = time.monotonic()

    def format(self, record: logging.LogRecord) -> str:
        elapsed = time.monotonic() - self.start
        prefix = "" if record.name == log.name else f"{record.levelname.lower()} {record.name}: "
        return f"{elapsed:6.1f}s {prefix}{record.getMessage()}"


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a line is logged (a command run in
    a test runner gets a new one each time), not the one it was created with."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure(verbosity: int) -> None:
    """The CLI's logging: progress lines on stderr; ``-v`` adds the lakehouse's INFO
    logs (flush step timings, ...), ``-vv`` DEBUG."""
    handler = _Stderr()
    handler.setFormatter(Formatter())
    root = logging.getLogger("lakehouse_assets")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(
        logging.DEBUG if verbosity > 1 else logging.INFO if verbosity else logging.WARNING
    )
    log.setLevel(logging.INFO)
