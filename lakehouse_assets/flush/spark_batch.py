"""A batch flushed with Spark: the journal read and reduced by its tasks (or
staged from the driver), newness against the main table, the translog rewrite
and the change feed as Spark jobs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse_assets import faults, progress
from lakehouse_assets.flush import driver
from lakehouse_assets.flush.commits import (
    KEY_SCHEMA,
    FlushResult,
    Reader,
    _commit_statements,
    _commit_translog,
    _key_table,
    _num_records,
    _tasks,
    commit_changes,
)
from lakehouse_assets.journal import Claim
from lakehouse_assets.journal_stage import stage_batch
from lakehouse_assets.locks import Fence
from lakehouse_assets.reduce import REDUCED_SCHEMA, reduce_events
from lakehouse_assets.spark.session import parallelism, ranged
from lakehouse_assets.tables import feed
from lakehouse_assets.tables.probe import probe
from lakehouse_assets.tables.schemas import (
    CHANGES_SCHEMA,
    PROVENANCE_FIELDS,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)
from lakehouse_assets.tables.snapshot import DataFile, Snapshot, read_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakehouse_assets.context import DatasetContext

log = logging.getLogger(__name__)

#: Journal rows a flush task reads and reduces at most (about: a task takes
#: whole buckets). A task holds its rows in Arrow several times over (the
#: read, the reduce, the staged copy) in a Python worker Spark keeps for the
#: next task: with two tasks a 1M-row batch the workers held 1.75 GB at the
#: peak of a 1M flush, with tasks of 200k rows 1.47 GB (same time).
TASK_ROWS = 200_000

#: The newness probe reads the row groups its keys can be in on the driver even
#: where they are most of the table, as long as they hold at most this many rows:
#: the ids of 2M statements take pyarrow about a second, the Spark scan and join
#: it replaces several (a 1% change into 1M statements: its files' 987 row
#: groups probed in 2 s against 44 s for the scan and join, under load;
#: ``benchmarks/flush_phases.py``).
PROBE_ROWS = 2_000_000


def _reduced_frame(
    spark: SparkSession,
    ds: DatasetContext,
    claim: Claim,
    batch: list[tuple[int, int]],
    staging_uri: str,
    reduced: pa.Table | None = None,
) -> tuple[DataFrame, int, int, list[Reader]]:
    """The batch's statements, reduced, as a DataFrame over staged Parquet, how
    many, how many of them are tombstones, and readers of their columns on the
    driver (no Spark job): one per staged file, each a contiguous range of
    buckets, in order.

    Spark's tasks read and reduce the journal in parallel where they can open
    it (:mod:`spark.journal_source`) and the batch is larger than
    ``flush_driver_rows``; otherwise the driver reads it, reduces in Arrow and
    stages the result as Parquet in the lake.
    """
    from lakehouse_assets.spark.journal_source import journal_frame, reachable
    from lakehouse_assets.tables.spark_io import arrow_frame

    url = ds.journal.url
    options = dict(ds.statements_table.storage_options)
    if (
        reduced is None
        and sum(n for _, n in batch) > ds.settings.flush_driver_rows
        and reachable(url, spark, ds.settings)
    ):
        frame, rows, deleted, files = journal_frame(
            spark,
            url,
            claim,
            batch,
            max(parallelism(spark), -(-sum(n for _, n in batch) // TASK_ROWS)),
            staging_uri=staging_uri,
            storage_options=options,
        )

        return frame, rows, deleted, [_staged_reader(file, options) for file in files]
    if reduced is None:
        reduced = reduce_events(ds.journal.read_claimed(claim, [b for b, _ in batch]))
    deleted = reduced.num_rows - reduced.column("deleted_at").null_count
    frame = arrow_frame(spark, reduced, staging_uri, options)
    held = reduced
    return frame, reduced.num_rows, deleted, [lambda columns: held.select(list(columns))]


def _flush_new_batch_without_spark(
    ds: DatasetContext,
    batch: list[tuple[int, int]],
    span: tuple[int, int],
    claim: Claim,
    fence: Fence,
    result: FlushResult,
    meta: dict[str, str],
    staging_uri: str,
    workers: Callable[[], Executor],
    step: progress.Steps,
) -> bool:
    """A batch into buckets neither table holds a file of (a first build): its
    journal rows read, reduced and staged by worker processes, one bucket range
    per core (:func:`.journal_stage.stage_batch`), then written by the driver as
    they are (:func:`.driver._flush_new_buckets`); no Spark job, no JVM. False
    (nothing done) where the buckets hold stored rows: Spark's path joins them."""
    from lakehouse_assets.spark.journal_source import balanced_ranges

    main_snapshot = Snapshot.load(ds.statements_table)
    log_snapshot = Snapshot.load(ds.translog_table)
    if main_snapshot.select(span) or log_snapshot.select(span):
        return False
    options = dict(ds.statements_table.storage_options)
    pool = workers()
    # as many ranges as Spark would make tasks: a worker holds a range's rows
    ranges = balanced_ranges(
        batch, max(getattr(pool, "_max_workers", 1) or 1, -(-sum(n for _, n in batch) // TASK_ROWS))
    )
    staged = stage_batch(pool, ds.journal.url, claim, ranges, staging_uri, options)
    statements = sum(int(s["rows"]) for s in staged)
    deleted = sum(int(s["deleted"]) for s in staged)
    journal_rows = sum(n for _, n in batch)
    step(
        "read %d journal rows, reduced to %d statements (%d ranges in worker processes, "
        "their CPU %.2f s)",
        journal_rows,
        statements,
        len(ranges),
        sum(float(s["cpu"]) for s in staged),
    )
    files = [DataFile(s["uri"], s["path"], int(s["size"]), {}, None, None) for s in staged]
    _write_new_batch(
        ds,
        [_staged_reader(f, options) for f in files],
        (main_snapshot, log_snapshot),
        meta,
        fence,
        result,
        claim,
        step,
        (journal_rows, statements, deleted),
    )
    return True


def _staged_reader(file: DataFile, options: dict[str, str]) -> Reader:
    """The driver's reader of a staged file's columns (no Spark job)."""
    return lambda columns: read_files([file], REDUCED_SCHEMA, options, columns=list(columns))


def _write_new_batch(
    ds: DatasetContext,
    readers: list[Reader],
    snapshots: tuple[Snapshot, Snapshot],
    meta: dict[str, str],
    fence: Fence,
    result: FlushResult,
    claim: Claim,
    step: progress.Steps,
    counts: tuple[int, int, int],
) -> None:
    """A staged batch into buckets nothing is stored in, written by the driver as
    it is (:func:`.driver._flush_new_buckets`), and counted: ``counts`` are its
    journal rows, its statements (reduced) and how many of those are tombstones."""
    journal_rows, statements, deleted = counts
    driver._flush_new_buckets(ds, readers, *snapshots, meta, fence, result, claim.flush_id, step)
    result.ignored_tombstones += deleted
    result.superseded += journal_rows - statements
    faults.point("flush.after_translog_commit")
    result.journal_rows += journal_rows
    result.batches += 1


def _flush_batch(
    spark_session: Callable[[], SparkSession],
    ds: DatasetContext,
    batch: list[tuple[int, int]],
    claim: Claim,
    fence: Fence,
    result: FlushResult,
    staging_uri: str,
    workers: Callable[[], Executor] | None = None,
) -> None:
    step = progress.Steps(log, f"flush {ds.name}")
    buckets = [b for b, _ in batch]
    journal_rows = sum(n for _, n in batch)
    if journal_rows == 0:
        return
    meta = {"lakehouse.operation": "flush", "dataset": ds.name, "flush_id": claim.flush_id}
    span = (min(buckets), max(buckets))
    driver_read = None
    if journal_rows <= ds.settings.flush_driver_rows:
        driver_read = reduce_events(ds.journal.read_claimed(claim, buckets))
        step("read %d journal rows on the driver", journal_rows)
        if driver._flush_batch_on_driver(ds, driver_read, span, claim, fence, result, meta, step):
            result.superseded += journal_rows - driver_read.num_rows
            result.journal_rows += journal_rows
            result.batches += 1
            return
    if (
        driver_read is None
        and workers is not None
        and _flush_new_batch_without_spark(
            ds, batch, span, claim, fence, result, meta, staging_uri, workers, step
        )
    ):
        return
    # (imported here: a batch the driver flushes needs no pyspark, whose import
    # was a tenth of a small flush's process)
    from pyspark.sql import functions as F

    from lakehouse_assets.tables.spark_io import arrow_frame, read_snapshot, write_files

    spark = spark_session()
    main = ds.statements_table
    options = main.storage_options
    reduced, statements, deleted, readers = _reduced_frame(
        spark, ds, claim, batch, staging_uri, driver_read
    )
    step("read %d journal rows, reduced to %d statements", journal_rows, statements)
    # under the lock the latest version holds everything committed, published or not
    main_snapshot = Snapshot.load(main)
    main_files = main_snapshot.select(span)
    log_snapshot = Snapshot.load(ds.translog_table)
    if not main_files and not log_snapshot.select(span):
        # nothing stored in these buckets (a first flush): every live statement is
        # new and its translog row its own; the staged rows are written as they
        # are, on the driver (no join, range sample, shuffle or sort for Spark)
        _write_new_batch(
            ds,
            readers,
            (main_snapshot, log_snapshot),
            meta,
            fence,
            result,
            claim,
            step,
            (journal_rows, statements, deleted),
        )
        return
    # the batch's keys, for probes of the row groups that can hold them (a small
    # batch into a large table reads a row group or two per entity, not the table)
    keys = (
        _key_table(pa.concat_tables([read(KEY_SCHEMA.names) for read in readers]))
        if main_files and statements <= driver.PROBE_STATEMENTS
        else None
    )
    if main_files:
        found = None
        if keys is not None:
            found = probe(
                main_files,
                STATEMENTS_SCHEMA,
                options,
                keys,
                key_column="canonical_id",
                partition=STATEMENTS_PARTITION,
                max_rows=PROBE_ROWS,
            )
        if found is not None:
            result.row_groups_read += found.row_groups_read
            result.row_groups_total += found.row_groups_total
            stored = found.rows.select(["origin", "id"]).group_by(["origin", "id"]).aggregate([])
            in_main = arrow_frame(spark, stored, staging_uri, options)
        else:  # a batch spread over most of a large table: one scan of its buckets
            in_main = (
                read_snapshot(
                    spark,
                    main_files,
                    pa.schema([STATEMENTS_SCHEMA.field(c) for c in ("id", "bucket", "origin")]),
                    options,
                    partition=STATEMENTS_PARTITION,
                    buckets=buckets,
                )
                .select("origin", "id")
                .distinct()
            )
        in_main = in_main.withColumn("in_main", F.lit(True))
        keyed = reduced.join(in_main, ["origin", "id"], "left").cache()
        step("found stored statements (%s)", "probed" if found is not None else "scan")
    else:  # nothing stored in these buckets yet: every live statement is new
        keyed = reduced.withColumn("in_main", F.lit(None).cast("boolean"))
    new = keyed.where(F.col("in_main").isNull() & F.col("deleted_at").isNull()).select(
        *STATEMENTS_SCHEMA.names
    )
    tasks = _tasks(ds, statements, 0)
    in_bytes = sum(f.size for f in main_files)
    new = ranged(new, tasks, "bucket", "canonical_id", input_bytes=in_bytes).sortWithinPartitions(
        "bucket", "canonical_id", "prop", "value", "origin"
    )
    actions = write_files(
        new,
        main.uri,
        options,
        STATEMENTS_SCHEMA,
        staging_uri=staging_uri,
        partition=STATEMENTS_PARTITION,
    )
    step("wrote %d new statement files", len(actions))
    faults.point("flush.after_parquet")
    published = _commit_statements(
        ds, main_snapshot, actions, meta, fence, result, sum(_num_records(a.stats) for a in actions)
    )
    step("committed statements")
    faults.point("flush.after_statements_commit")
    # Statements in the main table (now including the new ones) get a translog row;
    # a tombstone for a statement that never reached the table has nothing to mark.
    updates = keyed.where(F.col("in_main").isNotNull() | F.col("deleted_at").isNull()).select(
        "id",
        F.col("bucket").cast("int").alias("bucket"),
        "first_seen",
        "last_seen",
        "deleted_at",
        "origin",
        *PROVENANCE_FIELDS,
        "in_main",
    )
    if main_files:
        stored, dead = F.col("in_main").isNotNull(), F.col("deleted_at").isNotNull()
        counts = (
            keyed.agg(
                F.count(F.when(stored & dead, 1)).alias("tombstones"),
                F.count(F.when(stored & ~dead, 1)).alias("duplicates"),
                F.count(F.when(~stored & dead, 1)).alias("ignored_tombstones"),
            )
            .collect()[0]
            .asDict()
        )
        step("counted duplicates/tombstones")
    else:  # nothing stored to duplicate or mark: no Spark job (0.1 s of a small flush)
        counts = {"tombstones": 0, "duplicates": 0, "ignored_tombstones": deleted}
    version = rewrite_translog(
        spark,
        ds,
        updates,
        span,
        meta,
        statements,
        fence=fence,
        publishes=published,
        staging_uri=staging_uri,
        keys=keys,
        result=result,
        only_new=not counts["tombstones"] and not counts["duplicates"],
    )
    step("rewrote translog")
    if version is not None:
        result.translog_version = version
        faults.point("flush.before_changes_commit")
        record_changes(spark, ds, keyed, version, published, claim.flush_id, fence, staging_uri)
        step("recorded the change feed")
    result.tombstones += int(counts["tombstones"])
    result.duplicates += int(counts["duplicates"])
    result.ignored_tombstones += int(counts["ignored_tombstones"])
    result.superseded += journal_rows - statements
    keyed.unpersist()
    faults.point("flush.after_translog_commit")
    result.journal_rows += journal_rows
    result.batches += 1


#: At most this many candidate translog rows are read on the driver by the probe
#: of a batch's keys (beyond, and over most of the table, Spark rewrites every
#: file of the span without knowing which hold the batch's rows).
ONLY_NEW_CHECK_ROWS = 1_000_000


def rewrite_translog(
    spark: SparkSession,
    ds: DatasetContext,
    updates: DataFrame,
    span: tuple[int, int],
    metadata: dict[str, str],
    rows: int,
    *,
    fence: Fence,
    publishes: int | None,
    staging_uri: str,
    keys: pa.Table | None = None,
    result: FlushResult | None = None,
    only_new: bool = False,
) -> int | None:
    """Upsert translog rows: rewrite the files that hold them, in one commit.

    With the batch's ``keys`` (:data:`KEY_SCHEMA`) the files that hold a
    row of one of them are found by a probe of their row groups
    (:mod:`.tables.probe`): only those are rewritten, and the rows of
    statements no file holds yet (new ones) are written with them, into new
    files, so a batch of new statements rewrites nothing. Without keys, or where the
    probe would read most of the table, every file whose bucket range
    overlaps the batch's ``span`` is rewritten.

    A row's ``first_seen`` only moves back, ``last_seen`` only forward,
    ``deleted_at`` and the last tenant/write are the last event's, and the
    first tenant/write stay those of the first flush that stored the row:
    applying the same updates twice gives the same rows, which is what makes
    a retried flush safe. The commit
    publishes the statements version ``publishes`` (see :mod:`tables`).
    """
    from pyspark.sql import functions as F

    from lakehouse_assets.tables.spark_io import read_snapshot, write_files

    location = ds.translog_table
    options = location.storage_options
    snapshot = Snapshot.load(location)
    old_files = snapshot.select(span)
    found = None
    if keys is not None and old_files:
        # read up to ONLY_NEW_CHECK_ROWS candidate rows even where most of the
        # table's row groups are candidates (a small table): the rows say
        # whether the batch's statements have translog rows (``only_new``)
        found = probe(
            old_files,
            TRANSLOG_SCHEMA,
            options,
            keys,
            key_column="id",
            max_rows=ONLY_NEW_CHECK_ROWS,
        )
    if found is not None:
        old_files = [f for f in old_files if f.path in found.files]
        if result is not None:
            result.row_groups_read += found.row_groups_read
            result.row_groups_total += found.row_groups_total
    if result is not None:
        result.translog_files_rewritten += len(old_files)
    old = (
        read_snapshot(spark, old_files, TRANSLOG_SCHEMA, options)
        .withColumn("_stored", F.lit(True))
        .alias("t")
    )
    new = updates.select(*TRANSLOG_SCHEMA.names).withColumn("_update", F.lit(True)).alias("s")

    def latest(name: str) -> Any:
        return F.when(F.col("s._update"), F.col(f"s.{name}")).otherwise(F.col(f"t.{name}"))

    def earliest(name: str) -> Any:  # a stored row keeps its first write, even unknown
        return F.when(F.col("t._stored"), F.col(f"t.{name}")).otherwise(F.col(f"s.{name}"))

    merged = old.join(new, ["origin", "id"], "full_outer").select(
        F.coalesce(F.col("s.bucket"), F.col("t.bucket")).alias("bucket"),
        "origin",
        "id",
        F.least(F.col("t.first_seen"), F.col("s.first_seen")).alias("first_seen"),
        F.greatest(F.col("t.last_seen"), F.col("s.last_seen")).alias("last_seen"),
        latest("deleted_at").alias("deleted_at"),
        earliest("first_tenant").alias("first_tenant"),
        earliest("first_write").alias("first_write"),
        latest("last_tenant").alias("last_tenant"),
        latest("last_write").alias("last_write"),
    )
    old_bytes = sum(f.size for f in old_files)
    merged = ranged(merged, _tasks(ds, rows, old_bytes), "bucket", input_bytes=old_bytes)
    merged = merged.sortWithinPartitions("bucket", "origin", "id")
    adds = write_files(
        merged, location.uri, options, TRANSLOG_SCHEMA, staging_uri=staging_uri, prefix="translog"
    )
    # a stored translog row of one of the batch's statements (one another writer
    # deleted from the statements table, written again) keeps its first_seen,
    # which the new main row does not have: the join is then no identity
    return _commit_translog(
        ds,
        snapshot,
        old_files,
        adds,
        metadata,
        fence,
        publishes,
        only_new=only_new and (not old_files or (found is not None and not found.rows.num_rows)),
    )


def record_changes(
    spark: SparkSession,
    ds: DatasetContext,
    keyed: DataFrame,
    version: int,
    published: int | None,
    flush_id: str,
    fence: Fence,
    staging_uri: str,
) -> None:
    """Commit the batch's rows of the change feed (:mod:`.tables.feed`) for translog
    ``version``: every statement given a translog row, live or dead, and the row
    that marks the version covered. Not for a translog's first version (nothing
    before it to change from: a first flush writes no copy of its statements)."""
    from pyspark.sql import functions as F

    from lakehouse_assets.tables.spark_io import write_files

    if version == 0:
        return
    head = [
        F.lit(version).cast("long").alias("translog_version"),
        F.lit(published).cast("long").alias("statements_version"),
        F.lit(flush_id).alias("flush_id"),
    ]
    dead = F.col("deleted_at").isNotNull()
    rows = keyed.where(F.col("in_main").isNotNull() | ~dead).select(
        *head,
        F.when(dead, F.lit(feed.DEAD)).otherwise(F.lit(feed.LIVE)).alias("change"),
        "origin",
        "id",
        "canonical_id",
    )
    marker = spark.range(1).select(
        *head,
        F.lit(feed.VERSION).alias("change"),
        *(F.lit(None).cast("string").alias(c) for c in ("origin", "id", "canonical_id")),
    )
    location = ds.changes_table
    ordered = marker.unionByName(rows).coalesce(1).sortWithinPartitions("canonical_id", "id")
    actions = write_files(
        ordered,
        location.uri,
        location.storage_options,
        CHANGES_SCHEMA,
        staging_uri=staging_uri,
        prefix="changes",
    )
    commit_changes(ds, actions, flush_id, fence, version)
