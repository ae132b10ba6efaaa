"""Flush: move the journal into the Delta statements table and the translog.

The specification's process, made safe against crashes and concurrent writers:

1. Take the dataset's ``.LOCK`` (one table writer per dataset, whoever the
   tenant) and **claim** the journal: fix the rows committed by now (see
   :class:`journal.Claim`). Rows committed later wait for the next flush;
   only claimed rows are read, and only they are deleted at the end.
2. Read the claimed rows a range of buckets at a time (batches of about
   ``flush_batch_rows`` rows, so memory stays bounded whatever the backlog)
   straight into Arrow: by Spark's tasks in parallel, or by the driver for a
   batch of at most ``flush_driver_rows`` (a daily change: starting Python
   workers would cost more than the read) or a journal the tasks cannot open.
3. Reduce the events to one row per statement (``origin``, ``id``): its
   columns from the first write, the earliest ``first_seen``, the latest
   ``last_seen``, and the last event's ``deleted_at`` (a tombstone, or NULL
   when the statement was written last) — in Arrow, where the batch already
   is (:func:`reduce.reduce_events`), then staged as Parquet in the lake for Spark.
4. Statements not yet in the main table (checked by Spark against the table
   itself, only the batch's buckets) are **new**: Spark writes them as
   Parquet, delta-rs commits them (one append). Which statements the table
   holds is found by a probe (:mod:`.tables.probe`): the row groups whose
   ``bucket``/``canonical_id`` min/max can hold one of the batch's entities
   are read on the driver, so a small batch into a large table reads a row
   group or two per entity, not the table; a batch spread over most of a
   table of millions of statements scans its buckets instead.
5. The translog gets one row per statement that is in the main table:
   ``first_seen``/``last_seen`` widened, ``deleted_at`` from the last event.
   A probe of the translog (by ``bucket`` and ``id``) finds the files that
   hold a row of the batch; Spark rewrites those (old rows merged with the
   updates) and writes the rows of statements no file holds yet with them,
   so a batch of new statements rewrites no file (without a probe: every
   file whose bucket range overlaps the batch). One commit removes the old
   files, adds the new ones and publishes the statements version readers
   pair with it. Then the batch's rows of the change feed (:mod:`.tables.feed`:
   the statements it made live or dead, by entity) are committed, tagged
   with that translog version; a crash between the two commits leaves the
   version out of the feed, which readers take as a gap (their full path).
6. Only when every batch is in both tables are the claimed journal rows
   deleted (all at once: SQLite truncates when nothing else waits).

A batch of at most ``flush_driver_rows`` journal rows (a daily change) takes
steps 3-5 on the driver alone, in Arrow (:func:`_flush_batch_on_driver`), as
long as the stored files its probes read and its translog rewrite merges hold
at most ``flush_driver_merge_rows`` rows: the same commits, fences and fault
points, no Spark job, and, in a fresh process, no JVM started at all. The
driver reads and merges those files one per core at a time, so its memory is
a few files' whatever the table's size.

Both commits are fenced (:func:`delta.commit`): made from the version the
flush read, with the lock's generation, after checking the lock is still
held; a flush that lost its lock commits nothing.

Why this survives a crash anywhere: newness is decided against the main
table, so a retry after step 4 finds the statements there and does not
append them twice; the translog update is a min/max/last merge, so applying
it twice gives the same row (a retry's probe finds the rows a dead run
committed, in whatever file, and merges into them rather than adding a
second row: min/max pruning skips only row groups that cannot hold a key);
the journal still holds every row not yet in both tables (the next flush claims a dead flush's rows again). Files
written by a run that died before its commit are not in the Delta log
(readers never see them) and ``vacuum`` removes them.

Fault points for tests: :data:`faults.FLUSH_POINTS`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults, progress, staging
from lakehouse_assets.errors import LockedError
from lakehouse_assets.journal import Claim
from lakehouse_assets.locks import Fence
from lakehouse_assets.reduce import REDUCED_SCHEMA, reduce_events
from lakehouse_assets.spark.session import (
    get_spark,
    parallelism,
    ranged,
    scratch_cleanup,
)
from lakehouse_assets.tables import feed
from lakehouse_assets.tables.delta import commit, remove_action
from lakehouse_assets.tables.parquet_files import write_table
from lakehouse_assets.tables.probe import Probe, file_threads, probe
from lakehouse_assets.tables.schemas import (
    CHANGES_SCHEMA,
    PROVENANCE_FIELDS,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)
from lakehouse_assets.tables.snapshot import (
    DataFile,
    Snapshot,
    _read_cast,
    _row_group_index,
    read_files,
)
from lakehouse_assets.tables.translog import merge_rows

if TYPE_CHECKING:
    from deltalake.transaction import AddAction
    from pyspark.sql import DataFrame, SparkSession

    from lakehouse_assets.context import DatasetContext

log = logging.getLogger(__name__)


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


def plan_batches(buckets: Sequence[tuple[int, int]], batch_rows: int) -> list[list[int]]:
    """Group (bucket, rows) into consecutive batches of about ``batch_rows`` rows.

    A remainder of less than a quarter of a batch joins the batch before it:
    every batch costs a few Spark jobs, and a tiny last one costs as much as
    a full one.
    """
    batches: list[list[int]] = []
    sizes: list[int] = []
    for bucket, rows in buckets:
        if not batches or (sizes[-1] + rows > batch_rows and batches[-1]):
            batches.append([])
            sizes.append(0)
        batches[-1].append(bucket)
        sizes[-1] += rows
    if len(batches) > 1 and sizes[-1] < batch_rows // 4:
        batches[-2].extend(batches.pop())
    return batches


def _tasks(ds: DatasetContext, rows: int, old_bytes: int) -> int:
    """How many files a write should produce: one per ~250k rows (or 32 MB of
    old files it replaces), at most one per shuffle partition, at least one.

    A small flush then writes one small file, not one per partition."""
    wanted = rows // 250_000 + old_bytes // (32 * 1024 * 1024) + 1
    return max(1, min(ds.settings.spark_shuffle_partitions, wanted))


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
        found = probe(old_files, TRANSLOG_SCHEMA, options, keys, key_column="id")
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
    return _commit_translog(ds, snapshot, old_files, adds, metadata, fence, publishes)


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
) -> int | None:
    """One commit: the ``replaced`` translog files out, their rewrites and the new
    rows' files in, publishing statements version ``publishes``."""
    removes = [remove_action(f.path, f.size, f.partition_values) for f in replaced]
    if not adds and not removes and snapshot.version is None:
        return None  # nothing to record and no table to publish in yet
    return commit(
        ds.translog_table,
        [*removes, *adds],
        schema=TRANSLOG_SCHEMA,
        metadata=meta,
        fence=fence,
        read_version=snapshot.version,
        publishes=publishes,
    )


