"""Sensors on a real lake and a real (ephemeral) Dagster instance."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from lakehouse_assets import conventions as cv
from lakehouse_assets.definitions import defs
from lakehouse_assets.defs import sensors
from lakehouse_assets.defs.partitions import DATASETS
from lakehouse_assets.defs.sensors import archive_files, journal_writes, new_datasets
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets_tests.helpers.defs import daemon_tick, quiet, resources


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """A real instance with its storage in a temp folder, alive for the test."""
    with dg.instance_for_test() as instance:
        yield instance


#: Sensor contexts opened by a test (the lake resource nests dagster-aws's S3
#: resource, so its context must be entered), closed after the test.
_opened = contextlib.ExitStack()


@pytest.fixture(autouse=True)
def _close_contexts() -> Iterator[None]:
    yield
    _opened.close()


def context(
    instance: dg.DagsterInstance, lake: Lakehouse, cursor: str | None = None
) -> dg.SensorEvaluationContext:
    return _opened.enter_context(
        dg.build_sensor_context(
            instance=instance, cursor=cursor, resources=resources(lake), definitions=defs
        )
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


def test_partitions_follow_the_datasets_both_ways(
    local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """A deleted dataset's partition goes, in the same kind of tick that adds new ones."""
    for name in ("first", "second", "third"):
        local_lake.create_dataset(name)
    result, _ = daemon_tick(new_datasets, instance, local_lake)
    assert isinstance(result, dg.SensorResult)
    assert instance.get_dynamic_partitions(DATASETS) == ["first", "second", "third"]
    assert isinstance(daemon_tick(new_datasets, instance, local_lake)[0], dg.SkipReason)

    # one dataset leaves the lake, another arrives: one tick adds and deletes
    shutil.rmtree(local_lake.store.local_path(cv.dataset_path("second")))
    local_lake.create_dataset("fourth")
    result, _ = daemon_tick(new_datasets, instance, local_lake)
    assert isinstance(result, dg.SensorResult)
    kinds = {
        type(r).__name__: list(r.partition_keys or [])
        for r in result.dynamic_partitions_requests or []
    }
    assert kinds == {
        "AddDynamicPartitionsRequest": ["fourth"],
        "DeleteDynamicPartitionsRequest": ["second"],
    }
    assert instance.get_dynamic_partitions(DATASETS) == ["first", "third", "fourth"]
    assert isinstance(daemon_tick(new_datasets, instance, local_lake)[0], dg.SkipReason)

    # a lake without its catalog index (a wrong URI, a half-copied lake) deletes nothing
    local_lake.store.delete(cv.CATALOG_INDEX)
    shutil.rmtree(local_lake.store.local_path(cv.dataset_path("third")))
    assert isinstance(daemon_tick(new_datasets, instance, local_lake)[0], dg.SkipReason)
    assert instance.get_dynamic_partitions(DATASETS) == ["first", "third", "fourth"]


