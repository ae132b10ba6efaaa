"""delta-rs helpers: commit Parquet files to Delta tables, list snapshots.

Spark writes Parquet; delta-rs writes the Delta log. Keeping the two apart
is what lets the lake work without any JVM JAR (Maven is unreachable) while
staying standard Delta that delta-spark, DuckDB or Polars can read.

Every commit of a dataset's tables is **fenced**: it carries the writer's
lock generation as a Delta app transaction (``lakehouse.writer``), is made
from the snapshot the writer read (so any commit since then by another
writer of the same app id is a conflict, not a silent rebase), and checks
just before committing that the lock is still the writer's. A writer that
lost its lock therefore fails with ``LockLostError`` or
``ConcurrentWriteError`` and commits nothing.

A translog commit also *publishes* a statements-table version (the app
transaction ``lakehouse.statements``): readers take the translog's latest
version and the statements version it names, so they never pair a flush's
appended statements with the translog from before it (see
:class:`tables.snapshot.DatasetSnapshot`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from lakehouse_assets.errors import ConcurrentWriteError, LockLostError

#: App transaction of translog commits: the statements version they publish.
PUBLISHED_APP_ID = "lakehouse.statements"

#: Commit metadata a lakehouse commit carries: flush, compact, optimize, vacuum,
#: schema evolution (``lakehouse.operation``), the version anchor, the graph index.
OWN_COMMIT_KEYS = (
    "lakehouse.operation",
    "lakehouse.manifest_hash",
    "lakehouse.graph.reflects_translog",
)


class CommitFence(Protocol):
    """A lock's fence (:class:`locks.Fence`): app id, generation, still-held check."""

    @property
    def app_id(self) -> str: ...

    @property
    def generation(self) -> int: ...

    def check(self) -> None: ...


@dataclass(frozen=True, slots=True)
class DeltaLocation:
    """Where a Delta table lives and how to reach it."""

    uri: str
    storage_options: Mapping[str, str]

    def table(self, version: int | None = None) -> DeltaTable | None:
        """The table (at ``version``), or None if it does not exist yet."""
        try:
            return DeltaTable(self.uri, version=version, storage_options=dict(self.storage_options))
        except TableNotFoundError:
            return None

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(self.uri, storage_options=dict(self.storage_options))


#: String min/max longer than this are left out of the file stats.
MAX_STAT_CHARS = 64


def unique_file_name(prefix: str = "part") -> str:
    """Spark reuses ``part-00000-<uuid>`` across partitions: name files anew."""
    return f"{prefix}-{uuid.uuid4().hex}.parquet"


