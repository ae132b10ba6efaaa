"""Maintenance (optimize, compact) and the scheduled refresh, as asset jobs over datasets.

``optimize`` and ``compact`` are assets: each materialization is one run of
that operation on one dataset's tables, with what it did (files merged or
removed, bytes, the job record under ``jobs/runs/``). They change how the
statements are stored, not what they say, so they are downstream of
``statements`` rather than a new materialization of it: the exports stay
fresh. What they changed is reported where operators look for it, as an
observation of ``statements`` (and ``translog``) with the new table version,
per dataset.

The schedules ask for one run over many datasets (``BackfillPolicy.single_run``
on every computed asset), so N datasets share one Spark start:

- ``nightly_optimize``: ``optimize`` (with vacuum) at 02:00 UTC;
- ``weekly_compact``: ``compact`` on Sundays at 04:00 UTC;
- ``daily_refresh``: the whole chain (``refresh_dataset``) at 03:00 UTC, for
  datasets whose automation was paused or that missed a tick: only those
  the freshness rule finds stale (:func:`refresh_requests`), so a day with
  no change asks for no run.
"""

import bisect
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import dagster as dg
from pydantic import Field

from lakehouse_assets import conventions as cv
from lakehouse_assets.defs.batch import SINGLE_RUN, Report, for_each_dataset, materializations
from lakehouse_assets.defs.metadata import table_metadata, table_summary
from lakehouse_assets.defs.partitions import DATASETS, datasets, existing_datasets
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.freshness import freshness
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.tables.schemas import STATEMENTS_SCHEMA, TRANSLOG_SCHEMA

GROUP = "ftm_lakehouse"  # one group: the UI folds a graph of several groups

#: Dagster's run tags for a run over a range of partitions (a single-run backfill).
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


class OptimizeConfig(dg.Config):
    vacuum: bool = Field(default=True, description="Delete files no version needs any more.")
    retention_hours: int | None = Field(
        default=None,
        description="Keep files younger than this (default: LAKEHOUSE_VACUUM_RETENTION_HOURS).",
    )


@dg.asset(
    deps=["statements", "translog", "graph"],
    partitions_def=datasets,
    group_name=GROUP,
    kinds={"delta", "spark"},
    backfill_policy=SINGLE_RUN,
    description="Optimize: merge the small files of the statements, translog and graph "
    "tables, then vacuum what no version needs. Reports the new table versions on "
    "`statements` and `translog` (observations); scheduled nightly (`nightly_optimize`).",
)
def optimize(
    context: dg.AssetExecutionContext,
    config: OptimizeConfig,
    lakehouse: LakehouseResource,
    spark: SparkResource,
) -> Iterator[dg.MaterializeResult[None]]:
    def one(name: str) -> dict[str, Report]:
        ds = lakehouse.dataset(name, spark)
        result = ds.optimize(vacuum=config.vacuum, retention_hours=config.retention_hours)
        return {"optimize": _report(context, ds, result.as_dict())}

    yield from materializations(for_each_dataset(context, one))


@dg.asset(
    deps=["statements", "translog"],
    partitions_def=datasets,
    group_name=GROUP,
    kinds={"delta", "spark"},
    backfill_policy=SINGLE_RUN,
    description="Compact: rewrite the statements table with live rows only and drop the "
    "deleted translog rows (the exports do not change). Reports the new table versions on "
    "`statements` and `translog`; scheduled weekly (`weekly_compact`).",
)
def compact(
    context: dg.AssetExecutionContext, lakehouse: LakehouseResource, spark: SparkResource
) -> Iterator[dg.MaterializeResult[None]]:
    def one(name: str) -> dict[str, Report]:
        ds = lakehouse.dataset(name, spark)
        return {"compact": _report(context, ds, ds.compact().as_dict())}

    yield from materializations(for_each_dataset(context, one))


def _report(context: dg.AssetExecutionContext, ds: Dataset, result: dict[str, Any]) -> Report:
    """Observe the changed tables (per dataset) and report what the operation did."""
    done = {
        k: dg.MetadataValue.json(v) if isinstance(v, dict | list) else v
        for k, v in result.items()
        if v is not None
    }
    for key, location, schema in (
        ("statements", ds.statements_table, STATEMENTS_SCHEMA),
        ("translog", ds.translog_table, TRANSLOG_SCHEMA),
    ):
        context.log_event(
            dg.AssetObservation(
                asset_key=key,
                partition=ds.name,
                metadata=table_metadata(table_summary(location), schema),
            )
        )
    return Report({"dagster/uri": ds.statements_table.uri, **done})


optimize_job = dg.define_asset_job(
    "optimize_job",
    selection=[optimize],
    description="Optimize (+ vacuum) the tables of the selected datasets, in one run.",
)

compact_job = dg.define_asset_job(
    "compact_job",
    selection=[compact],
    description="Compact the tables of the selected datasets, in one run.",
)


