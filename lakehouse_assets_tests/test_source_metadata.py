"""Source metadata of FtM JSON kept on write: an OpenSanctions-style entity's seen
times become its statements', what the statement model has no place for is
reported, and values followthemoney's cleaning drops are counted."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
import orjson
import pytest
from click.testing import CliRunner

from lakehouse_assets import conventions as cv
from lakehouse_assets.defs.partitions import DATASETS
from lakehouse_assets.defs.queue import consume_queue
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets_tests.conftest import cli_args
from lakehouse_assets_tests.helpers.defs import resources

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: As OpenSanctions publishes an entity (targets.nested.json / entities.ftm.json),
#: spelled out: seen times, the datasets and referents of the merged entity, the
#: target flag, and one phone number followthemoney's cleaning cannot parse.
OPENSANCTIONS_ENTITY: dict[str, Any] = {
    "id": "NK-ann-example",
    "caption": "Ann Example",
    "schema": "Person",
    "properties": {
        "name": ["Ann Example"],
        "phone": ["+49 30 1234567", "call me maybe"],
        "country": ["de"],
    },
    "referents": ["ofac-1234", "eu-fsf-5678"],
    "datasets": ["us_ofac_sdn", "eu_fsf"],
    "first_seen": "2023-01-05T10:00:00",
    "last_seen": "2024-03-01T12:00:00",
    "last_change": "2023-06-01T08:30:00",
    "target": True,
}
FIRST, LAST, CHANGE = "2023-01-05T10:00:00", "2024-03-01T12:00:00", "2023-06-01T08:30:00"
#: What the write reports: the phone number the cleaning dropped, the fields not kept.
NOTES = {
    "dropped_values": {"phone": 1},
    "fields_not_kept": {"datasets": 1, "referents": 1, "target": 1},
}


def statement_rows(ds: Dataset, entity_id: str) -> list[dict[str, str]]:
    data = ds.store.read_bytes(cv.dataset_path(ds.name, cv.STATEMENTS_CSV)).decode("utf-8")
    return [r for r in csv.DictReader(io.StringIO(data)) if r["canonical_id"] == entity_id]


def exported_entity(ds: Dataset, entity_id: str) -> dict[str, Any]:
    data = ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON))
    (found,) = [e for e in map(orjson.loads, data.splitlines()) if e["id"] == entity_id]
    return dict(found)


def check_exports(ds: Dataset) -> None:
    """statements.csv rows carry the input's seen times (the ``id`` row: last_change
    as its first_seen, where followthemoney's model keeps it); entities.ftm.json
    the seen times and last_change, the phone number that parsed."""
    rows = statement_rows(ds, OPENSANCTIONS_ENTITY["id"])
    assert {r["prop"] for r in rows} == {"id", "name", "phone", "country"}
    for row in rows:
        first = CHANGE if row["prop"] == "id" else FIRST
        assert (row["first_seen"], row["last_seen"]) == (first, LAST), row
    entity = exported_entity(ds, OPENSANCTIONS_ENTITY["id"])
    assert (entity["first_seen"], entity["last_seen"], entity["last_change"]) == (
        FIRST,
        LAST,
        CHANGE,
    )
    assert entity["properties"]["phone"] == ["+49301234567"]
    assert entity["datasets"] == [ds.name] and entity["referents"] == []
    assert "target" not in entity  # reported on write, not kept


def test_an_opensanctions_entity_keeps_its_seen_times_across_writes(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    ds = local_lake.create_dataset("sanctioned")
    line = orjson.dumps(OPENSANCTIONS_ENTITY) + b"\n"
    bulk = ds.write_entities(io.BytesIO(line), origin="opensanctions")
    assert (bulk.entities, bulk.notes.as_dict()) == (1, NOTES)
    ds.make()
    check_exports(ds)
    # seen again later, then a write that says it was seen earlier and not as late:
    # the translog keeps the earliest first_seen and the latest last_seen
    later = {**OPENSANCTIONS_ENTITY, "first_seen": "2023-02-01T00:00:00"}
    later["last_seen"] = "2024-06-01T00:00:00"
    ds.write_entities(io.BytesIO(orjson.dumps(later)), origin="opensanctions")
    earlier_seen = {**OPENSANCTIONS_ENTITY, "last_seen": "2023-12-31T00:00:00"}
    earlier_seen["first_seen"] = "2022-11-30T00:00:00"
    earlier_seen["last_change"] = "2022-11-30T00:00:00"
    ds.write_entities(io.BytesIO(orjson.dumps(earlier_seen)), origin="opensanctions")
    ds.make()
    rows = statement_rows(ds, OPENSANCTIONS_ENTITY["id"])
    names = [r for r in rows if r["prop"] == "name"]
    assert [(r["first_seen"], r["last_seen"]) for r in names] == [
        ("2022-11-30T00:00:00", "2024-06-01T00:00:00")
    ]
    stored = {s.prop: s for s in ds.stored_statements(OPENSANCTIONS_ENTITY["id"])}
    assert (stored["name"].first_seen, stored["name"].last_seen) == (
        "2022-11-30T00:00:00",
        "2024-06-01T00:00:00",
    )


def test_seen_times_are_normalised_and_default_to_the_write(local_lake: Lakehouse) -> None:
    """An offset is converted to UTC (the translog compares the strings); an entity
    without seen times is seen at the write, as before."""
    ds = local_lake.create_dataset("seen")
    ds.add_entity(
        {
            "id": "p1",
            "schema": "Person",
            "properties": {"name": ["Ann"]},
            "first_seen": "2024-01-01T01:30:00+02:00",
        }
    )
    ds.add_entity({"id": "p2", "schema": "Person", "properties": {"name": ["Bo"]}})
    (p1,) = [s for s in ds.journal.live_entity_statements("seen", "p1") if s.prop == "name"]
    (p2,) = [s for s in ds.journal.live_entity_statements("seen", "p2") if s.prop == "name"]
    assert p1.first_seen == "2023-12-31T23:30:00"
    assert p1.last_seen is not None and p1.last_seen == p2.first_seen == p2.last_seen
    assert p1.last_seen > "2025"


def test_the_cli_reports_what_it_dropped(
    spark: SparkSession, local_lake: Lakehouse, tmp_path: Path
) -> None:
    from lakehouse_assets.cli import cli

    ds = local_lake.create_dataset("cli_sanctioned")
    owned = {"id": "acme", "schema": "Company", "properties": {"name": ["Acme"]}}
    source = tmp_path / "entities.ftm.json"
    source.write_bytes(b"\n".join(orjson.dumps(e) for e in (OPENSANCTIONS_ENTITY, owned)))
    base = cli_args(ds)
    written = CliRunner().invoke(cli, [*base, "entities", "write", "-i", str(source)])
    assert written.exit_code == 0, written.output
    assert "wrote 2 entities" in written.stderr
    assert "values dropped by followthemoney's cleaning: phone 1" in written.stderr
    assert "entity fields not kept (entities): datasets 1, referents 1, target 1" in written.stderr
    made = CliRunner().invoke(cli, [*base, "make", "--json"])
    assert made.exit_code == 0, made.output
    check_exports(ds)
    # an input without any of it: no such line
    plain = tmp_path / "plain.ftm.json"
    plain.write_bytes(orjson.dumps(owned))
    written = CliRunner().invoke(cli, [*base, "entities", "write", "-i", str(plain)])
    assert written.exit_code == 0 and "wrote 1 entities" in written.stderr
    assert "dropped" not in written.stderr and "not kept" not in written.stderr


def test_a_queued_entity_s_dropped_values_are_in_the_job_record(local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("queued_sanctioned")
    ds.queue.push("UPSERT", "entity", OPENSANCTIONS_ENTITY, tenant="opensanctions")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(DATASETS, [ds.name])
        done = consume_queue.execute_in_process(
            partition_key=ds.name, instance=instance, resources=resources(local_lake)
        )
    assert done.success
    (output,) = [e for e in done.all_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = output.event_specific_data.metadata  # type: ignore[union-attr]
    assert metadata["dropped_values"].value == NOTES["dropped_values"]
    assert metadata["fields_not_kept"].value == NOTES["fields_not_kept"]
    (name,) = [
        s for s in ds.journal.live_entity_statements(ds.name, "NK-ann-example") if s.prop == "name"
    ]
    assert (name.first_seen, name.last_seen) == (FIRST, LAST)
    (item,) = ds.queue.list(state="all")
    assert item.state == "done"


@pytest.mark.parametrize(
    ("extra", "kept"),
    [
        ({"datasets": ["sanctioned"], "referents": [], "target": False}, {}),
        ({"origin": ["opensanctions"]}, {}),
        ({"origin": ["crawl"], "context": {"x": 1}}, {"context": 1, "origin": 1}),
    ],
)
def test_only_what_is_lost_is_reported(
    local_lake: Lakehouse,
    extra: dict[str, Any],
    kept: dict[str, int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The write's own dataset and origin, no referents, target false: nothing lost.
    ``Dataset.add_entity``, which answers a count, logs what was not kept."""
    ds = local_lake.create_dataset("sanctioned")
    entity = {"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}, **extra}
    with ds.bulk(origin="opensanctions") as bulk:
        bulk.add_entity(entity)
    assert bulk.notes.as_dict() == {"dropped_values": {}, "fields_not_kept": kept}
    with caplog.at_level("WARNING", logger="lakehouse_assets.lake"):
        ds.add_entity(entity, origin="opensanctions")
    logged = [r.getMessage() for r in caplog.records if r.name == "lakehouse_assets.lake"]
    assert logged == ([f"sanctioned: entity written; {bulk.notes.describe()}"] if kept else [])
