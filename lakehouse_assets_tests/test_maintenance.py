"""Compact and optimize rewrite tables (that they change nothing visible is a property:
test_properties_dataset)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from click.testing import CliRunner

from lakehouse_assets import conventions as cv
from lakehouse_assets.cli import cli
from lakehouse_assets.jobs import list_runs
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.tables.snapshot import Snapshot
from lakehouse_assets_tests.conftest import cli_args, sample_entities

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark_modes

ENTITIES = sample_entities()


def test_optimize_merges_files_and_tags(spark: SparkSession, local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("optimizing")
    for e in ENTITIES:  # one flush per entity: many small files
        ds.add_entity(e)
        ds.flush()
    files_before = len(Snapshot.load(ds.statements_table).files)
    assert files_before == len(ENTITIES)
    entities_before = [e.to_dict() for e in ds.query(flush=False)]
    result = ds.optimize()
    assert result.files_removed >= files_before and result.files_added >= 1
    assert len(Snapshot.load(ds.statements_table).files) < files_before
    assert [e.to_dict() for e in ds.query(flush=False)] == entities_before
    assert ds.core_tags.get(cv.STATEMENTS_OPTIMIZED) is not None
    # the replaced files stay for older readers until vacuum removes them
    vacuumed = ds.optimize(vacuum=True, retention_hours=0)
    assert vacuumed.vacuumed >= files_before
    ds.compact()
    # each run leaves a job record, listed by `lakehouse jobs TYPE` as a table
    runs = list_runs(local_lake.store, ds.name, "optimize")
    assert [r.status for r in runs] == ["succeeded", "succeeded"]
    assert runs[0].stats["files_removed"] == result.files_removed
    assert runs[1].stats["vacuumed"] == vacuumed.vacuumed
    (compacted,) = list_runs(local_lake.store, ds.name, "compact")
    assert compacted.status == "succeeded" and compacted.stats["live"] > 0
    base = cli_args(ds)
    table = CliRunner().invoke(cli, [*base, "jobs", "optimize"])
    assert table.exit_code == 0, table.output
    header, *lines = table.stdout.splitlines()
    assert header.split()[:2] == ["state", "started"] and len(lines) == 2
    assert lines[1].startswith("succeeded") and f"vacuumed {vacuumed.vacuumed}" in lines[1]
    listed = CliRunner().invoke(cli, [*base, "jobs", "compact", "--json"])
    assert json.loads(listed.stdout)["stats"]["live"] == compacted.stats["live"]


def test_compact_on_empty_dataset_is_a_no_op(spark: SparkSession, local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("nothing")
    assert ds.compact().live == 0
    assert ds.optimize().files_added == 0
