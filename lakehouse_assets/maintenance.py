"""Table maintenance: compact (apply the translog) and optimize (merge small files).

Both rewrite tables, so they hold the dataset's ``.LOCK``, as flush does: one
writer of a dataset's tables at a time, whoever the tenant, and every commit
fenced by the lock. Readers are never blocked: each table changes in one
Delta commit, the translog commit last, publishing the statements version
readers pair with it; the files a rewrite replaces stay on disk until
``vacuum`` (with a retention period) removes them.

Fault points for tests: :data:`faults.COMPACT_POINTS`, :data:`faults.OPTIMIZE_POINTS`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from deltalake import CommitProperties

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults, progress, staging
from lakehouse_assets.errors import InvalidInputError
from lakehouse_assets.locks import Fence
from lakehouse_assets.settings import MAX_RETENTION_HOURS
from lakehouse_assets.spark.session import get_spark, partitions_for, ranged
from lakehouse_assets.tables.delta import DeltaLocation, commit, remove_action
from lakehouse_assets.tables.parquet_files import write_table
from lakehouse_assets.tables.schemas import (
    STATEMENTS_ORDER,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)
from lakehouse_assets.tables.snapshot import (
    DataFile,
    DatasetSnapshot,
    Snapshot,
    _row_group_index,
    read_files,
)
from lakehouse_assets.tables.spark_io import live_frame, read_snapshot, write_files
from lakehouse_assets.tables.writers import foreign_commits

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction
    from pyspark.sql import SparkSession

    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.versions import Version


@dataclass
class Rewrite:
    """A table rewrite that kept every live statement, to publish: the head it
    started from (which named exactly the files it replaced) and the snapshot
    it committed."""

    parent: Version
    snapshot: DatasetSnapshot


def covered_head(ds: DatasetContext, before: DatasetSnapshot) -> Version | None:
    """The head, if it names exactly the files of ``before`` (nothing unpublished,
    no other writer's commit since):
    a rewrite of ``before`` then needs only a version that carries the head's
    statements over to the new files."""
    from lakehouse_assets import versions

    head = versions.head(ds)
    if head is None or not versions.covers(head, before):
        return None
    # another writer's commits after the versions readers read: the rewrite
    # reads the latest table, so it would carry their change under a version
    # that claims no entity changed (the next make publishes it with its diff)
    if foreign_commits(ds.statements_table, before.statements.version) or foreign_commits(
        ds.translog_table, before.translog.version
    ):
        return None
    return head


def _has_versions(ds: DatasetContext) -> bool:
    from lakehouse_assets import versions

    return versions.head(ds) is not None


def publish_rewrite(ds: DatasetContext, rewrite: Rewrite, operation: str) -> dict[str, Any]:
    """Publish the files a compact or optimize wrote, so the head covers every file
    readers read (``lakehouse verify`` holds them to it). Called after the table
    lock is released (publishing tags the translog under it); a version published
    meanwhile by ``make`` wins, and the next ``make`` covers the rewrite."""
    from lakehouse_assets import versions

    published = versions.publish_relayout(ds, rewrite.snapshot, rewrite.parent, operation)
    if published.skipped:
        log.info("%s %s: no version published: %s", operation, ds.name, published.skipped)
    return published.as_dict()


@dataclass
class CompactResult:
    live: int
    removed_translog: int
    statements_version: int | None
    seconds: float
    #: what to publish (None: nothing rewritten, or the head was not current)
    rewrite: Rewrite | None = None
    #: the version published for it
    published: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "live": self.live,
            "removed_translog": self.removed_translog,
            "statements_version": self.statements_version,
            "seconds": round(self.seconds, 3),
            **({"published": self.published} if self.published is not None else {}),
        }


def compact(ds: DatasetContext, *, wait: float | None = None) -> CompactResult:
    """Compact (:func:`_compact`), leaving a job record (``jobs/runs/compact/``);
    then the rewritten tables are published (:func:`publish_rewrite`)."""
    with ds.job("compact") as job:
        progress.stage("compact %s: rewriting the live statements (Spark)", ds.name)
        result = _compact(ds, wait=wait)
        if result.rewrite is not None:
            result.published = publish_rewrite(ds, result.rewrite, "compact")
        job.run.stats = result.as_dict()
    progress.stage(
        "compact %s: done in %.1f s: %s live statements, %s deleted rows dropped",
        ds.name,
        result.seconds,
        f"{result.live:,}",
        f"{result.removed_translog:,}",
    )
    return result


def _compact(ds: DatasetContext, *, wait: float | None = None) -> CompactResult:
    """Rewrite the main table with live rows only, seen range from the translog.

    The spec's order matters for crash safety: the main table is rewritten
    first (one overwrite commit); deleted rows are removed from the translog
    only afterwards, in the commit that publishes the new main table, so a
    crash in between leaves readers on the old pair and deleted rows deleted.
    """
    clock = time.monotonic()
    main = ds.statements_table
    with ds.table_lock("compact", wait=wait) as lock, ExitStack() as stack:
        # under the lock the latest versions hold everything committed
        current = DatasetSnapshot(Snapshot.load(main), Snapshot.load(ds.translog_table))
        if current.statements.version is None:
            return CompactResult(0, 0, None, time.monotonic() - clock)
        parent = covered_head(ds, current)
        staging.clean_stale(ds, "compact")
        area = stack.enter_context(staging.area(ds, "compact"))
        spark = get_spark(ds.settings)
        partitions = partitions_for(ds.settings, sum(f.size for f in current.statements.files))
        parquet = sum(f.size for f in (*current.statements.files, *current.translog.files))
        live = ranged(
            live_frame(spark, ds, current),
            partitions,
            "bucket",
            "canonical_id",
            input_bytes=parquet,
        ).sortWithinPartitions(*STATEMENTS_ORDER)
        actions = write_files(
            live,
            main.uri,
            main.storage_options,
            STATEMENTS_SCHEMA,
            staging_uri=area,
            partition=STATEMENTS_PARTITION,
        )
        faults.point("compact.after_parquet")
        version = commit(
            main,
            actions,
            schema=STATEMENTS_SCHEMA,
            partition_by=[STATEMENTS_PARTITION],
            mode="overwrite",
            metadata={"lakehouse.operation": "compact", "dataset": ds.name},
            fence=lock.fence(),
            read_version=current.statements.version,
        )
        faults.point("compact.after_statements_commit")
        removed = _drop_deleted_translog(spark, ds, current.translog, lock.fence(), version, area)
        faults.point("compact.after_translog_commit")
        live_rows = sum(_records(a.stats) for a in actions)
        rewritten = ds.snapshot()  # under the lock: what this compact committed
    return CompactResult(
        live_rows,
        removed,
        version,
        time.monotonic() - clock,
        Rewrite(parent, rewritten) if parent is not None else None,
    )


def _drop_deleted_translog(
    spark: SparkSession,
    ds: DatasetContext,
    snapshot: Snapshot,
    fence: Fence,
    publishes: int,
    staging_uri: str,
) -> int:
    """Rewrite the translog without deleted rows, publishing the compacted main table."""
    from pyspark.sql import functions as F

    location = ds.translog_table
    meta = {"lakehouse.operation": "compact", "dataset": ds.name}
    if not snapshot.files:
        publish(ds, snapshot, fence, publishes, meta)
        return 0
    rows = read_snapshot(spark, snapshot.files, TRANSLOG_SCHEMA, location.storage_options)
    deleted = rows.where(F.col("deleted_at").isNotNull()).count()
    if deleted == 0:
        publish(ds, snapshot, fence, publishes, meta)
        return 0
    live = ranged(
        rows.where(F.col("deleted_at").isNull()),
        max(1, ds.settings.spark_shuffle_partitions // 4),
        "bucket",
        input_bytes=sum(f.size for f in snapshot.files),
    ).sortWithinPartitions("bucket", "origin", "id")
    adds = write_files(
        live, location.uri, location.storage_options, TRANSLOG_SCHEMA, staging_uri=staging_uri
    )
    commit(
        location,
        adds,
        schema=TRANSLOG_SCHEMA,
        mode="overwrite",
        metadata=meta,
        fence=fence,
        read_version=snapshot.version,
        publishes=publishes,
    )
    return int(deleted)


def publish(
    ds: DatasetContext,
    translog: Snapshot,
    fence: Fence,
    statements_version: int,
    meta: dict[str, str],
) -> None:
    """A translog commit without data: readers move to ``statements_version``."""
    if translog.version is None:
        return  # no translog yet: the first flush that makes one publishes
    commit(
        ds.translog_table,
        [],
        schema=TRANSLOG_SCHEMA,
        metadata=meta,
        fence=fence,
        read_version=translog.version,
        publishes=statements_version,
    )


def _records(stats: str | None) -> int:
    import json

    return int(json.loads(stats or "{}").get("numRecords", 0))


@dataclass
class OptimizeResult:
    files_removed: int
    files_added: int
    vacuumed: int
    seconds: float
    rewrite: Rewrite | None = None
    published: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "files_removed": self.files_removed,
            "files_added": self.files_added,
            "vacuumed": self.vacuumed,
            "seconds": round(self.seconds, 3),
            **({"published": self.published} if self.published is not None else {}),
        }


#: Files smaller than this are merged by optimize.
SMALL_FILE_BYTES = 64 * 1024 * 1024


def _optimize_table(
    spark: Callable[[], SparkSession],
    ds: DatasetContext,
    location: DeltaLocation,
    schema: pa.Schema,
    partition: str | None,
    order: Sequence[str],
    target_size: int,
    fence: Fence,
    staging_uri: str,
    publishes: int | None = None,
) -> tuple[int, int, int | None]:
    """Rewrite a table's small files as few large ones, sorted for point reads.

    Row content never changes (the commit says ``dataChange: false``), so
    readers and exports see exactly the same statements before and after.
    Returns (files removed, files added, the new version or None).

    Small files of at most :data:`DRIVER_OPTIMIZE_ROWS` rows in all are merged
    on the driver (:func:`_merge_on_driver`), without starting Spark.
    """
    snapshot = Snapshot.load(location)
    groups: dict[str | None, list[DataFile]] = {}
    for file in snapshot.files:
        if file.size < target_size:
            key = file.partition_values.get(partition) if partition else None
            groups.setdefault(key, []).append(file)
    small = [f for files in groups.values() if len(files) > 1 for f in files]
    if not small:
        return 0, 0, None
    total = sum(f.size for f in small)
    files = max(1, -(-total // target_size))
    options = tuple(sorted(location.storage_options.items()))
    if sum(_row_group_index(f.uri, options).metadata.num_rows for f in small) <= (
        DRIVER_OPTIMIZE_ROWS
    ):
        adds = _merge_on_driver(location, schema, partition, order, small, target_size)
    else:
        rows = read_snapshot(spark(), small, schema, location.storage_options, partition=partition)
        ordered = ranged(rows, files, *order, input_bytes=total).sortWithinPartitions(*order)
        adds = write_files(
            ordered,
            location.uri,
            location.storage_options,
            schema,
            staging_uri=staging_uri,
            partition=partition,
            prefix="optimized",
            data_change=False,
        )
    faults.point("optimize.after_parquet")
    removes = [remove_action(f.path, f.size, f.partition_values, data_change=False) for f in small]
    version = commit(
        location,
        [*removes, *adds],
        schema=schema,
        partition_by=[partition] if partition else None,
        metadata={"lakehouse.operation": "optimize", "dataset": ds.name},
        fence=fence,
        read_version=snapshot.version,
        publishes=publishes,
    )
    return len(removes), len(adds), version


#: Optimize merges a table's small files on the driver, in Arrow, when they hold
#: at most this many rows in all: read, sorted and written a file at a time,
#: without starting Spark, whose JVM start and jobs were most of a 1M-statement
#: optimize (the Arrow table and a file's rows: about 0.6 GB at 1M statements).
DRIVER_OPTIMIZE_ROWS = 2_000_000


def _merge_on_driver(
    location: DeltaLocation,
    schema: pa.Schema,
    partition: str | None,
    order: Sequence[str],
    small: Sequence[DataFile],
    target_size: int,
) -> list[AddAction]:
    """The Spark rewrite of :func:`_optimize_table` on the driver: per partition
    value, its small files' rows sorted by ``order`` and cut into files of about
    ``target_size`` bytes (as many as the Spark path's range partitions), each
    file's rows taken from the table when it is written."""
    import pyarrow.compute as pc

    groups: dict[str | None, list[DataFile]] = {}
    for file in small:
        groups.setdefault(file.partition_values.get(partition) if partition else None, []).append(
            file
        )
    sort_keys = [(c, "ascending", "at_start") for c in order]
    adds: list[AddAction] = []
    for _, files in sorted(groups.items(), key=lambda item: item[0] or ""):
        # in bucket order: a first build's files (each sorted, bucket ranges in
        # sequence) are then in order as they are read, and need no sort
        files = sorted(files, key=lambda f: (f.min_bucket or 0, f.max_bucket or 0, f.path))
        rows = read_files(files, schema, location.storage_options, partition=partition)
        indices = None if in_order(rows, order) else pc.sort_indices(rows, sort_keys=sort_keys)
        pieces = max(1, -(-sum(f.size for f in files) // target_size))
        size = max(1, -(-rows.num_rows // pieces))
        for start in range(0, rows.num_rows, size):
            adds += write_table(
                rows.slice(start, size)
                if indices is None
                else rows.take(indices.slice(start, size)),
                location.uri,
                location.storage_options,
                schema,
                partition=partition,
                prefix="optimized",
                data_change=False,
            )
    return adds


def in_order(rows: pa.Table, order: Sequence[str]) -> bool:
    """Whether ``rows`` are sorted by ``order`` already, with no nulls in its
    columns (then a stable sort would leave them as they are): each row's keys,
    compared column by column from the last, are at most the next row's. About
    a tenth of the sort it saves (1M statements: 0.15 against 1.6 s)."""
    import pyarrow.compute as pc

    if rows.num_rows < 2:
        return True
    if any(rows.column(c).null_count for c in order):
        return False
    ok: pa.ChunkedArray | pa.Array | None = None
    for name in reversed(order):
        column = rows.column(name).combine_chunks()
        before, after = column.slice(0, len(column) - 1), column.slice(1)
        less = pc.less(before, after)
        if ok is None:
            ok = pc.or_(less, pc.equal(before, after))
        else:
            ok = pc.or_(less, pc.and_(pc.equal(before, after), ok))
    return bool(pc.all(ok).as_py()) if ok is not None else True


#: Commits that leave a table's rows as they are: our optimize, and the two
#: commits delta-rs's vacuum records.
LAYOUT_ONLY = ("VACUUM START", "VACUUM END")


def layout_only_since(table: DeltaTable, version: int) -> bool:
    """Whether every commit after ``version`` keeps the rows (optimize, vacuum)."""
    latest = table.version()
    if latest <= version:
        return True
    for entry in table.history(latest - version):
        if entry.get("version", -1) <= version:
            continue
        if entry.get("lakehouse.operation") != "optimize" and entry.get("operation") not in (
            LAYOUT_ONLY
        ):
            return False
    return True


def unpublished_optimize(ds: DatasetContext) -> int | None:
    """The statements version to publish when every commit after the published one
    only re-laid files out (an optimize that died before publishing); None when
    there is none or when a data commit (a flush that died before its translog
    commit) is among them."""
    table = ds.statements_table.table()
    if table is None:
        return None
    current = ds.snapshot().statements.version
    if current is None or current >= table.version():
        return None
    return table.version() if layout_only_since(table, current) else None


def _vacuum_table(location: DeltaLocation, retention: timedelta) -> int:
    table = location.table()
    if table is None:
        return 0
    hours = int(retention.total_seconds() // 3600)
    removed = table.vacuum(
        retention_hours=hours,
        dry_run=False,
        enforce_retention_duration=False,
        # verify tells the lakehouse's vacuums from a foreign writer's commits
        commit_properties=CommitProperties(custom_metadata={"lakehouse.operation": "vacuum"}),
    )
    return len(removed)


def optimize(
    ds: DatasetContext,
    *,
    vacuum: bool = False,
    retention_hours: int | None = None,
    target_size: int | None = None,
    wait: float | None = None,
) -> OptimizeResult:
    """Optimize (:func:`_optimize`), leaving a job record (``jobs/runs/optimize/``).

    ``retention_hours`` is held to the setting's bounds before any work: the
    Python API took any number, and 1e29 hours overflowed the vacuum's dates.
    """
    if retention_hours is not None and (
        isinstance(retention_hours, bool)
        or not isinstance(retention_hours, int)
        or not 0 <= retention_hours <= MAX_RETENTION_HOURS
    ):
        raise InvalidInputError(
            f"dataset {ds.name!r}: retention_hours must be a whole number of hours from 0 "
            f"to {MAX_RETENTION_HOURS}, got {retention_hours!r}"
        )
    with ds.job("optimize") as job:
        progress.stage(
            "optimize %s: merging small files%s", ds.name, vacuum and ", then vacuum" or ""
        )
        result = _optimize(
            ds,
            vacuum=vacuum,
            retention_hours=retention_hours,
            target_size=target_size,
            wait=wait,
        )
        if result.rewrite is not None:
            result.published = publish_rewrite(ds, result.rewrite, "optimize")
        job.run.stats = result.as_dict()
    progress.stage(
        "optimize %s: done in %.1f s: %d files merged into %d, %d vacuumed",
        ds.name,
        result.seconds,
        result.files_removed,
        result.files_added,
        result.vacuumed,
    )
    return result


def _optimize(
    ds: DatasetContext,
    *,
    vacuum: bool = False,
    retention_hours: int | None = None,
    target_size: int | None = None,
    wait: float | None = None,
) -> OptimizeResult:
    """Merge small Parquet files of both tables into large, sorted ones (on the
    driver up to :data:`DRIVER_OPTIMIZE_ROWS` rows a table, else with Spark).

    The statements table first, then the translog, whose commit publishes the
    new statements version. With ``vacuum``, files no longer referenced by any
    version younger than the retention period (default:
    ``LAKEHOUSE_VACUUM_RETENTION_HOURS``) are deleted, including files of runs
    that crashed before their commit: a reader that started within the
    retention period keeps its files; the graph index's tables are vacuumed
    the same way. Sets ``statements/store_optimized``.
    Row content never changes.
    """
    clock = time.monotonic()
    removed = added = vacuumed = 0
    target = target_size or SMALL_FILE_BYTES
    with ds.table_lock("optimize", wait=wait) as lock, ExitStack() as stack:
        staging.clean_stale(ds, "optimize")
        area = stack.enter_context(staging.area(ds, "optimize"))
        before = ds.snapshot()
        parent = covered_head(ds, before)
        started: list[SparkSession] = []

        def spark() -> SparkSession:
            """Spark, started when a table's small files are too many rows for the driver."""
            if not started:
                started.append(get_spark(ds.settings))
            return started[0]

        published: int | None = None
        main = ds.statements_table
        if main.table() is not None:
            r, a, published = _optimize_table(
                spark,
                ds,
                main,
                STATEMENTS_SCHEMA,
                STATEMENTS_PARTITION,
                STATEMENTS_ORDER,
                target,
                lock.fence(),
                area,
            )
            removed += r
            added += a
            faults.point("optimize.after_statements_commit")
            if published is None:
                # an earlier optimize that died before publishing: its version
                # holds the same rows, so readers may move to it now
                published = unpublished_optimize(ds)
        log_snapshot = Snapshot.load(ds.translog_table)
        if log_snapshot.version is not None:
            r, a, version = _optimize_table(
                spark,
                ds,
                ds.translog_table,
                TRANSLOG_SCHEMA,
                None,
                ("bucket", "origin", "id"),
                target,
                lock.fence(),
                area,
                publishes=published,
            )
            removed += r
            added += a
            if version is None and published is not None:
                publish(
                    ds,
                    log_snapshot,
                    lock.fence(),
                    published,
                    {"lakehouse.operation": "optimize", "dataset": ds.name},
                )
            faults.point("optimize.after_translog_commit")
        if vacuum:
            faults.point("optimize.before_vacuum")
            hours = (
                ds.settings.vacuum_retention_hours if retention_hours is None else retention_hours
            )
            current = ds.snapshot().statements.version
            latest = main.table()
            # the published head must stay readable (as-of reads, verify --deep):
            # with changes it does not cover, this optimize publishes no version
            # of its own, and a vacuum would delete files only the head names
            unpublished = parent is None and _has_versions(ds)
            if unpublished:
                log.warning(
                    "optimize %s: the tables hold changes no version published: not "
                    "vacuumed (run make, then optimize --vacuum)",
                    ds.name,
                )
            for location in (ds.statements_table, ds.translog_table):
                if unpublished:
                    continue
                if (
                    location is ds.statements_table
                    and latest is not None
                    and current is not None
                    and not layout_only_since(latest, current)
                ):
                    # readers are sent to a version before the latest (a flush
                    # died between its commits): its files must stay until
                    # the rerun publishes
                    log.warning(
                        "optimize %s: statements v%s not published yet (readers use v%s): "
                        "not vacuumed",
                        ds.name,
                        latest.version(),
                        current,
                    )
                    continue
                vacuumed += _vacuum_table(location, timedelta(hours=hours))
            # the graph index's tables: a rebuild or a tombstone fold replaces
            # their files; lookups read the files graph/state.json lists, which
            # are always the latest (written under this same dataset lock)
            from lakehouse_assets import graph

            for table in (graph.BY_SOURCE, graph.BY_TARGET, graph.TOMBSTONES):
                vacuumed += _vacuum_table(graph.table_location(ds, table), timedelta(hours=hours))
        ds.core_tags.touch(cv.STATEMENTS_OPTIMIZED)
        after = ds.snapshot()  # under the lock: what this optimize committed
    rewrite = None
    if parent is not None and after.versions != before.versions:
        rewrite = Rewrite(parent, after)
    return OptimizeResult(removed, added, vacuumed, time.monotonic() - clock, rewrite)
