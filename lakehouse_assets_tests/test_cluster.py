"""A real standalone Spark cluster on 127.0.0.1: the CLI that runs it, the code
shipped to executors that lack the package, a SQLite journal and a lake folder
on a cluster, and executors lost in the middle of a flush.

Run by ``make test``'s cluster mode (``LAKEHOUSE_TEST_SPARK=cluster``): the
``spark`` fixture is then an in-process driver on the session's cluster
(conftest ``spark_cluster``), whose executors' Python has the lakehouse's
dependencies and not the lakehouse.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

from lakehouse_assets import Lakehouse, Settings
from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import ConfigurationError
from lakehouse_assets.locks import pid_alive
from lakehouse_assets.spark.session import stages_line
from lakehouse_assets_tests.conftest import (
    SPARK_MODE,
    cli_args,
    free_port,
    lakehouse_env,
    sample_entities,
)
from lakehouse_assets_tests.helpers.data import table_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(
        SPARK_MODE != "cluster", reason="runs in the cluster mode (LAKEHOUSE_TEST_SPARK=cluster)"
    ),
]

LAKEHOUSE = [sys.executable, "-m", "lakehouse_assets.cli"]


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LAKEHOUSE, *args], capture_output=True, text=True, env=env, timeout=600)


def test_cluster_start_status_stop(tmp_path: Path) -> None:
    """``lakehouse spark cluster``: start waits for its workers, a second start finds
    them, status names every process (all on 127.0.0.1), stop ends them with their
    process groups, and the state of a cluster whose processes died is recovered."""
    env = {
        **os.environ,
        "LAKEHOUSE_CACHE_DIR": str(tmp_path / "cache"),
        "LAKEHOUSE_SPARK_CLUSTER_PORT": str(free_port()),
    }
    started = _cli("spark", "cluster", "start", "--workers", "1", env=env)
    assert started.returncode == 0, started.stderr
    assert "running" in started.stdout and "worker-1: pid" in started.stdout
    settings = Settings(
        cache_dir=env["LAKEHOUSE_CACHE_DIR"],
        spark_cluster_port=int(env["LAKEHOUSE_SPARK_CLUSTER_PORT"]),
    )
    from lakehouse_assets.spark import cluster

    info = cluster.status(settings)
    assert info.running and [d.role for d in info.daemons] == ["master", "worker-1"]
    pids = [d.pid for d in info.daemons]
    assert all(pid_alive(p) for p in pids)
    assert Path(str(info.daemons[1].work_dir)).is_dir()
    # the secret is private to this user; the state names no other address
    secret = cluster.cluster_dir(settings) / "cluster.properties"
    assert secret.stat().st_mode & 0o077 == 0
    assert info.master_url == f"spark://127.0.0.1:{settings.spark_cluster_port}"
    again = _cli("spark", "cluster", "start", env=env)
    assert again.returncode == 0 and [d.pid for d in cluster.status(settings).daemons] == pids
    shown = _cli("spark", "cluster", "status", env=env)
    assert shown.returncode == 0 and all(f"pid {p} running" in shown.stdout for p in pids)

    stopped = _cli("spark", "cluster", "stop", env=env)
    assert stopped.returncode == 0 and "stopped 2 process(es)" in stopped.stdout
    assert not any(pid_alive(p) for p in pids)
    gone = _cli("spark", "cluster", "status", env=env)
    assert gone.returncode == 1 and "not running" in gone.stdout
    assert _cli("spark", "cluster", "stop", env=env).stdout.strip().endswith("(nothing to stop)")

    # a cluster killed behind its back: status reports it, then forgets it
    assert _cli("spark", "cluster", "start", "--workers", "1", env=env).returncode == 0
    for daemon in cluster.status(settings).daemons:
        os.killpg(daemon.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(pid_alive(d.pid) for d in cluster.status(settings).daemons):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    after = _cli("spark", "cluster", "status", env=env)
    assert after.returncode == 1 and "not running" in after.stdout
    assert not (cluster.cluster_dir(settings) / "cluster.json").exists()


def test_the_code_is_shipped_to_executors_without_the_package(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The executors' Python has no lakehouse_assets; the session's tasks import it
    from the shipped zip (built once per content digest in the cache folder)."""
    from lakehouse_assets.spark.shipping import code_digest

    settings = Settings()
    python = str(settings.spark_executor_python)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    bare = subprocess.run(
        [python, "-c", "import lakehouse_assets"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean,
    )
    assert bare.returncode != 0 and "No module named 'lakehouse_assets'" in bare.stderr

    def where(_):  # type: ignore[no-untyped-def]
        import pyarrow as pa

        import lakehouse_assets

        yield pa.RecordBatch.from_pydict({"file": [lakehouse_assets.__file__]})

    rows = spark.range(2, numPartitions=2).mapInArrow(where, "file string").collect()
    assert rows and all(f"-{code_digest()}.zip" in r["file"] for r in rows)


def test_a_dependency_missing_on_the_executors_is_one_line(
    spark: SparkSession, local_lake: Lakehouse, tmp_path: Path
) -> None:
    """Executors whose Python lacks a dependency: the command fails with one line
    naming the module and what to install where, not Spark's tracebacks. (The
    flush's journal readers are Python tasks: the journal is PostgreSQL, and the
    batch is read by tasks whatever its size.)"""
    base = getattr(sys, "_base_executable", sys.executable)
    empty = tmp_path / "empty-python"
    subprocess.run([base, "-m", "venv", "--without-pip", str(empty)], check=True)
    lake = local_lake
    assert lake.settings.resolved_journal_url().startswith("postgresql")
    ds = lake.create_dataset("missing")
    written = sum(ds.add_entity(e, origin="import") for e in sample_entities()[:5])
    env = lakehouse_env(
        lake,
        LAKEHOUSE_SPARK_EXECUTOR_PYTHON=str(empty / "bin" / "python"),
        LAKEHOUSE_FLUSH_DRIVER_ROWS="0",  # the tasks read even a batch this small
    )
    done = _cli(*cli_args(ds), "flush", env=env)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("Error: Spark's executors lack the Python module"), done.stderr
    assert "LAKEHOUSE_SPARK_EXECUTOR_PYTHON" in lines[-1] and "Traceback" not in done.stderr
    assert ds.journal.count(ds.name) == written  # nothing flushed, nothing lost


def test_executors_lost_again_and_again_is_one_line(
    spark: SparkSession, local_lake: Lakehouse, tmp_path: Path
) -> None:
    """Executors that die under every attempt of a task (as the out-of-memory killer
    would end them): Spark gives up (``Task … failed N times … ExecutorLostFailure``)
    and the command says so in one line, what to check and that a rerun is safe,
    without a traceback. Here the executors' Python kills its executor JVM on
    start; the command's own session allows 2 attempts (``spark.task.maxFailures``,
    a setting of the application)."""
    import json

    python = os.environ["LAKEHOUSE_SPARK_EXECUTOR_PYTHON"]  # the cluster's (conftest)
    killer = tmp_path / "python-that-kills-its-executor"
    killer.write_text(
        "#!/bin/sh\n"
        "# started by an executor JVM (Spark's Python daemon): end that JVM, as the system would\n"
        "if tr '\\0' ' ' < /proc/$PPID/cmdline | grep -q CoarseGrainedExecutorBackend; then\n"
        "  kill -9 $PPID; exit 1\n"
        "fi\n"
        f'exec "{python}" "$@"\n'
    )
    killer.chmod(0o755)
    ds = local_lake.create_dataset("executors_lost")
    # one entity: one journal bucket, one task, whose second attempt goes to the
    # other executor at once (no wait for a new one: the test stays cheap)
    written = ds.add_entity(sample_entities()[0], origin="import")
    conf = {**json.loads(os.environ["LAKEHOUSE_SPARK_CONFIG"]), "spark.task.maxFailures": "2"}
    env = lakehouse_env(
        local_lake,
        LAKEHOUSE_SPARK_EXECUTOR_PYTHON=str(killer),
        LAKEHOUSE_SPARK_CONFIG=json.dumps(conf),
        LAKEHOUSE_FLUSH_DRIVER_ROWS="0",  # the tasks read the journal: Python on executors
    )
    done = _cli(*cli_args(ds), "flush", env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "Error: Spark's executors were lost repeatedly: a task failed 2 times"
    ), done.stderr[-3000:]
    assert "workers' memory and logs" in last and "rerun" in last
    # nothing committed, nothing lost: a rerun has it all to do (a first flush on
    # this process's session is another minute on two busy cores: left out)
    assert ds.statements_table.table() is None
    assert ds.journal.count(ds.name) == written


def test_a_sqlite_journal_on_a_cluster_is_read_by_the_driver(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A cluster's executors cannot open a SQLite file of this machine: the driver
    reads and reduces the claimed rows and hands them over through the lake's
    staging area; the flush is complete and nothing stays staged."""
    from lakehouse_assets.spark.journal_source import reachable

    lake = Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{tmp_path / 'journal.sqlite'}")
    ds = lake.create_dataset("sqlite_on_cluster")
    assert not reachable(ds.journal.url, spark, ds.settings)
    written = sum(ds.add_entity(e, origin="import") for e in sample_entities())
    result = ds.flush()
    assert result.new == written and ds.journal.count(ds.name) == 0
    assert len(table_rows(ds)) == written
    staging = tmp_path / "lake" / ds.name / cv.STAGING
    assert not staging.exists() or not any(staging.rglob("*.parquet"))


def test_a_lake_folder_the_executors_cannot_see_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The check a session on a cluster elsewhere runs for a local lake: the
    executors read back a token the driver wrote there. Here (127.0.0.1) they
    see the folder; a probe they cannot find is refused with what to fix."""
    from lakehouse_assets.spark.probe import require_seen, require_visible_lake

    folder = tmp_path / "lake"
    require_visible_lake(spark, folder)
    assert not any(folder.iterdir())  # the probe file is gone
    with pytest.raises(ConfigurationError, match="cannot see the lake folder") as caught:
        require_seen(spark, folder, folder / ".spark-probe-elsewhere", "token")
    assert "s3://" in str(caught.value) and "same path on every worker" in str(caught.value)


def _executor_pids(app_id: str) -> list[int]:
    """This application's executor JVMs (Spark's CoarseGrainedExecutorBackend)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"CoarseGrainedExecutorBackend" in command and app_id.encode() in command:
            found.append(int(entry))
    return found


def _people(count: int) -> bytes:
    lines = (
        orjson.dumps(
            {
                "id": f"p{n}",
                "schema": "Person",
                "properties": {
                    "name": [f"Person {n}"],
                    "nationality": ["de" if n % 2 else "fr"],
                    "birthDate": [f"19{n % 100:02d}-01-01"],
                    "notes": [f"note {n}"],
                },
            }
        )
        for n in range(count)
    )
    return b"\n".join(lines) + b"\n"


@pytest.mark.slow
def test_an_executor_killed_mid_flush_and_mid_export_loses_nothing(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """kill -9 of an executor JVM while a flush's (then an export's) tasks run:
    Spark runs the lost tasks again, the flush commits every statement exactly
    once, the export equals the one of an undisturbed run, no staging is left."""
    app = spark.sparkContext.applicationId
    tracker = spark.sparkContext.statusTracker()
    local_lake.settings.flush_driver_rows = 0  # the executors read the journal too
    ds = local_lake.create_dataset("executor_loss")
    written = ds.write_entities(io.BytesIO(_people(20_000)), origin="bulk").count
    killed: list[int] = []

    def kill_when_busy(stop: threading.Event) -> None:
        # a stage with tasks still to finish (running, or handed to an executor
        # and not yet reported running: an export's short tasks can start and
        # end between two polls of "active tasks"), polled every 10 ms
        while not stop.is_set() and not killed:
            infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            if any(i is not None and i.numCompletedTasks < i.numTasks for i in infos):
                pids = _executor_pids(app)
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(pids[0])
                    return
            time.sleep(0.01)

    lines: list[str] = []

    def watch(stop: threading.Event) -> None:
        """The progress line (spark.session.stages_line) of every sample of the run."""
        while not stop.is_set():
            infos = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
            stages = [
                (i.numCompletedTasks, i.numTasks, i.numActiveTasks, i.numFailedTasks)
                for i in infos
                if i is not None
            ]
            if stages:
                lines.append(stages_line(stages))
            time.sleep(0.05)

    def disturbed(step):  # type: ignore[no-untyped-def]
        stop = threading.Event()
        killer = threading.Thread(target=kill_when_busy, args=(stop,), daemon=True)
        watcher = threading.Thread(target=watch, args=(stop,), daemon=True)
        killed.clear()
        killer.start()
        watcher.start()
        try:
            return step()
        finally:
            stop.set()
            killer.join()
            watcher.join()

    result = disturbed(ds.flush)
    assert killed, "no executor was killed: the flush ran no task"
    assert result.new == written and ds.journal.count(ds.name) == 0
    rows = table_rows(ds)
    assert len(rows) == written and len({r["id"] for r in rows}) == written
    staging = Path(local_lake.store.uri.removeprefix("file://")) / ds.name / cv.STAGING
    assert not staging.exists() or not any(staging.rglob("*.parquet"))

    disturbed(lambda: ds.export(["statements"], force=True))
    assert killed, "no executor was killed: the export ran no task"
    exported = _export_bytes(ds)
    ds.export(["statements"], force=True)
    assert _export_bytes(ds) == exported
    # the progress shown while tasks were lost and rerun never counts more than there are
    counts = [line.split(" tasks", 1)[0].split("/") for line in lines]
    assert counts and all(int(done) <= int(total) for done, total in counts)


def _export_bytes(ds) -> bytes:  # type: ignore[no-untyped-def]
    from lakehouse_assets import conventions as cv

    return ds.store.read_bytes(cv.dataset_path(ds.name, cv.STATEMENTS_CSV))  # type: ignore[no-any-return]
