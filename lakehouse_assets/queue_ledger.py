"""The queue's exactly-once ledger: which queue items the journal already holds.

A queue item's effect on the journal (its statements or tombstones) and its
mark in this ledger commit in one transaction of the journal's database, so a
consumer that died after applying an item finds the mark and does not apply it
again (see :mod:`lakehouse_assets.queue`). The ledger is the queue's concern,
not the journal's, so it lives here; its table sits in the journal's database,
created by this module on its first use of a journal (the journal does not know
the ledger: the module sits above it), and its functions work on a journal's
connection.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sqlalchemy import Column, MetaData, String, Table, delete, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

if TYPE_CHECKING:
    from lakehouse_assets.journal import Journal, Row, Write

#: The ledger's schema, created beside the journal's table on first use.
metadata = MetaData()
#: the engines whose database holds the ledger's table (checked once per process)
_ready: weakref.WeakSet[Engine] = weakref.WeakSet()
_ready_lock = threading.Lock()

#: Queue items whose effect on the journal is committed (see
#: :mod:`lakehouse_assets.queue`). The row is inserted in the same transaction
#: as the item's statements, so "applied" and "written" can never disagree, and
#: unlike the statements it survives a flush. The consumer removes the row once
#: the item's ``_done`` record is in the lake.
queue_applied_table = Table(
    "lakehouse_queue_applied",
    metadata,
    Column("dataset", String(128), primary_key=True),
    Column("item_id", String(36), primary_key=True),
    Column("applied_at", String(32), nullable=False),
)


def _ensure(journal: Journal) -> Engine:
    """The journal's engine, its database holding the ledger's table.

    Several processes may race to create it; losing is fine (as the journal's own).
    """
    engine = journal.engine
    if engine in _ready:
        return engine
    with _ready_lock:
        for attempt in range(5):
            try:
                metadata.create_all(engine, checkfirst=True)
                break
            except Exception as exc:  # SQLite locked, PostgreSQL: duplicate relation/type
                if attempt == 4:
                    raise
                if "already exists" not in str(exc):
                    time.sleep(0.2 * (attempt + 1))
        if engine.dialect.name == "postgresql":  # a temporary ledger would forget items
            journal.check_durable(list(metadata.tables))
        _ready.add(engine)
    return engine


def apply_once(
    journal: Journal, dataset: str, item_id: str, rows: Sequence[Row], write: Write
) -> bool:
    """Write the rows of queue item ``item_id`` unless it was applied before.

    The item's mark and its rows commit in one transaction: True if this
    call wrote them, False if the item's mark was already there (nothing
    written).
    """
    marker = queue_applied_table.insert().values(
        dataset=dataset, item_id=item_id, applied_at=datetime.now(UTC).isoformat()
    )
    _ensure(journal)
    try:
        with journal.transaction() as conn:
            conn.execute(marker)
            journal.insert_rows(conn, rows, write)
    except IntegrityError:
        if is_applied(journal, dataset, item_id):
            return False
        raise
    return True


def is_applied(journal: Journal, dataset: str, item_id: str) -> bool:
    t = queue_applied_table
    q = select(t.c.item_id).where(t.c.dataset == dataset, t.c.item_id == item_id)
    with _ensure(journal).connect() as conn:
        return conn.execute(q).first() is not None


def applied_items(journal: Journal, dataset: str) -> list[str]:
    """Ids of the dataset's queue items marked applied (those not yet recorded done)."""
    t = queue_applied_table
    q = select(t.c.item_id).where(t.c.dataset == dataset).order_by(t.c.item_id)
    with _ensure(journal).connect() as conn:
        return [str(r[0]) for r in conn.execute(q)]


def forget_applied(journal: Journal, dataset: str, item_ids: Sequence[str]) -> int:
    """Drop the marks of items whose ``_done`` record is written."""
    if not item_ids:
        return 0
    t = queue_applied_table
    q = delete(t).where(t.c.dataset == dataset, t.c.item_id.in_(list(item_ids)))
    with _ensure(journal).begin() as conn:
        return int(conn.execute(q).rowcount or 0)
