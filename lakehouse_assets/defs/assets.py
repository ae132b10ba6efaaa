"""The dataset-partitioned asset graph of the specification's dependency chain.

    archive → mappings → journal → statements + translog → statements_csv,
        └──────────────────┘                  │            entities_ftm_json,
                                              │            statistics → index
                                              └→ graph (the graph index)
    entities_ftm_json → graph_cypher (graph.cypher, graph.graphml, Neo4j CSVs)

``archive``, ``mappings`` and ``journal`` are written by tenants outside
Dagster: they are external assets whose changes the sensors report (with the
lake's tags as data versions). Everything downstream materializes on its own when they change
(``AutomationCondition.eager()``): the flush first, then the exports that share
one Spark pass, then the index.

A collection (children in its config.yml) keeps its partition of these assets,
but its tables are built and published by its own asset
(:mod:`lakehouse_assets.defs.collections`): its journal is never flushed, and
until its first build no step here writes or publishes anything for it (the
chain runs when its partition appears, before any build: it would publish an
empty version 1). Once built, the steps work from its tables like any
dataset's and find them fresh.
"""

import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
from pydantic import Field

from lakehouse_assets import conventions as cv
from lakehouse_assets.collections.leaves import is_collection
from lakehouse_assets.collections.make import built_from
from lakehouse_assets.defs.batch import SINGLE_RUN, Report, for_each_dataset, materializations
from lakehouse_assets.defs.metadata import (
    export_metadata,
    flush_counts,
    index_metadata,
    markdown_table,
    schema_distribution,
    table_metadata,
    table_summary,
    tag_version,
)
from lakehouse_assets.defs.partitions import datasets
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.exports import export
from lakehouse_assets.flush import flush
from lakehouse_assets.freshness import ENTITIES, EXPORTS, INDEX, STATEMENTS, STATISTICS
from lakehouse_assets.lake import Dataset
from lakehouse_assets.tables.schemas import STATEMENTS_SCHEMA, TRANSLOG_SCHEMA

#: The Delta tables' columns, shown as each table asset's column schema.
SCHEMAS = {"statements": STATEMENTS_SCHEMA, "translog": TRANSLOG_SCHEMA}

GROUP = "ftm_lakehouse"

#: Materialize when anything upstream changed (and on a new dataset).
AUTOMATION = dg.AutomationCondition.eager()

archive = dg.AssetSpec(
    "archive",
    partitions_def=datasets,
    group_name=GROUP,
    kinds={"file"},
    description="Source files, content-addressed (`{dataset}/archive/`). Written by tenants; "
    "the `archive_files` sensor lists it and reports changes, also of files written without "
    "the API (data version: a digest of its files).",
)

mappings = dg.AssetSpec(
    "mappings",
    deps=[archive],
    partitions_def=datasets,
    group_name=GROUP,
    kinds={"yaml"},
    description="followthemoney mapping configs of archived CSVs (`mappings/{hash}/mapping.yml`). "
    "Stored by tenants; the `mapping_changes` sensor reports changes (data version: tag "
    "`mappings/last_updated`) and processes changed mappings into the journal.",
)

journal = dg.AssetSpec(
    "journal",
    deps=[archive, mappings],
    partitions_def=datasets,
    group_name=GROUP,
    kinds={"sql"},
    description="The SQL buffer of written statements, not yet flushed. Written by tenants "
    "(and by Document entities of archived files); the `journal_writes` sensor reports "
    "changes (data version: tag `journal/last_updated`).",
)


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "statements",
            deps=[journal],
            group_name=GROUP,
            kinds={"delta", "spark"},
            automation_condition=AUTOMATION,
            description="Delta table of statements, partitioned by origin "
            "(`entities/statements`): the flush appends the journal's new statements.",
        ),
        dg.AssetSpec(
            "translog",
            deps=[journal],
            group_name=GROUP,
            kinds={"delta", "spark"},
            automation_condition=AUTOMATION,
            description="Delta table of first_seen / last_seen / deleted_at per statement "
            "(`entities/translog`), updated by the same flush.",
        ),
    ],
    partitions_def=datasets,
    backfill_policy=SINGLE_RUN,
)
def flush_tables(
    context: dg.AssetExecutionContext, lakehouse: LakehouseResource, spark: SparkResource
) -> Iterator[dg.MaterializeResult[None]]:
    """Flush the journal into the statements and translog tables (one Spark job).

    A collection's partition is not flushed: its journal takes no writes and its
    tables are built from its leaves by its own asset (``defs.collections``); the
    step reports the tables as they are."""

    def one(name: str) -> dict[str, Report]:
        ds = lakehouse.dataset(name, spark)
        if is_collection(ds.store, ds.name):
            counts: dict[str, Any] = {
                "outcome": f"a collection: built from its leaves by collection/{name}, not flushed"
            }
        else:
            result = flush(ds)  # starts Spark only if the journal holds rows
            context.log.info("flush of %s: %s", ds.name, result.as_dict())
            counts = flush_counts(ds, result.as_dict())
        reports = {}
        for key, location in (("statements", ds.statements_table), ("translog", ds.translog_table)):
            summary = table_summary(location)
            reports[key] = Report(
                {**table_metadata(summary, SCHEMAS[key]), **counts},
                dg.DataVersion(str(summary.version)) if summary.version is not None else None,
            )
        return reports

    yield from materializations(for_each_dataset(context, one))


