"""Mappings: stored, validated, versioned, and mapped like followthemoney's ``ftm map``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest
import yaml
from click.testing import CliRunner
from followthemoney import model
from followthemoney.proxy import EntityProxy

from lakehouse_assets import conventions as cv
from lakehouse_assets.cli import cli
from lakehouse_assets.errors import InvalidInputError, SourceNotFoundError
from lakehouse_assets.journal import row_statement
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.mappings import mapping_origin
from lakehouse_assets_tests.conftest import REPO, SHARED_DATA

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark_modes

HERE = Path(__file__).parent
#: A small CSV + mapping of our own, so the suite runs without ../shared.
PEOPLE_CSV = """name,nationality,employer,role
Ann Smith,de,ACME GmbH,Director
Bob Jones,gb,ACME GmbH,
"Carla ""CJ"" Diaz",es,Beta Ltd,Owner

Dan Brown,,,
"""
PEOPLE_YML = """people:
  queries:
    - csv_url: people.csv
      entities:
        person:
          schema: Person
          key: name
          properties:
            name: {column: name}
            nationality: {column: nationality}
        company:
          schema: Company
          key: employer
          properties:
            name: {column: employer}
        job:
          schema: Employment
          key: [name, employer]
          key_literal: employment
          properties:
            employee: {entity: person}
            employer: {entity: company}
            role: {column: role}
"""


def sources(tmp_path: Path) -> list[tuple[str, Path, Path]]:
    """(name, csv, mapping) pairs: ours, plus the shared donations and experts."""
    people = tmp_path / "people.csv"
    people.write_text(PEOPLE_CSV)
    people_yml = tmp_path / "people.yml"
    people_yml.write_text(PEOPLE_YML)
    found = [("people", people, people_yml)]
    for name in ("donations", "experts"):
        if (SHARED_DATA / f"{name}.csv").exists():
            found.append((name, SHARED_DATA / f"{name}.csv", SHARED_DATA / f"{name}.yml"))
    return found


def ftm_map(
    dataset: str, csv_path: Path, mapping: Path, tmp_path: Path
) -> dict[str, dict[str, Any]]:
    """followthemoney's own ``ftm map`` on the file, entities merged by id."""
    config = yaml.safe_load(mapping.read_text())
    for block in config.values():
        for query in block.get("queries", [block.get("query")]):
            query["csv_url"] = str(csv_path)
    local = tmp_path / f"{dataset}-local.yml"
    local.write_text(yaml.safe_dump(config))
    ftm = Path(sys.executable).parent / "ftm"
    out = subprocess.run(
        [str(ftm), "map", "-d", dataset, str(local)], check=True, capture_output=True
    ).stdout
    merged: dict[str, EntityProxy] = {}
    for line in out.splitlines():
        proxy = model.get_proxy(orjson.loads(line))
        if proxy.id in merged:
            merged[proxy.id].merge(proxy)
        else:
            merged[proxy.id] = proxy
    return {k: normal(v) for k, v in merged.items()}


def normal(proxy: EntityProxy) -> dict[str, Any]:
    return {
        "schema": proxy.schema.name,
        "properties": {p: sorted(vs) for p, vs in proxy.to_dict()["properties"].items()},
    }


def journal_entities(ds: Dataset, content_hash: str) -> dict[str, dict[str, Any]]:
    """What the journal holds of the mapping's origin, aggregated per entity."""
    merged: dict[str, EntityProxy] = {}
    origin = mapping_origin(content_hash)
    for row in ds.journal.rows(ds.name):
        stmt = row_statement(row)
        if stmt.origin != origin:
            continue
        proxy = merged.get(stmt.entity_id)
        if proxy is None:
            proxy = merged[stmt.entity_id] = model.make_entity(stmt.schema)
            proxy.id = stmt.entity_id
        elif proxy.schema.name != stmt.schema:
            proxy.schema = model.common_schema(proxy.schema, stmt.schema)
        if stmt.prop != "id":
            proxy.add(stmt.prop, stmt.value, cleaned=True)
    return {k: normal(v) for k, v in merged.items()}


