"""Data checks: what must hold before data flows on to the exports.

They read the live statements of one snapshot in Spark SQL (no Python task:
the statement ids are recomputed with SQL's SHA-1, the model's schemata and
properties are checked on the few distinct combinations) and report counts
and a few offending examples. Invalid schemata/properties and wrong
statement ids block the exports; dangling references only warn (a dataset
may reference entities it does not hold yet).

Checks are a function of the snapshot they read, so their results are kept
under ``{dataset}/checks/`` with the snapshot's (statements, translog)
versions: a run whose flush found nothing new answers from there, without
starting Spark.
"""

# (no ``from __future__ import annotations``: Dagster compares the context
# parameter's annotation with its classes when the checks are defined)
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import dagster as dg
from followthemoney import model
from followthemoney.statement import Statement

from lakehouse_assets import conventions as cv
from lakehouse_assets.defs.batch import check_results, for_each_dataset
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.errors import SourceNotFoundError
from lakehouse_assets.lake import Dataset
from lakehouse_assets.tables.snapshot import DatasetSnapshot
from lakehouse_assets.tables.spark_io import live_frame

#: How many offending examples a failed check shows.
EXAMPLES = 10

SCHEMA_VALID = "statements_schema_valid"
IDS_VALID = "statement_ids_valid"
REFERENCES = "references_resolve"


@dataclass
class Outcome:
    """A check's result as plain data (what the cache keeps)."""

    check_name: str
    passed: bool
    metadata: dict[str, Any]
    examples: list[dict[str, Any]] = field(default_factory=list)
    warn: bool = False

    def result(self, *, cached: bool, snapshot: DatasetSnapshot) -> dg.AssetCheckResult:
        statements, translog = snapshot.versions
        return dg.AssetCheckResult(
            check_name=self.check_name,
            passed=self.passed,
            severity=dg.AssetCheckSeverity.WARN if self.warn else dg.AssetCheckSeverity.ERROR,
            metadata={
                **self.metadata,
                "examples": dg.MetadataValue.json(self.examples),
                "statements_version": statements if statements is not None else -1,
                "translog_version": translog if translog is not None else -1,
                "cached": cached,
            },
        )


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


def _invalid_schemata(live: Any) -> Outcome:
    combos = live.groupBy("schema", "prop", "prop_type").count().collect()
    bad = [
        {"schema": r["schema"], "prop": r["prop"], "statements": r["count"], "problem": p}
        for r in combos
        if (p := _problem(r["schema"], r["prop"], r["prop_type"])) is not None
    ]
    return Outcome(
        SCHEMA_VALID,
        not bad,
        {
            "schema_property_pairs": len(combos),
            "invalid_pairs": len(bad),
            "invalid_statements": sum(b["statements"] for b in bad),
        },
        bad[:EXAMPLES],
    )


def _wrong_ids(live: Any) -> Outcome:
    """Statement ids against followthemoney's key, recomputed in Spark SQL."""
    from pyspark.sql import functions as F

    from lakehouse_assets.spark.sql import statement_key

    mismatches = live.select(
        "id", statement_key().alias("expected"), "entity_id", "prop", "lang"
    ).where(F.col("expected").isNull() | (F.col("id") != F.col("expected")))
    # one Spark job when all is well (each costs ~0.2 s on a small dataset);
    # examples only for a failure
    count = mismatches.count()
    examples = [r.asDict() for r in mismatches.limit(EXAMPLES).collect()] if count else []
    return Outcome(IDS_VALID, count == 0, {"wrong_ids": count}, examples)


def _dangling_references(live: Any) -> Outcome:
    from pyspark.sql import functions as F

    known = (
        live.select(F.col("entity_id").alias("ref"))
        .union(live.select(F.col("canonical_id").alias("ref")))
        .distinct()
    )
    refs = live.where(F.col("prop_type") == "entity").select(
        F.col("canonical_id").alias("source"), "prop", F.col("value").alias("ref")
    )
    dangling = refs.join(known, "ref", "left_anti")
    count = dangling.count()
    missing, examples = 0, []
    if count:  # the rest only where there is something to say
        dangling = dangling.persist()
        missing = dangling.select("ref").distinct().count()
        examples = [r.asDict() for r in dangling.limit(EXAMPLES).collect()]
        dangling.unpersist()
    return Outcome(
        REFERENCES,
        count == 0,
        {"dangling_references": count, "missing_entities": missing},
        examples,
        warn=True,
    )


# --- results kept by snapshot -----------------------------------------------------


def _cache_key(snapshot: DatasetSnapshot, extra: Mapping[str, Any] | None = None) -> list[Any]:
    return [*snapshot.content_key, dict(extra or {})]


