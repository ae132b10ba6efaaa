"""The full export pass in DuckDB on the driver: the same files as Spark's pass.

Why: a first build (and every full pass) of a dataset one machine holds paid
a cold JVM's start, JIT and garbage collection, Spark's plan, a range
exchange and Python workers for work DuckDB does in this process with the
same cores (issue 49: at 1M statements the Spark pass took 26.4 s, the
entity aggregation 17.3 s of it, against the peer's 8.0 s). Spark keeps the
pass where it grows past one machine: ``export_engine`` ``auto`` hands a
snapshot of more than ``export_duckdb_max_statements`` statements to it.

What it writes is byte for byte what :mod:`lakehouse_assets.export_pass`
writes (the SQL in :mod:`.sql`; ``test_export_duckdb.py`` compares the two
engines on arbitrary statements and on the exports' own tests):

- statements.csv by DuckDB's CSV writer straight into a local file (the run's
  staging area of a local lake, moved into place by a rename; for an S3 lake
  a scratch file, uploaded), then hashed in one read;
- entities.ftm.json from the ``entity_lines`` stream, a record batch at a
  time: rigour picks the captions the SQL leaves to it, the lines are
  written and hashed, and each entity's index row (its statistics
  contribution, the bytes of its lines) is kept for the incremental state;
- statistics.json from those rows (:class:`.export_state.Aggregates`, the
  sums the incremental export keeps), so the three files come from one read
  of one snapshot.

The same fault points as Spark's pass (``export.after_parts``, then
``export.before_replace`` / ``export.after_replace`` around each file): a
crash leaves the previous files as they were, and the state is written last.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets import conventions as cv
from lakehouse_assets import export_state, faults, progress, staging
from lakehouse_assets.export_duckdb import sql
from lakehouse_assets.export_duckdb.lines import (
    connect,
    entity_stream,
    id_ranges,
    memory_error,
    picked_lines,
)
from lakehouse_assets.export_state import SPARK_INDEX_COLUMNS, Aggregates
from lakehouse_assets.freshness import ENTITIES, STATEMENTS, STATISTICS
from lakehouse_assets.preload import preload
from lakehouse_assets.query import string_data
from lakehouse_assets.storage import LocalStore
from lakehouse_assets.tables.duck import scan_view
from lakehouse_assets.tables.schemas import STATEMENTS_PARTITION, STATEMENTS_SCHEMA, TRANSLOG_SCHEMA
from lakehouse_assets.tables.snapshot import DatasetSnapshot
from lakehouse_assets.tables.translog import main_is_live

if TYPE_CHECKING:
    import duckdb

    from lakehouse_assets.context import DatasetContext

log = logging.getLogger(__name__)


def takes_pass(ds: DatasetContext, snapshot: DatasetSnapshot) -> bool:
    """Whether DuckDB makes this snapshot's full pass (``export_engine``)."""
    engine = ds.settings.export_engine
    if engine != "auto":
        return engine == "duckdb"
    rows = sum(f.num_records or 0 for f in snapshot.statements.files)
    unknown = any(f.num_records is None for f in snapshot.statements.files)
    return not unknown and rows <= ds.settings.export_duckdb_max_statements


