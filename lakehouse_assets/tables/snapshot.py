"""How to read a dataset's Delta tables: snapshots, their files, pyarrow datasets.

Readers never guess from directory names: files and partition values come
from the Delta log (delta-rs), so local and S3 lakes read the same way for
Spark (through :mod:`lakehouse_assets.tables.spark_io`), DuckDB and pyarrow.

Readers see a :class:`DatasetSnapshot`: the translog's latest version and the
statements version that translog commit *published*. Writers commit the
statements table first and the translog last, naming the statements version
the translog goes with, so a reader running during a flush, compact or
optimize sees the state before it or after it, never a half of it (a flush's
new statements without its tombstones, say).

Also here: the pyarrow filesystem of a lake URI and the cached Parquet
footers of data files (:class:`RowGroupIndex`), which both the scans here and
the point lookups (:mod:`lakehouse_assets.tables.lookups`) use.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyarrow import fs as pafs

from lakehouse_assets.tables.delta import PUBLISHED_APP_ID, DeltaLocation, add_actions

if TYPE_CHECKING:
    import pyarrow.dataset as pads


@dataclass(frozen=True, slots=True)
class DataFile:
    """One Parquet file of a snapshot, as the Delta log describes it."""

    uri: str
    path: str
    size: int
    partition_values: Mapping[str, str | None]
    min_bucket: int | None
    max_bucket: int | None
    #: rows of the file (the log's ``numRecords``; None where it has no stats)
    num_records: int | None = None

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
        actions = add_actions(table)
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
                    num_records=action.get("num_records"),
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

    pyarrow.dataset is imported here, not by the module: it imports pandas
    (0.2-0.3 s), which the point reads of ``get`` and ``refs`` do without.
    """
    import pyarrow.dataset as pads

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


def stored_columns(f: DataFile, storage_options: Mapping[str, str]) -> set[str]:
    """The columns a data file stores, from its footer (cached); none where it
    cannot be read (the scan that follows says why)."""
    try:
        index = _row_group_index(f.uri, tuple(sorted(storage_options.items())))
    except (OSError, ValueError, pa.ArrowException):
        return set()
    return set(index.columns)


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


def forget_footers() -> None:
    """Drop the cached footers of :func:`_row_group_index`: for point reads they
    save a request per file, but a whole-table pass (a graph rebuild) has no
    use for them after its scan, and at 10M statements they held ~0.1 GB."""
    _row_group_index.cache_clear()


#: Footers of this many files stay cached (a few kB to a few MB each).
@lru_cache(maxsize=1024)
def _row_group_index(uri: str, options: tuple[tuple[str, str], ...]) -> RowGroupIndex:
    fs, path = arrow_filesystem(uri, dict(options))
    with fs.open_input_file(path) as handle:
        return RowGroupIndex(pq.ParquetFile(handle).metadata)
