"""The queue in Dagster: a sensor that asks for a consume where items wait.

Tenants push actions into ``{dataset}/queue/{tenant}/`` (CLI, API); the
``queue_items`` sensor lists the lake's queue markers (``.queue-changes/``,
rewritten by each push) once per tick, and the queues of the datasets whose
marker moved, of those that still had items at the last tick, and of
:data:`~lakehouse_assets.defs.partitions.SWEEP` others in turn (items copied
in behind the API move no marker). It requests a ``consume_queue`` run for
every dataset with pending items, unless a run of it is already queued or
running for that dataset. Listing every queue took 130 s a tick at 2,000
datasets on S3. The run applies the items exactly once (:mod:`lakehouse_assets.queue`);
its entity writes move ``journal/last_updated``, so ``journal_writes`` and
automation take it from there.

No run key: a run that stopped on a retryable error (a source offline) is
asked for again on a later tick while its items stay pending.
"""

import json

import dagster as dg

from lakehouse_assets import conventions as cv
from lakehouse_assets.defs.partitions import SWEEP, Watch, changed_partitions, datasets
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
    """Only the queues that may hold something: marker moved, items left at the
    last tick (a busy or failed run: asked for again), or the sweep's turn. The
    cursor keeps the markers seen, the sweep's place and the datasets left with
    items."""
    lake = lakehouse.lake()
    raw = json.loads(context.cursor) if context.cursor else {}
    watch = Watch.load(raw.get("watch"))
    left = [str(n) for n in raw.get("pending", [])]
    before = _cursor(watch, left)
    runs: list[dg.RunRequest] = []
    busy: list[str] = []
    pending: list[str] = []
    picked = changed_partitions(
        context.instance, lake, watch, sweep=SWEEP, folder=cv.QUEUE_CHANGES, also=left
    )
    for ds in list(picked):
        name = ds.name
        if not ds.queue.has_pending():
            continue
        pending.append(name)
        if _consuming(context.instance, name):
            busy.append(name)
            continue
        runs.append(dg.RunRequest(partition_key=name))
    cursor = _cursor(watch, pending)
    if runs:
        context.log.info(
            "pending queue items in %s", ", ".join(r.partition_key or "" for r in runs)
        )
        return dg.SensorResult(run_requests=runs, cursor=cursor)
    reason = f"being consumed: {', '.join(busy)}" if busy else "no pending queue items"
    if cursor == before:
        return dg.SkipReason(reason)
    return dg.SensorResult(skip_reason=reason, cursor=cursor)


def _cursor(watch: Watch, pending: list[str]) -> str:
    return json.dumps({"watch": watch.dump(), "pending": sorted(pending)}, sort_keys=True)


SENSORS = [queue_items]
JOBS = [consume_queue]
