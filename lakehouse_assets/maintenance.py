"""Table maintenance: compact (apply the translog) and optimize (merge small files).

Both rewrite tables, so they hold the dataset's ``tables`` lock, as flush
does: one writer of a dataset's tables at a time. Readers are never blocked:
every rewrite is one Delta commit, and the files it replaces stay on disk
until ``vacuum`` (with a retention period) removes them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse_assets import conventions as cv
from lakehouse_assets.delta import DeltaLocation, commit, remove_action
from lakehouse_assets.exports import live_frame
from lakehouse_assets.flush import TABLES_LOCK
from lakehouse_assets.spark.delta_io import read_snapshot, write_parquet
from lakehouse_assets.spark.session import get_spark
from lakehouse_assets.tables import (
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
    DataFile,
    Snapshot,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakehouse_assets.lake import Dataset

#: Sort order of statements files: point reads prune row groups on bucket and id.
STATEMENTS_ORDER = ("bucket", "canonical_id", "prop", "value", "origin")


@dataclass
class CompactResult:
    live: int
    removed_translog: int
    statements_version: int | None
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "live": self.live,
            "removed_translog": self.removed_translog,
            "statements_version": self.statements_version,
            "seconds": round(self.seconds, 3),
        }


def compact(ds: Dataset) -> CompactResult:
    """Rewrite the main table with live rows only, seen range from the translog.

    The spec's order matters for crash safety: the main table is rewritten
    first (one overwrite commit); deleted rows are removed from the translog
    only afterwards, so a crash in between leaves deleted rows deleted.
    """
    clock = time.monotonic()
    main = ds.statements_table
    with ds.operation_lock(TABLES_LOCK):
        if main.table() is None:
            return CompactResult(0, 0, None, time.monotonic() - clock)
        spark = get_spark(ds.settings)
        partitions = max(1, ds.settings.spark_shuffle_partitions)
        live = (
            live_frame(spark, ds)
            .repartitionByRange(partitions, "bucket", "canonical_id")
            .sortWithinPartitions(*STATEMENTS_ORDER)
        )
        actions = write_parquet(
            live, main.uri, main.storage_options, STATEMENTS_SCHEMA, partition=STATEMENTS_PARTITION
        )
        version = commit(
            main,
            actions,
            schema=STATEMENTS_SCHEMA,
            partition_by=[STATEMENTS_PARTITION],
            mode="overwrite",
            metadata={"lakehouse.operation": "compact", "dataset": ds.name},
        )
        removed = _drop_deleted_translog(spark, ds)
        live_rows = sum(_records(a.stats) for a in actions)
    return CompactResult(live_rows, removed, version, time.monotonic() - clock)


def _drop_deleted_translog(spark: SparkSession, ds: Dataset) -> int:
    """Rewrite the translog without deleted rows (one overwrite commit)."""
    from pyspark.sql import functions as F

    location = ds.translog_table
    snapshot = Snapshot.load(location)
    if not snapshot.files:
        return 0
    rows = read_snapshot(spark, snapshot.files, TRANSLOG_SCHEMA, location.storage_options)
    deleted = rows.where(F.col("deleted_at").isNotNull()).count()
    if deleted == 0:
        return 0
    live = (
        rows.where(F.col("deleted_at").isNull())
        .repartitionByRange(max(1, ds.settings.spark_shuffle_partitions // 4), "bucket")
        .sortWithinPartitions("bucket", "origin", "id")
    )
    adds = write_parquet(live, location.uri, location.storage_options, TRANSLOG_SCHEMA)
    commit(
        location,
        adds,
        schema=TRANSLOG_SCHEMA,
        mode="overwrite",
        metadata={"lakehouse.operation": "compact", "dataset": ds.name},
    )
    return int(deleted)


def _records(stats: str | None) -> int:
    import json

    return int(json.loads(stats or "{}").get("numRecords", 0))


@dataclass
class OptimizeResult:
    files_removed: int
    files_added: int
    vacuumed: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "files_removed": self.files_removed,
            "files_added": self.files_added,
            "vacuumed": self.vacuumed,
            "seconds": round(self.seconds, 3),
        }


#: Files smaller than this are merged by optimize.
SMALL_FILE_BYTES = 64 * 1024 * 1024


def _optimize_table(
    spark: SparkSession,
    ds: Dataset,
    location: DeltaLocation,
    schema: pa.Schema,
    partition: str | None,
    order: Sequence[str],
    target_size: int,
) -> tuple[int, int]:
    """Rewrite a table's small files as few large ones, sorted for point reads.

    Row content never changes (the commit says ``dataChange: false``), so
    readers and exports see exactly the same statements before and after.
    """
    snapshot = Snapshot.load(location)
    groups: dict[str | None, list[DataFile]] = {}
    for file in snapshot.files:
        if file.size < target_size:
            key = file.partition_values.get(partition) if partition else None
            groups.setdefault(key, []).append(file)
    small = [f for files in groups.values() if len(files) > 1 for f in files]
    if not small:
        return 0, 0
    total = sum(f.size for f in small)
    rows = read_snapshot(spark, small, schema, location.storage_options, partition=partition)
    ordered = rows.repartitionByRange(
        max(1, -(-total // target_size)), *order
    ).sortWithinPartitions(*order)
    adds = write_parquet(
        ordered,
        location.uri,
        location.storage_options,
        schema,
        partition=partition,
        prefix="optimized",
        data_change=False,
    )
    removes = [remove_action(f.path, f.size, f.partition_values, data_change=False) for f in small]
    commit(
        location,
        [*removes, *adds],
        schema=schema,
        partition_by=[partition] if partition else None,
        metadata={"lakehouse.operation": "optimize", "dataset": ds.name},
    )
    return len(removes), len(adds)


def _vacuum_table(location: DeltaLocation, retention: timedelta) -> int:
    table = location.table()
    if table is None:
        return 0
    hours = int(retention.total_seconds() // 3600)
    removed = table.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False)
    return len(removed)


def optimize(
    ds: Dataset,
    *,
    vacuum: bool = False,
    retention_hours: int | None = None,
    target_size: int | None = None,
) -> OptimizeResult:
    """Merge small Parquet files of both tables into large, sorted ones (Spark).

    With ``vacuum``, files no longer referenced by any version younger than
    the retention period (default: ``LAKEHOUSE_VACUUM_RETENTION_HOURS``) are
    deleted, including files of runs that crashed before their commit.
    Sets ``statements/store_optimized``. Row content never changes.
    """
    clock = time.monotonic()
    removed = added = vacuumed = 0
    target = target_size or SMALL_FILE_BYTES
    with ds.operation_lock(TABLES_LOCK):
        tables = (
            (ds.statements_table, STATEMENTS_SCHEMA, STATEMENTS_PARTITION, STATEMENTS_ORDER),
            (ds.translog_table, TRANSLOG_SCHEMA, None, ("bucket", "origin", "id")),
        )
        spark = None
        for location, schema, partition, order in tables:
            if location.table() is None:
                continue
            spark = spark or get_spark(ds.settings)
            r, a = _optimize_table(spark, ds, location, schema, partition, order, target)
            removed += r
            added += a
        if vacuum:
            hours = (
                ds.settings.vacuum_retention_hours if retention_hours is None else retention_hours
            )
            for location in (ds.statements_table, ds.translog_table):
                vacuumed += _vacuum_table(location, timedelta(hours=hours))
        ds.core_tags.touch(cv.STATEMENTS_OPTIMIZED)
    return OptimizeResult(removed, added, vacuumed, time.monotonic() - clock)
