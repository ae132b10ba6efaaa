"""A small batch flushed on the driver alone, in Arrow (no Spark job)."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import pyarrow as pa

from lakehouse_assets import faults, progress
from lakehouse_assets.flush.commits import (
    FlushResult,
    Reader,
    _commit_statements,
    _commit_translog,
    _key_table,
    _no_rows,
    _statement_keys,
    commit_changes,
)
from lakehouse_assets.journal import Claim
from lakehouse_assets.locks import Fence
from lakehouse_assets.tables import feed
from lakehouse_assets.tables.parquet_files import write_table
from lakehouse_assets.tables.probe import Probe, file_threads, probe
from lakehouse_assets.tables.schemas import (
    CHANGES_SCHEMA,
    STATEMENTS_ORDER,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)
from lakehouse_assets.tables.snapshot import (
    DataFile,
    Snapshot,
    _read_cast,
    _row_group_index,
)
from lakehouse_assets.tables.translog import SORT_KEYS, merge_rows

if TYPE_CHECKING:
    from deltalake.transaction import AddAction

    from lakehouse_assets.context import DatasetContext

#: A batch of at most this many statements probes the tables' row groups for its
#: keys (:mod:`.tables.probe`, on the driver); a larger one scans its buckets
#: with Spark (its keys would be a large share of most tables anyway).
PROBE_STATEMENTS = 200_000


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
            sort_keys=STATEMENTS_SORT,
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
    # no duplicate, no tombstone, and no translog row of one of them (a statement
    # another writer deleted from the statements table keeps its translog row and
    # first_seen, which the new main row does not have)
    only_new = not pc.any(in_main).as_py() and holding.rows.num_rows == 0
    version = _rewrite_translog_on_driver(
        ds, updates, log_snapshot, rewritten, holding.rows, meta, fence, published, only_new
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
    only_new: bool = False,
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
    return _commit_translog(ds, snapshot, files, adds, meta, fence, published, only_new=only_new)


#: The order of a statements file's rows (as the Spark path sorts them).
STATEMENTS_SORT = [(c, "ascending", "at_start") for c in STATEMENTS_ORDER]


def _flush_new_buckets(
    ds: DatasetContext,
    readers: Sequence[Reader],
    main_snapshot: Snapshot,
    log_snapshot: Snapshot,
    meta: dict[str, str],
    fence: Fence,
    result: FlushResult,
    flush_id: str,
    step: progress.Steps,
) -> None:
    """Steps 4-5 for a batch into buckets neither table holds a file of (a first
    flush, or its later batches), on the driver: every live statement is new
    and its translog row is its own, merged with nothing. Spark's tasks staged
    the batch's rows a contiguous range of buckets per file (``readers``, in
    order): each is sorted as a statements file and written as one (per
    origin), a file per core at a time, so the driver holds a few files' rows;
    then the translog (:func:`_write_new_translog`) and the change feed. The
    commits, fences and fault points are the Spark path's (at 1M statements
    its range sample, shuffle, sort and write of the new statements, then of
    the translog rows, cost more than this whole step)."""
    import pyarrow.compute as pc

    main = ds.statements_table

    def write(read: Reader) -> tuple[list[AddAction], pa.Table]:
        """One staged file's statements file(s); its translog rows' columns."""
        rows = read(list(dict.fromkeys([*STATEMENTS_SCHEMA.names, *TRANSLOG_SCHEMA.names])))
        if rows["deleted_at"].null_count < rows.num_rows:
            rows = rows.filter(pc.is_null(rows["deleted_at"]))
        new = rows.select(STATEMENTS_SCHEMA.names)
        new = new.take(pc.sort_indices(new, sort_keys=STATEMENTS_SORT))
        written = write_table(
            new, main.uri, main.storage_options, STATEMENTS_SCHEMA, partition=STATEMENTS_PARTITION
        )
        return written, rows.select([*TRANSLOG_SCHEMA.names, "canonical_id"])

    with ThreadPoolExecutor(max_workers=file_threads(len(readers))) as pool:
        done = list(pool.map(write, readers))
    actions = [action for written, _ in done for action in written]
    step("wrote %d new statement files (on the driver)", len(actions))
    faults.point("flush.after_parquet")
    live = pa.concat_tables([rows for _, rows in done])
    del done
    published = _commit_statements(ds, main_snapshot, actions, meta, fence, result, live.num_rows)
    step("committed statements")
    faults.point("flush.after_statements_commit")
    version = _write_new_translog(ds, live, log_snapshot, meta, fence, published)
    step("wrote the translog (new rows only, on the driver)")
    if version is not None:
        result.translog_version = version
        faults.point("flush.before_changes_commit")
        dead = pc.is_valid(live["deleted_at"])
        _record_changes_on_driver(
            ds, live, dead, version, published, flush_id, fence, ordered=False
        )
        step("recorded the change feed (on the driver)")


def _write_new_translog(
    ds: DatasetContext,
    rows: pa.Table,
    snapshot: Snapshot,
    meta: dict[str, str],
    fence: Fence,
    published: int | None,
) -> int | None:
    """The translog rows of a batch into buckets no file holds yet (a first flush),
    one commit: the new statements' own rows, merged with nothing (what
    :func:`_rewrite_translog_on_driver` makes of them), sorted as a file's rows
    and cut into files of about :data:`TRANSLOG_FILE_ROWS`. Each file's rows are
    taken from ``rows`` when it is written, so the driver holds the batch once,
    not a sorted copy of it besides."""
    import pyarrow.compute as pc

    location = ds.translog_table
    rows = rows.select(TRANSLOG_SCHEMA.names).cast(TRANSLOG_SCHEMA)
    order = pc.sort_indices(rows, sort_keys=SORT_KEYS)
    pieces = max(1, -(-rows.num_rows // TRANSLOG_FILE_ROWS))
    size = max(1, -(-rows.num_rows // pieces))

    def write(start: int) -> list[AddAction]:
        part = rows.take(order.slice(start, size))
        return write_table(
            part, location.uri, location.storage_options, TRANSLOG_SCHEMA, prefix="translog"
        )

    with ThreadPoolExecutor(max_workers=file_threads(pieces)) as pool:
        adds = [a for written in pool.map(write, range(0, rows.num_rows, size)) for a in written]
    return _commit_translog(ds, snapshot, [], adds, meta, fence, published, only_new=True)


def _record_changes_on_driver(
    ds: DatasetContext,
    updates: pa.Table,
    dead: pa.ChunkedArray,
    version: int,
    published: int | None,
    flush_id: str,
    fence: Fence,
    *,
    ordered: bool = True,
) -> None:
    """:func:`record_changes` for a batch the driver flushed: ``updates`` are
    the statements given a translog row (``dead``: those deleted); the rows
    sorted by canonical id unless not ``ordered`` (:func:`.feed.feed_table`)."""
    import pyarrow.compute as pc

    if version == 0:
        return
    changes = feed.feed_table(
        version,
        published,
        flush_id,
        pc.if_else(dead, feed.DEAD, feed.LIVE),
        updates,
        ordered=ordered,
    )
    location = ds.changes_table
    actions = write_table(
        changes, location.uri, location.storage_options, CHANGES_SCHEMA, prefix="changes"
    )
    commit_changes(ds, actions, flush_id, fence, version)