def test_archive_file_requests_a_run_for_its_partition(
    local_lake: Lakehouse, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    ds = local_lake.create_dataset("docs")
    other = local_lake.create_dataset("other")
    instance.add_dynamic_partitions(DATASETS, ["docs", "other"])
    assert quiet(archive_files(context(instance, local_lake)))

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
    version = event.tags["dagster/data_version"]

    # the cursor (as stored by the daemon) makes the next tick skip: nothing new
    cursor = result.cursor
    assert quiet(archive_files(context(instance, local_lake, cursor)))

    # a second file: only it is new, and only its dataset is asked for
    second = tmp_path / "memo2.txt"
    second.write_text("another memo")
    meta2 = other.add_file(str(second))
    result = archive_files(context(instance, local_lake, cursor))
    assert isinstance(result, dg.SensorResult)
    (run,) = result.run_requests or []
    assert run.partition_key == "other"
    assert run.run_config["ops"]["write_documents"]["config"]["checksums"] == [meta2.checksum]

    # another writer puts a file into the archive without the API (no tag moves):
    # the listing notices it, reports it and asks for its Document
    outside = tmp_path / "outside.txt"
    outside.write_text("put there by rsync")
    blob = other.archive.put(str(outside))  # stored by the API, to make a real entry ...
    folder = str(local_lake.store.local_path(cv.dataset_path("other", cv.ARCHIVE))) + "/"
    meta_path = next(p for p in Path(folder).rglob("*.json") if blob.file_id in p.name)
    copied = meta_path.read_bytes()
    meta_path.unlink()  # ... then removed and written back behind the API's back
    cursor = archive_files(context(instance, local_lake, result.cursor)).cursor  # type: ignore[union-attr]
    tag_before = other.core_tags.get(cv.ARCHIVE_LAST_UPDATED)
    meta_path.write_bytes(copied)
    assert other.core_tags.get(cv.ARCHIVE_LAST_UPDATED) == tag_before
    found = archive_files(context(instance, local_lake, cursor))
    assert isinstance(found, dg.SensorResult)
    (event,) = found.asset_events or []
    assert event.partition == "other" and event.metadata["new_files"].value == 1
    assert event.tags["dagster/data_version"] != version
    (req,) = found.run_requests or []
    assert req.run_config["ops"]["write_documents"]["config"]["checksums"] == [blob.checksum]
    assert quiet(archive_files(context(instance, local_lake, found.cursor)))

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
    assert quiet(journal_writes(context(instance, local_lake)))
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    result = journal_writes(context(instance, local_lake))
    assert isinstance(result, dg.SensorResult)
    (event,) = result.asset_events or []
    assert isinstance(event, dg.AssetMaterialization)
    assert event.asset_key == dg.AssetKey("journal") and event.partition == "writes"
    assert event.metadata["pending_statements"].value == 2
    assert quiet(journal_writes(context(instance, local_lake, result.cursor)))


def test_sensor_skips_datasets_not_yet_partitions(
    local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    ds = local_lake.create_dataset("later")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    # not a partition yet: no event (Dagster would reject it), cursor untouched
    assert quiet(journal_writes(context(instance, local_lake)))
    instance.add_dynamic_partitions(DATASETS, ["later"])
    assert isinstance(journal_writes(context(instance, local_lake)), dg.SensorResult)


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


def test_ticks_look_at_changed_datasets_and_sweep_the_rest(
    local_lake: Lakehouse,
    instance: dg.DagsterInstance,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A write through the API is reported at the next tick (its change marker moved);
    a copy behind the API's back, when the sweep (here one dataset a tick) reaches it."""
    monkeypatch.setattr(sensors, "SWEEP", 1)
    names = [f"d{i}" for i in range(6)]
    for name in names:
        local_lake.create_dataset(name)
    instance.add_dynamic_partitions(DATASETS, names)
    result = archive_files(context(instance, local_lake))
    assert quiet(result)
    cursor = result.cursor  # type: ignore[union-attr]

    # behind the API's back: a blob in d4's archive, no tag, no marker
    local_lake.store.write_bytes(
        cv.dataset_path("d4", cv.ARCHIVE, "ab", "cd", "ef", "ab" * 32, cv.BLOB), b"copied"
    )
    source = tmp_path / "memo.txt"
    source.write_text("a memo")
    local_lake.dataset("d1").add_file(str(source))
    reported: list[set[str]] = []
    for _ in names:
        result = archive_files(context(instance, local_lake, cursor))
        events = [] if isinstance(result, dg.SkipReason) else result.asset_events or []
        reported.append({e.partition for e in events if e.partition})
        cursor = getattr(result, "cursor", None) or cursor
    assert reported[0] == {"d1"}  # at once, without listing d4
    swept = next(i for i, found in enumerate(reported) if "d4" in found)
    assert 0 < swept < len(names) and reported.count({"d4"}) == 1
    assert set().union(*reported) == {"d1", "d4"}


def test_datasets_delete_removes_the_folder_and_the_partition(
    lake: Lakehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lakehouse datasets delete``: asks first; refused while a lock is held or
    journal rows wait; with --force every file of the dataset goes (local and
    S3), its journal rows, change marker and catalog entry, and its partition in
    the instance of DAGSTER_HOME; the sensor then finds nothing to do."""
    from click.testing import CliRunner

    from lakehouse_assets.cli import cli
    from lakehouse_assets_tests.conftest import lakehouse_env

    ds = lake.create_dataset("gone")
    lake.create_dataset("stays")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    memo = tmp_path / "memo.txt"
    memo.write_text("a memo")
    ds.add_file(str(memo))
    ds.queue.push("DELETE", "entity", {"entity_id": "p2"})
    assert lake.store.exists(cv.change_marker("gone"))
    assert lake.store.exists(cv.queue_marker("gone"))
    files = list(lake.store.list("gone/"))
    rows = lake.journal.count("gone")
    assert rows > 0
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(DATASETS, ["gone", "stays"])

    def delete(*args: str, answer: str | None = None) -> tuple[int, str]:
        env = lakehouse_env(lake, DAGSTER_HOME=str(home))
        done = CliRunner().invoke(cli, ["datasets", "delete", "gone", *args], input=answer, env=env)
        return done.exit_code, done.output

    code, said = delete(answer="n")  # asked, and declined
    assert code == 1 and "Delete dataset gone" in said
    lock = ds.lock("flush")
    lock.acquire()
    code, said = delete("--yes")
    assert code == 1 and "gone was not deleted" in said and ".LOCK" in said, said
    lock.release()
    code, said = delete("--yes")
    assert code == 1 and f"{rows} journal rows wait for a flush" in said, said
    # nothing touched (a lock taken and released leaves its free .LOCK)
    assert [p for p in lake.store.list("gone/") if p != "gone/.LOCK"] == files

    code, said = delete("--yes", "--force")
    assert code == 0, said
    assert f"deleted gone: {len(files)} files, {rows} journal rows not flushed" in said
    assert "Dagster partition deleted" in said
    assert list(lake.store.list("gone/")) == []
    assert lake.store.list_dirs("", empty=True) == [
        n for n in lake.store.list_dirs("", empty=True) if n != "gone"
    ]
    assert lake.datasets() == ["stays"]
    assert lake.journal.count("gone") == 0
    assert not lake.store.exists(cv.change_marker("gone"))
    assert not lake.store.exists(cv.queue_marker("gone"))
    catalog = lake.store.read_text(cv.CATALOG_INDEX)
    assert '"stays"' in catalog and '"gone"' not in catalog
    for key, value in lakehouse_env(lake).items():  # the S3 lake's endpoint and keys
        if key.startswith("LAKEHOUSE_S3_"):
            monkeypatch.setenv(key, value)
    with dg.DagsterInstance.get() as instance:
        assert instance.get_dynamic_partitions(DATASETS) == ["stays"]
        result, _ = daemon_tick(new_datasets, instance, lake)
        assert isinstance(result, dg.SkipReason)  # nothing left to add or delete
        assert instance.get_dynamic_partitions(DATASETS) == ["stays"]
    code, said = delete("--yes")
    assert code == 1 and "does not exist" in said