class ExportConfig(dg.Config):
    force: bool = Field(
        default=False,
        description="Rewrite even when the export is fresh (newer than the statements).",
    )


#: asset key → export kind of the library.
EXPORT_KINDS = {
    "statements_csv": STATEMENTS,
    "entities_ftm_json": ENTITIES,
    "statistics": STATISTICS,
}


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "statements_csv",
            deps=["statements", "translog"],
            group_name=GROUP,
            kinds={"csv", "spark"},
            automation_condition=AUTOMATION,
            description="`exports/statements.csv`: live statements in followthemoney's "
            "statement CSV format, sorted by entity.",
        ),
        dg.AssetSpec(
            "entities_ftm_json",
            deps=["statements", "translog"],
            group_name=GROUP,
            kinds={"json", "spark"},
            automation_condition=AUTOMATION,
            description="`entities.ftm.json`: one aggregated FtM entity per line.",
        ),
        dg.AssetSpec(
            "statistics",
            deps=["statements", "translog"],
            group_name=GROUP,
            kinds={"json", "spark"},
            automation_condition=AUTOMATION,
            description="`exports/statistics.json`: ftmq `DatasetStats` of the live entities.",
        ),
    ],
    partitions_def=datasets,
    can_subset=True,
    backfill_policy=SINGLE_RUN,
)
def exports(
    context: dg.AssetExecutionContext,
    config: ExportConfig,
    lakehouse: LakehouseResource,
    spark: SparkResource,
) -> Iterator[dg.MaterializeResult[None]]:
    """The selected exports in one Spark pass; fresh ones are kept (spec's freshness rule)."""
    selected = {k.to_user_string() for k in context.selected_asset_keys}
    kinds = [kind for key, kind in EXPORT_KINDS.items() if key in selected]

    def one(name: str) -> dict[str, Report]:
        ds = lakehouse.dataset(name, spark)
        if unbuilt_collection(ds):
            return {key: unbuilt_report(name) for key in EXPORT_KINDS if key in selected}
        result = export(ds, kinds, force=config.force)
        if result.skipped:
            context.log.info("%s: fresh, not rewritten: %s", name, ", ".join(result.skipped))
        reports = {}
        for key, kind in EXPORT_KINDS.items():
            if key not in selected:
                continue
            written = result.written.get(kind)
            meta = export_metadata(ds, kind, written)
            meta["duration_seconds"] = round(result.seconds, 3)
            if written is not None:  # incremental (from the change feed) or a full pass
                meta["mode"] = str(written.get("mode") or "full")
                meta["entities_touched"] = int(written.get("entities_touched") or 0)
                meta["bytes_carried"] = int(written.get("bytes_carried") or 0)
                if written.get("reason"):
                    meta["full_reason"] = str(written["reason"])
            if kind == STATISTICS and written is not None:
                stats = written.get("stats") or {}
                meta["entity_count"] = int(stats.get("entity_count") or 0)
                table = schema_distribution(stats)
                if table:
                    meta["schema_distribution"] = dg.MetadataValue.md(table)
            reports[key] = Report(meta, tag_version(ds, EXPORTS[kind][1]))
        return reports

    yield from materializations(for_each_dataset(context, one))


@dg.asset(
    deps=["statements_csv", "entities_ftm_json", "statistics"],
    partitions_def=datasets,
    group_name=GROUP,
    kinds={"json"},
    automation_condition=AUTOMATION,
    backfill_policy=SINGLE_RUN,
    description="`index.json`: dataset metadata, statistics and links to the exports "
    "Each change publishes a version: a manifest under `versions/` linked to its "
    "parent by hash, and an entity diff under `diffs/` (see `lakehouse versions`).",
)
def index(
    context: dg.AssetExecutionContext, lakehouse: LakehouseResource
) -> Iterator[dg.MaterializeResult[None]]:
    def one(name: str) -> dict[str, Report]:
        ds = lakehouse.dataset(name)
        return {"index": unbuilt_report(name) if unbuilt_collection(ds) else _index(ds)}

    yield from materializations(for_each_dataset(context, one))


