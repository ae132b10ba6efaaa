"""The two Delta tables of a dataset: their schemas and how to read a snapshot.

``entities/statements`` holds followthemoney statements, partitioned by
``origin``, plus ``bucket`` (the journal's flush bucket) so that a flush
batch touches few files. ``entities/translog`` holds one row per statement
(``origin``, ``id``) with ``first_seen``, ``last_seen`` and ``deleted_at``,
and who wrote it (:data:`PROVENANCE_FIELDS`): the main table is append-only
between compactions, the translog says what is live. Files written before a
column existed read it as NULL (every reader passes the full schema).

Readers never guess from directory names: files and partition values come
from the Delta log (delta-rs), so local and S3 lakes read the same way for
Spark (through :mod:`lakehouse_assets.spark.delta_io`), DuckDB and pyarrow.

Readers see a :class:`DatasetSnapshot`: the translog's latest version and the
statements version that translog commit *published*. Writers commit the
statements table first and the translog last, naming the statements version
the translog goes with, so a reader running during a flush, compact or
optimize sees the state before it or after it, never a half of it (a flush's
new statements without its tombstones, say).
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyarrow import fs as pafs

from lakehouse_assets.delta import PUBLISHED_APP_ID, DeltaLocation

log = logging.getLogger(__name__)

#: followthemoney's statement fields (its ``Statement`` model).
STATEMENT_FIELDS: tuple[str, ...] = (
    "id",
    "entity_id",
    "canonical_id",
    "prop",
    "prop_type",
    "schema",
    "value",
    "dataset",
    "lang",
    "original_value",
    "external",
    "first_seen",
    "last_seen",
)


def column_type(name: str) -> pa.DataType:
    """Arrow type of a statement column: all strings but these two."""
    return {"external": pa.bool_(), "bucket": pa.int32()}.get(name, pa.string())


#: The statements table: followthemoney's fields, the flush bucket, the origin.
STATEMENTS_SCHEMA = pa.schema(
    [(name, column_type(name)) for name in (*STATEMENT_FIELDS, "bucket", "origin")]
)

#: Who wrote a statement: the tenant and journal write (:class:`journal.Write`) of
#: its first event and of its last one (the write that deleted it, for a
#: tombstone). NULL in rows flushed before provenance was recorded.
PROVENANCE_FIELDS: tuple[str, ...] = ("first_tenant", "first_write", "last_tenant", "last_write")

TRANSLOG_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("bucket", pa.int32()),
        ("first_seen", pa.string()),
        ("last_seen", pa.string()),
        ("deleted_at", pa.string()),
        ("origin", pa.string()),
        *((name, pa.string()) for name in PROVENANCE_FIELDS),
    ]
)

#: The statements table is partitioned by origin; the translog is not.
STATEMENTS_PARTITION = "origin"


def physical_schema(schema: pa.Schema, partition: str | None) -> pa.Schema:
    """The schema stored in the Parquet files (Delta keeps partitions in the log)."""
    if partition is None:
        return schema
    return schema.remove(schema.get_field_index(partition))


def partition_dir(value: str) -> str:
    """A readable, path-safe folder name for a partition value.

    The folder name is cosmetic: readers take partition values from the log.
    """
    return re.sub(r"[^A-Za-z0-9_.-]", "_", value)[:100] or "_"


@dataclass(frozen=True, slots=True)
class DataFile:
    """One Parquet file of a snapshot, as the Delta log describes it."""

    uri: str
    path: str
    size: int
    partition_values: Mapping[str, str | None]
    min_bucket: int | None
    max_bucket: int | None

    def overlaps(self, buckets: tuple[int, int] | None) -> bool:
        """Could this file hold rows of the bucket range (stats-based pruning)?"""
        if buckets is None or self.min_bucket is None or self.max_bucket is None:
            return True
        return not (self.max_bucket < buckets[0] or self.min_bucket > buckets[1])


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The files of one version of a Delta table (empty if it doesn't exist)."""

    location: DeltaLocation
    version: int | None
    files: tuple[DataFile, ...]

    @classmethod
    def load(cls, location: DeltaLocation, version: int | None = None) -> Snapshot:
        table = location.table(version)
        if table is None:
            return cls(location, None, ())
        return cls.of(location, table)

    @classmethod
    def of(cls, location: DeltaLocation, table: DeltaTable) -> Snapshot:
        """The snapshot of an already loaded table."""
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        root = location.uri.rstrip("/")
        files = []
        for action in actions:
            parts = {
                k.removeprefix("partition."): v
                for k, v in action.items()
                if k.startswith("partition.")
            }
            files.append(
                DataFile(
                    uri=f"{root}/{action['path']}",
                    path=action["path"],
                    size=int(action["size_bytes"]),
                    partition_values=parts,
                    min_bucket=action.get("min.bucket"),
                    max_bucket=action.get("max.bucket"),
                )
            )
        return cls(location, table.version(), tuple(sorted(files, key=lambda f: f.uri)))

    def select(self, buckets: tuple[int, int] | None = None) -> list[DataFile]:
        return [f for f in self.files if f.overlaps(buckets)]


