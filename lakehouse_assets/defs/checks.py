"""Data checks: what must hold before data flows on to the exports.

They read the live statements in Spark (the run's session) and report counts
and a few offending examples. Invalid schemata/properties and wrong statement
ids block the exports; dangling references only warn (a dataset may reference
entities it does not hold yet).
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg
import pyarrow as pa
from followthemoney import model
from followthemoney.statement import Statement

from lakehouse_assets import conventions as cv
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.exports import live_frame

#: How many offending examples a failed check shows.
EXAMPLES = 10


def _problem(schema: str, prop: str, prop_type: str) -> str | None:
    """Why a (schema, prop, prop_type) of a statement is not valid in the model."""
    found = model.get(schema)
    if found is None:
        return f"unknown schema {schema!r}"
    if prop == Statement.BASE:
        return None
    prop_obj = found.get(prop)
    if prop_obj is None:
        return f"{schema} has no property {prop!r}"
    if prop_obj.type.name != prop_type:
        return f"{schema}:{prop} has type {prop_obj.type.name}, statement says {prop_type!r}"
    return None


SCHEMA_VALID = "statements_schema_valid"
IDS_VALID = "statement_ids_valid"
REFERENCES = "references_resolve"


def _invalid_schemata(live: Any) -> dg.AssetCheckResult:
    combos = live.groupBy("schema", "prop", "prop_type").count().collect()
    bad = [
        {"schema": r["schema"], "prop": r["prop"], "statements": r["count"], "problem": p}
        for r in combos
        if (p := _problem(r["schema"], r["prop"], r["prop_type"])) is not None
    ]
    return dg.AssetCheckResult(
        check_name=SCHEMA_VALID,
        passed=not bad,
        metadata={
            "schema_property_pairs": len(combos),
            "invalid_pairs": len(bad),
            "invalid_statements": sum(b["statements"] for b in bad),
            "examples": dg.MetadataValue.json(bad[:EXAMPLES]),
        },
    )


def _id_task(rows: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Recompute each statement's id with followthemoney; emit the mismatches."""
    for batch in rows:
        data = batch.to_pydict()
        bad: dict[str, list[Any]] = {"id": [], "expected": [], "entity_id": [], "prop": []}
        for i, sid in enumerate(data["id"]):
            expected = Statement.make_key(
                data["dataset"][i],
                data["entity_id"][i],
                data["prop"][i],
                data["value"][i],
                bool(data["external"][i]),
            )
            if sid != expected:
                bad["id"].append(sid)
                bad["expected"].append(expected)
                bad["entity_id"].append(data["entity_id"][i])
                bad["prop"].append(data["prop"][i])
        if bad["id"]:
            yield pa.RecordBatch.from_pydict(bad)


def _wrong_ids(live: Any) -> dg.AssetCheckResult:
    columns = live.select("id", "dataset", "entity_id", "prop", "value", "external")
    schema = "id string, expected string, entity_id string, prop string"
    mismatches = columns.mapInArrow(_id_task, schema).persist()
    count = mismatches.count()
    examples = [r.asDict() for r in mismatches.limit(EXAMPLES).collect()]
    mismatches.unpersist()
    return dg.AssetCheckResult(
        check_name=IDS_VALID,
        passed=count == 0,
        metadata={"wrong_ids": count, "examples": dg.MetadataValue.json(examples)},
    )


def _dangling_references(live: Any) -> dg.AssetCheckResult:
    from pyspark.sql import functions as F

    known = (
        live.select(F.col("entity_id").alias("ref"))
        .union(live.select(F.col("canonical_id").alias("ref")))
        .distinct()
    )
    refs = live.where(F.col("prop_type") == "entity").select(
        F.col("canonical_id").alias("source"), "prop", F.col("value").alias("ref")
    )
    dangling = refs.join(known, "ref", "left_anti").persist()
    count = dangling.count()
    missing = dangling.select("ref").distinct().count() if count else 0
    examples = [r.asDict() for r in dangling.limit(EXAMPLES).collect()]
    dangling.unpersist()
    return dg.AssetCheckResult(
        check_name=REFERENCES,
        passed=count == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "dangling_references": count,
            "missing_entities": missing,
            "examples": dg.MetadataValue.json(examples),
        },
    )


@dg.multi_asset_check(
    name="statements_checks",
    specs=[
        dg.AssetCheckSpec(
            SCHEMA_VALID,
            asset="statements",
            blocking=True,
            description="Every live statement's schema and property exist in the "
            "followthemoney model, with the property's type.",
        ),
        dg.AssetCheckSpec(
            IDS_VALID,
            asset="statements",
            blocking=True,
            description="Every statement id equals followthemoney's id of (dataset, entity, "
            "property, value, external): ids are how duplicates and deletions are found.",
        ),
        dg.AssetCheckSpec(
            REFERENCES,
            asset="statements",
            description="Entity-typed property values point at entities of this dataset "
            "(warns: a dataset may reference entities it does not hold yet).",
        ),
    ],
)
def statements_checks(
    context: dg.AssetCheckExecutionContext, lakehouse: LakehouseResource, spark: SparkResource
) -> Iterator[dg.AssetCheckResult]:
    """The statement checks over one scan of the live statements (cached between them)."""
    ds = lakehouse.dataset(context.partition_key)
    live = live_frame(spark.session(ds.settings), ds).persist()
    try:
        yield _invalid_schemata(live)
        yield _wrong_ids(live)
        yield _dangling_references(live)
    finally:
        live.unpersist()


@dg.asset_check(
    asset="entities_ftm_json",
    additional_deps=["statistics"],
    blocking=True,
    description="entities.ftm.json holds one line per live entity of the statements "
    "table, and statistics.json counts the same number.",
)
def exports_match_statements(
    context: dg.AssetCheckExecutionContext, lakehouse: LakehouseResource, spark: SparkResource
) -> dg.AssetCheckResult:
    import json

    ds = lakehouse.dataset(context.partition_key)
    live = live_frame(spark.session(ds.settings), ds)
    expected = live.select("canonical_id").distinct().count()
    path = cv.dataset_path(ds.name, cv.ENTITIES_JSON)
    lines = 0
    if ds.store.exists(path):
        with ds.store.open_read(path) as fh:
            while chunk := fh.read(8 * 1024 * 1024):
                lines += chunk.count(b"\n")
    stats_path = cv.dataset_path(ds.name, cv.STATISTICS_JSON)
    stats_count = None
    if ds.store.exists(stats_path):
        stats_count = json.loads(ds.store.read_text(stats_path)).get("entity_count")
    passed = lines == expected and stats_count in (None, expected)
    return dg.AssetCheckResult(
        passed=passed,
        metadata={
            "live_entities": expected,
            "entities_ftm_json_lines": lines,
            "statistics_entity_count": stats_count if stats_count is not None else -1,
        },
    )


CHECKS = [statements_checks, exports_match_statements]
