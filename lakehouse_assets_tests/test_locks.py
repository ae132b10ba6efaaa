"""Locks that heal, locks that fence: broken lock files, dead or re-used holders,
clock skew, ``unlock``, and a writer that lost its lock committing nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from lakehouse_assets import conventions as cv
from lakehouse_assets.cli import cli
from lakehouse_assets.errors import ConcurrentWriteError, LockedError, LockLostError
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.locks import boot_id, process_start
from lakehouse_assets.tables.delta import DeltaLocation, add_action, commit

NOW = datetime.now(UTC)


def lock_path(ds: Dataset) -> str:
    return cv.dataset_path(ds.name, cv.LOCK)


def holder(**fields: object) -> bytes:
    doc: dict[str, object] = {
        "state": "held",
        "generation": 7,
        "token": "t0ken",
        "host": "elsewhere",
        "boot_id": "b",
        "pid": 4242,
        "pid_start": 1,
        "tenant": "other",
        "operation": "flush",
        "acquired_at": NOW.isoformat(),
    }
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


# a live process of this host that is not the test itself
@pytest.fixture
def live_pid() -> object:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


BROKEN = {
    "empty": b"",
    "torn": b'{"state": "held", "generation": 3, "pi',
    "garbage": b"\x00\xffnot a lock",
    "not a lock": b'["a", "list"]',
    "no pid/host/time": json.dumps({"state": "held", "generation": 2}).encode(),
    "pid not a number": holder(pid="x", host=socket.gethostname()),
    "time unparseable": holder(acquired_at="yesterday", host=socket.gethostname()),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_broken_lock_files_are_recovered(lake: Lakehouse, kind: str) -> None:
    ds = lake.create_dataset("broken")
    lake.store.write_bytes(lock_path(ds), BROKEN[kind])
    with ds.table_lock("flush", wait=0) as lock:
        assert lock.state().held and lock.state().token == lock.token
    assert not ds.lock().state().held


def test_naive_timestamps_are_utc(local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("naive")
    old = (NOW - timedelta(days=1)).replace(tzinfo=None).isoformat()
    local_lake.store.write_bytes(lock_path(ds), holder(acquired_at=old))
    with ds.table_lock("flush", wait=0):  # older than the TTL: stale, no traceback
        pass
    fresh = NOW.replace(tzinfo=None).isoformat()
    local_lake.store.write_bytes(lock_path(ds), holder(acquired_at=fresh))
    with pytest.raises(LockedError, match=r"flush by tenant other, pid 4242 on elsewhere"):
        ds.table_lock("flush", wait=0).__enter__()


def test_lock_of_another_host_is_reported_with_the_command_to_clear_it(
    local_lake: Lakehouse,
) -> None:
    ds = local_lake.create_dataset("remote")
    local_lake.store.write_bytes(lock_path(ds), holder())
    with pytest.raises(LockedError) as info:
        ds.table_lock("compact", wait=0).__enter__()
    message = str(info.value)
    assert "\n" not in message
    assert "pid 4242 on elsewhere" in message
    assert "run `lakehouse -d remote unlock`" in message
    result = CliRunner().invoke(cli, ["--lake", local_lake.store.uri, "-d", "remote", "unlock"])
    assert result.exit_code == 0, result.output
    assert "unlocked" in result.output
    with ds.table_lock("compact", wait=0) as lock:
        assert lock.generation > 7  # the old holder is fenced off


def test_clock_skew_is_named(local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("skew")
    future = (NOW + timedelta(hours=2)).isoformat()
    local_lake.store.write_bytes(lock_path(ds), holder(acquired_at=future))
    with pytest.raises(LockedError, match="in the future: the holder's clock is ahead"):
        ds.table_lock("flush", wait=0).__enter__()


def test_unlock_refuses_while_the_holder_lives_here(local_lake: Lakehouse, live_pid: int) -> None:
    ds = local_lake.create_dataset("alive")
    here = {"host": socket.gethostname(), "boot_id": boot_id(), "pid": live_pid}
    local_lake.store.write_bytes(lock_path(ds), holder(**here, pid_start=process_start(live_pid)))
    result = CliRunner().invoke(cli, ["--lake", local_lake.store.uri, "-d", "alive", "unlock"])
    assert result.exit_code == 1
    assert "refusing to unlock" in result.output and "Traceback" not in result.output
    assert ds.lock().state().held


def test_reused_pid_and_reboot_make_a_lock_stale(local_lake: Lakehouse, live_pid: int) -> None:
    ds = local_lake.create_dataset("reused")
    started = process_start(live_pid)
    assert started is not None
    here = {"host": socket.gethostname(), "boot_id": boot_id(), "pid": live_pid}
    # the pid is alive, but it belongs to a process that started at another time
    local_lake.store.write_bytes(lock_path(ds), holder(**here, pid_start=started + 1))
    with ds.table_lock("flush", wait=0):
        pass
    # same host name, earlier boot: whatever holds the pid now is not the holder
    local_lake.store.write_bytes(
        lock_path(ds), holder(**{**here, "boot_id": "an-earlier-boot"}, pid_start=started)
    )
    with ds.table_lock("flush", wait=0):
        pass
    # the real holder, alive: not stale
    local_lake.store.write_bytes(lock_path(ds), holder(**here, pid_start=started))
    with pytest.raises(LockedError):
        ds.table_lock("flush", wait=0).__enter__()


def test_a_waiting_writer_gets_the_lock_when_it_is_released(local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("waiting")
    code = (
        "import sys, time\n"
        "from lakehouse_assets import Lakehouse\n"
        "ds = Lakehouse(sys.argv[1]).dataset('waiting')\n"
        "with ds.table_lock('compact'):\n"
        "    print('locked', flush=True)\n"
        "    time.sleep(1.5)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, local_lake.store.uri], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"locked"
    with pytest.raises(LockedError):
        ds.table_lock("flush", wait=0).__enter__()
    with ds.table_lock("flush", wait=30) as lock:
        assert lock.held
    proc.wait()


def _table(tmp_path: Path) -> tuple[DeltaLocation, pa.Schema]:
    schema = pa.schema([("id", pa.string())])
    location = DeltaLocation(str(tmp_path / "table"), {})
    return location, schema


def _add(location: DeltaLocation, schema: pa.Schema, name: str) -> object:
    folder = Path(location.uri)
    folder.mkdir(parents=True, exist_ok=True)
    collector: list[pq.FileMetaData] = []
    pq.write_table(
        pa.table({"id": [name]}, schema=schema),
        folder / f"{name}.parquet",
        metadata_collector=collector,
    )
    size = (folder / f"{name}.parquet").stat().st_size
    meta = pq.read_metadata(folder / f"{name}.parquet")
    return add_action(f"{name}.parquet", size, meta, {})


def test_a_writer_that_lost_its_lock_commits_nothing(local_lake: Lakehouse, tmp_path: Path) -> None:
    ds = local_lake.create_dataset("fenced")
    location, schema = _table(tmp_path)
    commit(location, [_add(location, schema, "first")], schema=schema)  # type: ignore[list-item]

    stale = ds.lock("flush")
    stale.acquire()
    read = location.table()
    assert read is not None
    # paused past the TTL: another writer breaks the lock and commits
    local_lake.store.write_bytes(
        lock_path(ds),
        json.dumps(
            {
                **json.loads(ds.lock().state().version.data),  # type: ignore[union-attr]
                "acquired_at": (NOW - timedelta(days=1)).isoformat(),
            }
        ).encode(),
    )
    with ds.table_lock("flush", wait=0) as fresh:
        assert fresh.generation > stale.generation
        commit(
            location,
            [_add(location, schema, "second")],
            schema=schema,  # type: ignore[list-item]
            fence=fresh.fence(),
            read_version=read.version(),
        )
    # the stale writer wakes up: its lock check fails ...
    with pytest.raises(LockLostError, match="lost its lock"):
        commit(
            location,
            [_add(location, schema, "third")],
            schema=schema,  # type: ignore[list-item]
            fence=stale.fence(),
            read_version=read.version(),
        )
    # ... and even if it had passed, the table's fence refuses the older generation
    object.__setattr__(stale, "check", lambda: None)
    with pytest.raises((LockLostError, ConcurrentWriteError)):
        commit(
            location,
            [_add(location, schema, "fourth")],
            schema=schema,  # type: ignore[list-item]
            fence=stale.fence(),
            read_version=None,
        )
    table = location.table()
    assert table is not None
    assert sorted(pa.table(table.to_pyarrow_dataset().to_table()).column("id").to_pylist()) == [
        "first",
        "second",
    ]


def test_two_writers_from_one_snapshot_cannot_both_commit(
    local_lake: Lakehouse, tmp_path: Path
) -> None:
    ds = local_lake.create_dataset("one_winner")
    location, schema = _table(tmp_path)
    commit(location, [_add(location, schema, "base")], schema=schema)  # type: ignore[list-item]
    base = location.table()
    assert base is not None
    with ds.table_lock("flush", wait=0) as lock:
        fence = lock.fence()
        commit(
            location,
            [_add(location, schema, "a")],
            schema=schema,  # type: ignore[list-item]
            fence=fence,
            read_version=base.version(),
        )
        with pytest.raises(ConcurrentWriteError, match="another writer committed meanwhile"):
            commit(
                location,
                [_add(location, schema, "b")],
                schema=schema,  # type: ignore[list-item]
                fence=fence,
                read_version=base.version(),
            )
    assert os.path.exists(Path(location.uri) / "b.parquet")  # written, never committed
    table = location.table()
    assert table is not None and table.to_pyarrow_dataset().count_rows() == 2


# --- breaking a stale lock is a compare-and-swap ------------------------------------------


def race_for_the_lock(task: dict[str, object]) -> str | None:
    """Run in a worker: with ~30 ms per S3 request, try to take the stale lock at ``go_at``."""
    import time

    from lakehouse_assets.settings import Settings

    settings = Settings.model_validate(task["settings"])
    lake = Lakehouse(str(task["uri"]), settings=settings)
    client = lake.store.client  # type: ignore[attr-defined]
    client.meta.events.register("before-send.s3", lambda **_: time.sleep(0.03))
    lock = lake.dataset(str(task["dataset"])).lock("flush")
    time.sleep(max(0.0, float(task["go_at"]) - time.time()))  # type: ignore[arg-type]
    if lock.try_acquire() is None:
        return lock.token  # held, never released: the test looks at who holds it
    return None


def test_four_processes_breaking_a_stale_lock_on_slow_s3_leave_one_holder(
    s3_settings: object, tmp_path: Path
) -> None:
    import multiprocessing as mp
    import time

    from lakehouse_assets.settings import Settings
    from lakehouse_assets_tests.conftest import make_bucket

    assert isinstance(s3_settings, Settings)
    lake = Lakehouse(
        f"s3://{make_bucket(s3_settings)}/lake",
        settings=s3_settings,
        journal_url=f"sqlite:///{tmp_path / 'j.sqlite'}",
    )
    ds = lake.create_dataset("raced")
    stale = holder(acquired_at=(NOW - timedelta(days=1)).isoformat())
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        pool.map(time.sleep, [0] * 4)
        for _round in range(15):
            lake.store.write_bytes(lock_path(ds), stale)
            go_at = time.time() + 0.5
            task = {
                "settings": s3_settings.model_dump(),
                "uri": lake.store.uri,
                "dataset": ds.name,
                "go_at": go_at,
            }
            tokens = pool.map(race_for_the_lock, [task] * 4, chunksize=1)
            winners = [t for t in tokens if t is not None]
            assert len(winners) == 1, tokens
            assert ds.lock().state().token == winners[0]


def test_a_graph_index_writer_that_lost_its_lock_commits_nothing(local_lake: Lakehouse) -> None:
    """The graph index's tables are written by delta-rs's own writer, and now
    under the table lock's fence like every other table: a writer whose lock
    was taken over commits nothing, and a held lock's commit carries its
    generation (so an older holder's later commit is refused by the table)."""
    from types import SimpleNamespace

    from lakehouse_assets.graph.tables import (
        BY_SOURCE,
        EDGE_SCHEMA,
        TOMBSTONE_SCHEMA,
        TOMBSTONES,
        _write,
        table_location,
    )
    from lakehouse_assets.locks import FENCE_APP_ID

    ds = local_lake.create_dataset("graph_fence")
    with ds.table_lock("graph", wait=0) as held:
        _write(ds, TOMBSTONES, TOMBSTONE_SCHEMA.empty_table(), "overwrite", 0, fence=held.fence())
        stale = held.fence()
    table = table_location(ds, TOMBSTONES).table()
    assert table is not None and table.transaction_version(FENCE_APP_ID) == stale.generation
    version = table.version()

    # the lock is released (or broken) and taken by a newer writer: the old fence is spent
    with ds.table_lock("graph", wait=0) as fresh:
        assert fresh.generation > stale.generation
        _write(ds, TOMBSTONES, TOMBSTONE_SCHEMA.empty_table(), "append", 1, fence=fresh.fence())
    with pytest.raises(LockLostError):
        _write(ds, BY_SOURCE, EDGE_SCHEMA.empty_table(), "overwrite", 2, fence=stale)
    # even a writer past its own lock check: the table refuses the older generation
    unchecked = SimpleNamespace(
        app_id=stale.app_id, generation=stale.generation, check=lambda: None
    )
    with pytest.raises(LockLostError, match="newer lock holder"):
        _write(ds, TOMBSTONES, TOMBSTONE_SCHEMA.empty_table(), "append", 2, fence=unchecked)
    assert table_location(ds, BY_SOURCE).table() is None
    after = table_location(ds, TOMBSTONES).table()
    assert after is not None and after.version() == version + 1
