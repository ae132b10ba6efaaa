"""Maintenance jobs (optimize, compact) and the schedules that run them per dataset.

They are op jobs, not asset materializations: they change how the statements
are stored, not what they say. Each reports an observation of ``statements``
so the UI shows the new table version next to the materializations.
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg
from pydantic import Field

from lakehouse_assets.defs.metadata import table_metadata, table_summary
from lakehouse_assets.defs.partitions import DATASETS, datasets
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.lake import Dataset
from lakehouse_assets.tables import STATEMENTS_SCHEMA


class OptimizeConfig(dg.Config):
    vacuum: bool = Field(default=True, description="Delete files no version needs any more.")
    retention_hours: int | None = Field(
        default=None,
        description="Keep files younger than this (default: LAKEHOUSE_VACUUM_RETENTION_HOURS).",
    )


@dg.op(description="Merge small files of the statements/translog tables, then vacuum.")
def optimize_tables(
    context: dg.OpExecutionContext,
    config: OptimizeConfig,
    lakehouse: LakehouseResource,
    spark: SparkResource,
) -> Iterator[dg.AssetObservation | dg.Output[None]]:
    ds = lakehouse.dataset(context.partition_key)
    spark.session(ds.settings)
    result = ds.optimize(vacuum=config.vacuum, retention_hours=config.retention_hours)
    yield _observe_statements(ds, result.as_dict())
    yield dg.Output(None)


@dg.op(description="Rewrite the statements table with live rows only; drop deleted translog rows.")
def compact_tables(
    context: dg.OpExecutionContext, lakehouse: LakehouseResource, spark: SparkResource
) -> Iterator[dg.AssetObservation | dg.Output[None]]:
    ds = lakehouse.dataset(context.partition_key)
    spark.session(ds.settings)
    yield _observe_statements(ds, ds.compact().as_dict())
    yield dg.Output(None)


def _observe_statements(ds: Dataset, result: dict[str, Any]) -> dg.AssetObservation:
    """The table after maintenance, with what the operation did (nested values as JSON)."""
    done = {
        k: dg.MetadataValue.json(v) if isinstance(v, dict | list) else v
        for k, v in result.items()
        if v is not None
    }
    return dg.AssetObservation(
        asset_key="statements",
        partition=ds.name,
        metadata={
            **table_metadata(table_summary(ds.statements_table), STATEMENTS_SCHEMA),
            **done,
        },
    )


@dg.job(partitions_def=datasets, description="optimize (+ vacuum) one dataset's tables.")
def optimize_job() -> None:
    optimize_tables()


@dg.job(partitions_def=datasets, description="compact one dataset's tables.")
def compact_job() -> None:
    compact_tables()


def _per_dataset(context: dg.ScheduleEvaluationContext, operation: str) -> Iterator[dg.RunRequest]:
    tick = context.scheduled_execution_time
    stamp = tick.strftime("%Y%m%dT%H%M")
    for name in sorted(context.instance.get_dynamic_partitions(DATASETS)):
        yield dg.RunRequest(run_key=f"{operation}:{name}:{stamp}", partition_key=name)


@dg.schedule(
    job=optimize_job,
    cron_schedule="0 2 * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every night: optimize and vacuum every dataset (one run per dataset).",
)
def nightly_optimize(context: dg.ScheduleEvaluationContext) -> Iterator[dg.RunRequest]:
    yield from _per_dataset(context, "optimize")


@dg.schedule(
    job=compact_job,
    cron_schedule="0 4 * * 0",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every Sunday: compact every dataset (one run per dataset).",
)
def weekly_compact(context: dg.ScheduleEvaluationContext) -> Iterator[dg.RunRequest]:
    yield from _per_dataset(context, "compact")


JOBS = [optimize_job, compact_job]
SCHEDULES = [nightly_optimize, weekly_compact]
