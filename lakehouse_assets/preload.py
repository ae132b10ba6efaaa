"""Import a module on a background thread while the process waits for Spark.

A small dataset's export is bound by start-up, not by data: importing ftmq
takes about half a second (pyrql builds its query grammar when ``ftmq`` is
imported), and the export needs it only after its Spark jobs (the statistics
and the line writes), to turn the aggregation into ftmq's ``DatasetStats``.
While those jobs run, the main
thread waits on a socket (Spark Connect's gRPC, or py4j in process) and holds
no GIL, so the import costs nothing if it runs then.

Python's import system makes this safe: a later ``import`` of the same module
on the main thread waits for the module's lock and gets the finished module.
Start it only once the caller's own modules are imported (two threads
importing packages that import each other could see each other's modules half
made); ftmq imports nothing of this package.
"""

from __future__ import annotations

import importlib
import logging
import threading

log = logging.getLogger(__name__)


def preload(name: str) -> threading.Thread:
    """Start importing module ``name`` on a daemon thread; return the thread.

    A failure is only logged (at DEBUG): the caller's own import of the module
    raises it where it matters, with its usual traceback.
    """

    def load() -> None:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - the foreground import reports it
            log.debug("preloading %s failed: %s", name, exc)

    thread = threading.Thread(target=load, name=f"preload {name}", daemon=True)
    thread.start()
    return thread
