"""Dagster's own storage on PostgreSQL (dagster-postgres), against the local server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa

from lakehouse_assets.definitions import defs
from lakehouse_assets.defs.demo import report_sources
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets_tests.conftest import psycopg2_url


def instance_at(home: Path) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(str(home))


def test_runs_and_partitions_persist_in_postgres(
    spark: Any, dagster_postgres: str, local_lake: Lakehouse, tmp_path: Path
) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\n"
        f"storage:\n  postgres:\n    postgres_url: {psycopg2_url(dagster_postgres)}\n"
    )
    ds = local_lake.create_dataset("pg_storage")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    lakehouse = LakehouseResource(
        lake_uri=local_lake.settings.lake_uri, journal_url=local_lake.settings.journal_url
    )
    with instance_at(home) as instance:
        report_sources(instance, lakehouse, ds.name)
        job = defs.resolve_job_def("refresh_dataset")
        result = job.execute_in_process(
            partition_key=ds.name,
            instance=instance,
            resources={"lakehouse": lakehouse, "spark": SparkResource()},
        )
        assert result.success
        run_id = result.run_id

    # a new instance on the same database sees everything: partitions, the
    # run, the reported journal and the materializations with their metadata
    with instance_at(home) as again:
        assert again.get_dynamic_partitions("datasets") == ["pg_storage"]
        run = again.get_run_by_id(run_id)
        assert run is not None and run.is_success
        records = again.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=dg.AssetKey("statements"), asset_partitions=["pg_storage"]
            ),
            limit=1,
        ).records
        (record,) = records
        mat = record.asset_materialization
        assert mat is not None and mat.metadata["new_statements"].value == 2
        journal = again.fetch_materializations(dg.AssetKey("journal"), limit=1).records
        assert journal and journal[0].run_id == ""
    with sa.create_engine(psycopg2_url(dagster_postgres)).connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
    assert {"runs", "event_logs", "dynamic_partitions"} <= tables