def cached_outcomes(ds: Dataset, name: str, key: list[Any]) -> list[Outcome] | None:
    """The outcomes of the checks ``name`` for ``key``, if they were judged already."""
    try:
        data = json.loads(ds.store.read_text(cv.check_cache(ds.name, name)))
    except (SourceNotFoundError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("key") != key:
        return None
    return [Outcome(**item) for item in data.get("outcomes", [])]


def keep_outcomes(ds: Dataset, name: str, key: list[Any], outcomes: list[Outcome]) -> None:
    data = {"key": key, "outcomes": [asdict(o) for o in outcomes]}
    ds.store.write_text(cv.check_cache(ds.name, name), json.dumps(data, default=str))


def statement_outcomes(
    ds: Dataset, spark: SparkResource
) -> tuple[list[Outcome], bool, DatasetSnapshot]:
    """The three statement checks of the current snapshot (from the cache if judged)."""
    snapshot = ds.snapshot()
    key = _cache_key(snapshot)
    found = cached_outcomes(ds, "statements", key)
    if found is not None:
        return found, True, snapshot
    live = live_frame(spark.session(ds.settings), ds, snapshot).persist()
    try:
        outcomes = [_invalid_schemata(live), _wrong_ids(live), _dangling_references(live)]
    finally:
        live.unpersist()
    keep_outcomes(ds, "statements", key, outcomes)
    return outcomes, False, snapshot


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
            "property, value, language, external), recomputed in Spark SQL: ids are how "
            "duplicates and deletions are found.",
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
    """The statement checks over one scan of the live statements, or their kept results
    when the tables did not change since they were judged."""

    def one(name: str) -> list[dg.AssetCheckResult]:
        outcomes, cached, snapshot = statement_outcomes(lakehouse.dataset(name), spark)
        if cached:
            context.log.info("%s: tables unchanged since the last check: results kept", name)
        return [outcome.result(cached=cached, snapshot=snapshot) for outcome in outcomes]

    yield from check_results(for_each_dataset(context, one))


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
    return _one_check(context, lambda name: _exports_match(lakehouse.dataset(name), spark))


def _one_check(
    context: dg.AssetCheckExecutionContext, check: Callable[[str], dg.AssetCheckResult]
) -> dg.AssetCheckResult:
    """A single check over every dataset of the run (see :mod:`defs.batch`)."""
    results = for_each_dataset(context, lambda name: [check(name)])
    return next(check_results(results))


def _exports_match(ds: Dataset, spark: SparkResource) -> dg.AssetCheckResult:
    snapshot = ds.snapshot()
    # the live entity count depends on the snapshot only; the files on the exports' stamps
    stamps = {k: str(ds.core_tags.get(k)) for k in (cv.EXPORTS_ENTITIES, cv.EXPORTS_STATISTICS)}
    key = _cache_key(snapshot, stamps)
    found = cached_outcomes(ds, "exports", key)
    if found is None:
        live = live_frame(spark.session(ds.settings), ds, snapshot)
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
        outcome = Outcome(
            "exports_match_statements",
            lines == expected and stats_count in (None, expected),
            {
                "live_entities": expected,
                "entities_ftm_json_lines": lines,
                "statistics_entity_count": stats_count if stats_count is not None else -1,
            },
        )
        keep_outcomes(ds, "exports", key, [outcome])
    else:
        (outcome,) = found
    result = outcome.result(cached=found is not None, snapshot=snapshot)
    return dg.AssetCheckResult(passed=result.passed, metadata=result.metadata)


@dg.asset_check(
    asset="index",
    description="The dataset's version chain verifies: manifests linked by their hashes, "
    "the head anchored in the Delta commit that published it (a rolled-back version fails), "
    "every file readers trust (table files, exports, index.json, diffs, graph index, catalog "
    "entry) covered by the head's manifest, and no foreign commit after it "
    "(`lakehouse verify`; `--deep` also recomputes the logical hash).",
)
def versions_verified(
    context: dg.AssetCheckExecutionContext, lakehouse: LakehouseResource
) -> dg.AssetCheckResult:
    return _one_check(context, lambda name: _verified(lakehouse.dataset(name)))


def _verified(ds: Dataset) -> dg.AssetCheckResult:
    from lakehouse_assets.versions import verify

    report = verify(ds)
    problems = "\n".join(f"- {p}" for p in report.problems[:EXAMPLES])
    metadata: dict[str, Any] = {
        "versions": report.versions,
        "head": report.head or "",
        "files_hashed": report.files_hashed,
        "bytes_hashed": report.bytes_hashed,
        "problems": len(report.problems),
    }
    if problems:
        metadata["examples"] = dg.MetadataValue.md(problems)
    if report.notes:
        metadata["notes"] = dg.MetadataValue.md("\n".join(f"- {n}" for n in report.notes))
    return dg.AssetCheckResult(passed=report.ok, metadata=metadata)


@dg.asset_check(
    asset="graph",
    description="The graph index holds one edge per live entity-typed statement "
    "(origin, statement id), counted in Spark SQL over the snapshot it reflects.",
)
def graph_edges_match(
    context: dg.AssetCheckExecutionContext, lakehouse: LakehouseResource, spark: SparkResource
) -> dg.AssetCheckResult:
    return _one_check(context, lambda name: _edges_match(lakehouse.dataset(name), spark))


def _edges_match(ds: Dataset, spark: SparkResource) -> dg.AssetCheckResult:
    from lakehouse_assets import graph as graph_index

    state = graph_index.GraphState.load(ds)
    if state is None:
        return dg.AssetCheckResult(passed=False, metadata={"problem": "no graph index"})
    snapshot = ds.snapshot(state.translog_version)
    live = live_frame(spark.session(ds.settings), ds, snapshot)
    expected = live.where("prop_type = 'entity'").select("origin", "id").distinct().count()
    indexed = graph_index.edge_count(ds)
    return dg.AssetCheckResult(
        passed=indexed == expected,
        metadata={
            "live_entity_statements": expected,
            "indexed_edges": indexed,
            "reflects_translog_version": state.translog_version or -1,
        },
    )


CHECKS = [statements_checks, exports_match_statements, versions_verified, graph_edges_match]
