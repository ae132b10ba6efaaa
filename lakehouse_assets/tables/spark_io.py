"""Spark reads Delta snapshots and writes Parquet for delta-rs to commit.

Spark here has no Delta JARs and no ``s3a://`` filesystem. Both directions
therefore go through pyarrow inside Spark's Python workers:

- :func:`read_snapshot` is a Spark Python Data Source: one input partition
  per Parquet file of a snapshot (the list comes from the Delta log through
  delta-rs), read with pyarrow from a local disk or S3, with the partition
  column filled from the log rather than from directory names.
- :func:`write_files` writes a DataFrame as the Parquet files of a table and
  returns their AddActions; the driver then commits them in one delta-rs
  transaction. Where Spark reaches the lake's filesystem (a local folder) it
  is Spark's own writer (in the JVM: no Python worker touches a row) into
  the run's staging area, the files then moved into the table folder;
  otherwise (S3 without ``s3a``) :func:`write_parquet` runs ``mapInArrow``:
  every task writes its rows with pyarrow straight into the table folder.
  Both write Parquet bloom filters on the lookup columns and take the
  statistics from the footers. Files a crashed run wrote but never
  committed are invisible to readers and removed by ``vacuum`` (or, in
  staging, by the next run).

Both work the same on ``local[*]`` and on a cluster whose executors can reach
the lake.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from lakehouse_assets.tables import parquet_files
from lakehouse_assets.tables.delta import file_stats, unique_file_name
from lakehouse_assets.tables.parquet_files import TableFileWriter
from lakehouse_assets.tables.schemas import (
    STATEMENT_FIELDS,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
    partition_dir,
    physical_schema,
)
from lakehouse_assets.tables.snapshot import DataFile, arrow_filesystem
from lakehouse_assets.tables.translog import main_is_live

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.tables.snapshot import DatasetSnapshot

SOURCE_NAME = "lakehouse_snapshot"


class _FilePartition(InputPartition):
    def __init__(self, files: list[dict[str, Any]]) -> None:
        super().__init__(files)
        self.files = files


class SnapshotReader(DataSourceReader):
    """Reads the files named in the ``files`` option with pyarrow."""

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        self.columns = [f.name for f in schema.fields]
        self.files: list[dict[str, Any]] = json.loads(options["files"])
        self.storage: dict[str, str] = json.loads(options.get("storage", "{}"))
        self.partition = options.get("partition") or None
        # delta-rs may write string_view columns; Spark wants exactly these types
        self.types = {k: pa.type_for_alias(v) for k, v in json.loads(options["types"]).items()}
        buckets = options.get("buckets")
        self.buckets: list[int] | None = json.loads(buckets) if buckets else None

    def partitions(self) -> Sequence[InputPartition]:
        # Group small files so that a task has some work; large ones alone.
        groups: list[list[dict[str, Any]]] = [[]]
        size = 0
        for file in self.files:
            if groups[-1] and size + file["size"] > 64 * 1024 * 1024:
                groups.append([])
                size = 0
            groups[-1].append(file)
            size += file["size"]
        return [_FilePartition(g) for g in groups if g]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _FilePartition)
        stored = [c for c in self.columns if c != self.partition]
        for file in partition.files:
            fs, path = arrow_filesystem(file["uri"], self.storage)
            reader = pq.ParquetFile(fs.open_input_file(path))
            value = (file.get("partition_values") or {}).get(self.partition)
            # a file written before a column was added reads it as NULL
            present = set(reader.schema_arrow.names)
            columns = [c for c in stored if c in present]
            for batch in reader.iter_batches(batch_size=65_536, columns=columns):
                # the table's types first: another writer's file may store
                # string_view or large types, which pyarrow's kernels refuse
                batch = pa.RecordBatch.from_arrays(
                    [
                        column if column.type == self.types[name] else column.cast(self.types[name])
                        for name, column in zip(batch.schema.names, batch.columns, strict=True)
                    ],
                    names=batch.schema.names,
                )
                if self.buckets is not None:
                    mask = pc.is_in(batch.column("bucket"), pa.array(self.buckets, pa.int32()))
                    batch = batch.filter(mask)
                    if batch.num_rows == 0:
                        continue
                arrays = []
                for name in self.columns:
                    if name == self.partition:
                        arrays.append(pa.array([value] * batch.num_rows, type=pa.string()))
                    elif name not in present:
                        arrays.append(pa.nulls(batch.num_rows, self.types[name]))
                    else:
                        arrays.append(batch.column(name))
                yield pa.RecordBatch.from_arrays(arrays, names=self.columns)


class SnapshotSource(DataSource):
    """``spark.read.format("lakehouse_snapshot")``: files of one Delta snapshot."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:  # pragma: no cover - a schema is always given
        raise ValueError("lakehouse_snapshot needs an explicit schema")

    def reader(self, schema: StructType) -> DataSourceReader:
        return SnapshotReader(schema, self.options)


