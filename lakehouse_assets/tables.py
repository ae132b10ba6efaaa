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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
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
        return pafs.S3FileSystem(**kwargs), uri.removeprefix("s3://")
    return pafs.LocalFileSystem(), uri.removeprefix("file://")


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
    """
    if not files:
        return pads.dataset(pa.Table.from_batches([], schema=schema))
    fs, _ = arrow_filesystem(files[0].uri, storage_options)
    paths = [arrow_filesystem(f.uri, storage_options)[1] for f in files]
    partitions = [
        pc.field(partition) == pc.scalar(f.partition_values.get(partition))
        if partition is not None and f.partition_values.get(partition) is not None
        else pc.scalar(True)
        for f in files
    ]
    return pads.FileSystemDataset.from_paths(
        paths,
        schema=schema,
        format=pads.ParquetFileFormat(),
        filesystem=fs,
        partitions=partitions,
    )


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


#: Up to this many looked-up values a lookup goes to DuckDB: it binds an IN list of
#: thousands slowly (a diff's batches of entities), where pyarrow's scan is better.
POINT_VALUES = 256


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

    On a local lake DuckDB reads the files: it skips row groups by their
    statistics *and* by the Parquet bloom filters the writers put on the id
    columns (:data:`spark.delta_io.BLOOM_COLUMNS`), so a statement id, which
    no min/max can narrow, costs milliseconds instead of a scan. pyarrow,
    which reads no bloom filters, does the same on S3 (DuckDB would need its
    httpfs extension, which is downloaded at run time). Columns a file lacks
    (written before they existed) read as NULL either way, unless the caller
    says every file has the same columns (``same_schema``: DuckDB then skips
    reconciling the files' schemas, a millisecond a lookup).
    """
    names = list(columns or schema.names)
    if not files or not where or any(not values for values in where.values()):
        return schema.empty_table().select(names)
    few = sum(len(values) for values in where.values()) <= POINT_VALUES
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