@dataclass(frozen=True, slots=True)
class DatasetSnapshot:
    """What a reader of a dataset sees: a translog version and the statements version
    it published (see the module docstring)."""

    statements: Snapshot
    translog: Snapshot

    @classmethod
    def load(
        cls,
        statements: DeltaLocation,
        translog: DeltaLocation,
        translog_version: int | None = None,
    ) -> DatasetSnapshot:
        if translog_version is None:
            return _latest_snapshot(statements, translog)
        return cls._load(statements, translog, translog_version)

    @classmethod
    def _load(
        cls,
        statements: DeltaLocation,
        translog: DeltaLocation,
        translog_version: int | None = None,
    ) -> DatasetSnapshot:
        log = translog.table(translog_version)
        if log is None:  # nothing published yet (or a first flush died before it)
            return cls(Snapshot(statements, None, ()), Snapshot(translog, None, ()))
        published = log.transaction_version(PUBLISHED_APP_ID)
        # tables written before versions were published: the latest statements
        main = Snapshot.load(statements, published)
        return cls(main, Snapshot.of(translog, log))

    @property
    def versions(self) -> tuple[int | None, int | None]:
        """(statements version, translog version)."""
        return self.statements.version, self.translog.version

    @property
    def content_key(self) -> tuple[int | None, str]:
        """What identifies the live content: the statements version and the translog's
        files. Unlike :attr:`versions` it stays the same over translog commits that
        change no data (the commit a published version leaves, see
        :mod:`lakehouse_assets.versions`), so results cached by it survive those."""
        files = hashlib.sha1("\n".join(f.path for f in self.translog.files).encode()).hexdigest()
        return self.statements.version, files


#: The latest snapshot each pair of tables was seen at, and the identity of the
#: translog commit file it was read from (see :func:`_latest_snapshot`).
_LATEST: dict[tuple[str, str], tuple[DatasetSnapshot, tuple[int, int]]] = {}
_LATEST_LOCK = threading.Lock()


def _commit_file(location: DeltaLocation, version: int) -> tuple[pafs.FileSystem, str]:
    fs, root = arrow_filesystem(location.uri.rstrip("/"), location.storage_options)
    return fs, f"{root}/_delta_log/{version:020d}.json"


def _next_commit(current: str, version: int) -> str:
    """The path of the commit after the one at ``current`` (same log folder)."""
    return f"{current.rsplit('/', 1)[0]}/{version + 1:020d}.json"


def _latest_snapshot(statements: DeltaLocation, translog: DeltaLocation) -> DatasetSnapshot:
    """The latest snapshot, loaded again only when the translog has a new commit.

    Loading two Delta tables costs milliseconds, a get's whole budget; a
    reader asks again and again of tables that rarely change. The cached
    snapshot is still the latest when the translog's next commit file does
    not exist and the commit file it was read from is the same file (size and
    modification time: a dataset deleted and created again has new ones; S3
    gives the time to the second): two stats on a local lake, two HEAD
    requests on S3. A snapshot is immutable data (file lists), so readers may
    share it. The check runs on every call, so writers calling this under
    the dataset's lock see their own last commit as before.
    """
    key = (statements.uri, translog.uri)
    with _LATEST_LOCK:
        cached = _LATEST.get(key)
    if cached is not None:
        snapshot, identity = cached
        version = snapshot.translog.version
        assert version is not None
        fs, current = _commit_file(translog, version)
        infos = fs.get_file_info([current, _next_commit(current, version)])
        same = (infos[0].size, infos[0].mtime_ns) == identity
        if same and infos[1].type == pafs.FileType.NotFound:
            return snapshot
    snapshot = DatasetSnapshot._load(statements, translog)
    version = snapshot.translog.version
    if version is not None:
        fs, current = _commit_file(translog, version)
        info = fs.get_file_info(current)
        if info.type == pafs.FileType.File and info.mtime_ns is not None:
            with _LATEST_LOCK:
                if len(_LATEST) > 1024:
                    _LATEST.clear()
                _LATEST[key] = (snapshot, (info.size, info.mtime_ns))
    return snapshot


