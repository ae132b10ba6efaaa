"""A flush's result and its commits: the statements append, the translog
rewrite and the change feed's rows, each fenced (:func:`.tables.delta.commit`);
the batch's keys the probes take.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse_assets.locks import Fence
from lakehouse_assets.tables import feed
from lakehouse_assets.tables.delta import commit, remove_action
from lakehouse_assets.tables.schemas import (
    CHANGES_SCHEMA,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)
from lakehouse_assets.tables.snapshot import DataFile, Snapshot
from lakehouse_assets.tables.translog import MAIN_IS_LIVE_KEY, main_is_live

if TYPE_CHECKING:
    from deltalake.transaction import AddAction

    from lakehouse_assets.context import DatasetContext


@dataclass
class FlushResult:
    """What a flush did (the spec's return value is ``new``)."""

    #: statements stored for the first time
    new: int = 0
    #: statements written again (already stored): their seen range widened
    duplicates: int = 0
    #: stored statements deleted
    tombstones: int = 0
    #: events folded into a later event of the same statement in the same flush
    #: (a statement written twice, or written then deleted, before one flush)
    superseded: int = 0
    #: deletes of statements that were never stored (nothing to mark)
    ignored_tombstones: int = 0
    #: journal rows read: new + duplicates + tombstones + superseded + ignored_tombstones
    journal_rows: int = 0
    batches: int = 0
    statements_version: int | None = None
    translog_version: int | None = None
    seconds: float = 0.0
    #: leftovers of killed runs removed by this one (staging areas, Spark scratch)
    cleaned: dict[str, Any] = field(default_factory=dict)
    #: row groups the newness check and the translog update probed, of those the
    #: files they could have scanned hold (:mod:`.tables.probe`)
    row_groups_read: int = 0
    row_groups_total: int = 0
    #: translog files rewritten (holding a row of a statement of the batch)
    translog_files_rewritten: int = 0

    @property
    def changed(self) -> bool:
        return self.journal_rows > 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "new": self.new,
            "duplicates": self.duplicates,
            "tombstones": self.tombstones,
            "superseded": self.superseded,
            "ignored_tombstones": self.ignored_tombstones,
            "journal_rows": self.journal_rows,
            "batches": self.batches,
            "statements_version": self.statements_version,
            "translog_version": self.translog_version,
            "seconds": round(self.seconds, 3),
            "cleaned": self.cleaned,
            "row_groups_read": self.row_groups_read,
            "row_groups_total": self.row_groups_total,
            "translog_files_rewritten": self.translog_files_rewritten,
        }


def _tasks(ds: DatasetContext, rows: int, old_bytes: int) -> int:
    """How many files a write should produce: one per ~250k rows (or 32 MB of
    old files it replaces), at most one per shuffle partition, at least one.

    A small flush then writes one small file, not one per partition."""
    wanted = rows // 250_000 + old_bytes // (32 * 1024 * 1024) + 1
    return max(1, min(ds.settings.spark_shuffle_partitions, wanted))


def _commit_statements(
    ds: DatasetContext,
    snapshot: Snapshot,
    actions: Sequence[AddAction],
    meta: dict[str, str],
    fence: Fence,
    result: FlushResult,
    new: int,
) -> int | None:
    """Append a batch's ``new`` statements' files to the main table (one commit);
    the statements version the translog commit is to publish."""
    if not actions:
        return snapshot.version
    published = commit(
        ds.statements_table,
        actions,
        schema=STATEMENTS_SCHEMA,
        partition_by=[STATEMENTS_PARTITION],
        metadata=meta,
        fence=fence,
        read_version=snapshot.version,
    )
    result.statements_version = published
    result.new += new
    return published


def _commit_translog(
    ds: DatasetContext,
    snapshot: Snapshot,
    replaced: Sequence[DataFile],
    adds: Sequence[AddAction],
    meta: dict[str, str],
    fence: Fence,
    publishes: int | None,
    *,
    only_new: bool = False,
) -> int | None:
    """One commit: the ``replaced`` translog files out, their rewrites and the new
    rows' files in, publishing statements version ``publishes``.

    ``only_new``: the batch's translog rows are all those of statements it
    stored new (no duplicate, no tombstone): they hold what the main table
    holds, and if the translog before changed no main row either, the commit
    says so (:data:`.tables.translog.MAIN_IS_LIVE_KEY`: readers skip the join)."""
    removes = [remove_action(f.path, f.size, f.partition_values) for f in replaced]
    if not adds and not removes and snapshot.version is None:
        return None  # nothing to record and no table to publish in yet
    if only_new and main_is_live(ds.translog_table, snapshot.version):
        meta = {**meta, MAIN_IS_LIVE_KEY: "true"}
    return commit(
        ds.translog_table,
        [*removes, *adds],
        schema=TRANSLOG_SCHEMA,
        metadata=meta,
        fence=fence,
        read_version=snapshot.version,
        publishes=publishes,
    )


#: A reader of some columns (by name) of a batch's reduced rows, on the driver.
Reader = Callable[[Sequence[str]], pa.Table]


#: The columns of a batch's keys (:func:`_key_table`).
KEY_SCHEMA = pa.schema(
    [
        pa.field("origin", pa.string()),
        pa.field("id", pa.string()),
        pa.field("bucket", pa.int32()),
        pa.field("canonical_id", pa.string()),
    ]
)


def _key_table(reduced: pa.Table) -> pa.Table:
    return reduced.select(KEY_SCHEMA.names).cast(KEY_SCHEMA)


def _no_rows(*names: str) -> pa.Table:
    return pa.table({name: pa.array([], pa.string()) for name in names})


def _statement_keys(table: pa.Table) -> pa.ChunkedArray:
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(table["origin"], table["id"], "\x1f")


def commit_changes(
    ds: DatasetContext,
    actions: Sequence[AddAction],
    flush_id: str,
    fence: Fence,
    version: int,
    *,
    operation: str = "flush",
) -> None:
    """Commit a batch's change feed files (:mod:`.tables.feed`), saying which
    translog version they record (a reader checks the feed's commits back to it);
    ``operation``: what wrote them (a flush, a collection's build)."""
    location = ds.changes_table
    commit(
        location,
        actions,
        schema=CHANGES_SCHEMA,
        metadata={
            "lakehouse.operation": operation,
            "dataset": ds.name,
            "flush_id": flush_id,
            feed.TRANSLOG_VERSION_KEY: version,
        },
        fence=fence,
        read_version=Snapshot.load(location).version,
    )


def _num_records(stats: str | None) -> int:
    import json

    return int(json.loads(stats or "{}").get("numRecords", 0))
