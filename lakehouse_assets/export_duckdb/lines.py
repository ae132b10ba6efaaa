"""The entity lines' stream of the DuckDB pass and rigour's caption picks in it.

Shared by the full pass (:mod:`.full_pass`) and the incremental export's rows
(:mod:`.rows`): the SQL leaves one rule to Python, rigour's pick of a caption
among an entity's several names, which is made here on the rows that carry
``_pick_names`` (few: at 1M statements of the kek set, none).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets.entity_lines import NoCommonSchema, _pick, json_string
from lakehouse_assets.errors import ExportMemoryError
from lakehouse_assets.export_duckdb import sql
from lakehouse_assets.tables.duck import bounded_duckdb

if TYPE_CHECKING:
    import duckdb

    from lakehouse_assets.settings import Settings

#: entity rows a record batch of the ``entity_lines`` stream holds
BATCH_ROWS = 65_536
#: Statements of the snapshot an entity range holds per GiB of
#: ``export_duckdb_memory_limit``: the aggregation keeps each entity's values
#: in lists, which DuckDB does not spill, on each of its threads (1M statements
#: of the kek set in one range used about 0.6 GB of 1GB).
STATEMENTS_PER_GIB = 1_000_000
#: canonical ids sampled to place the ranges' boundaries
SAMPLED_IDS = 65_536


def id_ranges(
    con: duckdb.DuckDBPyConnection, table: str, statements: int, memory_limit: str
) -> list[sql.IdRange]:
    """Ranges of canonical ids that cut ``statements`` rows of ``table`` into
    parts of about :data:`STATEMENTS_PER_GIB` per GiB of ``memory_limit``; one
    range (everything) for a snapshot that fits.

    The boundaries are quantiles of a sample of the canonical ids (a scan of
    that one column). Not the row groups' minima in the footers: the files are
    sorted by bucket first, so a row group's ids span the whole id space and
    their minima all fall at its start (at 10M statements the last range then
    held nearly everything). Where they fall changes no byte of the output:
    an entity is in one range, and the ranges follow each other in id order."""
    per_range = max(1, int(STATEMENTS_PER_GIB * memory_gib(memory_limit)))
    count = -(-statements // per_range)
    if count <= 1:
        return [(None, None)]
    sample = con.execute(
        f"SELECT canonical_id FROM {table} WHERE canonical_id IS NOT NULL "
        f"USING SAMPLE reservoir({SAMPLED_IDS} ROWS) REPEATABLE (42)"
    ).fetchall()
    ids = sorted(str(row[0]) for row in sample)
    bounds = sorted({ids[len(ids) * i // count] for i in range(1, count)} if ids else set())
    edges: list[str | None] = [None, *bounds, None]
    return [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def table_ranges(table: pa.Table, memory_limit: str) -> list[sql.IdRange]:
    """:func:`id_ranges` for statements held in Arrow (an incremental change's):
    boundaries among their distinct canonical ids, about as many rows apart."""
    per_range = max(1, int(STATEMENTS_PER_GIB * memory_gib(memory_limit)))
    count = -(-table.num_rows // per_range)
    if count <= 1:
        return [(None, None)]
    ids = pc.unique(table.column("canonical_id").combine_chunks().drop_null())
    ids = ids.take(pc.sort_indices(ids)).to_pylist()
    bounds = sorted({str(ids[len(ids) * i // count]) for i in range(1, count)})
    edges: list[str | None] = [None, *bounds, None]
    return [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def memory_error(
    exc: BaseException, settings: Settings, dataset: str, what: str, advice: str = ""
) -> ExportMemoryError:
    """The error of a DuckDB pass that ran out of ``export_duckdb_memory_limit``:
    which dataset, what it was making, the limit's setting and DuckDB's first line."""
    first = next(iter(str(exc).splitlines()), repr(exc))
    return ExportMemoryError(
        f"dataset {dataset}: DuckDB ran out of memory {what} "
        f"(LAKEHOUSE_EXPORT_DUCKDB_MEMORY_LIMIT={settings.export_duckdb_memory_limit}): "
        f"{first}{advice}"
    )


def memory_gib(limit: str) -> float:
    """GiB of a memory size as the settings write it (``1GB``, ``512MiB``)."""
    import re

    match = re.fullmatch(r"\s*([0-9.]+)\s*(KB|MB|GB|KiB|MiB|GiB)\s*", limit)
    if match is None:
        raise ValueError(f"not a memory size: {limit!r}")
    scale = {"KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    return float(match[1]) * scale[match[2]] / 2**30


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
    con: duckdb.DuckDBPyConnection,
    dataset: str,
    *,
    lines: bool,
    ranges: Sequence[sql.IdRange] = ((None, None),),
) -> Iterator[pa.RecordBatch]:
    """The ``entity_lines`` rows, a record batch at a time (``json`` only if
    ``lines``), a range of canonical ids after the other (:func:`id_ranges`)."""
    import duckdb

    sql.schema_rules(con)
    columns = ["canonical_id", *sql.INDEX_COLUMNS, "_caption", "_pick_names"]
    if lines:
        columns.insert(1, "json")
    listed = ", ".join(f'"{c}"' for c in columns)
    try:
        for ids in ranges:
            found = con.execute(sql.schema_sets(ids)).fetchall()
            con.register("merged", sql.merged_schemata(r[0] for r in found))
            sql.entity_lines_view(con, ids)
            yield from con.execute(f"SELECT {listed} FROM entity_lines").to_arrow_reader(BATCH_ROWS)
    except duckdb.InvalidInputException as exc:
        message = str(exc)
        if "no common schema" in message:
            detail = message[message.index("entity ") :] if "entity " in message else message
            raise NoCommonSchema(f"dataset {dataset}: {detail}") from None
        raise
