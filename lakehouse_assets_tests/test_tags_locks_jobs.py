"""Tags and freshness, dataset/operation locks, job run records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from lakehouse_assets import Lakehouse
from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidNameError, LockedError
from lakehouse_assets.jobs import list_runs


def test_tags_are_namespaced_per_tenant(lake: Lakehouse) -> None:
    ds = lake.create_dataset("tags")
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    ds.tags("aleph").set("sync/last", t0)
    assert ds.tags("aleph").get("sync/last") == t0
    assert ds.tags("memorious").get("sync/last") is None
    assert list(ds.tags("aleph").items()) == [("sync/last", t0)]
    assert lake.store.exists(cv.tag_path("tags", "aleph", "sync/last"))


def test_is_latest_follows_the_spec(lake: Lakehouse) -> None:
    tags = lake.create_dataset("fresh").core_tags
    base = datetime(2026, 1, 1, tzinfo=UTC)
    deps = [cv.STATEMENTS_LAST_UPDATED, cv.JOURNAL_LAST_UPDATED]
    assert not tags.is_latest(cv.EXPORTS_STATEMENTS, deps)  # never exported
    tags.set(cv.STATEMENTS_LAST_UPDATED, base)
    tags.set(cv.EXPORTS_STATEMENTS, base + timedelta(seconds=1))
    assert tags.is_latest(cv.EXPORTS_STATEMENTS, deps)  # unset deps don't count
    tags.set(cv.JOURNAL_LAST_UPDATED, base + timedelta(seconds=2))
    assert not tags.is_latest(cv.EXPORTS_STATEMENTS, deps)
    tags.set(cv.EXPORTS_STATEMENTS, base + timedelta(seconds=2))
    assert not tags.is_latest(cv.EXPORTS_STATEMENTS, deps)  # equal is not newer


def test_touch_never_goes_backwards(lake: Lakehouse) -> None:
    tags = lake.create_dataset("touch").core_tags
    future = datetime.now(UTC) + timedelta(hours=1)
    tags.set("x/y", future)
    assert tags.touch("x/y") > future


def test_core_tags_move_the_dataset_s_change_marker(lake: Lakehouse) -> None:
    """What the sensors list instead of every dataset's tags: one marker per dataset,
    rewritten after each move of a core tag (a tenant's own tags do not move it)."""
    a, b = lake.create_dataset("mark_a"), lake.create_dataset("mark_b")

    def marks() -> dict[str, str]:
        prefix = cv.CHANGES + "/"
        return {e.path[len(prefix) :]: e.fingerprint for e in lake.store.entries(prefix)}

    assert marks() == {}
    a.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    first = marks()
    assert set(first) == {"mark_a"}
    assert lake.store.read_text(cv.change_marker("mark_a")).startswith(cv.JOURNAL_LAST_UPDATED)
    b.tags("aleph").set("sync/last")
    assert marks() == first
    a.core_tags.touch(cv.EXPORTS_STATEMENTS)
    b.core_tags.touch(cv.ARCHIVE_LAST_UPDATED)
    second = marks()
    assert set(second) == {"mark_a", "mark_b"} and second["mark_a"] != first["mark_a"]
    # never a dataset: the catalog does not list it
    assert lake.datasets() == ["mark_a", "mark_b"]


def test_invalid_tag_names_are_refused(lake: Lakehouse) -> None:
    ds = lake.create_dataset("bad")
    with pytest.raises(InvalidNameError):
        ds.tags("app").set("../../escape")
    with pytest.raises(InvalidNameError):
        ds.tags("../x")


def test_lock_is_exclusive_and_names_holder(lake: Lakehouse) -> None:
    ds = lake.create_dataset("locks")
    with ds.operation_lock("flush"):
        with pytest.raises(
            LockedError,
            match=rf"locks/lakehouse/flush is locked: flush by tenant lakehouse, pid {os.getpid()}",
        ):
            ds.operation_lock("flush").acquire()
        with ds.operation_lock("export"):  # other operations are independent
            pass
    with ds.operation_lock("flush"):  # released: can be taken again
        pass
    with ds.lock() as lock:
        assert lock.state().held
        first = lock.generation
    # a released lock stays as a free document that keeps its generation
    state = ds.lock().state()
    assert not state.held and state.generation == first
    with ds.lock() as lock:
        assert lock.generation > first


def test_stale_lock_of_a_dead_process_is_recovered(local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("stale")
    code = (
        "import sys, time\n"
        "from lakehouse_assets import Lakehouse\n"
        "ds = Lakehouse(sys.argv[1]).dataset('stale')\n"
        "ds.operation_lock('flush').acquire()\n"
        "print('locked', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, local_lake.store.uri], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"locked"
    with pytest.raises(LockedError):
        ds.operation_lock("flush").acquire()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    with ds.operation_lock("flush") as lock:  # the dead holder's lock is broken
        assert lock.held


def test_lock_older_than_ttl_is_stale(lake: Lakehouse) -> None:
    ds = lake.create_dataset("ttl")
    old = (datetime.now(UTC) - timedelta(days=2)).isoformat()
    lake.store.write_text(
        cv.lock_path("ttl", "lakehouse", "compact"),
        json.dumps({"host": "elsewhere", "pid": 1, "acquired_at": old}),
    )
    with ds.operation_lock("compact") as lock:
        assert lock.held


def test_job_run_records(lake: Lakehouse) -> None:
    ds = lake.create_dataset("jobs")
    with ds.job("crawl") as job:
        job.run.stats["files"] = 3
        job.save()
        assert list_runs(lake.store, "jobs", "crawl")[0].status == "running"
    with pytest.raises(ValueError), ds.job("crawl"):
        time.sleep(0.001)
        raise ValueError("source vanished")
    runs = list_runs(lake.store, "jobs", "crawl")
    assert [r.status for r in runs] == ["succeeded", "failed"]
    assert runs[0].stats == {"files": 3} and runs[0].finished_at is not None
    assert "source vanished" in (runs[1].error or "")
    paths = list(lake.store.list("jobs/jobs/runs/crawl/"))
    assert len(paths) == 2 and all(p.endswith("Z.json") for p in paths)
