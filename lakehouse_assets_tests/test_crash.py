"""Crash safety: SIGKILL at each injected point, then run again; nothing lost or doubled."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from lakehouse_assets import conventions as cv
from lakehouse_assets.faults import FLUSH_POINTS
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets_tests.conftest import PROFILE, sample_entities
from lakehouse_assets_tests.helpers.data import table_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

RUN = """
import json, sys
from lakehouse_assets.lake import Lakehouse
lake = Lakehouse(sys.argv[1], journal_url=sys.argv[2])
ds = lake.dataset(sys.argv[3])
if sys.argv[4] == "flush":
    print(json.dumps(ds.flush(batch_rows=int(sys.argv[5])).as_dict()))
elif sys.argv[4] == "optimize":
    ds.optimize(vacuum=True, retention_hours=0)
else:
    ds.export(["statements", "entities"], force=True)
"""


def run_child(
    lake: Lakehouse, name: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            RUN,
            lake.store.uri,
            lake.settings.resolved_journal_url(),
            name,
            *args,
        ],
        env={**os.environ, **(env or {})},
        capture_output=True,
        timeout=300,
    )


def run_killed(
    lake: Lakehouse, name: str, point: str, *args: str, env: dict[str, str] | None = None
) -> None:
    """Run an operation in a child process that SIGKILLs itself at ``point``."""
    env = {**os.environ, **(env or {}), "LAKEHOUSE_CRASH_AT": point}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            RUN,
            lake.store.uri,
            lake.settings.resolved_journal_url(),
            name,
            *args,
        ],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]


def prepare(lake: Lakehouse) -> Dataset:
    """Flushed state plus a journal of new rows, duplicates and tombstones."""
    ds = lake.create_dataset("crashing")
    entities = sample_entities()
    for e in entities[:6]:
        ds.add_entity(e, origin="first")
    ds.flush()
    for e in entities:  # 6 duplicates, the rest new
        ds.add_entity(e, origin="first")
    for e in entities[:4]:
        ds.add_entity(e, origin="second")  # new in another origin partition
    ds.delete_entity(str(entities[0]["id"]))  # tombstones for flushed statements
    return ds


def state(ds: Dataset) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    main = [(r["origin"], r["id"], r["prop"], r["value"]) for r in table_rows(ds)]
    log = [(r["origin"], r["id"], r["deleted_at"] is None) for r in table_rows(ds, "translog")]
    return main, log


#: Every flush fault point in the thorough profile (``make test-thorough``); in
#: ``make test`` the four that end a step of the flush's protocol (staged,
#: appended, published, journal about to be cleared), to keep the suite short:
#: the random kills of test_properties_dataset draw from every point there too.
KILL_POINTS = (
    FLUSH_POINTS
    if PROFILE == "thorough"
    else (
        "flush.after_parquet",
        "flush.after_statements_commit",
        "flush.after_translog_commit",
        "flush.before_journal_clear",
    )
)


#: (point, who flushes): a batch this small is flushed by the driver without
#: Spark; ``spark`` has Spark do it (``flush_driver_rows`` 0), as a larger batch
#: would be. Both at every point in the thorough profile; in ``make test`` the
#: driver at the four points above, Spark at two of them.
KILL_CASES = (
    [(point, path) for point in KILL_POINTS for path in ("driver", "spark")]
    if PROFILE == "thorough"
    else [
        *((point, "driver") for point in KILL_POINTS),
        ("flush.after_parquet", "spark"),
        ("flush.after_translog_commit", "spark"),
    ]
)


@pytest.mark.parametrize(("point", "path"), KILL_CASES)
def test_flush_killed_at_each_point_then_rerun(
    spark: SparkSession, tmp_path: Path, point: str, path: str
) -> None:
    """The control is flushed by the driver: a killed Spark flush and its rerun end
    with the same tables as well."""
    control = prepare(Lakehouse(tmp_path / "control"))
    control.flush(batch_rows=25)
    expected = state(control)

    lake = Lakehouse(
        tmp_path / "lake", settings=Settings(flush_driver_rows=0) if path == "spark" else None
    )
    ds = prepare(lake)
    pending = ds.journal.count(ds.name)
    env = {"LAKEHOUSE_FLUSH_DRIVER_ROWS": str(lake.settings.flush_driver_rows)}
    run_killed(lake, ds.name, point, "flush", "25", env=env)
    assert 0 < ds.journal.count(ds.name) <= pending  # the killed batch's rows are still there
    # the lake stays readable after the crash
    assert ds.get_entity(str(sample_entities()[1]["id"])) is not None
    # a stale lock of the dead process does not block the rerun (same host, dead pid)
    ds.flush(batch_rows=25)
    assert ds.journal.count(ds.name) == 0
    main, log = state(ds)
    assert len(main) == len(set(main)), "a statement was appended twice"
    assert (main, log) == expected
    assert ds.get_entity(str(sample_entities()[0]["id"])) is None


def test_export_killed_before_replace_keeps_previous_file(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake = Lakehouse(tmp_path / "lake")
    ds = lake.create_dataset("export_crash")
    for e in sample_entities()[:5]:
        ds.add_entity(e)
    ds.export(["statements", "entities"])
    csv_path = cv.dataset_path(ds.name, cv.STATEMENTS_CSV)
    json_path = cv.dataset_path(ds.name, cv.ENTITIES_JSON)
    before = (lake.store.read_bytes(csv_path), lake.store.read_bytes(json_path))
    for e in sample_entities()[5:]:
        ds.add_entity(e)
    ds.flush()
    run_killed(lake, ds.name, "export.before_replace", "export")
    assert (lake.store.read_bytes(csv_path), lake.store.read_bytes(json_path)) == before
    assert list(lake.store.list(cv.dataset_path(ds.name, cv.STAGING)))  # the dead run's parts
    ds.export(["statements", "entities"], force=True)
    assert not list(lake.store.list(cv.dataset_path(ds.name, cv.STAGING)))  # cleaned up
    lines = lake.store.read_bytes(json_path).splitlines()
    assert len(lines) == len(sample_entities())


def test_a_killed_flush_leaves_nothing_the_next_one_does_not_remove(tmp_path: Path) -> None:
    """Nothing in the temp folder; its staging area (in the lake) and its scratch folder
    (in the cache) are removed by the next flush and counted in its job record."""
    import json

    from lakehouse_assets.jobs import list_runs

    lake = Lakehouse(tmp_path / "lake")
    ds = prepare(lake)
    tmpdir, cache = tmp_path / "tmp", tmp_path / "cache"
    tmpdir.mkdir()
    # in-process Spark in the children: a killed JVM's folders are the point here
    # (a batch this small is flushed by the driver without Spark: have Spark do it)
    env = {
        "TMPDIR": str(tmpdir),
        "LAKEHOUSE_CACHE_DIR": str(cache),
        "LAKEHOUSE_SPARK_REMOTE": "",
        "LAKEHOUSE_FLUSH_DRIVER_ROWS": "0",
    }
    run_killed(lake, ds.name, "flush.after_parquet", "flush", "25", env=env)
    staged = [p for p in lake.store.list(cv.dataset_path(ds.name, cv.STAGING))]
    assert staged, "the killed flush staged its journal rows in the lake"
    assert len(list((cache / "scratch").iterdir())) == 1  # Spark's folders, not in /tmp
    assert sorted(p.name for p in tmpdir.iterdir()) == []
    done = run_child(lake, ds.name, "flush", "25", env=env)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["cleaned"]["staging"]["areas"] == 1
    assert result["cleaned"]["staging"]["files"] >= 1 and result["cleaned"]["staging"]["bytes"] > 0
    assert result["cleaned"]["spark_scratch"]["areas"] == 1  # the killed JVM's folder
    assert not list(lake.store.list(cv.dataset_path(ds.name, cv.STAGING)))
    assert list((cache / "scratch").iterdir()) == []  # the rerun removed its own at exit
    assert sorted(p.name for p in tmpdir.iterdir()) == []
    records = list_runs(lake.store, ds.name, "flush")
    assert records[-1].status == "succeeded"
    assert records[-1].stats["cleaned"]["staging"]["areas"] == 1
    # prepare()'s flush, the killed one (never finished), the rerun
    assert [r.status for r in records] == ["succeeded", "running", "succeeded"]


@pytest.mark.parametrize(
    "point",
    ["optimize.after_statements_commit", "optimize.after_parquet", "optimize.before_vacuum"],
)
def test_optimize_killed_between_its_commits_then_rerun_with_vacuum(
    spark: SparkSession, tmp_path: Path, point: str
) -> None:
    """An optimize killed after rewriting the statements table but before the
    translog commit that publishes it: the rerun publishes the optimized
    version (same rows) and its vacuum removes nothing readers are sent to."""
    lake = Lakehouse(tmp_path / "lake")
    ds = lake.create_dataset("optimize_crash")
    for i, e in enumerate(sample_entities()):
        ds.add_entity(e, origin="first")
        if i % 3 == 2:
            ds.flush()  # several small files per partition
    ds.flush()
    before = {e.id: e.to_dict() for e in ds.query(flush=False)}
    run_killed(lake, ds.name, point, "optimize")
    assert {e.id: e.to_dict() for e in ds.query(flush=False)} == before  # readable after the kill
    ds.optimize(vacuum=True, retention_hours=0)
    assert {e.id: e.to_dict() for e in ds.query(flush=False)} == before
    # every file readers are sent to is still there after the vacuum
    assert all(Path(f.uri).exists() for f in ds.snapshot().statements.files)
