"""A collection's build on the driver: DuckDB makes the rows the Spark plan makes.

At 1M statements the Spark build (:func:`.build.resolved_frame`) took about 60 s
of a cold ``make`` of 74, nomenklatura's whole route 23 (benchmarks/collections.py):
the JVM's start, and three passes of eight tasks over the union on two cores
for a few seconds of joins. The same SQL in DuckDB in this process — each
leaf's live statements scanned in place (:func:`.tables.duck.scan_view`),
joined with the canonical-id table, a referenced id rewritten and its
statement id recomputed (followthemoney's ``make_key``: SHA-1 of
``dataset.entity_id.prop.value[@lang][.ext]``), one row per statement id —
is held to ``export_duckdb_memory_limit`` and spills beyond it. The files
are written by the tables' own writer (:class:`.tables.parquet_files.TableFileWriter`)
from DuckDB's sorted batches, the difference with the previous build
(:mod:`.changes`) taken by ``EXCEPT ALL`` both ways.

``export_engine`` chooses, as for the exports: ``duckdb``, ``spark``, or
``auto``: DuckDB while the leaves' statement files hold at most
``export_duckdb_max_statements`` rows. Both engines build the same rows, so
the exports after them are the same bytes (``test_collections.py`` compares).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse_assets.collections import changes
from lakehouse_assets.collections.judgements import canonical_rows
from lakehouse_assets.collections.leaves import leaves
from lakehouse_assets.collections.schemata import check_clusters
from lakehouse_assets.errors import CollectionError
from lakehouse_assets.export_duckdb.lines import connect, memory_error
from lakehouse_assets.journal_rows import BUCKETS
from lakehouse_assets.tables import feed
from lakehouse_assets.tables.duck import scan_view
from lakehouse_assets.tables.parquet_files import TableFileWriter
from lakehouse_assets.tables.schemas import (
    PROVENANCE_FIELDS,
    STATEMENT_FIELDS,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)
from lakehouse_assets.tables.translog import main_is_live

if TYPE_CHECKING:
    import duckdb
    from deltalake.transaction import AddAction

    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.tables.snapshot import DatasetSnapshot

#: rows per batch fetched from DuckDB into the file writers
BATCH_ROWS = 262_144
#: a new statements file once one holds this many bytes
FILE_BYTES = 256 * 1024 * 1024


@dataclass
class Built:
    """What an engine's build wrote (nothing committed yet)."""

    statements: list[AddAction]
    translog: list[AddAction]
    #: the difference with the previous build (:mod:`.changes`); None: none recorded
    changed: pa.Table | None
    count: int = 0
    merged_ids: int = 0
    leaves: dict[str, Any] = field(default_factory=dict)


def takes_build(ds: DatasetContext) -> bool:
    """Whether DuckDB builds the collection (``export_engine``, see the module)."""
    engine = ds.settings.export_engine
    if engine != "auto":
        return engine == "duckdb"
    rows = 0
    for name in leaves(ds.store, ds.name):
        files = ds.sibling(name).snapshot().statements.files
        if any(f.num_records is None for f in files):
            return False
        rows += sum(f.num_records or 0 for f in files)
    return rows <= ds.settings.export_duckdb_max_statements


def _live_view(
    con: duckdb.DuckDBPyConnection, name: str, ds: DatasetContext, snapshot: DatasetSnapshot
) -> None:
    """``name``: a snapshot's live statements with the translog's seen range
    (:func:`.tables.spark_io.live_frame`'s rows; its join skipped where the
    translog changes no main row)."""
    options = ds.statements_table.storage_options
    scan_view(
        con,
        f"{name}_main",
        snapshot.statements.files,
        STATEMENTS_SCHEMA,
        options,
        partition=STATEMENTS_PARTITION,
    )
    if main_is_live(snapshot.translog.location, snapshot.translog.version):
        con.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_main")
        return
    scan_view(con, f"{name}_log", snapshot.translog.files, TRANSLOG_SCHEMA, options)
    con.execute(
        f"""CREATE VIEW {name} AS
        SELECT m.* EXCLUDE (first_seen, last_seen),
               coalesce(l.first_seen, m.first_seen) AS first_seen,
               coalesce(l.last_seen, m.last_seen) AS last_seen
        FROM {name}_main m LEFT JOIN {name}_log l ON m.origin = l.origin AND m.id = l.id
        WHERE l.deleted_at IS NULL"""
    )