#: Journal rows a flush task reads and reduces at most (about: a task takes
#: whole buckets). A task holds its rows in Arrow several times over (the
#: read, the reduce, the staged copy) in a Python worker Spark keeps for the
#: next task: with two tasks a 1M-row batch the workers held 1.75 GB at the
#: peak of a 1M flush, with tasks of 200k rows 1.47 GB (same time).
TASK_ROWS = 200_000


#: A batch of at most this many statements probes the tables' row groups for its
#: keys (:mod:`.tables.probe`, on the driver); a larger one scans its buckets
#: with Spark (its keys would be a large share of most tables anyway).
PROBE_STATEMENTS = 200_000


#: The newness probe reads the row groups its keys can be in on the driver even
#: where they are most of the table, as long as they hold at most this many rows:
#: the ids of 2M statements take pyarrow about a second, the Spark scan and join
#: it replaces several (a 1% change into 1M statements: its files' 987 row
#: groups probed in 2 s against 44 s for the scan and join, under load;
#: ``benchmarks/flush_phases.py``).
PROBE_ROWS = 2_000_000


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


def _reduced_frame(
    spark: SparkSession,
    ds: DatasetContext,
    claim: Claim,
    batch: list[tuple[int, int]],
    staging_uri: str,
    reduced: pa.Table | None = None,
) -> tuple[DataFrame, int, int, Callable[[], pa.Table]]:
    """The batch's statements, reduced, as a DataFrame over staged Parquet, how
    many, how many of them are tombstones, and a reader of their keys
    (:data:`KEY_SCHEMA`) on the driver (from the staged files: no Spark job).

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

        def staged_keys() -> pa.Table:
            return _key_table(read_files(files, REDUCED_SCHEMA, options, columns=KEY_SCHEMA.names))

        return frame, rows, deleted, staged_keys
    if reduced is None:
        reduced = reduce_events(ds.journal.read_claimed(claim, [b for b, _ in batch]))
    deleted = reduced.num_rows - reduced.column("deleted_at").null_count
    frame = arrow_frame(spark, reduced, staging_uri, options)
    return frame, reduced.num_rows, deleted, lambda: _key_table(reduced)


def _flush_batch(
    spark_session: Callable[[], SparkSession],
    ds: DatasetContext,
    batch: list[tuple[int, int]],
    claim: Claim,
    fence: Fence,
    result: FlushResult,
    staging_uri: str,
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
        if _flush_batch_on_driver(ds, driver_read, span, claim, fence, result, meta, step):
            result.superseded += journal_rows - driver_read.num_rows
            result.journal_rows += journal_rows
            result.batches += 1
            return
    # (imported here: a batch the driver flushes needs no pyspark, whose import
    # was a tenth of a small flush's process)
    from pyspark.sql import functions as F

    from lakehouse_assets.tables.spark_io import arrow_frame, read_snapshot, write_files

    spark = spark_session()
    main = ds.statements_table
    options = main.storage_options
    reduced, statements, deleted, key_reader = _reduced_frame(
        spark, ds, claim, batch, staging_uri, driver_read
    )
    step("read %d journal rows, reduced to %d statements", journal_rows, statements)
    # under the lock the latest version holds everything committed, published or not
    main_snapshot = Snapshot.load(main)
    main_files = main_snapshot.select(span)
    # the batch's keys, for probes of the row groups that can hold them (a small
    # batch into a large table reads a row group or two per entity, not the table)
    keys = key_reader() if main_files and statements <= PROBE_STATEMENTS else None
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


def _flush_batch_on_driver(
    ds: DatasetContext,
    reduced: pa.Table,
    span: tuple[int, int],
    claim: Claim,
    fence: Fence,
    result: FlushResult,
    meta: dict[str, str],
    step: progress.Steps,
) -> bool:
    """Flush a small batch (``reduced``, read by the driver) without Spark.

    A daily change is a few thousand statements: the probes already find, on
    the driver, which of them the table holds and which translog files hold
    their rows, so what is left (writing the new statements, merging the
    translog files that hold a row of the batch, the change feed) is small
    Arrow work, where a Spark job, and in a fresh process the JVM it needs,
    cost seconds more than the work (a 1% change into 1M statements: the
    translog rewrite 8.9 s as a Spark job; ``benchmarks/flush_phases.py``).
    The steps, commits, fences and fault points are the Spark path's, so a
    crash anywhere is recovered the same way.

    Returns False, having written nothing, where its probes or the translog
    files to rewrite would hold more than ``flush_driver_merge_rows`` stored
    rows: the Spark path then does the batch. Up to that bound the driver's
    work is a read and a write of each file it touches, one file at a time
    (its memory is a file's), at about a second per million rows: a 1% change
    spread over every file of a 10M-statement table is merged faster here
    than a Spark job over the same files starts and shuffles.
    """
    import pyarrow.compute as pc

    if reduced.num_rows > PROBE_STATEMENTS:
        return False
    max_rows = ds.settings.flush_driver_merge_rows
    keys = _key_table(reduced)
    main, log_table = ds.statements_table, ds.translog_table
    main_snapshot, log_snapshot = Snapshot.load(main), Snapshot.load(log_table)
    main_files, log_files = main_snapshot.select(span), log_snapshot.select(span)
    stored = Probe(rows=_no_rows("origin", "id"))  # (nothing stored in these buckets yet)
    if main_files:
        found = probe(
            main_files,
            STATEMENTS_SCHEMA,
            main.storage_options,
            keys,
            key_column="canonical_id",
            partition=STATEMENTS_PARTITION,
            max_rows=max_rows,
        )
        if found is None:
            return False
        stored = found
    holding = Probe(rows=_no_rows("origin", "id", "_file"))
    if log_files:
        found = probe(
            log_files,
            TRANSLOG_SCHEMA,
            log_table.storage_options,
            keys,
            key_column="id",
            max_rows=max_rows,
        )
        if found is None:
            return False
        holding = found
    rewritten = [f for f in log_files if f.path in holding.files]
    options = tuple(sorted(log_table.storage_options.items()))
    if sum(_row_group_index(f.uri, options).metadata.num_rows for f in rewritten) > max_rows:
        return False
    for found in (stored, holding):
        result.row_groups_read += found.row_groups_read
        result.row_groups_total += found.row_groups_total
    in_main = pc.is_in(
        _statement_keys(reduced), value_set=_statement_keys(stored.rows).combine_chunks()
    )
    dead = pc.is_valid(reduced["deleted_at"])
    step("found stored statements (probed, on the driver)")

    new = reduced.filter(pc.and_(pc.invert(in_main), pc.invert(dead))).select(
        STATEMENTS_SCHEMA.names
    )
    new = new.take(
        pc.sort_indices(
            new,
            sort_keys=[
                (c, "ascending", "at_start")
                for c in ("bucket", "canonical_id", "prop", "value", "origin")
            ],
        )
    )
    actions = write_table(
        new, main.uri, main.storage_options, STATEMENTS_SCHEMA, partition=STATEMENTS_PARTITION
    )
    step("wrote %d new statement files", len(actions))
    faults.point("flush.after_parquet")
    published = _commit_statements(ds, main_snapshot, actions, meta, fence, result, new.num_rows)
    step("committed statements")
    faults.point("flush.after_statements_commit")
    # Statements in the main table (now including the new ones) get a translog row;
    # a tombstone for a statement that never reached the table has nothing to mark.
    kept = pc.or_(in_main, pc.invert(dead))
    updates = reduced.filter(kept)
    version = _rewrite_translog_on_driver(
        ds, updates, log_snapshot, rewritten, holding.rows, meta, fence, published
    )
    result.translog_files_rewritten += len(rewritten)
    step("rewrote translog")
    if version is not None:
        result.translog_version = version
        faults.point("flush.before_changes_commit")
        _record_changes_on_driver(
            ds,
            updates,
            pc.is_valid(updates["deleted_at"]),
            version,
            published,
            claim.flush_id,
            fence,
        )
        step("recorded the change feed")

    def count(mask: pa.ChunkedArray | pa.Array) -> int:
        return int(pc.sum(mask.cast(pa.int64())).as_py() or 0)

    result.tombstones += count(pc.and_(in_main, dead))
    result.duplicates += count(pc.and_(in_main, pc.invert(dead)))
    result.ignored_tombstones += count(pc.and_(pc.invert(in_main), dead))
    faults.point("flush.after_translog_commit")
    return True


def _no_rows(*names: str) -> pa.Table:
    return pa.table({name: pa.array([], pa.string()) for name in names})


def _statement_keys(table: pa.Table) -> pa.ChunkedArray:
    import pyarrow.compute as pc

    return pc.binary_join_element_wise(table["origin"], table["id"], "\x1f")


#: A translog file a driver flush writes holds at most about this many rows
#: (the Spark path's files: one per 250k rows).
TRANSLOG_FILE_ROWS = 250_000


def _rewrite_translog_on_driver(
    ds: DatasetContext,
    updates: pa.Table,
    snapshot: Snapshot,
    rewritten: Sequence[DataFile],
    holding: pa.Table,
    meta: dict[str, str],
    fence: Fence,
    published: int | None,
) -> int | None:
    """The translog update of :func:`rewrite_translog`, one file at a time: each
    file that holds a row of the batch is merged with its updates
    (:func:`.tables.translog.merge_rows`) and written anew; a statement no file
    holds yet joins the file whose bucket range it falls in (the first file's
    if none), or, with no file to rewrite, one new file. One commit removes the
    old files and adds the new ones, as in the Spark path."""
    import bisect

    import pyarrow.compute as pc

    location = ds.translog_table
    options = location.storage_options
    updates = updates.select(TRANSLOG_SCHEMA.names).cast(TRANSLOG_SCHEMA)
    where = updates.join(
        holding.select(["origin", "id", "_file"]), keys=["origin", "id"], join_type="left outer"
    )
    files = sorted(rewritten, key=lambda f: (f.min_bucket or 0, f.path))
    parts: list[tuple[DataFile | None, pa.Table]] = []
    if files:
        unheld = where.filter(pc.is_null(where["_file"]))
        starts = [f.min_bucket or 0 for f in files]
        target = [
            max(0, bisect.bisect_right(starts, bucket) - 1)
            for bucket in unheld["bucket"].to_pylist()
        ]
        chosen = pa.array(target, pa.int32())
        for index, held in enumerate(files):
            own = where.filter(pc.equal(where["_file"], held.path))
            joining = unheld.filter(pc.equal(chosen, index))
            parts.append((held, pa.concat_tables([own, joining])))
    else:
        parts.append((None, where))

    def rewrite(part: tuple[DataFile | None, pa.Table]) -> list[AddAction]:
        part_file, file_updates = part
        old = (
            _read_cast(part_file, TRANSLOG_SCHEMA, options, None)
            if part_file is not None
            else TRANSLOG_SCHEMA.empty_table()
        )
        merged = merge_rows(old, file_updates.select(TRANSLOG_SCHEMA.names))
        # a file grown past twice the size the Spark path writes is split again
        pieces = -(-merged.num_rows // TRANSLOG_FILE_ROWS)
        size = -(-merged.num_rows // pieces) if merged.num_rows > 2 * TRANSLOG_FILE_ROWS else None
        written: list[AddAction] = []
        for start in range(0, merged.num_rows, size or max(1, merged.num_rows)):
            written += write_table(
                merged.slice(start, size), location.uri, options, TRANSLOG_SCHEMA, prefix="translog"
            )
        return written

    # pyarrow's reads, joins, sorts and writes let go of the GIL: a file per
    # core at a time (a 1% change spread over every file of a large table)
    with ThreadPoolExecutor(max_workers=file_threads(len(parts))) as pool:
        adds = [action for written in pool.map(rewrite, parts) for action in written]
    return _commit_translog(ds, snapshot, files, adds, meta, fence, published)


def _record_changes_on_driver(
    ds: DatasetContext,
    updates: pa.Table,
    dead: pa.ChunkedArray,
    version: int,
    published: int | None,
    flush_id: str,
    fence: Fence,
) -> None:
    """:func:`record_changes` for a batch the driver flushed: ``updates`` are
    the statements given a translog row (``dead``: those deleted)."""
    import pyarrow.compute as pc

    if version == 0:
        return
    rows = updates.num_rows + 1
    changes = pa.table(
        {
            "translog_version": pa.repeat(pa.scalar(version, pa.int64()), rows),
            "statements_version": pa.repeat(pa.scalar(published, pa.int64()), rows),
            "flush_id": pa.repeat(pa.scalar(flush_id, pa.string()), rows),
            "change": pa.concat_arrays(
                [
                    pa.array([feed.VERSION], pa.string()),
                    pc.if_else(dead, feed.DEAD, feed.LIVE).combine_chunks(),
                ]
            ),
            **{
                name: pa.concat_arrays(
                    [pa.nulls(1, pa.string()), updates[name].combine_chunks().cast(pa.string())]
                )
                for name in ("origin", "id", "canonical_id")
            },
        },
        schema=CHANGES_SCHEMA,
    )
    changes = changes.take(
        pc.sort_indices(
            changes,
            sort_keys=[("canonical_id", "ascending", "at_start"), ("id", "ascending", "at_start")],
        )
    )
    location = ds.changes_table
    actions = write_table(
        changes, location.uri, location.storage_options, CHANGES_SCHEMA, prefix="changes"
    )
    _commit_changes(ds, actions, flush_id, fence, version)


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
    _commit_changes(ds, actions, flush_id, fence, version)


def _commit_changes(
    ds: DatasetContext, actions: Sequence[AddAction], flush_id: str, fence: Fence, version: int
) -> None:
    """Commit a batch's change feed files (:mod:`.tables.feed`), saying which
    translog version they record (a reader checks the feed's commits back to it)."""
    location = ds.changes_table
    commit(
        location,
        actions,
        schema=CHANGES_SCHEMA,
        metadata={
            "lakehouse.operation": "flush",
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


def flush(
    ds: DatasetContext, *, batch_rows: int | None = None, wait: float | None = None
) -> FlushResult:
    """Flush a dataset's journal into its Delta tables (see the module docstring).

    Waits up to ``wait`` seconds (default ``LAKEHOUSE_LOCK_WAIT_SECONDS``) for
    another writer of the dataset's tables to finish. Each flush leaves a job
    record (``jobs/runs/flush/``) with its counts and what it cleaned up.
    """
    clock = time.monotonic()
    result = FlushResult()
    with ds.table_lock("flush", wait=wait) as lock, ds.job("flush") as job:
        # no other flush runs: staging areas left are those of killed flushes
        result.cleaned["staging"] = staging.clean_stale(ds, "flush").as_dict()
        # last_flushed is taken before the claim: a write that committed after
        # it is newer, so the next ensure_flush still picks it up.
        started = cv.utcnow()
        flush_id = uuid.uuid4().hex
        claim = ds.journal.claim(ds.name, flush_id)
        faults.point("flush.after_claim")
        buckets = ds.journal.claimed_buckets(claim)
        if buckets:
            started_spark: list[SparkSession] = []

            def spark() -> SparkSession:
                """Spark, started when a batch needs it (a small flush never does)."""
                if not started_spark:
                    started_spark.append(get_spark(ds.settings))
                return started_spark[0]

            rows = batch_rows or ds.settings.flush_batch_rows
            counts = dict(buckets)
            batches = plan_batches(buckets, rows)
            progress.stage(
                "flush %s: %s journal rows in %d batch(es)",
                ds.name,
                f"{sum(counts.values()):,}",
                len(batches),
            )
            with staging.area(ds, "flush", flush_id) as area:
                for number, batch in enumerate(batches, 1):
                    sized = [(b, counts[b]) for b in batch]
                    _flush_batch(spark, ds, sized, claim, lock.fence(), result, area)
                    progress.stage(
                        "flush %s: batch %d/%d done (buckets %d-%d); so far %s new, "
                        "%s duplicates, %s tombstones",
                        ds.name,
                        number,
                        len(batches),
                        batch[0],
                        batch[-1],
                        f"{result.new:,}",
                        f"{result.duplicates:,}",
                        f"{result.tombstones:,}",
                    )
                    faults.point("flush.after_batch")
            # the claimed rows are in both tables: release them all at once (one
            # SQLite truncate when nothing else waits; a killed flush re-does
            # its batches, which the newness check and translog merge make safe)
            result.cleaned["spark_scratch"] = scratch_cleanup()
            faults.point("flush.before_journal_clear")
            lock.check()  # a flush that lost its lock leaves the rows to their new owner
            ds.journal.release_claimed(claim, [b for b, _ in buckets])
        ds.core_tags.set(cv.JOURNAL_LAST_FLUSHED, started)
        if result.changed:
            ds.core_tags.touch(cv.STATEMENTS_LAST_UPDATED)
        result.seconds = time.monotonic() - clock
        job.run.stats = result.as_dict()
    if result.journal_rows:
        progress.stage("flush %s: done in %.1f s", ds.name, result.seconds)
    return result


def needs_flush(ds: DatasetContext) -> bool:
    """Unflushed rows in the journal, or a journal tag newer than the last flush."""
    if ds.journal.has_pending(ds.name):
        return True
    return not ds.core_tags.is_latest(cv.JOURNAL_LAST_FLUSHED, [cv.JOURNAL_LAST_UPDATED]) and (
        ds.core_tags.get(cv.JOURNAL_LAST_UPDATED) is not None
    )


def ensure_flush(ds: DatasetContext, *, wait: float | None = None) -> FlushResult | None:
    """Flush when the journal holds anything newer than the last flush."""
    return flush(ds, wait=wait) if needs_flush(ds) else None


@dataclass
class ReaderFlush:
    """What a reader's flush-first did: the flush, or why not and what is left."""

    result: FlushResult | None = None
    pending: int = 0
    locked_by: str | None = None


def flush_for_reading(ds: DatasetContext, *, wait: float) -> ReaderFlush:
    """A reader's flush-first (query, export): never fails because a writer holds the lock.

    Waits up to ``wait`` seconds for the dataset's lock (saying on the log
    whom it waits for); if the writer is still busy, the reader goes on with
    the current snapshot and says how many journal rows are still pending.
    """
    try:
        with progress.part("flush"):
            return ReaderFlush(ensure_flush(ds, wait=wait))
    except LockedError as exc:
        pending = ds.journal.count(ds.name)
        log.warning(
            "%s: not flushed, %d journal rows are pending; reading the current snapshot (%s)",
            ds.name,
            pending,
            exc,
        )
        return ReaderFlush(None, pending, str(exc))
