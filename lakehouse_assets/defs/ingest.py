"""Ingest jobs: crawl a source into a dataset's archive and journal.

The crawl writes outside the asset functions (into ``archive`` and
``journal``, the tenants' assets); it reports the archive it changed, and the
journal sensor and automation carry its results on through the graph.
"""

from collections.abc import Iterator

import dagster as dg
from pydantic import Field

from lakehouse_assets import conventions as cv
from lakehouse_assets.defs.partitions import datasets
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.defs.sensors import archive_event


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
) -> Iterator[dg.AssetMaterialization | dg.Output[None]]:
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
    ts = ds.core_tags.get(cv.ARCHIVE_LAST_UPDATED)
    if result.archived and ts is not None:
        event = archive_event(ds, ts, list(ds.archive.list()), result.archived)
        yield event
    yield dg.Output(
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


JOBS = [crawl_job]
