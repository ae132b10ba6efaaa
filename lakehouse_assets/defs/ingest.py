"""Ingest jobs: crawl a source, process mappings; the mapping sensor.

The crawl and the mappings write into ``archive`` and ``journal``, the
tenants' assets; the sensors report those changes like any tenant's, and
automation carries the results on through the graph.
"""

from datetime import datetime
from typing import Any

import dagster as dg
from pydantic import Field

from lakehouse_assets import conventions as cv
from lakehouse_assets.defs.metadata import DATA_VERSION_TAG, markdown_table
from lakehouse_assets.defs.partitions import datasets
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.defs.sensors import watch_tag
from lakehouse_assets.lake import Dataset
from lakehouse_assets.settings import Settings


class CrawlConfig(dg.Config):
    source_uri: str = Field(description="Local folder, file:// or s3:// prefix to crawl.")
    prefix: str | None = Field(default=None, description="Only files under this path.")
    glob: str | None = Field(default=None, description="Only files matching this pattern.")
    exclude: str | None = Field(default=None, description="Leave out files matching this.")
    skip_existing: bool = Field(
        default=True, description="Skip files an earlier crawl of the source archived."
    )


@dg.op(description="Archive every matching file of the source, with a Document entity each.")
def crawl_source(
    context: dg.OpExecutionContext, config: CrawlConfig, lakehouse: LakehouseResource
) -> dg.Output[None]:
    ds = lakehouse.dataset(context.partition_key)
    result = ds.crawl(
        config.source_uri,
        prefix=config.prefix,
        glob=config.glob,
        exclude=config.exclude,
        skip_existing=config.skip_existing,
    )
    context.log.info("crawl of %s into %s: %s", config.source_uri, ds.name, result.as_dict())
    for error in result.errors:
        context.log.warning("failed: %s (%s)", error["path"], error["error"])
    return dg.Output(
        None,
        metadata={
            **result.as_dict(),
            "errors": dg.MetadataValue.json(result.errors[:100]),
        },
    )


@dg.job(
    partitions_def=datasets,
    description="Crawl a source (folder, file://, s3://) into one dataset (run config: crawl_source).",
)
def crawl_job() -> None:
    crawl_source()


class MappingsConfig(dg.Config):
    content_hashes: list[str] = Field(
        default_factory=list,
        description="CSV content hashes whose mappings to process (empty: every stale one).",
    )
    force: bool = Field(default=False, description="Process even fresh mappings.")


@dg.op(description="Map archived CSVs into the journal with their stored mappings.")
def process_mappings(
    context: dg.OpExecutionContext, config: MappingsConfig, lakehouse: LakehouseResource
) -> dg.Output[None]:
    ds = lakehouse.dataset(context.partition_key)
    hashes = config.content_hashes or [
        m["content_hash"] for m in ds.mappings() if config.force or not m["fresh"]
    ]
    results = []
    for content_hash in hashes:
        result = ds.process_mapping(content_hash, force=config.force)
        context.log.info("mapping %s of %s: %s", content_hash, ds.name, result.as_dict())
        results.append(result.as_dict())
    return dg.Output(
        None,
        metadata={
            "mappings": len(results),
            "statements": sum(r["statements"] for r in results),
            "csv_rows": sum(r["csv_rows"] for r in results),
            "results": dg.MetadataValue.json(results),
        },
    )


@dg.job(
    partitions_def=datasets,
    description="Process stored mappings of one dataset (requested by `mapping_changes`).",
)
def mappings_job() -> None:
    process_mappings()


def mappings_event(
    ds: Dataset, ts: datetime, stored: list[dict[str, Any]]
) -> dg.AssetMaterialization:
    """The reported materialization of a dataset's ``mappings``."""
    return dg.AssetMaterialization(
        asset_key="mappings",
        partition=ds.name,
        tags={DATA_VERSION_TAG: ts.isoformat()},
        metadata={
            "mappings": len(stored),
            "stale": sum(1 for m in stored if not m["fresh"]),
            "last_updated": dg.MetadataValue.timestamp(ts),
            "list": dg.MetadataValue.md(
                markdown_table(
                    ["csv", "queries", "versions", "last processed"],
                    [
                        (
                            m["content_hash"][:16],
                            m["queries"],
                            m["versions"],
                            m["last_processed"] or "-",
                        )
                        for m in stored
                    ],
                )
            ),
        },
    )


@dg.sensor(
    name="mapping_changes",
    job=mappings_job,
    minimum_interval_seconds=Settings().sensor_interval_seconds,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Reports stored/changed mappings (tag `mappings/last_updated`) and requests "
    "a run that maps the stale ones into the journal.",
)
def mapping_changes(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    def observe(
        ds: Dataset, ts: datetime, _: datetime | None
    ) -> tuple[dg.AssetMaterialization, dg.RunRequest | None]:
        stored = ds.mappings()
        stale = sorted(m["content_hash"] for m in stored if not m["fresh"])
        run = None
        if stale:
            run = dg.RunRequest(
                run_key=f"{ds.name}:mappings:{ts.isoformat()}",
                partition_key=ds.name,
                run_config=dg.RunConfig(
                    ops={"process_mappings": MappingsConfig(content_hashes=stale)}
                ),
            )
        return mappings_event(ds, ts, stored), run

    return watch_tag(context, lakehouse.lake(), cv.MAPPINGS_LAST_UPDATED, observe)


JOBS = [crawl_job, mappings_job]
SENSORS = [mapping_changes]
