"""The Dagster layer's shared test pieces: the asset keys of the definitions, the
resources of a lake (for sensors and jobs built in tests), a sensor tick as the
daemon runs it."""

from __future__ import annotations

import dagster as dg

from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.lake import Lakehouse

KEYS = {
    "archive",
    "mappings",
    "journal",
    "statements",
    "translog",
    "statements_csv",
    "entities_ftm_json",
    "statistics",
    "index",
    "graph",
    "graph_cypher",
    "optimize",
    "compact",
}

#: The collections' external asset; each collection's own asset
#: (``collection/{name}``) comes from the lake's catalog when the definitions load.
COLLECTION_KEYS = {"judgements"}


def resources(lake: Lakehouse) -> dict[str, object]:
    return {
        "lakehouse": LakehouseResource(
            lake_uri=lake.settings.lake_uri, journal_url=lake.settings.journal_url
        )
    }


def daemon_tick(
    sensor: dg.SensorDefinition,
    instance: dg.DagsterInstance,
    lake: Lakehouse,
    cursor: str | None = None,
) -> tuple[dg.SensorResult | dg.SkipReason, list[str]]:
    """Evaluate a sensor and do with its result what Dagster's sensor daemon does.

    As in ``dagster/_daemon/sensor.py``: report the asset events (run-less), apply
    the dynamic partition requests, launch the requested runs (here in process, on
    the same instance). Returns the result and the ids of the runs it started.
    """
    from lakehouse_assets.definitions import defs

    with dg.build_sensor_context(
        instance=instance, cursor=cursor, resources=resources(lake), definitions=defs
    ) as ctx:
        result = sensor(ctx)
    if not isinstance(result, dg.SensorResult):
        assert isinstance(result, dg.SkipReason), result
        return result, []
    for event in result.asset_events or []:
        instance.report_runless_asset_event(event)
    for request in result.dynamic_partitions_requests or []:
        keys = list(request.partition_keys or [])
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, keys)
        else:
            for key in keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
    runs = []
    for run in result.run_requests or []:
        job = defs.resolve_job_def(run.job_name or sensor.job_name)
        done = job.execute_in_process(
            run_config=run.run_config,
            instance=instance,
            resources=resources(lake),
            partition_key=run.partition_key,
            tags=run.tags,
        )
        assert done.success
        runs.append(done.run_id)
    return result, runs


def quiet(result: dg.SensorResult | dg.SkipReason) -> bool:
    """A tick that reports and requests nothing (it may still save its cursor)."""
    if isinstance(result, dg.SkipReason):
        return True
    return (
        result.skip_reason is not None
        and not result.asset_events
        and not result.run_requests
        and not result.dynamic_partitions_requests
    )
