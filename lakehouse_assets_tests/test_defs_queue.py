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
        _cursors.pop(id(instance), None)


#: The cursor each test's last tick left, as the daemon keeps it.
_cursors: dict[int, str | None] = {}


def tick(instance: dg.DagsterInstance, lake: Lakehouse) -> dg.SensorResult | dg.SkipReason:
    """One tick from the cursor the last tick on this instance left; a quiet tick
    that only saves its cursor is returned as its skip."""
    cursor = _cursors.get(id(instance))
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, resources=resources(lake)
    ) as context:
        result = queue_items(context)
    assert isinstance(result, dg.SensorResult | dg.SkipReason)
    if isinstance(result, dg.SensorResult):
        _cursors[id(instance)] = result.cursor or cursor
        if not result.run_requests:
            return dg.SkipReason(result.skip_reason.skip_message if result.skip_reason else None)
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


def test_the_sensor_reads_only_marked_queues_and_sweeps_the_rest(
    local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """A push moves the dataset's queue marker: the next tick reads that queue and
    SWEEP others in turn, not all of them; items copied in behind the API (no
    marker) are found by the sweep within a few ticks, and a dataset whose items
    are still there is asked for again."""
    from lakehouse_assets import conventions as cv
    from lakehouse_assets.defs.partitions import SWEEP
    from lakehouse_assets.queue.ids import uuid7

    names = [f"ds_{i:02d}" for i in range(SWEEP + 5)]
    for name in names:
        local_lake.create_dataset(name)
    instance.add_dynamic_partitions(DATASETS, names)
    assert isinstance(tick(instance, local_lake), dg.SkipReason)  # every queue read once
    assert isinstance(tick(instance, local_lake), dg.SkipReason)

    # an item in every queue, copied in behind the API (no marker moved) ...
    for name in names:
        local_lake.store.write_text(cv.queue_item(name, "open-aleph", uuid7()), "{}")
    # ... and one pushed through it, into the last dataset (its marker moves)
    local_lake.dataset(names[-1]).queue.push("DELETE", "entity", {"entity_id": "p1"})
    assert local_lake.store.exists(cv.queue_marker(names[-1]))
    first = tick(instance, local_lake)
    assert isinstance(first, dg.SensorResult)
    asked = [r.partition_key for r in first.run_requests or []]
    assert names[-1] in asked and len(asked) == SWEEP + 1  # not every queue
    # the next tick: those still waiting again, and the sweep reaches the rest
    second = tick(instance, local_lake)
    assert isinstance(second, dg.SensorResult)
    assert sorted(r.partition_key or "" for r in second.run_requests or []) == names
