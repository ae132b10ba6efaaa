"""Progress of long operations: stage lines on one logger, Spark's task counts.

Every long operation (flush, export, make, compact, optimize, mapping, crawl)
says what it is doing on the ``lakehouse_assets.progress`` logger: a stage
name and its counts (``flush acme: batch 2/4: 512,300 journal rows``). The
CLI shows that logger on stderr (its other loggers only with ``-v``); Dagster
runs show it in the run's log. Where a Spark job runs, :func:`watch_spark`
adds the tasks done of the running stages, from Spark's status tracker (in
process) or the progress handler of a Spark Connect session.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("lakehouse_assets.progress")

#: Seconds between two lines about the same running Spark stage.
SPARK_INTERVAL = 5.0


def stage(message: str, *args: object) -> None:
    """One progress line (``%``-style arguments, formatted only when shown)."""
    log.info(message, *args)


class Steps:
    """Logs how long each step of an operation took, on the operation's own
    logger at INFO (the CLI's ``-v``): the timings to profile from."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger = logger
        self.what = what
        self.clock = time.monotonic()

    def __call__(self, message: str, *args: object) -> None:
        now = time.monotonic()
        self.logger.info("%s: " + message + " (%.2f s)", self.what, *args, now - self.clock)
        self.clock = now


class _Throttle:
    """Lets a line through when its text changed and ``SPARK_INTERVAL`` has passed."""

    def __init__(self) -> None:
        self.last = ""
        self.when = 0.0

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if text != self.last and now - self.when >= SPARK_INTERVAL:
            self.last, self.when = text, now
            log.info("spark: %s", text)


def watch_spark(spark: SparkSession) -> None:
    """Report Spark's running stages (tasks done / total) on the progress logger
    while this process lives; once per session."""
    if getattr(spark, "_lakehouse_progress", False):
        return
    from lakehouse_assets.spark.session import is_connect

    throttle = _Throttle()
    try:
        spark._lakehouse_progress = True  # type: ignore[attr-defined]
    except AttributeError:  # a session object that takes no attributes: no progress
        return
    if is_connect(spark):
        register = getattr(spark, "registerProgressHandler", None)
        if register is None:
            return

        def handler(stages: Any = None, inflight_tasks: int = 0, **_: Any) -> None:
            if not stages:
                return
            done = sum(int(getattr(s, "num_completed_tasks", 0)) for s in stages)
            total = sum(int(getattr(s, "num_tasks", 0)) for s in stages)
            if total:
                throttle(
                    f"{done}/{total} tasks of {len(stages)} stage(s), {inflight_tasks} running"
                )

        register(handler)
        return
    tracker = spark.sparkContext.statusTracker()

    def poll() -> None:
        while spark.sparkContext._jsc is not None:
            try:
                infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            except Exception:  # noqa: BLE001 - the JVM is going away
                return
            running = [i for i in infos if i is not None]
            if running:
                done = sum(i.numCompletedTasks for i in running)
                total = sum(i.numTasks for i in running)
                active = sum(i.numActiveTasks for i in running)
                throttle(f"{done}/{total} tasks of {len(running)} stage(s), {active} running")
            time.sleep(1.0)

    threading.Thread(target=poll, name="lakehouse-spark-progress", daemon=True).start()


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
