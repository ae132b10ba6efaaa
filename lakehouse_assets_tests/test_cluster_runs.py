"""Runs on a real standalone Spark cluster compared byte for byte with an
in-process ``local[1]`` run: a Spark Connect server on the cluster (the CLI and
a Dagster run), ``make`` with the in-process driver on the cluster, and a
loopback Connect server that cannot see this disk.

Run by ``make test``'s cluster mode (``LAKEHOUSE_TEST_SPARK=cluster``), as
:mod:`lakehouse_assets_tests.test_cluster` is; a module of its own so that the
two test workers share the cluster's tests.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

from lakehouse_assets import Dataset, Lakehouse, Settings
from lakehouse_assets import conventions as cv
from lakehouse_assets_tests import test_cluster
from lakehouse_assets_tests.conftest import (
    cli_args,
    free_port,
    lakehouse_env,
    run_python,
    sample_entities,
)
from lakehouse_assets_tests.helpers.data import table_rows
from lakehouse_assets_tests.test_cluster import _cli, _export_bytes, _people

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: test_cluster's marks: the cluster mode only
pytestmark = test_cluster.pytestmark


#: The exports compared byte for byte between the cluster and an in-process run.
EXPORTS = (cv.STATEMENTS_CSV, cv.ENTITIES_JSON, cv.STATISTICS_JSON)

#: docs/cluster.md's Dagster recipe: the ``spark`` resource's ``remote`` by run
#: config, the URL (with its token) from an environment variable of the run worker
CLUSTER_RUN_CONFIG = {
    "resources": {"spark": {"config": {"remote": {"env": "SPARK_CLUSTER_CONNECT"}}}}
}

#: A Dagster run worker's part: the dataset a partition (as the sensor adds it), the
#: journal reported, ``refresh_dataset``'s flush and exports (its checks, graph and
#: index are the in-process suite's) run with the run config; what it
#: materialized and whether this process started a JVM of its own, as JSON.
DAGSTER_REFRESH = """
import json, sys
import dagster as dg
from pyspark import SparkContext
from lakehouse_assets.definitions import defs
from lakehouse_assets.defs.demo import report_sources
from lakehouse_assets.defs.resources import LakehouseResource

name, run_config = sys.argv[1], json.loads(sys.argv[2])
with dg.instance_for_test() as instance:
    report_sources(instance, LakehouseResource(), name)
    result = defs.resolve_job_def("refresh_dataset").execute_in_process(
        run_config=run_config,
        partition_key=name,
        instance=instance,
        op_selection=["flush_tables", "exports"],
        raise_on_error=False,
    )
    materialized = {
        event.materialization.asset_key.to_user_string(): {
            "partition": event.materialization.partition,
            **{k: v.value for k, v in event.materialization.metadata.items()
               if isinstance(v.value, (int, str))},
        }
        for event in result.get_asset_materialization_events()
    }
print(json.dumps({"success": result.success, "materialized": materialized,
                  "jvm_here": SparkContext._gateway is not None}))
