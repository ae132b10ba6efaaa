"""A table's Parquet files written with pyarrow, in the lake's layout.

The layout every writer of the tables keeps (Spark's own writer in
:mod:`.spark_io` sets the same): zstd, row groups of at most
:data:`ROW_GROUP_ROWS` rows (point reads find an entity by min/max in one or
two small groups), Parquet bloom filters on the lookup columns, one file per
partition value, and Delta statistics taken from the footer. Two callers: the
tasks of :func:`.spark_io.write_parquet` (a lake Spark's JVM cannot write to:
S3 without ``s3a``) and the driver of a small flush (a daily change: a few
thousand rows, where a Spark job would cost more than the write).

Only pyarrow and delta-rs' action type here: nothing starts Spark.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from lakehouse_assets.tables.delta import file_stats, unique_file_name
from lakehouse_assets.tables.schemas import partition_dir
from lakehouse_assets.tables.snapshot import arrow_filesystem

#: Row groups of at most this many rows keep point reads (get entity) cheap: the
#: files are sorted by their lookup keys, so min/max names the one or two row
#: groups that can hold an entity, and reading one costs about its size. At 1M
#: statements, reading an 8k-row group took 2.1 ms, a 2k-row one 0.6 ms; a full
#: scan got 6% slower (1k rows: 55% slower), the files 5% larger.
ROW_GROUP_ROWS = 2048
#: Spark's writer also closes a row group at this many bytes (wide rows).
ROW_GROUP_BYTES = 2 * 1024 * 1024
#: Columns that point reads look up: Parquet bloom filters let a reader skip
#: row groups whose min/max range contains the value but whose rows do not.
BLOOM_COLUMNS = ("canonical_id", "id")
BLOOM_FPP = 0.01
#: Columns whose every value is its own (a statement's id): written without a dictionary.
UNIQUE_COLUMNS = ("id",)


@dataclass(frozen=True)
class WrittenFile:
    """A Parquet file written into a table folder, not yet committed."""

    #: path relative to the table folder
    path: str
    size: int
    #: the partition value its rows share (None: an unpartitioned table)
    partition: str | None
    #: Delta ``stats`` JSON from its footer
    stats: str
    rows: int

    def add_action(self, partition: str | None, *, data_change: bool = True) -> AddAction:
        values = {partition: self.partition} if partition else {}
        return AddAction(
            self.path, self.size, values, int(time.time() * 1000), data_change, self.stats
        )


@dataclass
class _Open:
    rel: str
    sink: Any
    writer: pq.ParquetWriter
    collector: list[pq.FileMetaData]


class TableFileWriter:
    """Writes rows, in the order given, into new files of the table at ``table_uri``:
    one file per partition value (``partition``: a column of ``schema`` kept in
    the folder name and the Delta log, not in the file).

    ``file_bytes`` starts a new file once one holds that many bytes, and
    ``grouped`` says the rows come grouped by partition value (a sorted
    stream): a partition's file is closed as soon as the next value starts,
    so one file is open at a time and memory does not grow with the number
    of partitions. ``row_group_rows`` and ``bloom_columns`` default to the
    statements tables' layout.
    """

    def __init__(
        self,
        table_uri: str,
        storage_options: Mapping[str, str],
        schema: pa.Schema,
        *,
        partition: str | None = None,
        prefix: str = "part",
        file_bytes: int | None = None,
        grouped: bool = False,
        row_group_rows: int | None = None,
        bloom_columns: tuple[str, ...] | None = None,
    ) -> None:
        self.fs, self.root = arrow_filesystem(table_uri, storage_options)
        self.schema = schema
        self.partition = partition
        self.prefix = prefix
        self.file_bytes = file_bytes
        self.grouped = grouped
        # the module's values are read here, not bound as defaults, so the
        # layout follows them (a test shrinks ROW_GROUP_ROWS to get many groups)
        self.row_group_rows = row_group_rows or ROW_GROUP_ROWS
        self.bloom_columns = tuple(
            c for c in (BLOOM_COLUMNS if bloom_columns is None else bloom_columns) if c != partition
        )
        self.stored = pa.schema([f for f in schema if f.name != partition])
        self._open: dict[str | None, _Open] = {}
        self._written: list[WrittenFile] = []

    def _writer(self, value: str | None) -> _Open:
        if value not in self._open:
            folder = f"{self.partition}={partition_dir(value or '')}/" if self.partition else ""
            rel = f"{folder}{unique_file_name(self.prefix)}"
            self.fs.create_dir(f"{self.root}/{folder}".rstrip("/"), recursive=True)
            collector: list[pq.FileMetaData] = []
            sink = self.fs.open_output_stream(f"{self.root}/{rel}")
            writer = pq.ParquetWriter(
                sink,
                self.stored,
                compression="zstd",
                # a dictionary of unique ids is built, then dropped: 9% of a
                # translog file's write, and the files 5% larger
                use_dictionary=[n for n in self.stored.names if n not in UNIQUE_COLUMNS],
                metadata_collector=collector,
                bloom_filter_options={
                    c: {"ndv": self.row_group_rows, "fpp": BLOOM_FPP}
                    for c in self.bloom_columns
                    if c in self.stored.names
                },
            )
            self._open[value] = _Open(rel, sink, writer, collector)
        return self._open[value]

    def write(self, rows: pa.Table | pa.RecordBatch) -> None:
        """Append rows (any column order; cast to the table's types)."""
        if rows.num_rows == 0:
            return
        table = pa.Table.from_batches([rows]) if isinstance(rows, pa.RecordBatch) else rows
        table = table.select(self.schema.names).cast(self.schema)
        if self.partition is None:
            groups: list[tuple[str | None, pa.Table]] = [(None, table)]
        else:
            values = table.column(self.partition)
            groups = [(v, table.filter(pc.equal(values, v))) for v in pc.unique(values).to_pylist()]
        for value, part in groups:
            if self.partition is not None:
                part = part.drop_columns([self.partition])
            if self.grouped:
                for other in [v for v in self._open if v != value]:
                    self._finish(other)
            open_file = self._writer(value)
            open_file.writer.write_table(part, row_group_size=self.row_group_rows)
            if self.file_bytes is not None and open_file.sink.tell() >= self.file_bytes:
                self._finish(value)

    def _finish(self, value: str | None) -> None:
        open_file = self._open.pop(value)
        open_file.writer.close()
        size = open_file.sink.tell()
        open_file.sink.close()
        meta = open_file.collector[0]
        self._written.append(
            WrittenFile(open_file.rel, size, value, file_stats(meta), meta.num_rows)
        )

    def close(self) -> list[WrittenFile]:
        """Finish every file (on S3 each object appears now, complete)."""
        for value in list(self._open):
            self._finish(value)
        written, self._written = self._written, []
        return written


def write_table(
    table: pa.Table,
    table_uri: str,
    storage_options: Mapping[str, str],
    schema: pa.Schema,
    *,
    partition: str | None = None,
    prefix: str = "part",
    data_change: bool = True,
) -> list[AddAction]:
    """Write an Arrow table of the driver's (already in the files' order) as new
    files of a table; return their AddActions. Nothing is committed here."""
    writer = TableFileWriter(table_uri, storage_options, schema, partition=partition, prefix=prefix)
    writer.write(table)
    return [f.add_action(partition, data_change=data_change) for f in writer.close()]
