"""The entity lines' stream of the DuckDB pass and rigour's caption picks in it.

Shared by the full pass (:mod:`.full_pass`) and the incremental export's rows
(:mod:`.rows`): the SQL leaves one rule to Python, rigour's pick of a caption
among an entity's several names, which is made here on the rows that carry
``_pick_names`` (few: at 1M statements of the kek set, none).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets.entity_lines import NoCommonSchema, _pick, json_string
from lakehouse_assets.export_duckdb import sql
from lakehouse_assets.tables.duck import bounded_duckdb

if TYPE_CHECKING:
    import duckdb

    from lakehouse_assets.settings import Settings

#: entity rows a record batch of the ``entity_lines`` stream holds
BATCH_ROWS = 65_536


@contextmanager
def connect(settings: Settings) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection for the pass: every core, ``export_duckdb_memory_limit``,
    spilling beyond it, Spark's order of nulls."""
    with bounded_duckdb(
        settings, threads=os.cpu_count() or 2, memory_limit=settings.export_duckdb_memory_limit
    ) as con:
        for key, value in sql.connection_settings().items():
            con.execute(f"SET {key} = '{value}'")
        yield con


def picked_lines(batch: pa.RecordBatch) -> pa.Array:
    """The batch's ``json`` with rigour's caption where it picks among names:
    Spark's ``coalesce(pick, caption)`` (:func:`.spark.ftm_sql.with_caption`)."""
    lines = batch.column("json")
    names = batch.column("_pick_names")
    if names.null_count == len(names):
        return lines
    texts = lines.to_pylist()
    ids = batch.column("canonical_id").to_pylist()
    captions = batch.column("_caption").to_pylist()
    for row in pc.indices_nonzero(pc.is_valid(names)).to_pylist():
        listed = [(n["value"], n["lang"]) for n in names[row].as_py()]
        picked = _pick(sorted(listed, key=lambda n: (n[0], n[1] or "")))
        if picked is None or picked == captions[row]:
            continue
        head = '{"id":' + json_string(ids[row])
        old = head + ("" if captions[row] is None else ',"caption":' + json_string(captions[row]))
        line = texts[row]
        if not line.startswith(old):
            raise AssertionError(f"entity {ids[row]}: its line does not start as it should")
        texts[row] = head + ',"caption":' + json_string(picked) + line[len(old) :]
    return pa.array(texts, pa.string())


def entity_stream(
    con: duckdb.DuckDBPyConnection, dataset: str, *, lines: bool
) -> Iterator[pa.RecordBatch]:
    """The ``entity_lines`` rows, a record batch at a time (``json`` only if ``lines``)."""
    import duckdb

    con.register(
        "merged", sql.merged_schemata(r[0] for r in con.execute(sql.SCHEMA_SETS).fetchall())
    )
    sql.schema_rules(con)
    sql.entity_lines_view(con)
    columns = ["canonical_id", *sql.INDEX_COLUMNS, "_caption", "_pick_names"]
    if lines:
        columns.insert(1, "json")
    listed = ", ".join(f'"{c}"' for c in columns)
    try:
        yield from con.execute(f"SELECT {listed} FROM entity_lines").to_arrow_reader(BATCH_ROWS)
    except duckdb.InvalidInputException as exc:
        message = str(exc)
        if "no common schema" in message:
            detail = message[message.index("entity ") :] if "entity " in message else message
            raise NoCommonSchema(f"dataset {dataset}: {detail}") from None
        raise