"""


def _seen_entities() -> bytes:
    """The sample entities and a few hundred people, each with its own seen times
    and last change (kept by the lakehouse): the input of two runs whose exports
    must be the same bytes."""
    out = []
    people = [orjson.loads(line) for line in _people(300).splitlines()]
    for n, entity in enumerate(sample_entities() + people):
        day = 1 + n % 28
        out.append(
            orjson.dumps(
                {
                    **entity,
                    "first_seen": f"2023-01-{day:02d}T10:00:00",
                    "last_seen": f"2024-03-{day:02d}T12:00:00",
                    "last_change": f"2023-06-{day:02d}T08:30:00",
                }
            )
        )
    return b"\n".join(out) + b"\n"


def _child_env(lake: Lakehouse, **extra: str) -> dict[str, str]:
    """A child's environment for ``lake`` without this process's Spark settings
    (conftest's ``spark`` puts the cluster's there): only ``extra``'s apply."""
    env = lakehouse_env(lake, **extra)
    for key in (
        "LAKEHOUSE_SPARK_REMOTE",
        "LAKEHOUSE_SPARK_MASTER",
        "LAKEHOUSE_SPARK_CONFIG",
        "LAKEHOUSE_SPARK_EXECUTOR_PYTHON",
    ):
        env.pop(key, None)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The exports of an in-process ``local[1]`` CLI ``make`` of :func:`_seen_entities`
    (fixed seen times) on a lake of its own: what every run on the cluster must
    equal byte for byte. Made once for the module (each is a JVM's start and a
    ``make``, and three tests compare with it)."""
    root = tmp_path_factory.mktemp("reference")
    lake = Lakehouse(root / "lake", journal_url=f"sqlite:///{root / 'journal.sqlite'}")
    ds = lake.create_dataset("seen_fixed")
    ds.write_entities(io.BytesIO(_seen_entities()), origin="import")
    done = _cli(*cli_args(ds), "make", env=_child_env(lake, LAKEHOUSE_SPARK_MASTER="local[1]"))
    assert done.returncode == 0, done.stderr[-3000:]
    return {path: ds.store.read_bytes(cv.dataset_path(ds.name, path)) for path in EXPORTS}


@pytest.mark.slow
def test_a_connect_server_on_the_cluster_runs_the_shipped_code(
    spark: SparkSession,
    spark_cluster: Settings,
    local_lake: Lakehouse,
    local_reference: dict[str, bytes],
    tmp_path: Path,
) -> None:
    """A Spark Connect server whose driver uses the cluster, and whose Python (for
    its own data-source planning and for the executors) lacks the package: a
    client's session ships the code (addArtifacts). On it: flush + exports from
    a CLI process with only LAKEHOUSE_SPARK_REMOTE set; Dagster's
    ``refresh_dataset`` (its flush and exports) with the ``spark`` resource's
    ``remote`` set by run config (docs/cluster.md's recipe; no JVM in the run
    worker), whose exports are byte for byte those of an in-process
    ``local[1]`` run of the same input (fixed seen times) on another lake."""
    on_cluster = _refresh_on_a_connect_server(spark_cluster, local_lake, _seen_entities(), tmp_path)
    for path in EXPORTS:
        mine = on_cluster.store.read_bytes(cv.dataset_path(on_cluster.name, path))
        assert mine == local_reference[path], f"{path} differs between the cluster and local[1]"


def _refresh_on_a_connect_server(
    spark_cluster: Settings, local_lake: Lakehouse, seen: bytes, tmp_path: Path
) -> Dataset:
    """The Connect server on the cluster: the CLI's make, then Dagster's refresh of
    ``seen`` (checked here); the refreshed dataset."""
    import json

    from lakehouse_assets.spark import connect

    server = spark_cluster.model_copy(update={"cache_dir": str(tmp_path / "connect")})
    port = free_port()
    # started by another process: a Connect client in this one (start's first
    # query) would mark it as a Connect process beside its in-process Spark
    started = run_python(
        "import sys\n"
        "from lakehouse_assets.settings import Settings\n"
        "from lakehouse_assets.spark import connect\n"
        "print(connect.start(Settings(), int(sys.argv[1])).running)\n",
        str(port),
        env={
            **os.environ,
            "LAKEHOUSE_CACHE_DIR": server.cache_dir,
            "LAKEHOUSE_SPARK_MASTER": server.spark_master,
            "LAKEHOUSE_SPARK_EXECUTOR_PYTHON": str(server.spark_executor_python),
            "LAKEHOUSE_SPARK_CONFIG": json.dumps(server.spark_config),
        },
        timeout=600,
    )
    try:
        assert started.stdout.strip() == "True", started.stderr
        url = connect.client_url(server, port)
        ds = local_lake.create_dataset("over_connect")
        written = sum(ds.add_entity(e, origin="import") for e in sample_entities())
        # the tasks read the journal (the data source planned on the server, run
        # by executors), not the driver as it would read a batch this small
        env = _child_env(local_lake, LAKEHOUSE_SPARK_REMOTE=url, LAKEHOUSE_FLUSH_DRIVER_ROWS="0")
        done = _cli(*cli_args(ds), "make", env=env)
        assert done.returncode == 0, done.stderr
        assert ds.journal.count(ds.name) == 0 and len(table_rows(ds)) == written
        exported = _export_bytes(ds)
        rows = list(csv.reader(io.StringIO(exported.decode("utf-8"), newline="")))
        assert len(rows) == written + 1  # a header and every statement

        # Dagster: the resource pointed at the server by run config alone
        on_cluster = local_lake.create_dataset("seen_fixed")
        count = on_cluster.write_entities(io.BytesIO(seen), origin="import").count
        ran = run_python(
            DAGSTER_REFRESH,
            on_cluster.name,
            json.dumps(CLUSTER_RUN_CONFIG),
            env=_child_env(local_lake, SPARK_CLUSTER_CONNECT=url),
            check=False,
            timeout=600,
        )
        assert ran.returncode == 0, ran.stderr[-3000:]
        report = json.loads(ran.stdout.strip().splitlines()[-1])
        assert report["success"] and not report["jvm_here"], ran.stderr[-3000:]
        materialized = report["materialized"]
        for key in ("statements", "translog", "statements_csv", "entities_ftm_json", "statistics"):
            assert materialized[key]["partition"] == on_cluster.name, sorted(materialized)
        assert materialized["statements"]["new_statements"] == count
        assert on_cluster.journal.count(on_cluster.name) == 0
    finally:
        connect.stop(server, port)
    return on_cluster


@pytest.mark.slow
def test_make_on_the_cluster_is_byte_for_byte_an_in_process_make(
    spark: SparkSession, lake: Lakehouse, local_reference: dict[str, bytes]
) -> None:
    """``make`` with the in-process driver on the cluster (this process's Spark),
    Spark doing the flush (a local lake on a SQLite journal: the driver reads the
    claimed rows and hands them to the executors through the lake's staging
    area; an S3 lake on a PostgreSQL journal: the tasks read it) and the full
    export, equals byte for byte an in-process ``local[1]`` CLI ``make`` of the
    same input on another lake; nothing is left in the staging area."""
    seen = _seen_entities()
    on_spark = Lakehouse(
        lake.store.uri,
        settings=lake.settings.model_copy(update={"flush_driver_rows": 0}),
    )
    ds = on_spark.create_dataset("seen_fixed")
    count = ds.write_entities(io.BytesIO(seen), origin="import").count
    ds.make()
    assert ds.journal.count(ds.name) == 0 and len(table_rows(ds)) == count
    for path in EXPORTS:
        mine = ds.store.read_bytes(cv.dataset_path(ds.name, path))
        assert mine == local_reference[path], f"{path} differs between the cluster and local[1]"
    assert not [
        p for p in ds.store.list(cv.dataset_path(ds.name, cv.STAGING)) if p.endswith(".parquet")
    ]


def _can_hide_folders() -> bool:
    """Whether this machine lets a process get its own mount namespace (root, or
    user namespaces): how a test makes a server that cannot see a folder."""
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0


@pytest.mark.slow
def test_a_loopback_connect_server_that_cannot_see_this_disk_is_elsewhere(
    tmp_path: Path,
) -> None:
    """A local-mode Connect server at 127.0.0.1 that is not this machine's (a
    tunnel, ``ssh -L``, to a server elsewhere) was taken as local: its tasks
    opened the SQLite journal themselves and failed deep in the flush (``unable
    to open database``). Here the server runs in its own mount namespace, where
    the client's cache folder (its journal and probe files) is an empty tmpfs:
    the client asks the server to read a file it wrote, finds it cannot, ships
    the code and reads the journal itself; the flush and exports complete."""
    import json
    import shutil

    from lakehouse_assets.spark import connect

    if shutil.which("unshare") is None or not _can_hide_folders():
        pytest.skip("no mount namespaces here (unshare -m refused): cannot hide a folder")
    hidden = tmp_path / "client-cache"
    hidden.mkdir()
    server = Settings(cache_dir=str(tmp_path / "server-cache"))
    port = free_port()
    start = (
        "import sys\n"
        "from lakehouse_assets.settings import Settings\n"
        "from lakehouse_assets.spark import connect\n"
        "print(connect.start(Settings(), int(sys.argv[1])).running)\n"
    )
    env = {**os.environ, "LAKEHOUSE_CACHE_DIR": server.cache_dir}
    for key in ("LAKEHOUSE_SPARK_MASTER", "LAKEHOUSE_SPARK_CONFIG", "LAKEHOUSE_SPARK_REMOTE"):
        env.pop(key, None)
    started = subprocess.run(
        [
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            'mount -t tmpfs none "$1" && shift && exec "$@"',
            "sh",
            str(hidden),
            sys.executable,
            "-c",
            start,
            str(port),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    try:
        assert started.stdout.strip() == "True", started.stderr
        lake = Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{hidden / 'journal.sqlite'}")
        ds = lake.create_dataset("through_a_tunnel")
        written = sum(ds.add_entity(e, origin="import") for e in sample_entities())
        client = lakehouse_env(
            lake,
            LAKEHOUSE_CACHE_DIR=str(hidden),
            LAKEHOUSE_SPARK_REMOTE=connect.client_url(server, port),
        )
        for key in ("LAKEHOUSE_SPARK_MASTER", "LAKEHOUSE_SPARK_CONFIG"):
            client.pop(key, None)
        done = _cli(*cli_args(ds), "make", "--json", env=client)
        assert done.returncode == 0, done.stderr[-3000:]
        assert ds.journal.count(ds.name) == 0 and len(table_rows(ds)) == written
        summary = json.loads(done.stdout)
        assert summary, done.stdout
        assert list(hidden.glob("probes/connect-*")) == []  # the probe file is gone
    finally:
        connect.stop(server, port)
