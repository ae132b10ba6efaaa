"""A collection's statements: its leaves' live statements, resolved, as its own tables.

One plan, on Spark or (up to ``export_duckdb_max_statements``, :mod:`.build_duckdb`)
in DuckDB on the driver: the union of every leaf's live statements (each at its latest
snapshot), left-joined with the collection's canonical-id table
(:mod:`.judgements`) twice, as nomenklatura's ``Linker.apply_statement`` does
per statement:

- ``canonical_id`` is the canonical id of the statement's ``entity_id``;
- a value of an entity-typed property (``prop_type = 'entity'``) that names
  a merged id becomes that id's canonical id, its ``original_value`` the value
  it had (unless it already had one), and its id followthemoney's key of the
  new value (``Statement.clone`` makes it so; two such statements of one
  entity that now coincide are kept once).

The rows are written as the collection's own ``entities/statements`` and
``entities/translog`` Delta tables (each an overwrite commit, the translog's
publishing the statements version, as compact does), and what changed since
the previous build is recorded in the collection's change feed
(:mod:`.changes`: the exports after it re-render only the canonical entities
it touched), so everything a dataset
does from its tables works for a collection unchanged: the exports (one
merged entity per canonical id: followthemoney's common schema, ``referents``
the other ids, ``datasets`` the leaves), statistics, ``index.json``, the
version chain, its diffs and yente's delta index (:func:`make`).

Before anything is written, the clusters that merge entities of schemata
with no common schema are looked for; any is an error naming the canonical
id, its schemata and its members (nothing published then, nothing dropped).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from functools import reduce
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc

from lakehouse_assets import conventions as cv
from lakehouse_assets import progress, staging
from lakehouse_assets.collections import build_duckdb, changes
from lakehouse_assets.collections.build_duckdb import Built
from lakehouse_assets.collections.judgements import canonical_table
from lakehouse_assets.collections.leaves import leaves
from lakehouse_assets.collections.resolver import CANONICAL_SCHEMA
from lakehouse_assets.collections.schemata import check_clusters
from lakehouse_assets.errors import CollectionError
from lakehouse_assets.journal import BUCKETS
from lakehouse_assets.spark.session import get_spark, partitions_for, ranged
from lakehouse_assets.tables import feed
from lakehouse_assets.tables.delta import commit
from lakehouse_assets.tables.schemas import (
    PROVENANCE_FIELDS,
    STATEMENT_FIELDS,
    STATEMENTS_ORDER,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)
from lakehouse_assets.tables.snapshot import Snapshot
from lakehouse_assets.tables.spark_io import live_frame, read_snapshot, write_files
from lakehouse_assets.tables.translog import MAIN_IS_LIVE_KEY

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.tables.snapshot import DatasetSnapshot

log = logging.getLogger(__name__)


@dataclass
class BuildResult:
    """What a build wrote: the leaves, their snapshots, the table versions."""

    collection: str
    leaves: dict[str, list[int | None]] = field(default_factory=dict)
    statements: int = 0
    merged_ids: int = 0
    #: what built the rows: ``duckdb`` on the driver, or ``spark``
    engine: str = "spark"
    #: statements the build made live / dead against the collection's previous
    #: build (None: a first build, or a change too large to record)
    live: int | None = None
    dead: int | None = None
    version: tuple[int | None, int | None] = (None, None)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolved_frame(
    spark: SparkSession, ds: DatasetContext
) -> tuple[DataFrame, dict[str, Any], int]:
    """The collection's statements (:data:`STATEMENTS_SCHEMA` columns), resolved;
    each leaf's (statements, translog) versions they were read at; the bytes of
    Parquet they come from (what sizes the pass)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from lakehouse_assets.spark.sql import statement_key

    names = leaves(ds.store, ds.name)
    frames = []
    versions: dict[str, Any] = {}
    parquet = 0
    for name in names:
        leaf = ds.sibling(name)
        snapshot = leaf.snapshot()
        versions[name] = list(snapshot.versions)
        parquet += sum(f.size for f in (*snapshot.statements.files, *snapshot.translog.files))
        if snapshot.statements.version is not None:
            frames.append(live_frame(spark, leaf, snapshot))
    if not frames:
        raise CollectionError(
            f"collection {ds.name}: none of its leaves ({', '.join(names)}) has statements "
            "yet; flush them first"
        )
    union = reduce(lambda a, b: a.unionByName(b), frames)
    location = canonical_table(ds)
    canon = read_snapshot(
        spark, Snapshot.load(location).files, CANONICAL_SCHEMA, location.storage_options
    )
    by_entity = F.broadcast(
        canon.select(F.col("entity_id").alias("_e"), F.col("canonical_id").alias("_ce"))
    )
    by_value = F.broadcast(
        canon.select(F.col("entity_id").alias("_v"), F.col("canonical_id").alias("_cv"))
    )
    joined = union.join(by_entity, union["entity_id"] == by_entity["_e"], "left")
    is_ref = (F.col("prop_type") == "entity") & F.col("_cv").isNotNull()
    joined = joined.join(
        by_value, (joined["prop_type"] == "entity") & (joined["value"] == by_value["_v"]), "left"
    )
    canonical = F.coalesce(F.col("_ce"), F.col("entity_id"))
    columns = {
        **{c: F.col(c) for c in STATEMENT_FIELDS},
        "canonical_id": canonical,
        "value": F.when(is_ref, F.col("_cv")).otherwise(F.col("value")),
        "original_value": F.when(
            is_ref & F.col("original_value").isNull(), F.col("value")
        ).otherwise(F.col("original_value")),
        # the journal's bucket of the canonical id: crc32 of its UTF-8 bytes
        "bucket": (F.crc32(canonical.cast("binary")) % BUCKETS).cast("int"),
        "origin": F.col("origin"),
    }
    resolved = joined.select(
        *[columns[c].alias(c) for c in STATEMENTS_SCHEMA.names], is_ref.alias("_ref")
    )
    # followthemoney's ``Statement.clone`` gives a statement whose value changed a
    # new id (``make_key`` over the new value): nomenklatura's statements have it
    resolved = resolved.withColumn(
        "id", F.when(F.col("_ref"), statement_key()).otherwise(F.col("id"))
    ).drop("_ref")
    # two values of one entity naming ids of one cluster are now one statement
    # (one id): kept once, as followthemoney's entity keeps one statement per id
    # (the first by original value and seen range, so every build keeps the same)
    first = Window.partitionBy("origin", "id").orderBy(
        F.col("original_value").asc_nulls_first(), "first_seen", "last_seen"
    )
    resolved = (
        resolved.withColumn("_n", F.row_number().over(first)).where(F.col("_n") == 1).drop("_n")
    )
    return resolved, versions, parquet


