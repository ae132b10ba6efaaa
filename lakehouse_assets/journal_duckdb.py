"""DuckDB's reader of a SQLite journal: a flush task's claimed rows straight into Arrow.

Spark's Python workers read their slice of a SQLite journal this way
(:mod:`lakehouse_assets.spark.journal_source`), several times faster than
Python rows. DuckDB and its SQLite scanner are imported only here, inside the
functions, so nothing else that reads the journal loads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse_assets.journal import EVENTS_SCHEMA, journal_table

if TYPE_CHECKING:
    from lakehouse_assets.journal import Claim


def duckdb_connection() -> Any:
    """A one-thread DuckDB connection with the SQLite scanner loaded from its PyPI
    wheel (nothing is downloaded at run time)."""
    import duckdb
    import duckdb_extension_sqlite_scanner as scanner

    extension = (
        Path(scanner.__file__).parent
        / "extensions"
        / f"v{duckdb.__version__}"
        / "sqlite_scanner.duckdb_extension"
    )
    con = duckdb.connect(config={"threads": 1})
    con.execute(f"LOAD '{extension}'")
    return con


def read_sqlite_natively(path: str, claim: Claim, low: int, high: int) -> pa.Table:
    """Claimed rows of buckets ``low..high`` of a SQLite journal, read by DuckDB's
    SQLite reader straight into Arrow (several times faster than Python rows).

    The query runs inside SQLite (``sqlite_query``), so the journal's (dataset,
    bucket) index picks the rows: DuckDB's scan of an attached SQLite table
    pushes no filter down, and every flush task read the whole journal (at 10M
    journal rows, each of a flush's 50 tasks). ``sqlite_query`` returns text
    columns; the outer query gives them their types back.

    DuckDB brings its own SQLite library. POSIX file locks belong to a process,
    and closing one library's handle on a file drops the other library's locks
    on it (WAL's shared-memory locks included): call this only in a process
    that holds no other SQLite connection to the journal — Spark's Python
    workers, where the journal data source is the only one that opens it.
    """
    sql_types = {pa.int64(): "BIGINT", pa.int32(): "INTEGER", pa.bool_(): "BOOLEAN"}
    columns = ", ".join(
        f'CAST("{f.name}" AS {sql_types[f.type]}) AS "{f.name}"'
        if f.type in sql_types
        else f'"{f.name}"'
        for f in EVENTS_SCHEMA
    )

    def text(value: str) -> str:  # SQLite's string literal
        return "'" + value.replace("'", "''") + "'"

    if claim.bound is not None:
        where = f"dataset = {text(claim.dataset)} AND seq <= {int(claim.bound)}"
    else:
        where = f"dataset = {text(claim.dataset)} AND flush_id = {text(str(claim.flush_id))}"
    inner = (
        f"SELECT {', '.join(EVENTS_SCHEMA.names)} FROM {journal_table.name} "
        f"WHERE {where} AND bucket BETWEEN {int(low)} AND {int(high)}"
    )
    with duckdb_connection() as con:
        quoted = path.replace("'", "''")  # ATTACH takes no parameters
        con.execute(f"ATTACH '{quoted}' AS journal (TYPE sqlite, READ_ONLY)")
        table = con.execute(
            f"SELECT {columns} FROM sqlite_query('journal', $1)", [inner]
        ).to_arrow_table()
    return table.cast(EVENTS_SCHEMA)


def sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite:///...`` journal URL (None for other databases)."""
    if not url.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url

    return make_url(url).database or None
