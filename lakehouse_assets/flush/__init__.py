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

A larger batch into buckets neither table holds a file of (a first flush,
and each batch of a first flush in several) has nothing to join with: every
live statement is new and its translog row is its own. After Spark's tasks
have read, reduced and staged it (a contiguous range of buckets per staged
file; where Spark would be a JVM started in this process, worker processes
of the flush's own do that instead, :mod:`.journal_stage`, and no Spark job
runs at all), the driver sorts and writes each staged file as statements files, the
translog rows and the change feed in Arrow, a file per core at a time
(:func:`.driver._flush_new_buckets`): no join, range sample, shuffle or sort
is left for Spark. A translog commit of only new statements' rows says so
(:data:`.tables.translog.MAIN_IS_LIVE_KEY`) while no earlier commit changed
a stored row: readers of such a snapshot skip their join with the translog.

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

import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults, journal_stage, progress, staging
from lakehouse_assets.errors import LockedError
from lakehouse_assets.flush.commits import FlushResult
from lakehouse_assets.flush.spark_batch import _flush_batch, record_changes, rewrite_translog
from lakehouse_assets.spark.session import get_spark, in_this_process, scratch_cleanup

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from lakehouse_assets.context import DatasetContext

__all__ = [
    "FlushResult",
    "ReaderFlush",
    "ensure_flush",
    "flush",
    "flush_for_reading",
    "needs_flush",
    "plan_batches",
    "record_changes",
    "rewrite_translog",
]

log = logging.getLogger(__name__)


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
            with staging.area(ds, "flush", flush_id) as area, contextlib.ExitStack() as stack:
                pool: list[Executor] = []

                def workers() -> Executor:
                    """Processes reading the journal, spawned when a batch needs them."""
                    if not pool:
                        pool.append(stack.enter_context(journal_stage.workers()))
                    return pool[0]

                # a first build's batches need no Spark job: where Spark would be a
                # JVM started in this process, worker processes read the journal
                local = in_this_process(ds.settings)
                for number, batch in enumerate(batches, 1):
                    sized = [(b, counts[b]) for b in batch]
                    _flush_batch(
                        spark,
                        ds,
                        sized,
                        claim,
                        lock.fence(),
                        result,
                        area,
                        workers if local else None,
                    )
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
