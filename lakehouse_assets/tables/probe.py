"""Which stored rows hold a batch's keys, read from the row groups that can hold them.

A flush must know which of its statements the main table already has (the
newness check) and which translog files hold a row of one of them (the files
its translog update rewrites). Both tables' files are sorted by ``bucket``
then a key (the statements table by ``canonical_id``, the translog by
``origin``, ``id``) in small row groups (:data:`.parquet_files.ROW_GROUP_ROWS`),
so a row group's min/max of ``bucket`` and of its key column, from the
footers (cached per file, :class:`.snapshot.RowGroupIndex`), say whether it
can hold one of the batch's keys: a small batch reads a row group or two per
key, not the table. :func:`probe` reads those on the driver with pyarrow and
returns the rows that match a key exactly, with the file each came from; it
gives up (returns None) where min/max leave more than a share of the table to
read, and the caller scans as before, unless what is left to read is small
in rows (``max_rows``): reading a few hundred thousand ids on the driver costs
less than the Spark job a scan and its join take, whatever their share.

Pruning by min/max is exact whatever the files' order: bounds are the rows'
true minimum and maximum, so a row group they exclude holds none of the keys.
The order only decides how much is read. Footers without statistics (another
writer's files) make their row groups candidates.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakehouse_assets.tables.snapshot import (
    DataFile,
    RowGroupIndex,
    _row_group_index,
    arrow_filesystem,
)

#: Files the driver reads or rewrites at once at most (one per core up to this).
MAX_THREADS = 4

#: Rows a probe reads at a time (of one file's candidate row groups).
READ_BATCH_ROWS = 262_144

#: A probe reads at most this share of the files' row groups; more means the
#: batch is spread over most of the table, and a scan is the cheaper read.
MAX_SHARE = 0.5


@dataclass
class Probe:
    """What a probe found, and what it read to find it."""

    #: the stored rows holding one of the keys (``origin``, ``id``, ``_file``, and
    #: the columns asked for)
    rows: pa.Table
    #: paths (relative to the table) of the files holding at least one of them
    files: set[str] = field(default_factory=set)
    row_groups_read: int = 0
    row_groups_total: int = 0


class _Keys:
    """A batch's keys by bucket, sorted, for min/max tests (None: any key of the bucket)."""

    def __init__(self, buckets: Sequence[int], keys: Sequence[str | None]) -> None:
        by_bucket: dict[int, list[str] | None] = {}
        for bucket, key in zip(buckets, keys, strict=True):
            found = by_bucket.setdefault(bucket, [])
            if found is None:
                continue
            if key is None:  # unknown key (a tombstone with no live event): the whole bucket
                by_bucket[bucket] = None
            else:
                found.append(key)
        self.by_bucket = {b: (None if k is None else sorted(set(k))) for b, k in by_bucket.items()}
        self.buckets = sorted(self.by_bucket)

    def admits(self, buckets: tuple[int, int] | None, keys: tuple[str, str] | None) -> bool:
        """Could a row group with these bounds hold a key (None bounds: anything)?"""
        low, high = buckets if buckets is not None else (self.buckets[0], self.buckets[-1])
        start = bisect.bisect_left(self.buckets, low)
        for bucket in self.buckets[start : bisect.bisect_right(self.buckets, high)]:
            sorted_keys = self.by_bucket[bucket]
            if sorted_keys is None or keys is None:
                return True
            at = bisect.bisect_left(sorted_keys, keys[0])
            if at < len(sorted_keys) and sorted_keys[at] <= keys[1]:
                return True
        return False


def _candidates(index: RowGroupIndex, keys: _Keys, key_column: str) -> list[int]:
    if "bucket" not in index.columns:
        return list(range(index.metadata.num_row_groups))
    buckets = index.ranges("bucket")
    bounds = index.ranges(key_column) if key_column in index.columns else None
    return [
        g
        for g in range(index.metadata.num_row_groups)
        if keys.admits(buckets[g], None if bounds is None else bounds[g])
    ]


def file_threads(files: int) -> int:
    """Threads for work on ``files`` files on the driver (a probe's reads, a
    flush's translog rewrite): one per core, at most :data:`MAX_THREADS`, each
    holding a file's rows a few times over."""
    return max(1, min(files, os.cpu_count() or 1, MAX_THREADS))