def _canonical(con: duckdb.DuckDBPyConnection, ds: DatasetContext) -> None:
    """``canon``: the canonical-id table with each canonical id's journal bucket."""
    rows = canonical_rows(ds)
    ids = rows.column("canonical_id").to_pylist()
    buckets = pa.array([zlib.crc32(i.encode("utf-8")) % BUCKETS for i in ids], pa.int32())
    con.register("canon", rows.append_column("bucket", buckets))


def _resolve(con: duckdb.DuckDBPyConnection) -> None:
    """``resolved``: :func:`.build.resolved_frame`'s rows, as a table of the
    connection's database (paged out to it beyond the memory limit)."""
    kept = [
        c for c in STATEMENT_FIELDS if c not in ("id", "canonical_id", "value", "original_value")
    ]
    key = (
        "sha1(j.dataset || '.' || j.entity_id || '.' || j.prop || '.' || j._cv"
        " || CASE WHEN j.lang IS NOT NULL THEN '@' || j.lang ELSE '' END"
        " || CASE WHEN j.external THEN '.ext' ELSE '' END)"
    )
    con.execute(
        f"""CREATE TABLE resolved AS
        WITH joined AS (
            SELECT u.*, ce.canonical_id AS _ce, ce.bucket AS _cb, cv.canonical_id AS _cv,
                   (u.prop_type = 'entity' AND cv.canonical_id IS NOT NULL) AS _ref
            FROM leaves u
            LEFT JOIN canon ce ON u.entity_id = ce.entity_id
            -- one key, not a key and a filter: DuckDB's plan of the two conditions
            -- of this left join took 38 s at 1M statements, this one 0.2
            LEFT JOIN canon cv
                ON (CASE WHEN u.prop_type = 'entity' THEN u.value END) = cv.entity_id
        ), rewritten AS (
            SELECT {", ".join(f'j."{c}"' for c in kept)},
                   CASE WHEN j._ref THEN {key} ELSE j.id END AS id,
                   coalesce(j._ce, j.entity_id) AS canonical_id,
                   CASE WHEN j._ref THEN j._cv ELSE j.value END AS value,
                   CASE WHEN j._ref AND j.original_value IS NULL THEN j.value
                        ELSE j.original_value END AS original_value,
                   CASE WHEN j._ce IS NOT NULL THEN j._cb
                        WHEN j.canonical_id = j.entity_id THEN j.bucket
                        ELSE lakehouse_bucket(j.entity_id) END AS bucket,
                   j.origin AS origin
            FROM joined j
        )
        SELECT * FROM rewritten
        QUALIFY row_number() OVER (
            PARTITION BY origin, id
            ORDER BY original_value ASC NULLS FIRST, first_seen ASC NULLS FIRST,
                     last_seen ASC NULLS FIRST
        ) = 1"""
    )


def _bucket(ids: pa.Array) -> pa.Array:
    return pa.array(
        [None if i is None else zlib.crc32(i.encode("utf-8")) % BUCKETS for i in ids.to_pylist()],
        pa.int32(),
    )


def _changed(con: duckdb.DuckDBPyConnection) -> pa.Table | None:
    """:func:`.changes.changed_statements` of ``resolved`` against ``old``: both hold
    one row per (``origin``, ``id``), so ``EXCEPT ALL`` both ways is a full join on
    that key keeping the rows that differ in a column (a fifth of its time)."""
    columns = sorted(c for c in STATEMENTS_SCHEMA.names if c not in ("origin", "id"))
    new_row = ", ".join(f'n."{c}"' for c in columns)
    old_row = ", ".join(f'o."{c}"' for c in columns)
    rows = con.execute(
        f"""WITH differ AS (
                SELECT n.origin AS n_origin, n.id AS n_id, n.canonical_id AS n_canonical,
                       o.origin AS o_origin, o.id AS o_id, o.canonical_id AS o_canonical
                FROM resolved n FULL OUTER JOIN old o ON n.origin = o.origin AND n.id = o.id
                WHERE n.id IS NULL OR o.id IS NULL
                   OR row({new_row}) IS DISTINCT FROM row({old_row})
            )
            SELECT n_origin AS origin, n_id AS id, n_canonical AS canonical_id,
                   '{feed.LIVE}' AS change FROM differ WHERE n_id IS NOT NULL
            UNION ALL
            SELECT o_origin, o_id, o_canonical, '{feed.DEAD}' FROM differ WHERE o_id IS NOT NULL
            LIMIT {changes.MAX_FEED_ROWS + 1}"""
    ).to_arrow_table()
    return None if rows.num_rows > changes.MAX_FEED_ROWS else rows


