"""The export lines of some entities in DuckDB: what an incremental export splices in.

An incremental export (:mod:`lakehouse_assets.incremental`) needs, for each
entity a change touched, its statements.csv lines, its entities.ftm.json line
and its statistics contribution. A few thousand entities are made in Python
(:mod:`lakehouse_assets.entity_lines`); a change too large for that took a
Spark job, and in a fresh process a JVM. Here the same rows come from the
full pass's own SQL (:mod:`.sql`) over the changed entities' live statements
held in Arrow, in this process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets.export_duckdb import sql
from lakehouse_assets.export_duckdb.lines import (
    connect,
    entity_stream,
    memory_error,
    picked_lines,
    table_ranges,
)
from lakehouse_assets.export_state import INDEX_SCHEMA, SPARK_INDEX_COLUMNS

if TYPE_CHECKING:
    from lakehouse_assets.settings import Settings


#: the rows: the index's columns, then the entity's lines
ROWS_SCHEMA = pa.schema(
    [
        *(INDEX_SCHEMA.field(c) for c in SPARK_INDEX_COLUMNS),
        pa.field("csv", pa.string()),
        pa.field("json", pa.string()),
    ]
)


def entity_rows(live: pa.Table, *, origins: int, settings: Settings, dataset: str) -> pa.Table:
    """One row per entity of ``live`` (live statements, ``query.LIVE_SCHEMA``),
    sorted by ``canonical_id``: :data:`.export_state.SPARK_INDEX_COLUMNS`, then
    ``csv`` (its lines) and ``json`` (its line), both with their line ends, as
    :func:`.entity_lines.entity_rows` makes them. ``origins``: how many origins
    the snapshot holds (copies of a statement in two are made one)."""
    import duckdb

    try:
        return _entity_rows(live, origins=origins, settings=settings, dataset=dataset)
    except duckdb.OutOfMemoryException as exc:
        raise memory_error(exc, settings, dataset, "making the changed entities' lines") from None


def _entity_rows(live: pa.Table, *, origins: int, settings: Settings, dataset: str) -> pa.Table:
    ranges = table_ranges(live, settings.export_duckdb_memory_limit)
    with connect(settings) as con:
        con.register("main", live)
        sql.statements_view(con, origins=origins, translog=False)
        parts = []
        for ids in ranges:
            sql.entity_csv_view(con, ids)
            query = "SELECT canonical_id, csv FROM entity_csv ORDER BY canonical_id"
            parts.append(con.execute(query).to_arrow_table())
        csv = pa.concat_tables(parts)
        batches = []
        for batch in entity_stream(con, dataset, lines=True, ranges=ranges):
            json = picked_lines(batch)
            ended = pc.binary_join_element_wise(json, "", "\n")
            batches.append(
                pa.RecordBatch.from_arrays(
                    [*(batch.column(c) for c in SPARK_INDEX_COLUMNS), ended],
                    names=[*SPARK_INDEX_COLUMNS, "json"],
                )
            )
    rows = pa.Table.from_batches(batches) if batches else None
    if rows is None or rows.num_rows == 0:
        return ROWS_SCHEMA.empty_table()
    if rows.column("canonical_id") != csv.column("canonical_id"):
        raise AssertionError("the entities and their CSV lines differ in their entities")
    rows = rows.append_column("csv", csv.column("csv"))
    return rows.select(ROWS_SCHEMA.names).cast(ROWS_SCHEMA)