def probe(
    files: Sequence[DataFile],
    schema: pa.Schema,
    storage_options: Mapping[str, str],
    keys: pa.Table,
    *,
    key_column: str,
    columns: Sequence[str] = (),
    partition: str | None = None,
    max_share: float = MAX_SHARE,
    max_rows: int = 0,
) -> Probe | None:
    """The stored rows with the (``origin``, ``id``) of a row of ``keys``.

    ``keys`` has ``origin``, ``id``, ``bucket`` and ``key_column`` (the column
    the files are sorted by within a bucket; NULL where unknown). Row groups
    are picked by their ``bucket`` and ``key_column`` min/max; None if more
    than ``max_share`` of them would be read and they hold more than
    ``max_rows`` rows (see the module docstring).
    """
    options = tuple(sorted(storage_options.items()))
    origins = set(keys.column("origin").to_pylist())
    if partition is not None:
        files = [f for f in files if f.partition_values.get(partition) in origins]
    wanted = _Keys(keys.column("bucket").to_pylist(), keys.column(key_column).to_pylist())
    plan: list[tuple[DataFile, RowGroupIndex, list[int]]] = []
    total = read = rows_read = 0
    for f in files:
        index = _row_group_index(f.uri, options)
        groups = _candidates(index, wanted, key_column) if wanted.buckets else []
        total += index.metadata.num_row_groups
        read += len(groups)
        rows_read += sum(index.metadata.row_group(g).num_rows for g in groups)
        if groups:
            plan.append((f, index, groups))
    if total and read > max_share * total and rows_read > max_rows:
        return None
    names = ["origin", "id", *(c for c in columns if c not in ("origin", "id"))]
    target = pa.schema([*(schema.field(n) for n in names), pa.field("_file", pa.string())])
    pairs = keys.select(["origin", "id"]).group_by(["origin", "id"]).aggregate([])
    parts = _read_matches(
        plan, schema, storage_options, names, partition, "id", pc.unique(keys.column("id"))
    )
    rows = pa.concat_tables(parts) if parts else target.empty_table()
    rows = rows.join(pairs, keys=["origin", "id"], join_type="inner").select(target.names)
    return Probe(
        rows=rows.cast(target),
        files=set(rows.column("_file").to_pylist()),
        row_groups_read=read,
        row_groups_total=total,
    )


def _read_matches(
    plan: Sequence[tuple[DataFile, RowGroupIndex, list[int]]],
    schema: pa.Schema,
    storage_options: Mapping[str, str],
    names: Sequence[str],
    partition: str | None,
    match_column: str,
    values: pa.Array,
) -> list[pa.Table]:
    """Per planned file: the rows of its row groups whose ``match_column`` holds
    one of ``values`` (``names`` and ``_file``)."""

    def matches_of(item: tuple[DataFile, RowGroupIndex, list[int]]) -> pa.Table:
        f, index, groups = item
        stored = [n for n in names if n != partition and n in index.columns]
        read = stored if match_column in stored else [*stored, match_column]
        fs, path = arrow_filesystem(f.uri, storage_options)
        read_schema = pa.schema([schema.field(n) for n in read])
        matches = []
        with fs.open_input_file(path) as handle:
            # a batch at a time, only the matches kept: memory is a batch's,
            # not the file's, whatever share of it the keys spread over
            batches = pq.ParquetFile(handle, metadata=index.metadata).iter_batches(
                batch_size=READ_BATCH_ROWS, row_groups=groups, columns=read
            )
            for batch in batches:
                part = pa.Table.from_batches([batch]).cast(read_schema)
                matches.append(part.filter(pc.is_in(part.column(match_column), value_set=values)))
        table = pa.concat_tables(matches) if matches else read_schema.empty_table()
        for name in names:
            if name not in stored:
                value = f.partition_values.get(name) if name == partition else None
                table = table.append_column(
                    name, pa.array([value] * table.num_rows, schema.field(name).type)
                )
        return table.select(list(names)).append_column(
            "_file", pa.array([f.path] * table.num_rows, pa.string())
        )

    # pyarrow's reads and filters let go of the GIL: a file per core at a time
    with ThreadPoolExecutor(max_workers=file_threads(len(plan))) as pool:
        return list(pool.map(matches_of, plan))


def rows_of(
    files: Sequence[DataFile],
    schema: pa.Schema,
    storage_options: Mapping[str, str],
    buckets: Sequence[int],
    keys: Sequence[str],
    *,
    key_column: str,
    columns: Sequence[str] | None = None,
    partition: str | None = None,
) -> pa.Table:
    """Every stored row whose ``key_column`` holds one of ``keys`` (``buckets``
    gives each key's bucket), from the row groups whose min/max can hold one.

    The read of many entities or statements at once (an incremental export's
    changed entities, a get of many ids): each key costs a row group or two of
    the files that can hold its bucket, where one filtered scan of the files
    (or DuckDB's, by its bloom filters) read every row group's key column. At
    10M statements the 100 entities of a small change took 4.5-6 s that way."""
    names = list(columns or schema.names)
    target = pa.schema([schema.field(n) for n in names])
    if not files or not keys:
        return target.empty_table()
    options = tuple(sorted(storage_options.items()))
    wanted = _Keys(buckets, keys)
    plan: list[tuple[DataFile, RowGroupIndex, list[int]]] = []
    for f in files:
        index = _row_group_index(f.uri, options)
        groups = _candidates(index, wanted, key_column)
        if groups:
            plan.append((f, index, groups))
    values = pc.unique(pa.array(keys, pa.string()))
    parts = _read_matches(plan, schema, storage_options, names, partition, key_column, values)
    if not parts:
        return target.empty_table()
    return pa.concat_tables(parts).select(names).cast(target)
