"""The change rows between two versions of a dataset's tables.

:func:`changed_translog_rows` reads only the translog files one snapshot has
and the other has not, and keeps the rows that differ: what the version diffs
(:mod:`lakehouse_assets.versions.diffs`) and the graph index's updates
(:mod:`lakehouse_assets.graph.index`) both start from. It lives with the
tables, below both, because it is about the tables' rows, not about versions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets.tables.duck import bounded_duckdb
from lakehouse_assets.tables.schemas import (
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)
from lakehouse_assets.tables.snapshot import (
    DataFile,
    DatasetSnapshot,
    _row_group_index,
    arrow_dataset,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from lakehouse_assets.context import DatasetContext

#: Rows of both sides a slice of the comparison joins at most: a whole rewritten
#: translog of 10M statements in one join ran out of DuckDB's 128MB limit
SLICE_ROWS = 1_000_000
#: every bucket (a slice's bounds where a file has no bucket statistics)
_ALL_BUCKETS = (-(2**31), 2**31 - 1)


def changed_translog_rows(
    ds: DatasetContext, old: DatasetSnapshot | None, new: DatasetSnapshot
) -> tuple[pa.Table, pa.Table]:
    """Translog rows (origin, id, bucket) that differ between two snapshots.

    Only the files one snapshot has and the other has not are read (the
    translog is rewritten a bucket range at a time), and rows equal on both
    sides are dropped, so compact and optimize produce no changes.
    Returns (rows of the new side, rows of the old side).
    """
    cols = ["origin", "id", "bucket", "deleted_at", "first_seen", "last_seen"]
    return _rows_that_differ(
        ds,
        old.translog.files if old else (),
        new.translog.files,
        TRANSLOG_SCHEMA,
        cols,
        # timestamps compared with NULL as '' (a live row, deleted_at NULL, equals itself)
        nullable=("deleted_at", "first_seen", "last_seen"),
    )


def changed_statement_rows(
    ds: DatasetContext, old: DatasetSnapshot | None, new: DatasetSnapshot
) -> tuple[pa.Table, pa.Table]:
    """Statements-table rows (origin, id, canonical_id, bucket) that differ between
    two snapshots, every column compared: what a writer that bypassed the
    journal changed (a delta-rs ``delete()`` or append leaves the translog as
    it was), and what a flush added. Read as :func:`changed_translog_rows`
    reads the translog: only the files one side has. Returns (new side, old side).
    """
    compared = [c for c in STATEMENTS_SCHEMA.names if c not in ("origin", "id")]
    new_rows, old_rows = _rows_that_differ(
        ds,
        old.statements.files if old else (),
        new.statements.files,
        STATEMENTS_SCHEMA,
        ["origin", "id", "canonical_id", "bucket"],
        compared=compared,
        partition=STATEMENTS_PARTITION,
    )
    return new_rows, old_rows


def _rows_that_differ(
    ds: DatasetContext,
    old_files: Sequence[DataFile],
    new_files: Sequence[DataFile],
    schema: pa.Schema,
    cols: list[str],
    *,
    nullable: Sequence[str] = (),
    compared: Sequence[str] | None = None,
    partition: str | None = None,
) -> tuple[pa.Table, pa.Table]:
    """The rows, keyed by (origin, id), that one side's files have and the other's
    have not, or that differ in a ``compared`` column (default: ``cols``);
    ``cols`` of each side's such rows. ``nullable`` columns compare NULL as ''."""
    options = ds.statements_table.storage_options
    olds = {f.path: f for f in old_files}
    news = {f.path: f for f in new_files}
    added = [f for p, f in news.items() if p not in olds]
    removed = [f for p, f in olds.items() if p not in news]
    new_side = arrow_dataset(added, schema, options, partition=partition)
    old_side = arrow_dataset(removed, schema, options, partition=partition)
    checked = list(compared if compared is not None else cols)
    wanted = list(dict.fromkeys([*cols, *checked]))

    def side(name: str, alias: str) -> str:
        fields = ", ".join(f"coalesce({c}, '') AS {c}" if c in nullable else c for c in wanted)
        return f"{alias} AS (SELECT {fields} FROM {name} WHERE bucket BETWEEN $lo AND $hi)"

    differs = " OR ".join(
        f"n.{c} IS DISTINCT FROM o.{c}" for c in checked if c not in ("origin", "id")
    )
    picked = ", ".join([*(f"n.{c} AS n_{c}" for c in cols), *(f"o.{c} AS o_{c}" for c in cols)])
    query = (
        f"WITH {side('new_side', 'n')}, {side('old_side', 'o')} "
        f"SELECT {picked} FROM n FULL OUTER JOIN o ON n.origin = o.origin AND n.id = o.id "
        f"WHERE n.id IS NULL OR o.id IS NULL OR {differs or 'false'}"
    )
    # A whole rewritten table (optimize; a daily change holds a row in every
    # translog file) joins all its rows: a bucket range at a time, each in the
    # memory limit. Slicing changes nothing in the result: a statement's two rows
    # are equal only with the same bucket, so in the same slice; rows of other
    # buckets differ and are kept on their side either way.
    slices = _bucket_slices([*added, *removed], options)
    parts = []
    with bounded_duckdb(ds.settings) as con:
        con.register("new_side", new_side)
        con.register("old_side", old_side)
        for lo, hi in slices:
            parts.append(con.execute(query, {"lo": lo, "hi": hi}).to_arrow_table())
    changed = pa.concat_tables(parts)
    out_schema = pa.schema([pa.field(c, schema.field(c).type) for c in cols])

    def rows(prefix: str) -> pa.Table:
        present = changed.filter(pc.is_valid(changed.column(f"{prefix}_id")))
        return pa.table([present.column(f"{prefix}_{c}") for c in cols], names=cols).cast(
            out_schema
        )

    return rows("n"), rows("o")


def _bucket_slices(files: Sequence[DataFile], options: Mapping[str, str]) -> list[tuple[int, int]]:
    """Bucket ranges holding about :data:`SLICE_ROWS` of the files' rows each (the
    files' rows from their footers, their buckets from the Delta log's statistics;
    one range of every bucket where a file has none)."""
    lows = [f.min_bucket for f in files]
    highs = [f.max_bucket for f in files]
    if not files or None in lows or None in highs:
        return [_ALL_BUCKETS]
    key = tuple(sorted(options.items()))
    rows = sum(_row_group_index(f.uri, key).metadata.num_rows for f in files)
    lo, hi = min(b for b in lows if b is not None), max(b for b in highs if b is not None)
    count = max(1, min(hi - lo + 1, -(-rows // SLICE_ROWS)))
    step = -(-(hi - lo + 1) // count)
    return [(start, min(hi, start + step - 1)) for start in range(lo, hi + 1, step)]
