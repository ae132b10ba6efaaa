"""DuckDB connections for whole-table work done in this process, in a memory limit.

A few steps read a whole table outside Spark whatever Spark's mode: the graph
index's rebuild, a version's diff (the translog files two snapshots do not
share) and a version's count of live statements. With Spark on a cluster the
rest of the work is the cluster's, and the host that runs the CLI or
Dagster's run workers should stay small; DuckDB's own default is 80% of the
machine's memory. Here it gets ``LAKEHOUSE_DUCKDB_MEMORY_LIMIT`` and spills
beyond it (sorts, joins, aggregations, the tables a step creates) to a
temporary folder that goes with the connection.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from lakehouse_assets.settings import Settings
    from lakehouse_assets.tables.snapshot import DataFile


@contextmanager
def bounded_duckdb(
    settings: Settings, *, threads: int = 2, memory_limit: str | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A DuckDB connection held to ``memory_limit`` (``settings.duckdb_memory_limit``
    unless given), its database and spill files in a temporary folder removed
    with it."""
    import duckdb  # 0.2 s: imported by the step that uses it, not by every reader

    with tempfile.TemporaryDirectory(prefix="lakehouse-duckdb-") as spill:
        # a database file, not ``:memory:``: the tables a step creates are paged
        # out to it too, not only the sorts' and joins' intermediates
        con = duckdb.connect(
            f"{spill}/work.duckdb",
            config={
                "memory_limit": memory_limit or settings.duckdb_memory_limit,
                "threads": threads,
                "temp_directory": spill,
                # a sort or join beyond the limit spills instead of keeping input order
                "preserve_insertion_order": False,
            },
        )
        try:
            yield con
        finally:
            con.close()


def give_back_freed_memory() -> None:
    """Hand back to the system what a whole-table pass freed, before the next
    part of the step starts: Arrow's memory pool keeps freed buffers for
    reuse and glibc's malloc keeps freed heap pages, so the process kept the
    peak of the pass through the rest of the step (a graph rebuild at 10M
    statements: ~80 MiB of the client)."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc (musl...)
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def scan_view(
    con: duckdb.DuckDBPyConnection,
    name: str,
    files: Sequence[DataFile],
    schema: pa.Schema,
    storage_options: Mapping[str, str],
    *,
    partition: str | None = None,
) -> None:
    """``name``: the rows of a snapshot's ``files`` with ``schema``'s columns
    (``partition``'s from the Delta log), for a whole-table pass.

    Local files are read by DuckDB's own Parquet reader, held to the
    connection's memory limit; S3 files (DuckDB reaches S3 only through its
    httpfs extension, which it cannot download here) and files that lack a
    column are a pyarrow dataset (:func:`.snapshot.arrow_dataset`). The
    reader matters at 10M statements: pyarrow's scanner reads batches ahead
    outside that limit (statements.csv's pass peaked at 3.1 GB through it,
    1.5 GB through DuckDB's reader, which was a fifth faster too)."""
    from lakehouse_assets.tables.snapshot import (
        arrow_dataset,
        arrow_filesystem,
        stored_columns,
    )

    needed = [n for n in schema.names if n != partition]
    local = bool(files) and all(not f.uri.startswith("s3://") for f in files)
    if not local or any(not set(needed) <= stored_columns(f, storage_options) for f in files):
        con.register(name, arrow_dataset(files, schema, storage_options, partition=partition))
        return
    groups: dict[str | None, list[str]] = {}
    for f in files:
        value = f.partition_values.get(partition) if partition is not None else None
        groups.setdefault(value, []).append(arrow_filesystem(f.uri, storage_options)[1])
    selects = []
    for value, paths in groups.items():
        listed = ", ".join(_literal(path) for path in paths)
        columns = [f'"{n}"' for n in needed]
        if partition is not None:
            columns.insert(
                schema.names.index(partition),
                f'{"NULL" if value is None else _literal(value)}::VARCHAR AS "{partition}"',
            )
        selects.append(
            f"SELECT {', '.join(columns)} FROM read_parquet([{listed}], union_by_name = true)"
        )
    con.execute(f"CREATE OR REPLACE TEMP VIEW {name} AS " + " UNION ALL ".join(selects))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
