"""The full export pass: one Spark plan over one snapshot.

statements.csv, entities.ftm.json and statistics.json come from one Spark
plan over the live statements, range-partitioned by ``canonical_id`` and
sorted by ``(canonical_id, prop, value, origin, id)``, all of it Spark SQL
(:mod:`lakehouse_assets.spark.ftm_sql`; tests compare it with
followthemoney's and ftmq's own code):

- CSV lines in followthemoney's statement CSV columns and dialect;
- one entity per line: followthemoney's ``StatementEntity.from_statements``
  and ``to_dict`` as aggregations (captions picked among several names by
  rigour in a Python UDF that sees those names only);
- ftmq's ``DatasetStats`` from one aggregation collected to the driver.

Spark's own text writer puts the lines of each partition into a part file in
the run's staging area of the lake (for S3 lakes, without ``s3a``, each task
writes its lines through the lake's filesystem); the driver joins the parts
in partition order (range partitioning makes that the global order), hashes
them on the way, and replaces the target in one atomic step, so a crash
mid-export leaves the previous file as it was.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse_assets import conventions as cv
from lakehouse_assets import export_duckdb, export_state, faults, incremental, progress, staging
from lakehouse_assets.errors import ExportMemoryError
from lakehouse_assets.freshness import ENTITIES, STATEMENTS, STATISTICS
from lakehouse_assets.query import SORT, csv_header, string_data
from lakehouse_assets.spark import ftm_sql
from lakehouse_assets.spark.session import get_spark, partitions_for, ranged
from lakehouse_assets.storage import LocalStore
from lakehouse_assets.tables.schemas import (
    STATEMENTS_PARTITION,
)
from lakehouse_assets.tables.snapshot import DatasetSnapshot, arrow_filesystem

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakehouse_assets.context import DatasetContext

log = logging.getLogger(__name__)


# --- the Spark pass ----------------------------------------------------------

LINES_RESULT = "part long, path string, rows long"


def _lines_task(staging_uri: str, storage: dict[str, str], name: str) -> Any:
    """A task writing its ``line`` column, ``\\n``-terminated, as one part file:
    the lines are made by Spark SQL, Python only moves their bytes (no row objects)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc
        from pyspark import TaskContext

        ctx = TaskContext.get()
        part = ctx.partitionId() if ctx is not None else 0
        fs, root = arrow_filesystem(staging_uri, storage)
        path = f"{root}/{name}-{part:05d}.txt"
        rows = 0
        with fs.open_output_stream(path) as out:
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                lines = pc.binary_join_element_wise(batch.column(0), "", "\n")
                if (data := string_data(lines)) is not None:
                    out.write(data)
                rows += batch.num_rows
        yield pa.RecordBatch.from_pydict({"part": [part], "path": [path], "rows": [rows]})

    return run


def _write_lines(
    lines: DataFrame, staging_uri: str, options: dict[str, str], name: str
) -> list[str]:
    """Write a one-column DataFrame of lines as part files in partition order; their URIs.

    Spark's own text writer (in the JVM) where it reaches the lake's folder;
    for S3 lakes (no ``s3a`` here) each task writes its lines through the
    lake's filesystem.
    """
    if "://" not in staging_uri or staging_uri.startswith("file://"):
        folder = Path(staging_uri.removeprefix("file://")) / name
        lines.write.mode("error").text(str(folder))
        return sorted(str(p) for p in folder.glob("part-*.txt"))
    _, root = arrow_filesystem(staging_uri, options)
    task = _lines_task(staging_uri, options, name)
    results = sorted(lines.mapInArrow(task, LINES_RESULT).collect(), key=lambda r: r["part"])
    return [_uri(staging_uri, r["path"], root) for r in results if r["rows"]]


@dataclass
class _Written:
    path: str
    size: int
    sha256: str
    sha1: str


