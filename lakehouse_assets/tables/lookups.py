"""Point lookups: the few rows with given ids among millions, in milliseconds.

The interactive reads (get an entity, a statement, a diff's batch) look rows
up by their key columns. The data files are sorted by those keys in small
row groups with Parquet bloom filters on the id columns
(:mod:`lakehouse_assets.tables.spark_io` writes them so), and a lookup reads
only the row groups that can hold a value: by their min/max from cached
footers (:class:`~lakehouse_assets.tables.snapshot.RowGroupIndex`), by DuckDB
(which also reads the bloom filters), or by pyarrow's filtered scan.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakehouse_assets.tables.arrays import constant_array, empty_table, values_array
from lakehouse_assets.tables.snapshot import (
    DataFile,
    _row_group_index,
    arrow_dataset,
    arrow_filesystem,
)

log = logging.getLogger(__name__)


#: Up to this many looked-up values a lookup is a point read (row groups pruned one
#: by one, or DuckDB); above it, pyarrow's scan of the files is better (DuckDB binds
#: an IN list of thousands slowly: a diff's batches of entities).
POINT_VALUES = 256

#: A point read reads the row groups its values can be in (by min/max) itself when
#: there are at most this many; more means min/max does not narrow the column (a
#: statement id in the statements table, sorted by entity) and DuckDB, which also
#: reads the Parquet bloom filters, does better.
POINT_ROW_GROUPS = 16


def point_lookup(
    files: Sequence[DataFile],
    schema: pa.Schema,
    storage_options: Mapping[str, str],
    where: Mapping[str, Sequence[str | int]],
    *,
    columns: Sequence[str] | None = None,
    partition: str | None = None,
    same_schema: bool = False,
) -> pa.Table:
    """Rows whose columns hold one of the given values (``{"id": [...], "bucket": [3]}``):
    the interactive reads' path to a few rows among millions.

    The files are sorted by their lookup keys in small row groups
    (:data:`tables.parquet_files.ROW_GROUP_ROWS`), so the row groups' min/max, from
    footers cached per file (:class:`RowGroupIndex`; data files never change),
    name the one or two that can hold a value: those are read with pyarrow and
    filtered, about a millisecond, local or S3. Where min/max leaves many row
    groups (a statement id in the entity-sorted statements table), DuckDB reads
    the files on a local lake: it also skips row groups by the Parquet bloom
    filters the writers put on the id columns (:data:`tables.parquet_files.BLOOM_COLUMNS`).
    pyarrow's filtered scan does it on S3 (DuckDB would need its httpfs extension,
    which is downloaded at run time). Columns a file lacks (written before they
    existed) read as NULL either way, unless the caller says every file has the
    same columns (``same_schema``: DuckDB then skips reconciling the files'
    schemas, a millisecond a lookup).
    """
    names = list(columns or schema.names)
    if not files or not where or any(not values for values in where.values()):
        return empty_table(schema).select(names)
    few = sum(len(values) for values in where.values()) <= POINT_VALUES
    if few:
        try:
            found = _row_group_lookup(files, schema, storage_options, where, names, partition)
        except (OSError, ValueError, TypeError, pa.ArrowException) as exc:  # a vacuumed file
            log.debug("row-group lookup failed (%s); reading the files", exc)
            found = None
        if found is not None:
            return found
    if few and all("://" not in f.uri or f.uri.startswith("file://") for f in files):
        try:
            return _duckdb_lookup(files, schema, where, names, partition, same_schema)
        except Exception as exc:  # noqa: BLE001 - e.g. a column no file has yet
            log.debug("point lookup by DuckDB failed (%s); reading with pyarrow", exc)
    expression: pc.Expression | None = None
    for column, values in where.items():
        term = pc.field(column).isin(list(values))
        expression = term if expression is None else expression & term
    dataset = arrow_dataset(files, schema, storage_options, partition=partition)
    return dataset.to_table(columns=names, filter=expression)


def _matching(table: pa.Table, where: Mapping[str, pa.Array]) -> pa.Array:
    """The mask of ``table``'s rows whose columns hold one of the values (kernels on
    arrays: an Acero filter plan costs a quarter of a millisecond to set up)."""
    mask: pa.Array | None = None
    for column, values in where.items():
        term = pc.is_in(table.column(column), value_set=values)
        mask = term if mask is None else pc.and_(mask, term)
    assert mask is not None
    return mask


def _row_group_lookup(
    files: Sequence[DataFile],
    schema: pa.Schema,
    storage_options: Mapping[str, str],
    where: Mapping[str, Sequence[str | int]],
    names: list[str],
    partition: str | None,
) -> pa.Table | None:
    """The point read by row groups (see :func:`point_lookup`), or None where min/max
    leaves more than :data:`POINT_ROW_GROUPS` row groups to read."""
    options = tuple(sorted(storage_options.items()))
    stored = [n for n in where if n != partition]
    if partition is not None and partition in where:  # the log knows, no footer needed
        allowed = set(where[partition])
        files = [f for f in files if f.partition_values.get(partition) in allowed]
    wanted = []
    for f in files:
        index = _row_group_index(f.uri, options)
        wanted.append((f, index, index.candidates({c: where[c] for c in stored})))
    if sum(len(groups) for _f, _i, groups in wanted) > POINT_ROW_GROUPS:
        return None
    target = pa.schema([schema.field(n) for n in names])
    values = {c: values_array(where[c], schema.field(c).type) for c in stored}
    parts = []
    for f, index, groups in wanted:
        if not groups:
            continue
        fs, path = arrow_filesystem(f.uri, storage_options)
        present = [n for n in names if n in index.columns]
        read = present + [c for c in stored if c not in present]
        with fs.open_input_file(path) as handle:
            # all candidates in one read: reading the key column first and then
            # only the row group that holds the rows took longer (4.2 vs 5.9 ms a
            # get at 1M), a read's fixed cost being most of a row group's. (Decoding
            # on this thread instead of Arrow's pool made gets slower: 4.1-5.7 ->
            # 5.9-7.7 ms median at 1M, idle machine.)
            parquet = pq.ParquetFile(handle, metadata=index.metadata)
            table = parquet.read_row_groups(groups, columns=read)
        # our types first (delta-rs writes string_view), then the values' filter
        table = table.cast(pa.schema([schema.field(n) for n in read]))
        if stored:
            table = table.filter(_matching(table, values))
        for name in names:
            if name in present:
                continue
            value = f.partition_values.get(name) if name == partition else None
            table = table.append_column(
                name, constant_array(value, schema.field(name).type, table.num_rows)
            )
        parts.append(table.select(names).cast(target))
    if not parts:
        return empty_table(target)
    return pa.concat_tables(parts)


_DUCKDB: Any = None


def _duckdb() -> Any:
    """One in-memory DuckDB per process for point lookups (each call takes a cursor:
    its own connection to it, safe across threads)."""
    global _DUCKDB
    if _DUCKDB is None:
        import duckdb

        _DUCKDB = duckdb.connect(config={"threads": 1})
    return _DUCKDB


def _duckdb_lookup(
    files: Sequence[DataFile],
    schema: pa.Schema,
    where: Mapping[str, Sequence[str | int]],
    names: list[str],
    partition: str | None,
    same_schema: bool = False,
) -> pa.Table:
    paths = [f.uri.removeprefix("file://") for f in files]
    union = "" if same_schema else "union_by_name = true, "
    stored = [n for n in names if n != partition]
    select = ", ".join(f'"{n}"' for n in stored)
    conditions = " AND ".join(
        f'"{column}" IN ({", ".join("?" for _ in values)})' for column, values in where.items()
    )
    params: list[object] = [v for values in where.values() for v in values]
    con = _duckdb().cursor()  # a connection costs ~6 ms, a cursor on one nothing
    try:
        table = con.execute(
            f"SELECT {select}, filename FROM read_parquet(?, {union}filename = true) "
            f"WHERE {conditions}",
            [paths, *params],
        ).to_arrow_table()
    finally:
        con.close()
    if partition is not None:
        value_of = {p: f.partition_values.get(partition) for p, f in zip(paths, files, strict=True)}
        values = [value_of.get(name) for name in table.column("filename").to_pylist()]
        table = table.append_column(partition, pa.array(values, pa.string()))
    return table.select(names).cast(pa.schema([schema.field(n) for n in names]))