def _write(con: duckdb.DuckDBPyConnection, query: str, writer: TableFileWriter) -> list[AddAction]:
    reader = con.execute(query).to_arrow_reader(BATCH_ROWS)
    for batch in reader:
        writer.write(batch)
    return [f.add_action(writer.partition) for f in writer.close()]


def build(ds: DatasetContext, current: DatasetSnapshot) -> Built:
    """The collection's new statements and translog files, and what changed since
    ``current`` (its tables before): see the module docstring."""
    import duckdb

    try:
        return _build(ds, current)
    except duckdb.OutOfMemoryException as exc:
        raise memory_error(
            exc, ds.settings, ds.name, "in its collection build", "; raise that limit"
        ) from None


def _build(ds: DatasetContext, current: DatasetSnapshot) -> Built:
    from duckdb.func import PythonUDFType

    names = leaves(ds.store, ds.name)
    versions: dict[str, Any] = {}
    views = []
    with connect(ds.settings) as con:
        con.create_function(
            "lakehouse_bucket",
            _bucket,
            ["varchar"],
            "integer",
            type=PythonUDFType.ARROW,
            side_effects=False,
        )
        for n, name in enumerate(names):
            leaf = ds.sibling(name)
            snapshot = leaf.snapshot()
            versions[name] = list(snapshot.versions)
            if snapshot.statements.version is not None:
                _live_view(con, f"leaf{n}", leaf, snapshot)
                views.append(f"SELECT * FROM leaf{n}")
        if not views:
            raise CollectionError(
                f"collection {ds.name}: none of its leaves ({', '.join(names)}) has "
                "statements yet; flush them first"
            )
        con.execute(f"CREATE VIEW leaves AS {' UNION ALL BY NAME '.join(views)}")
        _canonical(con, ds)
        _resolve(con)
        check_clusters(
            con.execute(
                """SELECT canonical_id, list_sort(list(DISTINCT schema)) AS schemata,
                          list_sort(list(DISTINCT entity_id)) AS members
                   FROM resolved GROUP BY canonical_id HAVING count(DISTINCT schema) > 1"""
            ).fetchall(),
            ds.name,
        )
        changed = None
        if current.statements.version is not None:
            _live_view(con, "old", ds, current)
            changed = _changed(con)
        main, log = ds.statements_table, ds.translog_table
        statements = _write(
            con,
            f"SELECT {', '.join(STATEMENTS_SCHEMA.names)} FROM resolved "
            "ORDER BY bucket, canonical_id, prop, value, origin",
            TableFileWriter(
                main.uri,
                main.storage_options,
                STATEMENTS_SCHEMA,
                partition=STATEMENTS_PARTITION,
                file_bytes=FILE_BYTES,
            ),
        )
        nulls = ", ".join(f"NULL::VARCHAR AS {c}" for c in ("deleted_at", *PROVENANCE_FIELDS))
        translog = _write(
            con,
            f"SELECT id, bucket, first_seen, last_seen, {nulls}, origin FROM resolved "
            "ORDER BY bucket, origin, id",
            TableFileWriter(log.uri, log.storage_options, TRANSLOG_SCHEMA, prefix="translog"),
        )
        count, merged = con.execute(
            """SELECT count(*), count(DISTINCT CASE WHEN canonical_id != entity_id
                                                   THEN entity_id END) FROM resolved"""
        ).fetchone() or (0, 0)
    return Built(statements, translog, changed, int(count), int(merged), versions)
