"""The queue in Dagster: a sensor that asks for a consume where items wait.

Tenants push actions into ``{dataset}/queue/{tenant}/`` (CLI, API); the
``queue_items`` sensor lists each dataset's queue (one small listing per
tenant folder) and requests a ``consume_queue`` run for every dataset with
pending items, unless a run of it is already queued or running for that
dataset. The run applies the items exactly once (:mod:`lakehouse_assets.queue`);
its entity writes move ``journal/last_updated``, so ``journal_writes`` and
automation take it from there.

No run key: a run that stopped on a retryable error (a source offline) is
asked for again on a later tick while its items stay pending.
"""

import dagster as dg

from lakehouse_assets.defs.partitions import datasets, partition_datasets
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.errors import LockedError
from lakehouse_assets.settings import Settings

#: Runs in these states are still going to consume the queue.
ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


@dg.op(
    description="Apply the dataset's pending queue items of every tenant, in UUID7 order, "
    "exactly once; bad items are set aside under queue/_failed/, what lies outside any "
    "tenant's folder is reported as invalid."
)
def apply_queue_items(
    context: dg.OpExecutionContext, lakehouse: LakehouseResource
) -> dg.Output[int]:
    ds = lakehouse.dataset(context.partition_key)
    try:
        result = ds.queue.consume()
    except LockedError as exc:  # another consumer is on it: its run applies the items
        context.log.info("queue of %s is being consumed elsewhere: %s", ds.name, exc)
        return dg.Output(0, metadata={"skipped": str(exc)})
    for failed in result.failed:
        context.log.warning("set aside %s/%s: %s", failed["tenant"], failed["id"], failed["error"])
    for invalid in result.invalid:
        context.log.warning("never consumed: %s is %s", invalid["folder"], invalid["error"])
    metadata: dict[str, dg.RawMetadataValue] = {
        "applied": result.applied,
        "recovered": result.recovered,
        "failed": len(result.failed),
        "invalid": len(result.invalid),
        "remaining": result.remaining,
        "seconds": round(result.seconds, 2),
    }
    if result.dropped_values or result.fields_not_kept:
        # what the entities carried that the lake does not store as given
        metadata["dropped_values"] = dg.MetadataValue.json(dict(result.dropped_values))
        metadata["fields_not_kept"] = dg.MetadataValue.json(dict(result.fields_not_kept))
    if result.failed:
        metadata["failed_items"] = dg.MetadataValue.json(result.failed)
    if result.invalid:
        # not a tenant's folder (a bad name, a symlink, a stray file): an operator's job
        metadata["invalid_folders"] = dg.MetadataValue.json(result.invalid)
    if result.stopped:
        raise dg.Failure(
            description=f"the queue of {ds.name} stopped: {result.stopped}", metadata=metadata
        )
    return dg.Output(result.applied + result.recovered, metadata=metadata)


@dg.job(
    partitions_def=datasets,
    description="Apply a dataset's queue (requested by `queue_items`).",
)
def consume_queue() -> None:
    apply_queue_items()


def _consuming(instance: dg.DagsterInstance, dataset: str) -> bool:
    """Whether a consume_queue run of the dataset is queued or running."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(
            job_name=consume_queue.name,
            statuses=ACTIVE,
            tags={"dagster/partition": dataset},
        ),
        limit=1,
    )
    return bool(runs)


@dg.sensor(
    name="queue_items",
    job=consume_queue,
    minimum_interval_seconds=Settings().sensor_interval_seconds,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Requests a `consume_queue` run for each dataset whose queue has pending "
    "items (queue/{tenant}/{uuid7}.json).",
)
def queue_items(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    lake = lakehouse.lake()
    runs: list[dg.RunRequest] = []
    busy: list[str] = []
    for ds in partition_datasets(context.instance, lake):
        name = ds.name
        if not ds.queue.has_pending():
            continue
        if _consuming(context.instance, name):
            busy.append(name)
            continue
        runs.append(dg.RunRequest(partition_key=name))
    if not runs:
        reason = f"being consumed: {', '.join(busy)}" if busy else "no pending queue items"
        return dg.SkipReason(reason)
    context.log.info("pending queue items in %s", ", ".join(r.partition_key or "" for r in runs))
    return dg.SensorResult(run_requests=runs)


SENSORS = [queue_items]
JOBS = [consume_queue]