_registered: set[int] = set()


def _register(spark: SparkSession) -> None:
    key = id(spark)
    if key not in _registered:
        spark.dataSource.register(SnapshotSource)
        _registered.add(key)


def read_snapshot(
    spark: SparkSession,
    files: Sequence[DataFile],
    schema: pa.Schema,
    storage_options: Mapping[str, str],
    *,
    partition: str | None = None,
    buckets: Sequence[int] | None = None,
) -> DataFrame:
    """A DataFrame over snapshot files (optionally only rows of some buckets)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    spark_schema = from_arrow_schema(schema)
    if not files:
        return spark.createDataFrame([], spark_schema)
    if all("://" not in f.uri for f in files):
        return _read_local(spark, files, schema, partition, buckets)
    _register(spark)
    payload = [
        {"uri": f.uri, "size": f.size, "partition_values": dict(f.partition_values)} for f in files
    ]
    reader = (
        spark.read.format(SOURCE_NAME)
        .schema(spark_schema)
        .option("files", json.dumps(payload))
        .option("storage", json.dumps(dict(storage_options)))
        .option("partition", partition or "")
        .option("types", json.dumps({f.name: str(f.type) for f in schema}))
    )
    if buckets is not None:
        reader = reader.option("buckets", json.dumps(sorted(set(buckets))))
    return reader.load()


def stage_table(
    table: pa.Table, staging_uri: str, storage_options: Mapping[str, str], prefix: str
) -> DataFile:
    """Write an Arrow table as one uncompressed Parquet file into a staging area
    of the lake (driver or task alike: through the lake's own filesystem)."""
    fs, root = arrow_filesystem(staging_uri, storage_options)
    fs.create_dir(root, recursive=True)
    name = unique_file_name(prefix)
    with fs.open_output_stream(f"{root}/{name}") as sink:
        pq.write_table(table, sink, compression="none", row_group_size=128_000)
    size = fs.get_file_info(f"{root}/{name}").size
    return DataFile(f"{staging_uri.rstrip('/')}/{name}", name, size, {}, None, None)


def arrow_frame(
    spark: SparkSession, table: pa.Table, staging_uri: str, storage_options: Mapping[str, str]
) -> DataFrame:
    """An Arrow table of the driver's as a DataFrame, staged as Parquet in the lake.

    ``createDataFrame(arrow)`` ships the rows through py4j and keeps them as one
    local relation (seconds per million rows, re-read on every use). Written
    once as Parquet into the run's staging area of the lake, Spark scans them
    with its vectorised reader, and this works wherever Spark runs, as long as
    it reaches the lake (Spark's own reader for a local folder, the snapshot
    data source for S3).
    """
    staged = stage_table(table, staging_uri, storage_options, "events")
    return read_snapshot(spark, [staged], table.schema, storage_options)


def _read_local(
    spark: SparkSession,
    files: Sequence[DataFile],
    schema: pa.Schema,
    partition: str | None,
    buckets: Sequence[int] | None,
) -> DataFrame:
    """Files on a disk Spark can see: its native vectorised Parquet reader.

    Partition discovery is off (``recursiveFileLookup``): the partition value
    comes from the Delta log, as in the Python source.
    """
    from functools import reduce

    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    stored = from_arrow_schema(physical_schema(schema, partition))
    groups: dict[str | None, list[str]] = {}
    for file in files:
        value = file.partition_values.get(partition) if partition else None
        groups.setdefault(value, []).append(file.uri)
    frames = []
    for value, paths in sorted(groups.items(), key=lambda kv: kv[0] or ""):
        frame = spark.read.schema(stored).option("recursiveFileLookup", "true").parquet(*paths)
        if partition is not None:
            frame = frame.withColumn(partition, F.lit(value).cast("string"))
        frames.append(frame.select(*schema.names))
    result = reduce(lambda a, b: a.unionByName(b), frames)
    if buckets is not None:
        result = result.where(F.col("bucket").isin(sorted(set(buckets))))
    return result


WRITE_RESULT = "path string, size long, partition string, stats string, rows long"


def write_files(
    df: DataFrame,
    table_uri: str,
    storage_options: Mapping[str, str],
    schema: pa.Schema,
    *,
    staging_uri: str,
    partition: str | None = None,
    prefix: str = "part",
    data_change: bool = True,
) -> list[AddAction]:
    """Write ``df`` as Parquet files of the table at ``table_uri``; return AddActions.

    ``df`` should already be ordered as the files should be. Spark's own
    writer where it can reach the table's folder (a local lake), the
    pyarrow-in-task writer otherwise. Nothing is committed here.
    """
    if "://" in table_uri:
        return write_parquet(
            df,
            table_uri,
            storage_options,
            schema,
            partition=partition,
            prefix=prefix,
            data_change=data_change,
        )
    return _write_native(
        df,
        table_uri,
        schema,
        staging_uri=staging_uri,
        partition=partition,
        prefix=prefix,
        data_change=data_change,
    )


def _write_native(
    df: DataFrame,
    table_uri: str,
    schema: pa.Schema,
    *,
    staging_uri: str,
    partition: str | None,
    prefix: str,
    data_change: bool,
) -> list[AddAction]:
    """Spark's Parquet writer into a staging folder, then each file moved into the table.

    Spark names partition folders with its own escaping and re-uses file
    names across folders: files get unique names, partition values come from
    Spark's folder names (unescaped) and go into the Delta log, where readers
    take them from.
    """
    from pyspark.sql import functions as F

    stage = Path(staging_uri.removeprefix("file://")) / f"write-{uuid.uuid4().hex}"
    columns = [F.col(f.name).cast(_spark_type(f.type)).alias(f.name) for f in schema]
    writer = df.select(*columns).write.mode("error").option("compression", "zstd")
    # the layout of :mod:`.parquet_files` (read at call time: tests make row groups small)
    rows = parquet_files.ROW_GROUP_ROWS
    writer = writer.option("parquet.block.size", str(parquet_files.ROW_GROUP_BYTES))
    writer = writer.option("parquet.block.row.count.limit", str(rows))
    for column in parquet_files.BLOOM_COLUMNS:
        if column in schema.names and column != partition:
            writer = writer.option(f"parquet.bloom.filter.enabled#{column}", "true")
            ndv = str(rows)  # a filter per row group, sized for its rows
            writer = writer.option(f"parquet.bloom.filter.expected.ndv#{column}", ndv)
            writer = writer.option(
                f"parquet.bloom.filter.fpp#{column}", str(parquet_files.BLOOM_FPP)
            )
    if partition is not None:
        writer = writer.partitionBy(partition)
    writer.parquet(str(stage))
    root = Path(table_uri.removeprefix("file://"))
    now = int(time.time() * 1000)
    actions = []
    for folder, _dirs, files in os.walk(stage):
        for name in sorted(files):
            if not name.endswith(".parquet"):
                continue
            source = Path(folder) / name
            meta = pq.read_metadata(source)
            if meta.num_rows == 0:
                continue
            values: dict[str, str | None] = {}
            target_folder = ""
            if partition is not None:
                key, _, raw = Path(folder).relative_to(stage).parts[0].partition("=")
                assert key == partition
                value = None if raw == "__HIVE_DEFAULT_PARTITION__" else unquote(raw)
                values[partition] = value
                target_folder = f"{partition}={partition_dir(value or '')}/"
            rel = f"{target_folder}{unique_file_name(prefix)}"
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(source, root / rel)
            size = (root / rel).stat().st_size
            actions.append(AddAction(rel, size, values, now, data_change, file_stats(meta)))
    shutil.rmtree(stage, ignore_errors=True)
    return actions


def _spark_type(arrow_type: pa.DataType) -> str:
    return {"int32": "int", "int64": "bigint", "bool": "boolean"}.get(str(arrow_type), "string")


def write_parquet(
    df: DataFrame,
    table_uri: str,
    storage_options: Mapping[str, str],
    schema: pa.Schema,
    *,
    partition: str | None = None,
    prefix: str = "part",
    data_change: bool = True,
) -> list[AddAction]:
    """Let Spark's tasks write ``df`` as Parquet into a table folder; return AddActions.

    ``df`` should already be ordered as the files should be (each task writes
    its rows in the order it receives them). Nothing is committed here.
    """
    storage = dict(storage_options)

    def write_task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        writer = TableFileWriter(table_uri, storage, schema, partition=partition, prefix=prefix)
        for batch in batches:
            writer.write(batch)
        written = writer.close()
        yield pa.RecordBatch.from_pydict(
            {
                "path": [f.path for f in written],
                "size": [f.size for f in written],
                "partition": [f.partition for f in written],
                "stats": [f.stats for f in written],
                "rows": [f.rows for f in written],
            },
            schema=pa.schema(
                [
                    ("path", pa.string()),
                    ("size", pa.int64()),
                    ("partition", pa.string()),
                    ("stats", pa.string()),
                    ("rows", pa.int64()),
                ]
            ),
        )

    results = df.mapInArrow(write_task, WRITE_RESULT).collect()
    actions = []
    for row in results:
        values = {partition: row["partition"]} if partition else {}
        actions.append(
            AddAction(row["path"], row["size"], values, _now_ms(), data_change, row["stats"])
        )
    return actions


def _now_ms() -> int:
    return int(time.time() * 1000)


def live_frame(
    spark: SparkSession, ds: DatasetContext, snapshot: DatasetSnapshot | None = None
) -> DataFrame:
    """Live statements of one snapshot: main rows not deleted in the translog,
    seen range from it.

    Where the translog changes no main row (:func:`.translog.main_is_live`: a
    first build, or flushes of new statements only) the main rows are the live
    ones as they are: the join with the translog, which shuffles both tables,
    is skipped (at 1M statements it was the largest step of an export)."""
    from pyspark.sql import functions as F

    snapshot = snapshot or ds.snapshot()
    options = ds.statements_table.storage_options
    main = read_snapshot(
        spark,
        snapshot.statements.files,
        STATEMENTS_SCHEMA,
        options,
        partition=STATEMENTS_PARTITION,
    )
    kept = [c for c in STATEMENT_FIELDS if c not in ("first_seen", "last_seen")]
    if main_is_live(snapshot.translog.location, snapshot.translog.version):
        return main.select(*kept, "first_seen", "last_seen", "bucket", "origin")
    log = read_snapshot(spark, snapshot.translog.files, TRANSLOG_SCHEMA, options).select(
        "origin",
        "id",
        F.col("first_seen").alias("t_first"),
        F.col("last_seen").alias("t_last"),
        "deleted_at",
    )
    return (
        main.join(log, ["origin", "id"], "left")
        .where(F.col("deleted_at").isNull())
        .select(
            *kept,
            F.coalesce("t_first", "first_seen").alias("first_seen"),
            F.coalesce("t_last", "last_seen").alias("last_seen"),
            "bucket",
            "origin",
        )
    )
