"""Asset jobs over many datasets, maintenance assets, freshness and the resources,
on real lakes (local and the loopback S3 server) and a real Dagster instance."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource
from dagster_pyspark import PySparkResource

from lakehouse_assets import conventions as cv
from lakehouse_assets.definitions import AUTOMATION_TAGS, defs
from lakehouse_assets.defs.demo import report_sources
from lakehouse_assets.defs.demo import summary as demo_summary
from lakehouse_assets.defs.freshness import CHECK, freshness_checks
from lakehouse_assets.defs.maintenance import RANGE_END, RANGE_START
from lakehouse_assets.defs.partitions import DATASETS
from lakehouse_assets.defs.resources import S3_ENV, LakehouseResource, SparkResource, s3_from_env
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets_tests.conftest import psycopg2_url
from lakehouse_assets_tests.helpers.defs import KEYS, daemon_tick, quiet

#: What the refresh computes: every asset but the reported ones and maintenance.
COMPUTED = KEYS - {"archive", "mappings", "journal", "optimize", "compact"}


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def lakehouse(lake: Lakehouse) -> LakehouseResource:
    return LakehouseResource(lake_uri=lake.settings.lake_uri, journal_url=lake.settings.journal_url)


def run_job(
    name: str, lake: Lakehouse, instance: dg.DagsterInstance, datasets: list[str], **kw: Any
) -> dg.ExecuteInProcessResult:
    """The job of the definitions over a range of dataset partitions: one run."""
    job = defs.resolve_job_def(name)
    return job.execute_in_process(
        instance=instance,
        tags={RANGE_START: datasets[0], RANGE_END: datasets[-1]},
        resources={"lakehouse": lakehouse(lake), "spark": SparkResource()},
        raise_on_error=False,
        **kw,
    )


def by_partition(result: dg.ExecuteInProcessResult, key: str) -> dict[str, dict[str, Any]]:
    out = {}
    for event in result.get_asset_materialization_events():
        mat = event.materialization
        if mat is not None and mat.asset_key.to_user_string() == key:
            assert mat.partition is not None
            out[mat.partition] = {k: v.value for k, v in mat.metadata.items()}
    return out


def test_definitions_name_the_card_s_resources_jobs_and_policies() -> None:
    graph = defs.resolve_asset_graph()
    for key in COMPUTED | {"optimize", "compact"}:
        node = graph.get(dg.AssetKey(key))
        # N datasets in one run: one Spark start
        assert node.backfill_policy == dg.BackfillPolicy.single_run(), key
    for key in ("statements_csv", "entities_ftm_json", "statistics", "index", "graph"):
        # freshness is the per-dataset `fresh` check, not a per-asset time window that
        # a quiet lake (no materialization for a day, every dataset fresh) would fail
        assert graph.get(dg.AssetKey(key)).freshness_policy is None, key
    # maintenance is downstream of the tables it changes, and not automated
    assert {p.to_user_string() for p in graph.get(dg.AssetKey("optimize")).parent_keys} == {
        "statements",
        "translog",
        "graph",
    }
    assert graph.get(dg.AssetKey("optimize")).automation_condition is None
    fresh = {k.asset_key.to_user_string() for k in graph.asset_check_keys if k.name == CHECK}
    assert fresh == COMPUTED - {"statements", "translog"}
    for name in ("optimize_job", "compact_job", "refresh_dataset", "flush_job", "export_job"):
        assert defs.resolve_job_def(name).executor_def.name == "in_process"
    assert {
        k.to_user_string()
        for k in defs.resolve_job_def("flush_job").asset_layer.selected_asset_keys
    } == {"statements", "translog"}
    resources = defs.resources or {}
    assert isinstance(resources["spark"], PySparkResource)
    lake = resources["lakehouse"]
    assert isinstance(lake, LakehouseResource) and isinstance(lake.s3, S3Resource)
    sensor = defs.resolve_sensor_def("lakehouse_automation")
    assert AUTOMATION_TAGS.items() <= dict(sensor.run_tags or {}).items()  # type: ignore[attr-defined]


def test_s3_credentials_are_env_vars_and_reach_the_lake(
    s3_settings: Settings, monkeypatch: pytest.MonkeyPatch, instance: dg.DagsterInstance
) -> None:
    from lakehouse_assets_tests.conftest import make_bucket

    env = {
        "LAKEHOUSE_S3_ENDPOINT_URL": str(s3_settings.s3_endpoint_url),
        "LAKEHOUSE_S3_ACCESS_KEY_ID": str(s3_settings.s3_access_key_id),
        "LAKEHOUSE_S3_SECRET_ACCESS_KEY": str(s3_settings.s3_secret_access_key),
    }
    resource = s3_from_env(env)
    # the values are not in the definitions, only the variables' names
    assert resource.endpoint_url == S3_ENV["endpoint_url"]
    assert resource.aws_secret_access_key == "LAKEHOUSE_S3_SECRET_ACCESS_KEY"
    assert resource.region_name is None  # unset: not wired (boto3's default applies)
    # the environment Dagster resolves them from holds the values; ours must not
    for key in env:
        monkeypatch.delenv(key, raising=False)
    lake = Lakehouse(f"s3://{make_bucket(s3_settings)}/lake", settings=s3_settings)
    lake.create_dataset("on_s3")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # a sensor of the definitions, with the EnvVar-wired S3 resource, lists the S3 lake
    with dg.build_sensor_context(
        instance=instance,
        resources={
            "lakehouse": LakehouseResource(
                lake_uri=lake.settings.lake_uri,
                journal_url=lake.settings.resolved_journal_url(),
                s3=s3_from_env(),
            )
        },
        definitions=defs,
    ) as ctx:
        result = defs.resolve_sensor_def("new_datasets")(ctx)
    assert isinstance(result, dg.SensorResult)
    (request,) = result.dynamic_partitions_requests or []
    assert list(request.partition_keys or []) == ["on_s3"]


def test_one_run_refreshes_many_datasets_then_maintains_them(
    spark: Any, local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    names = ["alpha", "beta", "gamma"]
    for i, name in enumerate(names):
        ds = local_lake.create_dataset(name)
        for n in range(i + 1):
            ds.add_entity(
                {"id": f"{name}-{n}", "schema": "Person", "properties": {"name": [f"P {n}"]}}
            )
        report_sources(instance, lakehouse(local_lake), name)

    result = run_job("refresh_dataset", local_lake, instance, names)
    assert result.success
    # one run, every dataset's partition materialized, each dataset's own work done
    assert len(instance.get_runs()) == 1
    stmts = by_partition(result, "statements")
    assert sorted(stmts) == names
    # the run's totals (Dagster copies one report onto the run's partitions)
    assert stmts["alpha"]["datasets"] == 3
    assert stmts["alpha"]["new_statements"] == 2 * (1 + 2 + 3)  # id + name each
    assert "| gamma |" in stmts["alpha"]["by_dataset"]
    for i, name in enumerate(names):
        ds = local_lake.dataset(name)
        text = ds.store.read_text(cv.dataset_path(name, cv.ENTITIES_JSON))
        assert len(text.splitlines()) == i + 1
        assert ds.version() is not None
    # the partitioned freshness check judged each dataset, and all are fresh
    evaluations = [c for c in result.get_asset_check_evaluations() if c.check_name == CHECK]
    assert evaluations and all(c.passed for c in evaluations)
    # the demo's summary of the run says what each materialization did: no empty rows
    # (the graph assets' rows were empty)
    rows = [line for line in demo_summary(result)[1:] if not line.startswith(" " * 20)]
    assert any(row.split()[0] == "graph" for row in rows)
    for row in rows:
        assert len(row.split()) > 1, row

    # nightly maintenance: one run over the datasets; statements observed per dataset
    before = {n: local_lake.dataset(n).statements_table.table().version() for n in names}  # type: ignore[union-attr]
    optimized = run_job(
        "optimize_job",
        local_lake,
        instance,
        names,
        run_config={"ops": {"optimize": {"config": {"vacuum": False}}}},
    )
    assert optimized.success
    assert sorted(by_partition(optimized, "optimize")) == names
    observed: dict[str, int] = {}
    for record in instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("statements")), limit=20
    ).records:
        obs = record.asset_observation
        assert obs is not None and obs.partition is not None
        observed.setdefault(obs.partition, int(obs.metadata["delta_version"].value))  # type: ignore[arg-type]
    assert sorted(observed) == names
    for name in names:  # the observation names the table's version after optimize
        table = local_lake.dataset(name).statements_table.table()
        assert table is not None and observed[name] == table.version() >= before[name]
    # optimize does not make the exports stale
    assert all(v.fresh for v in _states(local_lake, "beta").values())

    # the daily refresh asks for no run when nothing changed (it asked for one
    # run over every dataset, every day); after writes, for those datasets only
    now = datetime.now(UTC)
    quiet = daily_tick(instance, local_lake, now)
    assert not quiet.run_requests and "3 of 3 judged" in str(quiet.skip_message)
    later = daily_tick(instance, local_lake, now + timedelta(days=3))  # markers not moved since
    assert not later.run_requests and "0 of 3 judged" in str(later.skip_message)
    for name in ("alpha", "gamma"):
        local_lake.dataset(name).add_entity(
            {"id": f"{name}-new", "schema": "Person", "properties": {"name": ["New"]}}
        )
    asked = daily_tick(instance, local_lake, now + timedelta(days=1)).run_requests or []
    assert [r.partition_key for r in asked] == ["alpha", "gamma"]  # not beta, between them
    for request in asked:
        assert (
            defs.resolve_job_def("refresh_dataset")
            .execute_in_process(
                instance=instance,
                partition_key=request.partition_key,
                resources={"lakehouse": lakehouse(local_lake), "spark": SparkResource()},
            )
            .success
        )
    assert not daily_tick(instance, local_lake, now + timedelta(days=1)).run_requests


def daily_tick(
    instance: dg.DagsterInstance, lake: Lakehouse, when: datetime
) -> dg.ScheduleExecutionData:
    """The ``daily_refresh`` schedule evaluated as the daemon does, at ``when``."""
    with dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=when,
        repository_def=defs.get_repository_def(),
        resources={"lakehouse": lakehouse(lake)},
    ) as ctx:
        return defs.resolve_schedule_def("daily_refresh").evaluate_tick(ctx)


def _states(lake: Lakehouse, name: str) -> dict[str, Any]:
    from lakehouse_assets.freshness import freshness

    return freshness(lake.dataset(name))


def test_one_failing_dataset_fails_the_run_naming_it(
    spark: Any, local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    for name in ("good", "lost"):
        local_lake.create_dataset(name)
        report_sources(instance, lakehouse(local_lake), name)
    local_lake.dataset("good").add_entity(
        {"id": "g1", "schema": "Person", "properties": {"name": ["G"]}}
    )
    # the dataset leaves the lake after it became a partition
    local_lake.store.delete(cv.dataset_path("lost", cv.CONFIG))
    result = run_job("refresh_dataset", local_lake, instance, ["good", "lost"])
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "1 of 2 datasets failed: lost" in str(failure.event_specific_data)
    # the other dataset's work was done (and a retry finds nothing to flush)
    assert local_lake.journal.count("good") == 0


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def storage_instance(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[dg.DagsterInstance]:
    """A Dagster instance on SQLite storage, and one on the local PostgreSQL server."""
    if request.param == "sqlite":
        with dg.instance_for_test() as instance:
            yield instance
        return
    url = psycopg2_url(str(request.getfixturevalue("dagster_postgres")))
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(
        f"telemetry:\n  enabled: false\nstorage:\n  postgres:\n    postgres_url: {url}\n"
    )
    with dg.DagsterInstance.from_config(str(home)) as instance:
        yield instance


def _recorded(
    instance: dg.DagsterInstance, key: str, partition: str
) -> list[tuple[str, bool, str]]:
    """(run id, passed, description) of each recorded `fresh` check of ``key`` on the
    partition, newest first."""
    check_key = dg.AssetCheckKey(dg.AssetKey(key), CHECK)
    out = []
    for record in instance.event_log_storage.get_asset_check_execution_history(
        check_key, limit=100
    ):
        event = record.event.dagster_event if record.event else None
        if event is None or event.event_type != dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            continue  # planned, not evaluated (yet)
        evaluation = event.asset_check_evaluation_data
        if evaluation.partition == partition:
            out.append((record.run_id, evaluation.passed, str(evaluation.description)))
    return out


def test_fresh_check_turns_failed_and_passed_again(
    spark: Any, local_lake: Lakehouse, storage_instance: dg.DagsterInstance
) -> None:
    """fresh → stale → fresh → stale, each change recorded by the sensor's run.

    Before, the sensor reported run-less evaluations, and Dagster's unique index
    on (asset, check, run id "", partition) refused the second one of a dataset.
    """
    instance = storage_instance
    ds = local_lake.create_dataset("watched")
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    report_sources(instance, lakehouse(local_lake), ds.name)
    assert run_job("refresh_dataset", local_lake, instance, [ds.name]).success

    keys = ("statements_csv", "entities_ftm_json", "statistics", "index")

    def tick(cursor: str | None, expect: bool, why: str) -> str | None:
        before = {key: len(_recorded(instance, key, ds.name)) for key in keys}
        result, runs = daemon_tick(freshness_checks, instance, local_lake, cursor)
        assert isinstance(result, dg.SensorResult)
        # one more evaluation of each, recorded by this tick (in the run it asked for)
        by = runs[0] if runs else ""
        for key in keys:
            records = _recorded(instance, key, ds.name)
            assert len(records) == before[key] + 1
            run_id, passed, description = records[0]
            assert (run_id, passed) == (by, expect), (key, description)
            assert why in description
        # nothing changed since: no run
        again, runs = daemon_tick(freshness_checks, instance, local_lake, result.cursor)
        assert quiet(again) and not runs
        return result.cursor

    cursor = tick(None, True, "")
    ds.add_entity({"id": "p2", "schema": "Person", "properties": {"name": ["Bo"]}})
    cursor = tick(cursor, False, "2 journal rows wait")
    assert run_job("refresh_dataset", local_lake, instance, [ds.name]).success
    cursor = tick(cursor, True, "")
    ds.add_entity({"id": "p3", "schema": "Person", "properties": {"name": ["Cy"]}})
    tick(cursor, False, "2 journal rows wait")


def test_maintenance_schedules_ask_for_one_run_over_every_dataset() -> None:
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(DATASETS, ["a", "b", "c"])
        for name in ("nightly_optimize", "weekly_compact"):
            schedule = defs.resolve_schedule_def(name)
            tick = datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
            ctx = dg.build_schedule_context(
                instance=instance,
                scheduled_execution_time=tick,
                repository_def=defs.get_repository_def(),
            )
            (request,) = list(schedule.evaluate_tick(ctx).run_requests or [])
            assert request.partition_key_range == dg.PartitionKeyRange("a", "c")
            assert request.run_key and "20261122T0200" in request.run_key


def test_loading_the_definitions_shows_no_beta_or_preview_notice() -> None:
    """A code server loads the definitions at every start and every run: Dagster's
    notices about the two APIs we use on purpose (single-run backfills,
    partitioned checks) repeated seven blocks each time, and loading the
    repository one per sensor (their `owners`). Loaded with every warning shown,
    the repository built as a code server builds it, none of them is printed."""
    import subprocess
    import sys

    load = (
        "import lakehouse_assets.definitions as d\n"
        "assert len(list(d.defs.get_repository_def().sensor_defs)) > 5\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", load],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "BetaWarning" not in done.stderr and "PreviewWarning" not in done.stderr, done.stderr


def test_the_daily_refresh_groups_stale_neighbours_into_few_runs() -> None:
    from lakehouse_assets.defs.maintenance import _ranges

    names = list("abcdefghij")
    assert _ranges(names, list("abdhj"), 5) == [("a", "b"), ("d", "d"), ("h", "h"), ("j", "j")]
    # over the limit, the ranges with the fewest datasets between them merge
    assert _ranges(names, list("abdhj"), 2) == [("a", "d"), ("h", "j")]
    assert _ranges(names, list("abdhj"), 1) == [("a", "j")]