def check_schemata(resolved: DataFrame, collection: str) -> None:
    """:func:`check_clusters` of the Spark plan's rows."""
    from pyspark.sql import functions as F

    rows = (
        resolved.groupBy("canonical_id")
        .agg(
            F.array_sort(F.collect_set("schema")).alias("schemata"),
            F.array_sort(F.collect_set("entity_id")).alias("members"),
        )
        .where(F.size("schemata") > 1)
        .collect()
    )
    check_clusters([(r["canonical_id"], r["schemata"], r["members"]) for r in rows], collection)


def _spark_build(ds: DatasetContext, current: DatasetSnapshot, area: str) -> Built:
    """The build on Spark (:func:`resolved_frame`): its files written through the
    run's staging ``area``, nothing committed."""
    from pyspark.sql import functions as F

    spark = get_spark(ds.settings)
    resolved, versions, parquet = resolved_frame(spark, ds)
    resolved = resolved.persist()
    try:
        check_schemata(resolved, ds.name)
        changed = None
        if current.statements.version is not None:
            changed = changes.changed_statements(resolved, live_frame(spark, ds, current))
        main, translog = ds.statements_table, ds.translog_table
        partitions = partitions_for(ds.settings, parquet)
        ordered = ranged(
            resolved, partitions, "bucket", "canonical_id", input_bytes=parquet
        ).sortWithinPartitions(*STATEMENTS_ORDER)
        actions = write_files(
            ordered,
            main.uri,
            main.storage_options,
            STATEMENTS_SCHEMA,
            staging_uri=area,
            partition=STATEMENTS_PARTITION,
        )
        log_rows = resolved.select(
            "id",
            "bucket",
            "first_seen",
            "last_seen",
            F.lit(None).cast("string").alias("deleted_at"),
            "origin",
            *[F.lit(None).cast("string").alias(c) for c in PROVENANCE_FIELDS],
        )
        log_rows = ranged(log_rows, partitions, "bucket", input_bytes=parquet).sortWithinPartitions(
            "bucket", "origin", "id"
        )
        adds = write_files(
            log_rows, translog.uri, translog.storage_options, TRANSLOG_SCHEMA, staging_uri=area
        )
        count = resolved.count()
        merged = (
            resolved.where(F.col("canonical_id") != F.col("entity_id"))
            .select("entity_id")
            .distinct()
            .count()
        )
    finally:
        resolved.unpersist()
    return Built(actions, adds, changed, count, merged, versions)


