"""Table maintenance: compact (apply the translog) and optimize (merge small files).

Both rewrite tables, so they hold the dataset's ``tables`` lock, as flush
does: one writer of a dataset's tables at a time. Readers are never blocked:
every rewrite is one Delta commit, and the files it replaces stay on disk
until ``vacuum`` (with a retention period) removes them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from lakehouse_assets import conventions as cv
from lakehouse_assets.delta import DeltaLocation, commit
from lakehouse_assets.exports import live_frame
from lakehouse_assets.flush import TABLES_LOCK
from lakehouse_assets.spark.delta_io import write_parquet
from lakehouse_assets.spark.session import get_spark
from lakehouse_assets.tables import STATEMENTS_PARTITION, STATEMENTS_SCHEMA

if TYPE_CHECKING:
    from lakehouse_assets.lake import Dataset


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
            .sortWithinPartitions("bucket", "canonical_id", "prop", "value", "origin")
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
        removed = 0
        translog = ds.translog_table.table()
        if translog is not None:
            metrics = translog.delete("deleted_at IS NOT NULL")
            removed = int(metrics.get("num_deleted_rows", 0) or 0)
        live_rows = sum(_records(a.stats) for a in actions)
    return CompactResult(live_rows, removed, version, time.monotonic() - clock)


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


def _optimize_table(location: DeltaLocation, target_size: int | None) -> tuple[int, int]:
    table = location.table()
    if table is None:
        return 0, 0
    metrics = table.optimize.compact(target_size=target_size)
    return int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))


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
    """Merge small Parquet files of both tables (delta-rs' bin-packing compaction).

    With ``vacuum``, files no longer referenced by any version younger than
    the retention period (default: ``LAKEHOUSE_VACUUM_RETENTION_HOURS``) are
    deleted, including files of runs that crashed before their commit.
    Sets ``statements/store_optimized``. Row content never changes.
    """
    clock = time.monotonic()
    removed = added = vacuumed = 0
    with ds.operation_lock(TABLES_LOCK):
        for location in (ds.statements_table, ds.translog_table):
            r, a = _optimize_table(location, target_size)
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