@pytest.mark.parametrize("engine", ["local", "spark"])
def test_mapping_equals_ftm_map(
    engine: str, local_lake: Lakehouse, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if engine == "spark":
        request.getfixturevalue("spark")
    found = sources(tmp_path)
    if engine == "spark":  # the same code as local, in Spark's workers: one CSV suffices
        found = found[-2:] if len(found) > 1 else found
    for name, csv_path, mapping in found:
        ds = local_lake.create_dataset(name)
        meta = ds.add_file(str(csv_path))
        stored = ds.add_mapping(meta.checksum, mapping.read_text())
        assert stored.changed
        result = ds.process_mapping(meta.checksum, spark=engine == "spark")
        assert result.engine == engine and not result.skipped
        expected = ftm_map(name, csv_path, mapping, tmp_path)
        got = journal_entities(ds, meta.checksum)
        assert got == expected, name
        assert result.statements == ds.journal.count(ds.name)
        assert ds.core_tags.get(cv.mapping_processed_tag(meta.checksum)) is not None
        # unchanged mapping, unchanged CSV: skipped by the freshness rule
        again = ds.process_mapping(meta.checksum, spark=engine == "spark")
        assert again.skipped
        assert ds.journal.count(ds.name) == result.statements


def test_store_versions_and_list(local_lake: Lakehouse, tmp_path: Path) -> None:
    (_, csv_path, mapping), *_ = sources(tmp_path)
    ds = local_lake.create_dataset("mapping_versions")
    meta = ds.add_file(str(csv_path))
    assert ds.add_mapping(meta.checksum, mapping.read_text()).changed
    assert not ds.add_mapping(meta.checksum, mapping.read_text()).changed  # same: no version
    changed = mapping.read_text().replace("role: {column: role}", "summary: {column: role}")
    assert ds.add_mapping(meta.checksum, changed).changed
    stored = yaml.safe_load(ds.store.read_text(cv.mapping_config(ds.name, meta.checksum)))
    assert stored["content_hash"] == meta.checksum and len(stored["queries"]) == 1
    versions = list(ds.store.list(f"{cv.mappings_prefix(ds.name)}{meta.checksum}/versions/"))
    assert len(versions) == 2
    (listed,) = ds.mappings()
    assert listed["versions"] == 2 and listed["fresh"] is False


def test_changed_mapping_replaces_its_entities(local_lake: Lakehouse, tmp_path: Path) -> None:
    (_, csv_path, mapping), *_ = sources(tmp_path)
    ds = local_lake.create_dataset("replaced")
    meta = ds.add_file(str(csv_path))
    ds.add_mapping(meta.checksum, mapping.read_text())
    ds.process_mapping(meta.checksum, spark=False)
    # the new version maps people only: companies and employments must go
    only_people = yaml.safe_load(mapping.read_text())
    entities = only_people["people"]["queries"][0]["entities"]
    del entities["company"], entities["job"]
    ds.add_mapping(meta.checksum, only_people)
    result = ds.process_mapping(meta.checksum, spark=False)
    assert result.tombstones > 0
    live = {e.schema.name for e in ds.query()}
    assert live == {"Person"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda y: y.replace("schema: Company", "schema: Kompany"), "Kompany"),
        (
            lambda y: y.replace(
                "nationality: {column: nationality}", "colour: {column: nationality}"
            ),
            "colour",
        ),
        (lambda y: y.replace("{column: employer}", "{column: employer_name}"), "employer_name"),
        (lambda y: "people: [not, a, mapping", "not valid YAML"),
        (lambda y: "people:\n  queries: []\n", "no queries"),
    ],
)
def test_bad_mappings_store_nothing(
    local_lake: Lakehouse, tmp_path: Path, change: Any, message: str
) -> None:
    (_, csv_path, mapping), *_ = sources(tmp_path)
    ds = local_lake.create_dataset("bad_mapping")
    meta = ds.add_file(str(csv_path))
    with pytest.raises(InvalidInputError, match=message) as info:
        ds.add_mapping(meta.checksum, change(mapping.read_text()))
    assert "bad_mapping" in str(info.value) and meta.checksum in str(info.value)
    assert not list(ds.store.list(cv.mappings_prefix(ds.name)))


