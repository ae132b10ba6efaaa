"""The Dagster layer's asset graph: definitions, and real materializations on a real lake."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import orjson
import pytest
from followthemoney.statement import Statement

from lakehouse_assets import conventions as cv
from lakehouse_assets.definitions import COMPUTED, defs
from lakehouse_assets.defs.assets import ASSETS
from lakehouse_assets.defs.checks import CHECKS
from lakehouse_assets.defs.demo import report_sources
from lakehouse_assets.defs.freshness import CHECKS as FRESHNESS_CHECKS
from lakehouse_assets.defs.partitions import datasets
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.journal import Write, statement_row
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets_tests.conftest import sample_entities
from lakehouse_assets_tests.helpers.defs import COLLECTION_KEYS, KEYS

LINEAGE = {
    "archive": set(),
    "mappings": {"archive"},
    "journal": {"archive", "mappings"},
    "statements": {"journal"},
    "translog": {"journal"},
    "statements_csv": {"statements", "translog"},
    "entities_ftm_json": {"statements", "translog"},
    "statistics": {"statements", "translog"},
    "index": {"statements_csv", "entities_ftm_json", "statistics"},
    "graph": {"statements", "translog"},
    "graph_cypher": {"entities_ftm_json"},
    "optimize": {"statements", "translog", "graph"},
    "compact": {"statements", "translog"},
}


def test_definitions_load_with_the_specified_graph() -> None:
    graph = defs.resolve_asset_graph()
    # (the environment's lake may have collections: their assets are its own)
    keys = {k.to_user_string() for k in graph.get_all_asset_keys() if k.path[0] != "collection"}
    assert keys == KEYS | COLLECTION_KEYS
    for key, parents in LINEAGE.items():
        node = graph.get(dg.AssetKey(key))
        assert {p.to_user_string() for p in node.parent_keys} == parents, key
        assert node.partitions_def == datasets, key
    executable = {
        k.to_user_string() for k in graph.executable_asset_keys if k.path[0] != "collection"
    }
    assert executable == KEYS - {"archive", "mappings", "journal"}
    for key in executable - {"optimize", "compact"}:  # maintenance runs on schedules
        assert graph.get(dg.AssetKey(key)).automation_condition is not None, key
    checks = {c.name for c in graph.asset_check_keys}
    assert checks == {
        "statements_schema_valid",
        "statement_ids_valid",
        "references_resolve",
        "exports_match_statements",
        "versions_verified",
        "graph_edges_match",
        "fresh",
    }
    for name in (
        "new_datasets",
        "archive_files",
        "journal_writes",
        "mapping_changes",
        "lakehouse_automation",
        "freshness_checks",
    ):
        assert defs.resolve_sensor_def(name).default_status == dg.DefaultSensorStatus.RUNNING
    for name in ("nightly_optimize", "weekly_compact", "daily_refresh"):
        schedule = defs.resolve_schedule_def(name)
        assert defs.resolve_job_def(schedule.job_name).partitions_def == datasets
    job = defs.resolve_job_def("refresh_dataset")
    assert job.partitions_def == datasets
    # one process per run: every step shares one Spark session
    assert job.executor_def.name == "in_process"


def materialize(
    lake: Lakehouse, instance: dg.DagsterInstance, name: str
) -> dg.ExecuteInProcessResult:
    report_sources(
        instance,
        LakehouseResource(lake_uri=lake.settings.lake_uri, journal_url=lake.settings.journal_url),
        name,
    )
    return dg.materialize(
        [*ASSETS, *CHECKS, *FRESHNESS_CHECKS],
        selection=COMPUTED,
        partition_key=name,
        instance=instance,
        resources={
            "lakehouse": LakehouseResource(
                lake_uri=lake.settings.lake_uri, journal_url=lake.settings.journal_url
            ),
            "spark": SparkResource(),
        },
        raise_on_error=False,
    )


def materializations(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, Any]]:
    out = {}
    for event in result.get_asset_materialization_events():
        mat = event.materialization
        assert mat is not None and mat.partition is not None
        out[mat.asset_key.to_user_string()] = {k: v.value for k, v in mat.metadata.items()}
    return out


def checks(result: dg.ExecuteInProcessResult) -> dict[str, bool]:
    return {c.check_name: c.passed for c in result.get_asset_check_evaluations()}


def entity_ids(ds: Dataset) -> set[str]:
    text = ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON))
    return {orjson.loads(line)["id"] for line in text.splitlines() if line.strip()}


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """A real instance with its storage in a temp folder, alive for the test."""
    with dg.instance_for_test() as instance:
        yield instance


def test_materialize_the_graph_twice(
    spark: Any, local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    entities = sample_entities()
    ds = local_lake.create_dataset("graph_twice")
    with ds.bulk(origin="sample") as bulk:
        for entity in entities:
            bulk.add_entity(entity)
    written = local_lake.journal.count(ds.name)

    first = materialize(local_lake, instance, ds.name)
    assert first.success
    mats = materializations(first)
    assert set(mats) == KEYS - {"archive", "mappings", "journal", "optimize", "compact"}
    assert mats["statements"]["new_statements"] == written
    assert mats["statements"]["dagster/partition_row_count"] == written
    assert mats["statements"]["dagster/row_count"] == written
    columns = [c.name for c in mats["statements"]["dagster/column_schema"].columns]
    assert columns[:3] == ["id", "entity_id", "canonical_id"] and "origin" in columns
    translog = [c.name for c in mats["translog"]["dagster/column_schema"].columns]
    assert "deleted_at" in translog and "last_write" in translog
    assert mats["statements"]["delta_version"] >= 0
    assert mats["statements"]["dagster/uri"] == ds.statements_table.uri
    assert mats["entities_ftm_json"]["dagster/partition_row_count"] == len(entities)
    assert mats["statistics"]["entity_count"] == len(entities)
    assert "| schema | entities |" in mats["statistics"]["schema_distribution"]
    assert mats["statements_csv"]["dagster/partition_row_count"] == written
    assert mats["statements_csv"]["size_bytes"] == ds.store.size(
        cv.dataset_path(ds.name, cv.STATEMENTS_CSV)
    )
    assert all(checks(first).values()), checks(first)
    assert entity_ids(ds) == {e["id"] for e in entities}
    # freshness and Dagster agree: an export's data version is the stamp of its tag,
    # and it names the snapshot it was built from
    event = next(
        e.materialization
        for e in first.get_asset_materialization_events()
        if e.materialization is not None
        and e.materialization.asset_key == dg.AssetKey("entities_ftm_json")
    )
    stamp = ds.core_tags.get(cv.EXPORTS_ENTITIES)
    assert stamp is not None and event.tags["dagster/data_version"] == stamp.isoformat()
    # ... and the published version names the same table versions
    head = ds.version()
    assert head is not None and head.sequence == 1
    assert mats["index"]["version"] == 1 and mats["index"]["version_hash"] == head.hash
    assert mats["index"]["entities_add"] == len(entities)
    built = head.table_version("statements"), head.table_version("translog")
    assert mats["entities_ftm_json"]["built_from_statements_version"] == built[0]
    assert mats["entities_ftm_json"]["built_from_translog_version"] == built[1]
    assert checks(first)["versions_verified"]
    assert checks(first)["graph_edges_match"]
    assert mats["graph"]["mode"] == "rebuild" and mats["graph"]["edges"] > 0
    assert mats["graph_cypher"]["relationships"] > 0

    # tenants write a new entity and delete another; the graph runs again
    gone = str(entities[0]["id"])
    ds.add_entity(
        {"id": "new-co", "schema": "Company", "properties": {"name": ["New Co"]}}, origin="sample"
    )
    deleted = ds.delete_entity(gone)
    assert deleted > 0
    second = materialize(local_lake, instance, ds.name)
    assert second.success
    mats = materializations(second)
    assert mats["statements"]["new_statements"] == 2  # id + name of new-co
    assert mats["statements"]["tombstoned_statements"] == deleted
    assert mats["entities_ftm_json"]["dagster/partition_row_count"] == len(entities)
    assert all(mats[k]["rewritten"] for k in ("statements_csv", "entities_ftm_json", "statistics"))
    assert entity_ids(ds) == {e["id"] for e in entities} - {gone} | {"new-co"}
    index = json.loads(ds.store.read_text(cv.dataset_path(ds.name, cv.INDEX)))
    assert index["entity_count"] == len(entities)
    assert mats["index"]["version"] == 2
    assert (mats["index"]["entities_add"], mats["index"]["entities_del"]) == (1, 1)
    assert checks(second)["versions_verified"]
    assert checks(second)["graph_edges_match"]
    assert mats["graph"]["mode"] == "update"
    live = written + 2 - deleted

    # both journal writes were reported (as the sensor would), once each
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("journal"), asset_partitions=[ds.name]),
        limit=10,
    ).records
    assert len(records) == 2

    # nothing new: the exports are kept, and still say how many rows they hold
    third = materialize(local_lake, instance, ds.name)
    assert third.success
    mats = materializations(third)
    assert not mats["statements_csv"]["rewritten"]
    assert mats["statements_csv"]["dagster/row_count"] == live
    assert mats["entities_ftm_json"]["dagster/row_count"] == len(entities)
    assert mats["statements_csv"]["dagster/uri"].endswith(cv.STATEMENTS_CSV)
    # ... and every number the no-op run reports is what the files and tables hold
    index = json.loads(ds.store.read_text(cv.dataset_path(ds.name, cv.INDEX)))
    head = ds.version()
    assert head is not None and head.sequence == 2
    assert not mats["index"]["rewritten"]
    assert mats["index"]["outcome"].startswith("unchanged")
    assert mats["index"]["resources"] == len(index["resources"]) > 0
    assert (mats["index"]["version"], mats["index"]["version_hash"]) == (2, head.hash)
    assert "entities_add" not in mats["index"]
    for key, path in (
        ("statements_csv", cv.STATEMENTS_CSV),
        ("entities_ftm_json", cv.ENTITIES_JSON),
        ("index", cv.INDEX),
    ):
        assert mats[key]["size_bytes"] == ds.store.size(cv.dataset_path(ds.name, path)), key
    lines = ds.store.read_text(cv.dataset_path(ds.name, cv.STATEMENTS_CSV)).splitlines()
    assert mats["statements_csv"]["dagster/row_count"] == len(lines) - 1  # the header
    # the flush had nothing to do: it says so, and keeps the last real flush's counts
    flushed = mats["statements"]
    assert flushed["outcome"].startswith("nothing new")
    assert "new_statements" not in flushed and "journal_rows_flushed" not in flushed
    assert flushed["last_flush_new_statements"] == 2
    assert flushed["last_flush_tombstoned_statements"] == deleted
    assert (
        flushed["dagster/row_count"]
        == ds.statements_table.table().to_pyarrow_dataset().count_rows()
    )  # type: ignore[union-attr]
    assert flushed["delta_version"] == ds.statements_table.table().version()  # type: ignore[union-attr]


def test_blocking_check_stops_bad_data(
    spark: Any, local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    ds = local_lake.create_dataset("bad_data")
    ds.add_entity({"id": "ok", "schema": "Person", "properties": {"name": ["Ann"]}})
    # a row the API would refuse (unknown property), as a buggy writer could leave it
    good = Statement(entity_id="ok", prop="name", schema="Person", value="blue", dataset=ds.name)
    row = statement_row(good, ds.name, "buggy")
    bad = tuple("favouriteColour" if v == "name" else v for v in row)
    with local_lake.journal.engine.begin() as conn:
        local_lake.journal.insert_rows(conn, [bad], Write.new("buggy-app"))
    ds.core_tags.touch(cv.JOURNAL_LAST_UPDATED)

    result = materialize(local_lake, instance, ds.name)
    assert not result.success
    assert checks(result)["statements_schema_valid"] is False
    evaluation = next(
        c for c in result.get_asset_check_evaluations() if c.check_name == "statements_schema_valid"
    )
    examples = evaluation.metadata["examples"].value
    assert examples[0]["prop"] == "favouriteColour"
    mats = materializations(result)
    assert "statements" in mats
    assert not {"statements_csv", "entities_ftm_json", "statistics", "index"} & set(mats)
    assert not ds.store.exists(cv.dataset_path(ds.name, cv.ENTITIES_JSON))


def test_fresh_exports_are_kept_and_reported(
    spark: Any, local_lake: Lakehouse, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    ds = local_lake.create_dataset("kept")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    assert materialize(local_lake, instance, ds.name).success
    again = materialize(local_lake, instance, ds.name)
    assert again.success
    mats = materializations(again)
    assert mats["statements"]["outcome"].startswith("nothing new")
    assert mats["statements"]["last_flush_new_statements"] == 2  # id + name of p1
    assert not any(
        mats[k]["rewritten"] for k in ("statements_csv", "entities_ftm_json", "statistics")
    )
