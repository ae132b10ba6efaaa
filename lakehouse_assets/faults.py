"""Fault points: the places where a crash or a concurrent write would matter.

Operations call :func:`point` at each step where the lake is between two
durable states (files written but not committed, one table committed and the
other not, tables committed but the journal not yet cleared, ...). Two kinds
of tests use them:

* ``LAKEHOUSE_CRASH_AT=<name>`` (optionally ``<name>:<n>`` for the n-th time
  the point is reached) makes the process SIGKILL itself there, like a power
  cut, so a test can check that a rerun loses and doubles nothing;
* ``LAKEHOUSE_SLOW_AT=<name>:<seconds>`` makes the process pause there, so a
  test with several processes can be sure they overlap;
* :func:`on` registers a callback for a point in this process, so a test can
  interleave a concurrent write at exactly that moment (deterministically,
  without sleeps).

In production no variable is set and no callback registered: a point costs a
dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

#: Every point an operation may stop at, by operation (tests iterate these).
FLUSH_POINTS: Final = (
    "flush.after_claim",
    "flush.after_parquet",
    "flush.after_statements_commit",
    "flush.before_changes_commit",
    "flush.after_translog_commit",
    "flush.before_journal_clear",
    "flush.after_batch",
)
EXPORT_POINTS: Final = (
    "export.after_parts",
    "export.before_replace",
    "export.after_replace",
    # an incremental export (incremental.py): files spliced, nothing replaced yet;
    # the three files replaced, the state not yet written
    "export.after_splice",
    "export.before_state",
)
COMPACT_POINTS: Final = (
    "compact.after_parquet",
    "compact.after_statements_commit",
    "compact.after_translog_commit",
)
OPTIMIZE_POINTS: Final = (
    "optimize.after_parquet",
    "optimize.after_statements_commit",
    "optimize.after_translog_commit",
    "optimize.before_vacuum",
)
PUBLISH_POINTS: Final = (
    "publish.after_files",
    "publish.after_entry",
    "publish.after_tag",
)
GRAPH_POINTS: Final = ("graph.after_source", "graph.after_target")
ALL_POINTS: Final = (
    FLUSH_POINTS + EXPORT_POINTS + COMPACT_POINTS + OPTIMIZE_POINTS + PUBLISH_POINTS + GRAPH_POINTS
)

_hooks: dict[str, list[Callable[[], None]]] = {}
_hits: Counter[str] = Counter()
_lock = threading.Lock()


def point(name: str) -> None:
    """Mark a fault point: run registered callbacks, die here if asked to."""
    callbacks = _hooks.get(name)
    if callbacks:
        for callback in list(callbacks):
            callback()
    slow = os.environ.get("LAKEHOUSE_SLOW_AT")
    if slow:
        wanted, _, seconds = slow.partition(":")
        if wanted == name:
            time.sleep(float(seconds or 1))
    target = os.environ.get("LAKEHOUSE_CRASH_AT")
    if not target:
        return
    wanted, _, nth = target.partition(":")
    if wanted != name:
        return
    with _lock:
        _hits[name] += 1
        hit = _hits[name]
    if not nth or int(nth) == hit:
        os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def on(name: str, callback: Callable[[], None]) -> Iterator[None]:
    """Run ``callback`` each time ``name`` is reached, while the block runs."""
    _hooks.setdefault(name, []).append(callback)
    try:
        yield
    finally:
        _hooks[name].remove(callback)
        if not _hooks[name]:
            del _hooks[name]
