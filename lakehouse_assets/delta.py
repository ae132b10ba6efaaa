"""delta-rs helpers: commit Parquet files to Delta tables, list snapshots.

Spark writes Parquet; delta-rs writes the Delta log. Keeping the two apart
is what lets the lake work without any JVM JAR (Maven is unreachable) while
staying standard Delta that delta-spark, DuckDB or Polars can read.

Commits carry an *app transaction* (``app_id``, ``version``): Delta records
the highest version committed per app id, so a retried commit (after a
crash between writing files and clearing the journal) is recognised and
skipped instead of duplicating data.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions


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
    app_id: str | None = None,
    app_version: int | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> int:
    """Commit files in one transaction (creating the table if needed); return the version.

    ``actions`` may mix adds and removes: a rewrite (translog update, optimize)
    replaces its files atomically.
    """
    txns = []
    if app_id is not None and app_version is not None:
        txns.append(Transaction(app_id, app_version))
    props = CommitProperties(
        custom_metadata=dict(metadata or {}), max_commit_retries=20, app_transactions=txns
    )
    table = location.table()
    if table is None:
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
        table.create_write_transaction(
            list(actions),
            mode,
            schema,
            partition_by=list(partition_by or []) or None,
            commit_properties=props,
        )
    latest = location.table()
    assert latest is not None
    return latest.version()


def committed_version(location: DeltaLocation, app_id: str) -> int | None:
    """The highest app version committed for ``app_id`` (idempotent retries)."""
    table = location.table()
    return None if table is None else table.transaction_version(app_id)


def snapshot_files(location: DeltaLocation, version: int | None = None) -> list[str]:
    """Absolute URIs of the Parquet files of a snapshot (empty if no table)."""
    table = location.table(version)
    return [] if table is None else table.file_uris()