def _assemble(
    ds: DatasetContext,
    parts: Sequence[str],
    target: str,
    area: str,
    header: bytes = b"",
    lines: incremental.LineLengths | None = None,
) -> _Written:
    """Join part files (in order) into ``target``, atomically; hash on the way.

    The joined file is built in the run's staging area of a local lake (the
    same disk: moved into place by a rename) or in this process's scratch
    folder before its upload to S3.
    """
    store = ds.store
    options = ds.statements_table.storage_options
    digest = hashlib.sha256()
    sha1 = hashlib.sha1(usedforsecurity=False)  # what yente checks a download with
    if isinstance(store, LocalStore):
        tmp_dir = store.local_path(area)
    else:
        tmp_dir = staging.scratch_dir(ds.settings)
    tmp_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix="assemble-", dir=tmp_dir)
    size = 0
    with open(fd, "wb") as out:
        out.write(header)
        digest.update(header)
        sha1.update(header)
        size += len(header)
        for uri in parts:
            fs, path = arrow_filesystem(uri, options)
            with fs.open_input_stream(path) as src:
                while chunk := src.read(8 * 1024 * 1024):
                    if lines is not None:  # the incremental state measures its lines
                        lines.feed(chunk)
                    out.write(chunk)
                    digest.update(chunk)
                    sha1.update(chunk)
                    size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    faults.point("export.before_replace")
    store.put_file(cv.dataset_path(ds.name, target), Path(tmp_name))
    faults.point("export.after_replace")
    return _Written(target, size, digest.hexdigest(), sha1.hexdigest())


def full_pass(
    ds: DatasetContext, kinds: frozenset[str], snapshot: DatasetSnapshot
) -> dict[str, dict[str, Any]]:
    """The full pass over one snapshot by the engine ``export_engine`` names for
    it: DuckDB on the driver (:mod:`.export_duckdb`) or Spark (below); the same
    files either way."""
    if export_duckdb.takes_pass(ds, snapshot):
        progress.stage("export %s: the full pass in DuckDB, on the driver", ds.name)
        try:
            return export_duckdb.run_pass(ds, kinds, snapshot)
        except ExportMemoryError as exc:
            if ds.settings.export_engine != "auto":
                raise
            # nothing was replaced: Spark's pass makes the same files
            log.warning("%s; the pass goes on with Spark", exc)
    return _run_pass(ds, kinds, snapshot)