@contextmanager
def _local_folder(ds: DatasetContext) -> Iterator[Path]:
    """A local folder for the pass's files: in the run's staging area of a local
    lake (the finished files are renamed into place), a scratch folder of this
    process for an S3 lake (they are uploaded); removed afterwards."""
    if isinstance(ds.store, LocalStore):
        rel = staging.new_area(ds, "export")
        folder = ds.store.local_path(rel)
        folder.mkdir(parents=True, exist_ok=True)
        try:
            yield folder
        finally:
            staging.remove(ds, rel)
        return
    scratch = staging.scratch_dir(ds.settings)
    scratch.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="export-", dir=scratch))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class _HashedFile:
    """A local file written (or read back) with its SHA-256 and SHA-1 (what yente
    checks a download with) taken on the way, fsynced before it is replaced."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size = 0
        self.sha256 = hashlib.sha256()
        self.sha1 = hashlib.sha1(usedforsecurity=False)

    def update(self, data: bytes | memoryview) -> None:
        self.sha256.update(data)
        self.sha1.update(data)
        self.size += len(data)

    def hash_existing(self) -> None:
        """Hash a file DuckDB wrote: its SHA-1 on a thread beside its SHA-256
        (hashlib lets go of the GIL), as the cores are otherwise idle here
        (10M statements: 2.6 GB, 1.9 s + 1.4 s one after the other)."""
        with ThreadPoolExecutor(max_workers=1) as pool, self.path.open("rb") as src:
            while chunk := src.read(8 * 1024 * 1024):
                beside = pool.submit(self.sha1.update, chunk)
                self.sha256.update(chunk)
                beside.result()
                self.size += len(chunk)
            os.fsync(src.fileno())

    def describe(self, target: str) -> dict[str, Any]:
        return {
            "path": target,
            "size": self.size,
            "sha256": self.sha256.hexdigest(),
            "sha1": self.sha1.hexdigest(),
        }


def _replace(ds: DatasetContext, target: str, written: _HashedFile) -> None:
    """Put a finished file in place of ``target`` in one atomic step."""
    faults.point("export.before_replace")
    ds.store.put_file(cv.dataset_path(ds.name, target), written.path)
    faults.point("export.after_replace")


def _register(
    con: duckdb.DuckDBPyConnection, ds: DatasetContext, snapshot: DatasetSnapshot
) -> bool:
    """``main`` (and ``log`` where the translog changes stored rows) as views of
    the snapshot's files, scanned in place, local or on S3, with the tables'
    own column types (:func:`.tables.duck.scan_view`); whether ``log`` is
    needed."""
    options = ds.statements_table.storage_options
    files = snapshot.statements.files
    scan_view(con, "main", files, STATEMENTS_SCHEMA, options, partition=STATEMENTS_PARTITION)
    if main_is_live(snapshot.translog.location, snapshot.translog.version):
        return False
    scan_view(con, "log", snapshot.translog.files, TRANSLOG_SCHEMA, options)
    return True


@progress.part("exports")
def run_pass(
    ds: DatasetContext, kinds: frozenset[str], snapshot: DatasetSnapshot
) -> dict[str, dict[str, Any]]:
    """The requested kinds of one snapshot (see the module docstring): what the
    export records of each file, as :func:`.export_pass._run_pass` returns it.

    Raises :class:`.errors.ExportMemoryError` where DuckDB ran out of its
    memory limit (before any file was replaced)."""
    import duckdb

    try:
        return _run_pass(ds, kinds, snapshot)
    except duckdb.OutOfMemoryException as exc:
        raise memory_error(
            exc,
            ds.settings,
            ds.name,
            "in its export pass",
            "; raise that limit, or set LAKEHOUSE_EXPORT_ENGINE=spark",
        ) from None


def _run_pass(
    ds: DatasetContext, kinds: frozenset[str], snapshot: DatasetSnapshot
) -> dict[str, dict[str, Any]]:
    step = progress.Steps(log, f"export {ds.name}")
    if STATISTICS in kinds and "ftmq.model.stats" not in sys.modules:
        # ftmq's import (about half a second: pyrql builds its grammar) on a
        # thread while DuckDB, which lets go of the GIL, makes the files
        preload("ftmq.model.stats")
    out: dict[str, dict[str, Any]] = {}
    keep_state = kinds >= {STATEMENTS, ENTITIES, STATISTICS}
    origins = {f.partition_values.get(STATEMENTS_PARTITION) for f in snapshot.statements.files}
    with (
        _local_folder(ds) as folder,
        connect(ds.settings) as con,
    ):
        translog = _register(con, ds, snapshot)
        sql.statements_view(con, origins=len(origins), translog=translog)
        step(
            "DuckDB over the snapshot (%d origin(s), translog %s)",
            len(origins),
            "joined" if translog else "not needed",
        )
        csv: _HashedFile | None = None
        rows: int | None = None
        if STATEMENTS in kinds:
            csv = _HashedFile(folder / "statements.csv")
            copied = con.execute(
                f"COPY ({sql.csv_select()}) TO '{_sql_path(csv.path)}' "
                "(FORMAT csv, HEADER true, FORCE_QUOTE *)"
            ).fetchone()
            rows = int(copied[0]) if copied else 0
            csv.hash_existing()
            step("statements.csv written and hashed (%d statements)", rows)
        entities: _HashedFile | None = None
        index: pa.Table | None = None
        lengths: np.ndarray[Any, Any] | None = None
        if kinds & {ENTITIES, STATISTICS}:
            entities = _HashedFile(folder / "entities.ftm.json") if ENTITIES in kinds else None
            ranges = id_ranges(
                con,
                "main",
                sum(f.num_records or 0 for f in snapshot.statements.files),
                ds.settings.export_duckdb_memory_limit,
            )
            index, lengths = _write_entities(con, ds, entities, ranges)
            step(
                "entities aggregated and written (%d entities, %d id range(s))",
                index.num_rows,
                len(ranges),
            )
        faults.point("export.after_parts")
        if entities is not None and index is not None:
            _replace(ds, cv.ENTITIES_JSON, entities)
            out[ENTITIES] = {"rows": index.num_rows, **entities.describe(cv.ENTITIES_JSON)}
        if csv is not None:
            _replace(ds, cv.STATEMENTS_CSV, csv)
            out[STATEMENTS] = {"rows": rows, **csv.describe(cv.STATEMENTS_CSV)}
        step("files in place")
    if index is not None:
        aggregates = Aggregates()
        aggregates.add(index)
        if STATISTICS in kinds:
            out[STATISTICS] = export_state.write_statistics(
                ds.store, ds.name, aggregates.statistics().dataset_stats()
            )
        if keep_state and lengths is not None:
            files = {
                k: {x: out[k][x] for x in ("path", "size", "sha256")}
                for k in (STATEMENTS, ENTITIES)
            }
            export_state.full_state(ds, snapshot, index, lengths, files)
            step("statistics and incremental state saved")
    return out


def _write_entities(
    con: duckdb.DuckDBPyConnection,
    ds: DatasetContext,
    target: _HashedFile | None,
    ranges: Sequence[sql.IdRange],
) -> tuple[pa.Table, np.ndarray[Any, Any]]:
    """Stream the entity rows into ``target`` (None: statistics only); the
    per-entity index (:data:`.export_state.SPARK_INDEX_COLUMNS`) and the byte
    length of each entity's line, line end included, in file order."""
    batches: list[pa.RecordBatch] = []
    lengths: list[np.ndarray[Any, Any]] = []
    # each batch's index columns copied as they come: a column of DuckDB's Arrow
    # batch holds the whole batch's memory, lines included (at 10M statements
    # the kept index held 1.9 GB of lines, not 0.3 GB of index)
    schema = pa.schema([f for f in _index_schema() if f.name in SPARK_INDEX_COLUMNS])
    out = target.path.open("wb") if target is not None else None
    try:
        for batch in entity_stream(con, ds.name, lines=target is not None, ranges=ranges):
            if out is not None and target is not None:
                json = picked_lines(batch)
                ended = pc.binary_join_element_wise(json, "", "\n")
                data = string_data(ended)
                if data is not None:
                    out.write(data)
                    target.update(data)
                lengths.append(pc.binary_length(ended).to_numpy(zero_copy_only=False))
            kept = batch.select(SPARK_INDEX_COLUMNS).cast(schema)
            batches.append(kept.take(np.arange(kept.num_rows)))
        if out is not None:
            out.flush()
            os.fsync(out.fileno())
    finally:
        if out is not None:
            out.close()
    index = pa.Table.from_batches(batches, schema=schema)
    joined = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    return index, joined.astype(np.int64)


def _index_schema() -> pa.Schema:
    return export_state.INDEX_SCHEMA


def _sql_path(path: Path) -> str:
    """A local path as the text of a SQL string literal."""
    return str(path).replace("'", "''")
