"""The ``queue_items`` sensor and the ``consume_queue`` job on a real lake and instance."""

from __future__ import annotations

from collections.abc import Iterator

import dagster as dg
import pytest

from lakehouse_assets.defs.partitions import DATASETS
from lakehouse_assets.defs.queue import JOBS, SENSORS, consume_queue, queue_items
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets_tests.helpers.defs import resources


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def tick(instance: dg.DagsterInstance, lake: Lakehouse) -> dg.SensorResult | dg.SkipReason:
    with dg.build_sensor_context(instance=instance, resources=resources(lake)) as context:
        result = queue_items(context)
    assert isinstance(result, dg.SensorResult | dg.SkipReason)
    return result


def test_definitions_load_with_the_queue(
    local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    # under a live instance: Dagster resolves new Definitions against the process's
    # current one, and an earlier test's closed instance would be it
    defs = dg.Definitions(jobs=JOBS, sensors=SENSORS, resources=resources(local_lake))
    assert defs.resolve_job_def("consume_queue") is not None
    assert defs.resolve_sensor_def("queue_items").job_name == "consume_queue"


def test_pending_items_request_a_consume_that_lands_in_the_journal(
    local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    ds = local_lake.create_dataset("queued")
    local_lake.create_dataset("quiet")
    instance.add_dynamic_partitions(DATASETS, ["queued", "quiet"])
    assert isinstance(tick(instance, local_lake), dg.SkipReason)

    ds.queue.push(
        "UPSERT",
        "entity",
        {"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}},
        tenant="open-aleph",
    )
    result = tick(instance, local_lake)
    assert isinstance(result, dg.SensorResult)
    (run,) = result.run_requests or []
    assert run.partition_key == "queued"

    done = consume_queue.execute_in_process(
        partition_key="queued", instance=instance, resources=resources(local_lake)
    )
    assert done.success
    (output,) = [e for e in done.all_events if e.event_type_value == "STEP_OUTPUT"]
    assert output.event_specific_data.metadata["applied"].value == 1  # type: ignore[union-attr]
    statements = ds.journal.live_entity_statements("queued", "p1")
    assert {s.value for s in statements} >= {"Ann"}
    assert ds.queue.list() == [] and [e.state for e in ds.queue.list(state="all")] == ["done"]
    # nothing pending any more: the next tick asks for nothing
    assert isinstance(tick(instance, local_lake), dg.SkipReason)


def test_no_second_run_while_one_is_waiting(
    local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    ds = local_lake.create_dataset("waiting")
    instance.add_dynamic_partitions(DATASETS, ["waiting"])
    ds.queue.push("DELETE", "entity", {"entity_id": "p1"})
    instance.create_run_for_job(
        consume_queue,
        run_config={},
        tags={"dagster/partition": "waiting"},
        status=dg.DagsterRunStatus.NOT_STARTED,
    )
    skipped = tick(instance, local_lake)
    assert isinstance(skipped, dg.SkipReason)
    assert "being consumed: waiting" in (skipped.skip_message or "")