def _index(ds: Dataset) -> Report:
    clock = time.monotonic()
    result = export(ds, [INDEX])  # kept when fresh: no new version when nothing changed
    meta = index_metadata(ds, result.written.get(INDEX))
    meta["duration_seconds"] = round(time.monotonic() - clock, 3)
    return Report(meta, tag_version(ds, cv.EXPORTS_INDEX))


@dg.asset(
    deps=["statements", "translog"],
    partitions_def=datasets,
    group_name=GROUP,
    kinds={"delta"},
    automation_condition=AUTOMATION,
    backfill_policy=SINGLE_RUN,
    description="Graph index (`graph/by_source`, `graph/by_target`, partitioned by "
    "property, bloom filters on the lookup column): entity-typed statements as edges, "
    "kept up to date incrementally (tombstones for deletes); `lakehouse refs` reads it.",
)
def graph(
    context: dg.AssetExecutionContext, lakehouse: LakehouseResource
) -> Iterator[dg.MaterializeResult[None]]:
    def one(name: str) -> dict[str, Report]:
        ds = lakehouse.dataset(name)
        return {"graph": unbuilt_report(name) if unbuilt_collection(ds) else _graph(ds)}

    yield from materializations(for_each_dataset(context, one))


def _graph(ds: Dataset) -> Report:
    from lakehouse_assets import graph as graph_index

    result = graph_index.update(ds)
    state = graph_index.status(ds)
    meta: dict[str, Any] = {
        "mode": result.mode,
        "edges": int(state.get("edges", 0)),
        "edges_added": result.added,
        "edges_tombstoned": result.tombstoned,
        "tombstones": int(state.get("tombstones", 0)),
        "reflects_statements_version": result.reflects[0] if result.reflects[0] is not None else -1,
        "reflects_translog_version": result.reflects[1] if result.reflects[1] is not None else -1,
        "duration_seconds": round(result.seconds, 3),
        "dagster/uri": ds.store.full_uri(cv.dataset_path(ds.name, "graph")),
    }
    if state.get("dangling") is not None:
        meta["dangling_edges"] = int(state["dangling"])
    by_prop = state.get("by_prop") or {}
    if by_prop:
        meta["edges_by_property"] = dg.MetadataValue.md(
            markdown_table(["property", "edges"], sorted(by_prop.items()))
        )
    version = f"{result.reflects[0]}-{result.reflects[1]}"
    return Report(meta, dg.DataVersion(version))


@dg.asset(
    deps=["entities_ftm_json"],
    partitions_def=datasets,
    group_name=GROUP,
    kinds={"neo4j"},
    automation_condition=AUTOMATION,
    backfill_policy=SINGLE_RUN,
    description="`exports/graph.cypher` (batched UNWIND, a uniqueness constraint first), "
    "`exports/graph.graphml` and the Neo4j bulk-import CSVs under `exports/neo4j/`: "
    "followthemoney's graph model of the entities export (tag `exports/graph`).",
)
def graph_cypher(
    context: dg.AssetExecutionContext, lakehouse: LakehouseResource
) -> Iterator[dg.MaterializeResult[None]]:
    def one(name: str) -> dict[str, Report]:
        ds = lakehouse.dataset(name)
        report = unbuilt_report(name) if unbuilt_collection(ds) else _graph_cypher(ds)
        return {"graph_cypher": report}

    yield from materializations(for_each_dataset(context, one))


def _graph_cypher(ds: Dataset) -> Report:
    from lakehouse_assets.graph import exports as graph_exports

    clock = time.monotonic()
    written = graph_exports.export_graph(ds)
    meta: dict[str, Any] = {"duration_seconds": round(time.monotonic() - clock, 3)}
    if "skipped" in written:
        meta["rewritten"] = False
    else:
        meta["rewritten"] = True
        meta["nodes"] = int(written["graphml"]["nodes"])
        meta["relationships"] = int(written["graphml"]["edges"])
        meta["dagster/uri"] = ds.store.full_uri(cv.dataset_path(ds.name, cv.GRAPH_CYPHER))
    return Report(meta, tag_version(ds, cv.EXPORTS_GRAPH))


def unbuilt_collection(ds: Dataset) -> bool:
    """A collection never built yet: the dataset steps leave it alone (module docstring)."""
    return is_collection(ds.store, ds.name) and built_from(ds) is None


def unbuilt_report(name: str) -> Report:
    return Report(
        {"outcome": f"a collection not built yet: collection/{name} builds and publishes it"}
    )


ASSETS: list[dg.AssetsDefinition | dg.AssetSpec] = [
    archive,
    mappings,
    journal,
    flush_tables,
    exports,
    index,
    graph,
    graph_cypher,
]
