"""The graph index's tables: what an edge row is, where the three Delta tables
live, which files they hold, and the writer that appends to or overwrites them.

Every other module of the index reads or writes edges through these
definitions; the writer is kept apart so that it can move onto the fenced
Delta commit the other tables use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Literal

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import BloomFilterProperties, ColumnProperties, WriterProperties

from lakehouse_assets import conventions as cv
from lakehouse_assets.tables.delta import (
    CommitFence,
    DeltaLocation,
    add_actions,
    commit,
    fenced_write,
)
from lakehouse_assets.tables.parquet_files import TableFileWriter

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


#: One edge as stored (both directions hold the same columns).
EDGE_SCHEMA: Final = pa.schema(
    [
        ("prop", pa.string()),
        ("source", pa.string()),
        ("target", pa.string()),
        ("edge_id", pa.string()),
        ("origin", pa.string()),
        ("source_schema", pa.string()),
        ("generation", pa.int64()),
    ]
)
TOMBSTONE_SCHEMA: Final = pa.schema(
    [("origin", pa.string()), ("edge_id", pa.string()), ("generation", pa.int64())]
)
BY_SOURCE: Final = cv.GRAPH_BY_SOURCE
BY_TARGET: Final = cv.GRAPH_BY_TARGET
TOMBSTONES: Final = cv.GRAPH_TOMBSTONES
STATE: Final = cv.GRAPH_STATE
#: Rows per row group and bytes per file: small, so a lookup opens one file per
#: property (the files of a property hold disjoint id ranges, each file's range
#: in the Delta log) and decodes one short row group in it. Measured at 10M
#: statements (2.3M edges): 16k rows in 64 MB files took 9 ms a lookup, 4k rows
#: in 4 MB files 3.6 ms; smaller row groups in large files were slower (DuckDB
#: pays per row group), smaller files only add files.
ROW_GROUP_ROWS: Final = 4096
FILE_BYTES: Final = 4 * 1024 * 1024


def _table_files(ds: DatasetContext, table: str, column: str) -> list[dict[str, Any]]:
    """A table's files with their property partition and min/max of ``column``."""
    dt = table_location(ds, table).table()
    if dt is None:
        return []
    return [
        {
            "path": str(a["path"]),
            "prop": a.get("partition.prop"),
            "min": a.get(f"min.{column}"),
            "max": a.get(f"max.{column}"),
        }
        for a in add_actions(dt)
    ]


def table_location(ds: DatasetContext, table: str) -> DeltaLocation:
    """Where one of the index's Delta tables lives (``graph/by_source``, ...)."""
    return DeltaLocation(
        ds.store.full_uri(cv.dataset_path(ds.name, table)), ds.store.storage_options()
    )


def _writer(lookup: str) -> WriterProperties:
    bloom = ColumnProperties(bloom_filter_properties=BloomFilterProperties(True, 0.01))
    return WriterProperties(
        max_row_group_size=ROW_GROUP_ROWS,
        compression="ZSTD",
        column_properties={lookup: bloom, "edge_id": bloom},
    )


def _write(
    ds: DatasetContext,
    table: str,
    data: pa.Table | pa.RecordBatchReader,
    mode: Literal["append", "overwrite"],
    reflects: int | None,
    *,
    fence: CommitFence,
) -> None:
    """Append or overwrite one of the index's tables, under the fence of the
    dataset's table lock the caller holds (:func:`fenced_write`). A table is
    sorted by property and lookup column here; a stream (a rebuild's) comes
    sorted so, and is written a batch at a time."""
    lookup = "source" if table == BY_SOURCE else "target"
    metadata = {"lakehouse.graph.reflects_translog": str(reflects)}
    location = table_location(ds, table)
    if table == TOMBSTONES:
        fenced_write(location, data, mode=mode, fence=fence, metadata=metadata)
        return
    if isinstance(data, pa.RecordBatchReader):
        _write_sorted(location, data, lookup, mode, metadata, fence)
        return
    fenced_write(
        location,
        data.sort_by([("prop", "ascending"), (lookup, "ascending")]),
        mode=mode,
        fence=fence,
        metadata=metadata,
        partition_by=["prop"],
        writer_properties=_writer(lookup),
        target_file_size=FILE_BYTES,
    )


def _write_sorted(
    location: DeltaLocation,
    edges: pa.RecordBatchReader,
    lookup: str,
    mode: Literal["append", "overwrite"],
    metadata: dict[str, str],
    fence: CommitFence,
) -> None:
    """A stream of edges sorted by (prop, ``lookup``) written one file at a time
    (a property's files roll at :data:`FILE_BYTES`) and committed in one
    fenced transaction; the layout delta-rs's writer gave (zstd, row groups of
    :data:`ROW_GROUP_ROWS`, bloom filters on ``lookup`` and ``edge_id``).

    delta-rs's own writer kept a partition's writer and its buffers open
    until the end of the stream: a 10M-statement rebuild peaked at 1.2 GB in
    the client, most of it there. Files written before a crash or a lost
    lock are never committed (a vacuum removes them)."""
    writer = TableFileWriter(
        location.uri,
        location.storage_options,
        EDGE_SCHEMA,
        partition="prop",
        prefix="graph",
        file_bytes=FILE_BYTES,
        grouped=True,
        row_group_rows=ROW_GROUP_ROWS,
        bloom_columns=(lookup, "edge_id"),
    )
    try:
        for batch in edges:
            writer.write(batch)
    finally:
        files = writer.close()
    commit(
        location,
        [f.add_action("prop") for f in files],
        schema=EDGE_SCHEMA,
        partition_by=["prop"],
        mode=mode,
        fence=fence,
        metadata=metadata,
    )


def _edges_of(rows: pa.Table, generation: int) -> pa.Table:
    """Edges from statement rows (entity-typed ones only)."""
    rows = rows.filter(pc.equal(rows.column("prop_type"), "entity"))
    return pa.table(
        {
            "prop": rows.column("prop").cast(pa.string()),
            "source": rows.column("canonical_id").cast(pa.string()),
            "target": rows.column("value").cast(pa.string()),
            "edge_id": rows.column("id").cast(pa.string()),
            "origin": rows.column("origin").cast(pa.string()),
            "source_schema": rows.column("schema").cast(pa.string()),
            "generation": pa.array([generation] * rows.num_rows, pa.int64()),
        },
        schema=EDGE_SCHEMA,
    )