def all_datasets(
    context: dg.ScheduleEvaluationContext, operation: str
) -> dg.RunRequest | dg.SkipReason:
    """One run over every dataset partition (a range from the first to the last)."""
    names = list(context.instance.get_dynamic_partitions(DATASETS))
    if not names:
        return dg.SkipReason("no datasets yet")
    stamp = context.scheduled_execution_time.strftime("%Y%m%dT%H%M")
    key = f"{operation}:{stamp}"
    if len(names) == 1:
        return dg.RunRequest(run_key=key, partition_key=names[0])
    return dg.RunRequest(run_key=key, tags={RANGE_START: names[0], RANGE_END: names[-1]})


#: How far back the daily refresh looks for moved change markers: two days, so
#: one missed tick (a daemon down over 03:00) loses nothing.
LOOKBACK = timedelta(days=2)

#: At most this many runs per tick: stale datasets far apart in partition order
#: are separate runs (each its own Spark start), near ones share one.
MAX_REFRESH_RUNS = 5


def refresh_requests(
    context: dg.ScheduleEvaluationContext, lake: Lakehouse, job_name: str
) -> list[dg.RunRequest] | dg.SkipReason:
    """The daily refresh's runs: over the datasets the freshness rule finds stale.

    Every writer the rule reads moves the dataset's change marker, so a dataset
    whose marker did not move since the last ticks (:data:`LOOKBACK`) is as the
    ticks found it. A tick judges (tags and a journal count, no Spark) only the
    datasets whose marker moved since then, those without a marker, and those
    of this job's runs that failed since (their marker may not have moved);
    with no change it costs one listing of the markers and one query of runs.
    Stale datasets next to each other in partition order share a run (a range),
    at most :data:`MAX_REFRESH_RUNS` runs.
    """
    names = sorted(context.instance.get_dynamic_partitions(DATASETS))
    if not names:
        return dg.SkipReason("no datasets yet")
    since = context.scheduled_execution_time - LOOKBACK
    prefix = cv.CHANGES + "/"
    moved = {e.path[len(prefix) :]: e.modified for e in lake.store.entries(prefix)}
    look = {n for n in names if moved.get(n, since.timestamp()) >= since.timestamp()}
    look |= _failed_run_datasets(context.instance, job_name, since, names)
    stale = []
    for ds in existing_datasets(lake, sorted(look)):
        if any(not state.fresh for state in freshness(ds).values()):
            stale.append(ds.name)
    if not stale:
        return dg.SkipReason(
            f"no stale dataset: {len(look)} of {len(names)} judged (those whose change marker "
            f"moved since {since:%Y-%m-%d %H:%M} UTC, or whose refresh failed since)"
        )
    stamp = context.scheduled_execution_time.strftime("%Y%m%dT%H%M")
    requests = []
    for low, high in _ranges(names, stale, MAX_REFRESH_RUNS):
        key = f"refresh:{stamp}:{low}"
        if low == high:
            requests.append(dg.RunRequest(run_key=key, partition_key=low))
        else:
            requests.append(dg.RunRequest(run_key=key, tags={RANGE_START: low, RANGE_END: high}))
    return requests


def _failed_run_datasets(
    instance: dg.DagsterInstance, job_name: str, since: datetime, names: Sequence[str]
) -> set[str]:
    """The datasets of this job's runs that failed (or were canceled) since ``since``."""
    runs = instance.get_runs(
        dg.RunsFilter(
            job_name=job_name,
            statuses=[dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED],
            created_after=since,
        )
    )
    found: set[str] = set()
    for run in runs:
        partition = run.tags.get("dagster/partition")
        low, high = run.tags.get(RANGE_START), run.tags.get(RANGE_END)
        if partition is not None:
            found.add(partition)
        elif low is not None and high is not None:
            found.update(n for n in names if low <= n <= high)
    return found


def _ranges(names: Sequence[str], picked: Sequence[str], most: int) -> list[tuple[str, str]]:
    """``picked`` (a sorted subset of the sorted ``names``) as ranges of ``names``:
    neighbours share a range, and the ranges with the fewest names between them
    merge until there are at most ``most``."""
    at = [bisect.bisect_left(names, n) for n in picked]
    spans = [[at[0], at[0]]]
    for i in at[1:]:
        if i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    while len(spans) > most:
        gap = min(range(len(spans) - 1), key=lambda k: spans[k + 1][0] - spans[k][1])
        spans[gap : gap + 2] = [[spans[gap][0], spans[gap + 1][1]]]
    return [(names[low], names[high]) for low, high in spans]


@dg.schedule(
    job=optimize_job,
    cron_schedule="0 2 * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every night: optimize and vacuum every dataset, in one run.",
)
def nightly_optimize(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
    return all_datasets(context, "optimize")


@dg.schedule(
    job=compact_job,
    cron_schedule="0 4 * * 0",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every Sunday: compact every dataset, in one run.",
)
def weekly_compact(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
    return all_datasets(context, "compact")


JOBS = [optimize_job, compact_job]
ASSETS = [optimize, compact]
SCHEDULES = [nightly_optimize, weekly_compact]