@progress.part("collection")
def build(ds: DatasetContext, *, wait: float | None = None) -> BuildResult:
    """Rewrite the collection's statements and translog tables from its leaves and
    judgements (see the module docstring) with DuckDB or Spark
    (:func:`.build_duckdb.takes_build`); both commits, and the change feed's,
    under its ``.LOCK``."""
    clock = time.monotonic()
    result = BuildResult(ds.name)
    with ds.table_lock("collection", wait=wait) as lock, ds.job("collection") as job:
        current = ds.snapshot()
        with staging.area(ds, "collection") as area:
            if build_duckdb.takes_build(ds):
                result.engine = "duckdb"
                built = build_duckdb.build(ds, current)
            else:
                built = _spark_build(ds, current, area)
            main, translog = ds.statements_table, ds.translog_table
            meta = {"lakehouse.operation": "collection", "dataset": ds.name}
            version = commit(
                main,
                built.statements,
                schema=STATEMENTS_SCHEMA,
                partition_by=[STATEMENTS_PARTITION],
                mode="overwrite",
                metadata=meta,
                fence=lock.fence(),
                read_version=current.statements.version,
            )
            # every row live, seen ranges those of the statements table: the
            # exports' join of the two is an identity and is skipped
            logged = commit(
                translog,
                built.translog,
                schema=TRANSLOG_SCHEMA,
                mode="overwrite",
                metadata={**meta, MAIN_IS_LIVE_KEY: "true"},
                fence=lock.fence(),
                read_version=current.translog.version,
                publishes=version,
            )
            if built.changed is not None:
                changes.record(
                    ds,
                    built.changed,
                    translog_version=logged,
                    statements_version=version,
                    fence=lock.fence(),
                )
                kinds = built.changed.column("change")
                result.live = int(pc.sum(pc.equal(kinds, feed.LIVE)).as_py() or 0)
                result.dead = built.changed.num_rows - result.live
        result.leaves, result.statements, result.merged_ids = (
            built.leaves,
            built.count,
            built.merged_ids,
        )
        result.version = ds.snapshot().versions
        ds.core_tags.touch(cv.STATEMENTS_LAST_UPDATED)
        result.seconds = time.monotonic() - clock
        job.run.stats = result.as_dict()
    progress.stage(
        "collection %s: %s statements of %d leaves, %s merged ids, %s, in %.1f s (%s)",
        ds.name,
        f"{result.statements:,}",
        len(result.leaves),
        f"{result.merged_ids:,}",
        "no change recorded (a first build, or most rows changed)"
        if result.live is None
        else f"{result.live:,} statements made live and {result.dead:,} dead",
        result.seconds,
        result.engine,
    )
    return result