@progress.part("exports")
def _run_pass(
    ds: DatasetContext, kinds: frozenset[str], snapshot: DatasetSnapshot
) -> dict[str, dict[str, Any]]:
    """One Spark plan over one snapshot writing the requested kinds (see module docstring)."""
    from pyspark.sql import functions as F

    # (here, not at the top: an incremental export or a flush on the driver
    # starts no Spark, and pyspark's import was a tenth of such a process)
    from lakehouse_assets.tables.spark_io import live_frame

    step = progress.Steps(log, f"export {ds.name}")
    spark = get_spark(ds.settings)
    step("Spark session")
    staging_rel = staging.new_area(ds, "export")
    staging_uri = ds.store.full_uri(staging_rel)
    options = dict(ds.statements_table.storage_options)
    fs, root = arrow_filesystem(staging_uri, options)
    fs.create_dir(root, recursive=True)
    cached: list[DataFrame] = []
    # the aggregations read rows sorted by entity: sort-based aggregation streams
    # them (collect_set's default hash aggregation measured 2x slower at 1M)
    sort_agg = "spark.sql.execution.useObjectHashAggregateExec"
    previous = spark.conf.get(sort_agg, "true") or "true"
    spark.conf.set(sort_agg, "false")
    try:
        parquet = sum(f.size for f in (*snapshot.statements.files, *snapshot.translog.files))
        partitions = partitions_for(ds.settings, sum(f.size for f in snapshot.statements.files))
        origins = {f.partition_values.get(STATEMENTS_PARTITION) for f in snapshot.statements.files}
        live = live_frame(spark, ds, snapshot)
        # one partition (a small dataset) is a coalesce: no shuffle, and no
        # exchange for the statistics either
        by_entity = ranged(live, partitions, "canonical_id", input_bytes=parquet)
        ordered = ftm_sql.dedupe(by_entity, origins=len(origins))
        ordered = ordered.sortWithinPartitions(*[F.col(c) for c in SORT])
        need_entities = bool(kinds & {ENTITIES, STATISTICS})
        if need_entities and STATEMENTS in kinds:
            # read twice (entities, CSV lines): cached once. Measured at 1M,
            # caching the live view too costs more than computing it twice
            # (range partitioning's sample and the pass itself)
            ordered = ordered.persist()
            cached.append(ordered)
        out: dict[str, dict[str, Any]] = {}
        rows: int | None = None
        entity_parts: list[str] = []
        csv_parts: list[str] = []
        # all three at once: the state an incremental export starts from (incremental.py)
        keep_state = kinds >= {STATEMENTS, ENTITIES, STATISTICS}
        if need_entities:
            entities = ftm_sql.entity_frame(ordered, csv_bytes=keep_state).persist()
            cached.append(entities)
            counted = ftm_sql.statistics(entities)
            rows = counted.statements
            step("entities aggregated and counted (statistics)")
            if ENTITIES in kinds:
                captioned = ftm_sql.with_caption(entities, picks=counted.picks)
                lines = captioned.sortWithinPartitions("canonical_id").select(ftm_sql.entity_json())
                entity_parts = _write_lines(lines, staging_uri, options, "entities")
                step("entities.ftm.json parts written")
        if STATEMENTS in kinds:
            csv_parts = _write_lines(
                ordered.select(ftm_sql.csv_line()), staging_uri, options, "csv"
            )
            if rows is None:
                rows = ordered.count()
            step("statements.csv parts written")
        spark_index = None
        if keep_state:
            # sorted by Spark: the partitions are canonical_id ranges in order (as
            # the entity lines' parts), so the collected rows come sorted and this
            # process holds one copy of them, not a second one sorted
            spark_index = (
                entities.select(
                    *[c for c in export_state.SPARK_INDEX_COLUMNS if c != "pick"],
                    F.col("_pick_names").isNotNull().cast("long").alias("pick"),
                )
                .sortWithinPartitions("canonical_id")
                .toArrow()
            )
            step("per-entity index collected")
        faults.point("export.after_parts")
        chunks = incremental.LineLengths() if keep_state else None
        if ENTITIES in kinds:
            w = _assemble(ds, entity_parts, cv.ENTITIES_JSON, staging_rel, lines=chunks)
            out[ENTITIES] = {"rows": counted.entities, **_describe(w)}
        if STATEMENTS in kinds:
            header = csv_header()
            w = _assemble(ds, csv_parts, cv.STATEMENTS_CSV, staging_rel, header=header)
            out[STATEMENTS] = {"rows": rows, **_describe(w)}
        step("parts joined and hashed")
        if STATISTICS in kinds:
            # after the writes: ftmq's import ran while Spark wrote them
            out[STATISTICS] = export_state.write_statistics(
                ds.store, ds.name, counted.dataset_stats()
            )
        if spark_index is not None and chunks is not None:
            files = {
                k: {x: out[k][x] for x in ("path", "size", "sha256")}
                for k in (STATEMENTS, ENTITIES)
            }
            export_state.full_state(ds, snapshot, spark_index, chunks.lengths(), files)
            step("incremental state saved")
        return out
    finally:
        _release(spark, cached, sort_agg, previous)
        staging.remove(ds, staging_rel)


def _release(spark: SparkSession, cached: list[DataFrame], conf: str, previous: str) -> None:
    """Unpersist the pass's frames, dependants first (unpersisting a frame others
    were built on makes Spark re-plan their caches), and restore the setting.

    Best effort: after a failed job Spark may be gone (an out-of-memory error
    stops the SparkContext), and a failure here must neither hide the error
    that ended the pass nor keep the staging area from being removed."""
    for frame in reversed(cached):
        try:
            frame.unpersist()
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.warning("could not unpersist a cached frame: %s", _first_line(exc))
    try:
        spark.conf.set(conf, previous)
    except Exception as exc:  # noqa: BLE001 - see the docstring
        log.warning("could not restore %s: %s", conf, _first_line(exc))


def _first_line(exc: BaseException) -> str:
    """An error's first line (a Py4J error carries the JVM's whole stack)."""
    return next(iter(str(exc).splitlines()), repr(exc))


def _uri(staging_uri: str, task_path: str, root: str) -> str:
    """Back from a task's filesystem path to a URI the driver can open."""
    return staging_uri.rstrip("/") + task_path[len(root.rstrip("/")) :]


def _describe(w: _Written) -> dict[str, Any]:
    return {"path": w.path, "size": w.size, "sha256": w.sha256, "sha1": w.sha1}
