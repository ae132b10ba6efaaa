"""Sensors on a real lake and a real (ephemeral) Dagster instance."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest

from lakehouse_assets import conventions as cv
from lakehouse_assets.definitions import defs
from lakehouse_assets.defs.partitions import DATASETS
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.defs.sensors import archive_files, journal_writes, new_datasets
from lakehouse_assets.lake import Lakehouse


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """A real instance with its storage in a temp folder, alive for the test."""
    with dg.instance_for_test() as instance:
        yield instance


def resources(lake: Lakehouse) -> dict[str, object]:
    return {
        "lakehouse": LakehouseResource(
            lake_uri=lake.settings.lake_uri, journal_url=lake.settings.journal_url
        )
    }


def context(
    instance: dg.DagsterInstance, lake: Lakehouse, cursor: str | None = None
) -> dg.SensorEvaluationContext:
    return dg.build_sensor_context(
        instance=instance, cursor=cursor, resources=resources(lake), definitions=defs
    )


def test_new_dataset_becomes_a_partition(
    local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    assert isinstance(new_datasets(context(instance, local_lake)), dg.SkipReason)
    local_lake.create_dataset("first")
    local_lake.create_dataset("second")
    result = new_datasets(context(instance, local_lake))
    assert isinstance(result, dg.SensorResult)
    (request,) = result.dynamic_partitions_requests or []
    assert request.partitions_def_name == DATASETS
    assert sorted(request.partition_keys or []) == ["first", "second"]
    instance.add_dynamic_partitions(DATASETS, list(request.partition_keys or []))
    # known now: nothing to add
    assert isinstance(new_datasets(context(instance, local_lake)), dg.SkipReason)


def test_archive_file_requests_a_run_for_its_partition(
    local_lake: Lakehouse, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    ds = local_lake.create_dataset("docs")
    other = local_lake.create_dataset("other")
    instance.add_dynamic_partitions(DATASETS, ["docs", "other"])
    assert isinstance(archive_files(context(instance, local_lake)), dg.SkipReason)

    source = tmp_path / "memo.txt"
    source.write_text("a memo")
    meta = ds.add_file(str(source))
    result = archive_files(context(instance, local_lake))
    assert isinstance(result, dg.SensorResult)
    (run,) = result.run_requests or []
    assert run.partition_key == "docs"
    assert run.run_config["ops"]["write_documents"]["config"]["checksums"] == [meta.checksum]
    (event,) = result.asset_events or []
    assert isinstance(event, dg.AssetMaterialization)
    assert event.asset_key == dg.AssetKey("archive") and event.partition == "docs"
    assert event.metadata["new_files"].value == 1
    ts = ds.core_tags.get(cv.ARCHIVE_LAST_UPDATED)
    assert ts is not None and event.tags["dagster/data_version"] == ts.isoformat()

    # the cursor (as stored by the daemon) makes the next tick skip: nothing new
    cursor = result.cursor
    assert isinstance(archive_files(context(instance, local_lake, cursor)), dg.SkipReason)

    # a second file: only it is new, and only its dataset is asked for
    second = tmp_path / "memo2.txt"
    second.write_text("another memo")
    meta2 = other.add_file(str(second))
    result = archive_files(context(instance, local_lake, cursor))
    assert isinstance(result, dg.SensorResult)
    (run,) = result.run_requests or []
    assert run.partition_key == "other"
    assert run.run_config["ops"]["write_documents"]["config"]["checksums"] == [meta2.checksum]

    # the requested run writes the Document entity into the journal
    job = defs.resolve_job_def("archive_documents")
    done = job.execute_in_process(
        run_config=run.run_config,
        partition_key="other",
        instance=instance,
        resources=resources(local_lake),
    )
    assert done.success
    entity = other.stored_statements(meta2.checksum)
    assert {s.prop for s in entity} >= {"fileName", "contentHash"}
    assert {s.schema for s in entity} == {"Document"}


def test_journal_write_reports_the_journal(
    local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    ds = local_lake.create_dataset("writes")
    instance.add_dynamic_partitions(DATASETS, ["writes"])
    assert isinstance(journal_writes(context(instance, local_lake)), dg.SkipReason)
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    result = journal_writes(context(instance, local_lake))
    assert isinstance(result, dg.SensorResult)
    (event,) = result.asset_events or []
    assert isinstance(event, dg.AssetMaterialization)
    assert event.asset_key == dg.AssetKey("journal") and event.partition == "writes"
    assert event.metadata["pending_statements"].value == 2
    assert isinstance(journal_writes(context(instance, local_lake, result.cursor)), dg.SkipReason)


def test_sensor_skips_datasets_not_yet_partitions(
    local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    ds = local_lake.create_dataset("later")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    # not a partition yet: no event (Dagster would reject it), cursor untouched
    assert isinstance(journal_writes(context(instance, local_lake)), dg.SkipReason)
    instance.add_dynamic_partitions(DATASETS, ["later"])
    assert isinstance(journal_writes(context(instance, local_lake)), dg.SensorResult)


def test_schedules_request_one_run_per_dataset() -> None:
    # schedule contexts need a persistent instance (as the daemon has)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(DATASETS, ["a", "b"])
        for name in ("nightly_optimize", "weekly_compact"):
            schedule = defs.resolve_schedule_def(name)
            tick = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
            ctx = dg.build_schedule_context(
                instance=instance,
                scheduled_execution_time=tick,
                repository_def=defs.get_repository_def(),
            )
            requests = list(schedule.evaluate_tick(ctx).run_requests or [])
            assert sorted(r.partition_key or "" for r in requests) == ["a", "b"]
            # one run per dataset and tick, even if the tick is evaluated twice
            assert len({r.run_key for r in requests}) == 2
            assert all(r.run_key and "20261122T0200" in r.run_key for r in requests)


def test_files_with_their_document_need_no_run(
    local_lake: Lakehouse, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    ds = local_lake.create_dataset("has_docs")
    instance.add_dynamic_partitions(DATASETS, ["has_docs"])
    source = tmp_path / "memo.txt"
    source.write_text("a memo")
    ds.add_file(str(source), create_document=True)
    result = archive_files(context(instance, local_lake))
    assert isinstance(result, dg.SensorResult)
    assert len(result.asset_events or []) == 1
    assert not result.run_requests