def _stat_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def file_stats(metadata: pq.FileMetaData) -> str:
    """Delta ``stats`` JSON (numRecords, min/max, nullCount) from a Parquet footer."""
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    schema = metadata.schema.to_arrow_schema()
    for col_index, field in enumerate(schema):
        if pa.types.is_nested(field.type):
            continue
        lo = hi = None
        null_count = 0
        complete = True
        for rg in range(metadata.num_row_groups):
            stats = metadata.row_group(rg).column(col_index).statistics
            if stats is None or not stats.has_min_max:
                if stats is not None and stats.null_count == metadata.row_group(rg).num_rows:
                    null_count += stats.null_count
                    continue
                complete = False
                break
            null_count += stats.null_count or 0
            lo = stats.min if lo is None or stats.min < lo else lo
            hi = stats.max if hi is None or stats.max > hi else hi
        if not complete:
            continue
        nulls[field.name] = null_count
        if lo is None:
            continue
        # Long strings would need truncated bounds; no bounds is always safe
        # (the file is simply never pruned on that column).
        if isinstance(lo, str) and (len(lo) > MAX_STAT_CHARS or len(str(hi)) > MAX_STAT_CHARS):
            continue
        mins[field.name] = _stat_value(lo)
        maxs[field.name] = _stat_value(hi)
    return json.dumps(
        {"numRecords": metadata.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    )


def add_action(
    rel_path: str, size: int, metadata: pq.FileMetaData, partition_values: Mapping[str, str | None]
) -> AddAction:
    """An AddAction for a Parquet file already in the table folder."""
    return AddAction(
        rel_path,
        size,
        dict(partition_values),
        int(time.time() * 1000),
        True,
        file_stats(metadata),
    )


def remove_action(
    rel_path: str,
    size: int,
    partition_values: Mapping[str, str | None],
    *,
    data_change: bool = True,
) -> RemoveAction:
    """A RemoveAction for a file the commit replaces (it stays on disk until vacuum)."""
    return RemoveAction(
        rel_path, data_change, int(time.time() * 1000), size, dict(partition_values)
    )


def commit(
    location: DeltaLocation,
    actions: Sequence[AddAction | RemoveAction],
    *,
    schema: pa.Schema,
    partition_by: Sequence[str] | None = None,
    mode: Literal["append", "overwrite"] = "append",
    fence: CommitFence | None = None,
    read_version: int | None = None,
    publishes: int | None = None,
    app_id: str | None = None,
    app_version: int | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> int:
    """Commit files in one transaction (creating the table if needed); return the version.

    ``actions`` may mix adds and removes: a rewrite (translog update, optimize)
    replaces its files atomically. ``read_version`` is the version the writer
    read to decide what to write (default: the latest); ``fence`` is the
    writer's lock; ``publishes`` is the statements version a translog commit
    makes visible to readers.

    ``app_id``/``app_version`` make a commit idempotent: if the table already
    records ``app_version`` (or a later one) for ``app_id``, the commit was
    made before (a retry after a lost answer or a crash) and is skipped; the
    current version is returned.
    """
    if app_id is not None and app_version is not None:
        current = location.table()
        done = None if current is None else current.transaction_version(app_id)
        if current is not None and done is not None and done >= app_version:
            return current.version()
    txns = []
    if app_id is not None and app_version is not None:
        txns.append(Transaction(app_id, app_version))
    if fence is not None:
        txns.append(Transaction(fence.app_id, fence.generation))
    if publishes is not None:
        txns.append(Transaction(PUBLISHED_APP_ID, publishes))
    props = CommitProperties(
        custom_metadata=dict(metadata or {}), max_commit_retries=20, app_transactions=txns
    )
    table = location.table(read_version)
    try:
        if table is None:
            if fence is not None:
                fence.check()
            create_table_with_add_actions(
                location.uri,
                DeltaSchema.from_arrow(schema),
                [a for a in actions if isinstance(a, AddAction)],
                mode="append",
                partition_by=list(partition_by or []) or None,
                storage_options=dict(location.storage_options),
                commit_properties=props,
            )
        else:
            if fence is not None:
                _check_fence(location, table, fence)
            _add_missing_columns(table, schema, props)
            table.create_write_transaction(
                list(actions),
                mode,
                schema,
                partition_by=list(partition_by or []) or None,
                commit_properties=props,
            )
    except CommitFailedError as exc:
        if app_id is not None and app_version is not None:
            # the same commit, retried concurrently, may have won meanwhile
            latest = location.table()
            done = None if latest is None else latest.transaction_version(app_id)
            if latest is not None and done is not None and done >= app_version:
                return latest.version()
        raise ConcurrentWriteError(
            f"{location.uri}: another writer committed meanwhile ({exc}); "
            "nothing of this run was committed, run it again"
        ) from exc
    latest = location.table()
    assert latest is not None
    return latest.version()


def _check_fence(location: DeltaLocation, table: DeltaTable | None, fence: CommitFence) -> None:
    """Refuse a commit by a writer that lost its lock: the table records a newer
    lock generation, or the lock is no longer this writer's (checked last, just
    before the commit)."""
    recorded = None if table is None else table.transaction_version(fence.app_id)
    if recorded is not None and recorded > fence.generation:
        raise LockLostError(
            f"{location.uri}: a newer lock holder (generation {recorded}) has "
            f"committed; this writer (generation {fence.generation}) lost its lock "
            "and commits nothing"
        )
    fence.check()


def fenced_write(
    location: DeltaLocation,
    data: pa.Table | pa.RecordBatchReader,
    *,
    mode: Literal["append", "overwrite"],
    fence: CommitFence,
    metadata: Mapping[str, str],
    partition_by: Sequence[str] | None = None,
    writer_properties: WriterProperties | None = None,
    target_file_size: int | None = None,
) -> None:
    """delta-rs's own writer (its Parquet files: sorting, bloom filters, file
    sizes), committed under a lock's fence as :func:`commit` is.

    For tables whose files delta-rs writes itself (the graph index): the
    commit carries the fence's app transaction, is refused if the table
    records a newer lock generation, and the lock is checked just before;
    two writers with the same app id from one snapshot conflict in delta-rs
    instead of both committing. So a writer that lost its lock (paused past
    the TTL, or unlocked by hand) commits nothing here either.
    """
    _check_fence(location, location.table(), fence)
    props = CommitProperties(
        custom_metadata=dict(metadata),
        max_commit_retries=20,
        app_transactions=[Transaction(fence.app_id, fence.generation)],
    )
    # one call for both modes (delta-rs's overloads split them by a literal)
    write: Any = write_deltalake
    try:
        write(
            location.uri,
            data,
            mode=mode,
            partition_by=list(partition_by) if partition_by else None,
            storage_options=dict(location.storage_options),
            writer_properties=writer_properties,
            commit_properties=props,
            target_file_size=target_file_size,
        )
    except CommitFailedError as exc:
        raise ConcurrentWriteError(
            f"{location.uri}: another writer committed meanwhile ({exc}); "
            "nothing of this run was committed, run it again"
        ) from exc


def _add_missing_columns(table: DeltaTable, schema: pa.Schema, props: CommitProperties) -> None:
    """Evolve a table made by an earlier version: add the (nullable) columns ``schema``
    has and the table lacks, so that every Delta reader (delta-spark, DuckDB, Polars)
    sees them. Its own commit, made just before the data commit; old files read
    the new columns as NULL."""
    present = {f.name for f in table.schema().fields}
    missing = [f for f in schema if f.name not in present]
    if missing:
        fields = DeltaSchema.from_arrow(pa.schema(missing)).fields
        table.alter.add_columns(
            list(fields),
            commit_properties=CommitProperties(
                custom_metadata={
                    **(props.custom_metadata or {}),
                    "lakehouse.schema": "added " + ", ".join(f.name for f in missing),
                }
            ),
        )


def add_actions_table(table: DeltaTable) -> pa.Table:
    """The add actions of a table's snapshot (path, size, partition values, column
    statistics), flattened, as Arrow.

    Read through the Arrow stream interface: ``pa.table()`` of delta-rs' table
    first asks whether it is a pandas DataFrame, which imports pandas (0.2-0.3 s
    of a ``get`` that needs none of it).
    """
    return pa.RecordBatchReader.from_stream(table.get_add_actions(flatten=True)).read_all()


def add_actions(table: DeltaTable) -> list[dict[str, Any]]:
    """The add actions of a table's snapshot as dicts (see :func:`add_actions_table`)."""
    actions: list[dict[str, Any]] = add_actions_table(table).to_pylist()
    return actions


def committed_version(location: DeltaLocation, app_id: str) -> int | None:
    """The highest app version committed for ``app_id`` (idempotent retries)."""
    table = location.table()
    return None if table is None else table.transaction_version(app_id)


def snapshot_files(location: DeltaLocation, version: int | None = None) -> list[str]:
    """Absolute URIs of the Parquet files of a snapshot (empty if no table)."""
    table = location.table(version)
    return [] if table is None else table.file_uris()