def test_mapping_needs_the_csv_in_the_archive(local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("no_csv")
    with pytest.raises(SourceNotFoundError, match="no archived file"):
        ds.add_mapping("a" * 64, PEOPLE_YML)
    with pytest.raises(SourceNotFoundError, match="mapping add"):
        ds.process_mapping("a" * 64)


def test_mapping_cli(tmp_path: Path) -> None:
    (_, csv_path, mapping), *_ = sources(tmp_path)
    base = ["--lake", str(tmp_path / "lake"), "--journal-url", f"sqlite:///{tmp_path / 'j.sqlite'}"]
    runner = CliRunner()
    assert runner.invoke(cli, [*base, "datasets", "create", "cli_map"]).exit_code == 0
    added = runner.invoke(cli, [*base, "-d", "cli_map", "archive", "add", str(csv_path)])
    assert added.exit_code == 0, added.output
    checksum = json.loads(added.stdout)["checksum"]
    # a unique prefix of the checksum will do, as `archive ls` shows it
    result = runner.invoke(
        cli, [*base, "-d", "cli_map", "mapping", "add", checksum[:12], str(mapping)]
    )
    assert result.exit_code == 0, result.output
    listed = runner.invoke(cli, [*base, "-d", "cli_map", "mapping", "ls"])
    assert json.loads(listed.stdout.splitlines()[0])["content_hash"] == checksum
    done = runner.invoke(
        cli, [*base, "-d", "cli_map", "mapping", "process", checksum[:8], "--engine", "local"]
    )
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["statements"] > 0
    bad = tmp_path / "bad.yml"
    bad.write_text(PEOPLE_YML.replace("schema: Person", "schema: Persona"))
    failed = runner.invoke(cli, [*base, "-d", "cli_map", "mapping", "add", checksum, str(bad)])
    assert failed.exit_code != 0 and "Persona" in failed.output


def test_mapping_sensor_and_job(local_lake: Lakehouse, tmp_path: Path) -> None:
    import dagster as dg

    from lakehouse_assets.definitions import defs
    from lakehouse_assets.defs.ingest import mapping_changes
    from lakehouse_assets.defs.partitions import DATASETS
    from lakehouse_assets.defs.resources import LakehouseResource

    (_, csv_path, mapping), *_ = sources(tmp_path)
    ds = local_lake.create_dataset("sensed")
    meta = ds.add_file(str(csv_path))
    resources = {
        "lakehouse": LakehouseResource(
            lake_uri=local_lake.settings.lake_uri, journal_url=local_lake.settings.journal_url
        )
    }
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(DATASETS, [ds.name])

        def tick(cursor: str | None = None) -> Any:
            with dg.build_sensor_context(
                instance=instance, cursor=cursor, resources=resources
            ) as ctx:
                return mapping_changes(ctx)

        def skipped(result: Any) -> bool:
            """Nothing to do: a skip, bare or with the sensor's cursor kept."""
            if isinstance(result, dg.SkipReason):
                return True
            return (
                isinstance(result, dg.SensorResult)
                and result.skip_reason is not None
                and not result.run_requests
                and not result.asset_events
            )

        assert skipped(tick())
        ds.add_mapping(meta.checksum, mapping.read_text())
        result = tick()
        assert isinstance(result, dg.SensorResult)
        (event,) = result.asset_events or []
        assert event.asset_key == dg.AssetKey("mappings") and event.partition == ds.name
        assert event.metadata["stale"].value == 1
        (run,) = result.run_requests or []
        assert run.partition_key == ds.name
        config = run.run_config["ops"]["process_mappings"]["config"]
        assert config["content_hashes"] == [meta.checksum]
        assert skipped(tick(result.cursor))

        done = defs.resolve_job_def("mappings_job").execute_in_process(
            run_config=run.run_config, partition_key=ds.name, instance=instance, resources=resources
        )
        assert done.success
    assert ds.journal.count(ds.name) > 0
    (listed,) = ds.mappings()
    assert listed["fresh"] is True


@pytest.mark.on_cluster
def test_spark_mapping_stages_in_the_lake(
    spark: SparkSession, lake: Lakehouse, tmp_path: Path
) -> None:
    """The Spark engine stages the CSV rows and its tasks' output in the lake's
    own ``_staging/`` area (on S3 for an s3:// lake; tasks never use the driver's
    disk), gives what the local engine gives, and leaves no staging behind."""
    sample = REPO / "lakehouse_assets" / "sample"
    reference = Lakehouse(tmp_path / "reference")
    results = {}
    for engine, where in (("local", reference), ("spark", lake)):
        ds = where.create_dataset("staged")
        meta = ds.add_file(str(sample / "documents" / "northwind-shareholders.csv"))
        ds.add_mapping(meta.checksum, (sample / "northwind-shareholders.yml").read_text())
        result = ds.process_mapping(meta.checksum, spark=engine == "spark")
        assert result.engine == engine and result.statements > 0
        results[engine] = journal_entities(ds, meta.checksum)
        assert not ds.store.list_dirs(cv.dataset_path(ds.name, cv.STAGING))
    assert results["spark"] == results["local"] and results["local"]
