"""The SQLite side of the journal's engine: connection settings, and closing at exit.

A SQLite journal is a file in WAL mode: every connection gets the pragmas
that make a committed bulk durable and keep the write-ahead log small, and a
process closes its connections when it exits so that it leaves no WAL behind
(see :func:`_close_sqlite_journals`). Kept apart from :mod:`journal`, whose
table and reads are the same on both databases.
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any

from sqlalchemy import Engine

#: What a SQLite journal's write-ahead log is cut back to after a checkpoint
#: (the WAL file otherwise keeps the size of the largest write ever made).
WAL_SIZE_LIMIT = 64 * 1024 * 1024


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    # FULL: a committed bulk survives power loss, not only a process crash.
    # One commit per bulk makes the extra fsync negligible.
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA busy_timeout=300000")
    cur.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
    # FAST: freed pages are not overwritten with zeros. Debian builds SQLite
    # with secure_delete on, so releasing a flushed journal rewrote every page
    # it freed through the WAL: 1.1-1.35 s and a 312 MB WAL at 1M rows, 0.1 s
    # and none with FAST. The released rows live on in the lake's tables; a
    # journal that must not keep their bytes in free pages is VACUUMed.
    cur.execute("PRAGMA secure_delete=FAST")
    cur.close()


#: The SQLite journal engines this process opened, closed at its exit.
_sqlite_engines: weakref.WeakSet[Engine] = weakref.WeakSet()


def _close_sqlite_journals(pid: int) -> None:
    """At exit: close this process's SQLite journal connections.

    The last connection to close checkpoints the write-ahead log into the
    database and deletes it. A process that exits with its connections open
    (the CLI skips the interpreter's teardown) leaves the WAL behind, and
    the next process to open the journal first reads all of it to rebuild
    its index: 0.1 s after a 1M-statement write (a 313 MB WAL), 0.18 s after
    a few dozen kek-sized writes and flushes (462 MB), paid by every command.
    Only the process that opened them closes them (a forked child sharing
    the descriptors would drop its parent's locks).
    """
    if os.getpid() != pid:
        return
    for engine in list(_sqlite_engines):
        engine.dispose()


atexit.register(_close_sqlite_journals, os.getpid())