def arrow_filesystem(uri: str, storage_options: Mapping[str, str]) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path for ``uri`` (local path or s3://)."""
    if uri.startswith("s3://"):
        endpoint = storage_options.get("AWS_ENDPOINT_URL")
        kwargs: dict[str, object] = {
            "access_key": storage_options.get("AWS_ACCESS_KEY_ID"),
            "secret_key": storage_options.get("AWS_SECRET_ACCESS_KEY"),
            "region": storage_options.get("AWS_REGION", "us-east-1"),
        }
        if endpoint:
            scheme, _, host = endpoint.partition("://")
            kwargs["endpoint_override"] = host or scheme
            kwargs["scheme"] = scheme if host else "https"
        return _s3_filesystem(tuple(sorted(kwargs.items()))), uri.removeprefix("s3://")
    return pafs.LocalFileSystem(), uri.removeprefix("file://")


@lru_cache(maxsize=64)
def _s3_filesystem(kwargs: tuple[tuple[str, object], ...]) -> pafs.S3FileSystem:
    """One S3 filesystem per endpoint and credentials (making one costs milliseconds)."""
    return pafs.S3FileSystem(**dict(kwargs))


def arrow_dataset(
    files: Sequence[DataFile],
    schema: pa.Schema,
    storage_options: Mapping[str, str],
    *,
    partition: str | None = None,
) -> pads.Dataset:
    """A pyarrow dataset over snapshot files, partition column from the Delta log.

    DuckDB and pyarrow push filters and projections into it, and prune row
    groups by their statistics.

    Every column reads with the table's type (``schema``). Files of another
    writer may store other Arrow types: a delta-rs ``delete()`` or ``update()``
    (DataFusion) rewrites files with ``string_view`` columns, and pyarrow has
    no filter kernels for those (``no kernel matching input types (string,
    string_view)``): a pushed-down filter would fail on every later read of the
    dataset. Such files (told by their footers, cached) are read and cast to
    the table's types here, and the dataset is the union of them and the
    others; the lakehouse's own files are scanned in place as always.
    """
    if not files:
        return pads.dataset(pa.Table.from_batches([], schema=schema))
    foreign = [f for f in files if _foreign_types(f, schema, storage_options)]
    native = [f for f in files if f not in foreign] if foreign else list(files)
    parts: list[pads.Dataset] = []
    if native:
        fs, _ = arrow_filesystem(native[0].uri, storage_options)
        paths = [arrow_filesystem(f.uri, storage_options)[1] for f in native]
        partitions = [
            pc.field(partition) == pc.scalar(f.partition_values.get(partition))
            if partition is not None and f.partition_values.get(partition) is not None
            else pc.scalar(True)
            for f in native
        ]
        parts.append(
            pads.FileSystemDataset.from_paths(
                paths,
                schema=schema,
                format=pads.ParquetFileFormat(),
                filesystem=fs,
                partitions=partitions,
            )
        )
    if foreign:
        tables = [_read_cast(f, schema, storage_options, partition) for f in foreign]
        parts.append(pads.InMemoryDataset(pa.concat_tables(tables), schema=schema))
    return parts[0] if len(parts) == 1 else pads.UnionDataset(schema, parts)


def _foreign_types(f: DataFile, schema: pa.Schema, storage_options: Mapping[str, str]) -> bool:
    """Whether a file stores a column of ``schema`` with another Arrow type
    (``string_view``, ``large_string``...): see :func:`arrow_dataset`."""
    try:
        stored = _row_group_index(f.uri, tuple(sorted(storage_options.items()))).arrow_schema
    except (OSError, ValueError, pa.ArrowException):
        return False  # unreadable (vacuumed...): the scan says so, as it always did
    return any(
        field.name in schema.names and field.type != schema.field(field.name).type
        for field in stored
    )


def _read_cast(
    f: DataFile, schema: pa.Schema, storage_options: Mapping[str, str], partition: str | None
) -> pa.Table:
    """A whole file with the table's column types (partition value from the log,
    columns the file lacks as NULL)."""
    fs, path = arrow_filesystem(f.uri, storage_options)
    with fs.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle)
        present = [n for n in schema.names if n in parquet.schema_arrow.names and n != partition]
        table = parquet.read(columns=present)
    columns = []
    for field in schema:
        if field.name in present:
            columns.append(table.column(field.name).cast(field.type))
        else:
            value = f.partition_values.get(field.name) if field.name == partition else None
            columns.append(pa.array([value] * table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def read_files(
    files: Sequence[DataFile],
    schema: pa.Schema,
    storage_options: Mapping[str, str],
    *,
    columns: Sequence[str] | None = None,
    filter: pc.Expression | None = None,
    partition: str | None = None,
) -> pa.Table:
    """Read snapshot files into one Arrow table."""
    dataset = arrow_dataset(files, schema, storage_options, partition=partition)
    return dataset.to_table(columns=list(columns or schema.names), filter=filter)


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
    (:data:`spark.delta_io.ROW_GROUP_ROWS`), so the row groups' min/max, from
    footers cached per file (:class:`RowGroupIndex`; data files never change),
    name the one or two that can hold a value: those are read with pyarrow and
    filtered, about a millisecond, local or S3. Where min/max leaves many row
    groups (a statement id in the entity-sorted statements table), DuckDB reads
    the files on a local lake: it also skips row groups by the Parquet bloom
    filters the writers put on the id columns (:data:`spark.delta_io.BLOOM_COLUMNS`).
    pyarrow's filtered scan does it on S3 (DuckDB would need its httpfs extension,
    which is downloaded at run time). Columns a file lacks (written before they
    existed) read as NULL either way, unless the caller says every file has the
    same columns (``same_schema``: DuckDB then skips reconciling the files'
    schemas, a millisecond a lookup).
    """
    names = list(columns or schema.names)
    if not files or not where or any(not values for values in where.values()):
        return schema.empty_table().select(names)
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


class RowGroupIndex:
    """A data file's footer and its row groups' min/max per column (taken from the
    footer when a lookup first needs that column): what a point read needs to
    pick row groups without opening the file."""

    __slots__ = ("metadata", "arrow_schema", "columns", "_ranges")

    def __init__(self, metadata: pq.FileMetaData) -> None:
        self.metadata = metadata
        #: the Arrow types the file reads as (its writer's, e.g. delta-rs's string_view)
        self.arrow_schema: pa.Schema = metadata.schema.to_arrow_schema()
        self.columns: tuple[str, ...] = tuple(self.arrow_schema.names)
        self._ranges: dict[str, tuple[tuple[Any, Any] | None, ...]] = {}

    def ranges(self, column: str) -> tuple[tuple[Any, Any] | None, ...]:
        """Per row group: (min, max) of ``column``, or None where the footer has none."""
        found = self._ranges.get(column)
        if found is None:
            index = self.columns.index(column)
            bounds: list[tuple[Any, Any] | None] = []
            for rg in range(self.metadata.num_row_groups):
                stats = self.metadata.row_group(rg).column(index).statistics
                usable = stats is not None and stats.has_min_max
                bounds.append((stats.min, stats.max) if usable else None)
            found = self._ranges[column] = tuple(bounds)
        return found

    def candidates(self, where: Mapping[str, Sequence[str | int]]) -> list[int]:
        """Row groups whose min/max admit a value of every looked-up column
        (a column the file lacks admits nothing: it reads as NULL)."""
        groups = list(range(self.metadata.num_row_groups))
        for column, values in where.items():
            if column not in self.columns:
                return []
            bounds = self.ranges(column)
            if len(values) == 1:
                value = values[0]
                groups = [g for g in groups if (b := bounds[g]) is None or b[0] <= value <= b[1]]
            else:
                groups = [
                    g
                    for g in groups
                    if (b := bounds[g]) is None or any(b[0] <= v <= b[1] for v in values)
                ]
            if not groups:
                break
        return groups


#: Footers of this many files stay cached (a few kB to a few hundred kB each).
@lru_cache(maxsize=1024)
def _row_group_index(uri: str, options: tuple[tuple[str, str], ...]) -> RowGroupIndex:
    fs, path = arrow_filesystem(uri, dict(options))
    with fs.open_input_file(path) as handle:
        return RowGroupIndex(pq.ParquetFile(handle).metadata)


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
    values = {c: pa.array(where[c], schema.field(c).type) for c in stored}
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
                name, pa.array([value] * table.num_rows, schema.field(name).type)
            )
        parts.append(table.select(names).cast(target))
    if not parts:
        return target.empty_table()
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
