"""Issue 32, robustness: what a hostile tenant or a careless operator can do to a
dataset must end in one line or a correct answer, never a wedged dataset.

* a foreign delta-rs ``delete()`` commit (string_view files) is read correctly;
* forged lock files (a 70-bit pid, pid 1 / -1 / ``true`` on this host) are stale,
  and ``unlock --operation ''`` never clears the dataset's ``.LOCK``;
* the stale-area clean-up sees empty staging folders;
* an argument that is not UTF-8 text is one line naming it;
* ``--lake ftp://…``, ``trace`` of an unknown id and ``refs`` with an unknown
  property or schema say what is wrong.

CLI checks run the real ``lakehouse`` in a subprocess (``python -m``), so what
is checked is what a shell sees: exit code, stderr, no traceback.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import orjson
import pytest

from lakehouse_assets import conventions as cv
from lakehouse_assets import graph, staging
from lakehouse_assets.errors import InvalidNameError
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.locks import boot_id, process_start
from lakehouse_assets.storage import LocalStore
from lakehouse_assets_tests.conftest import cli_args, lakehouse_env, sample_entities

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def lakehouse(
    *args: str | bytes, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI as a shell runs it (arguments may be raw bytes, as ``$'\\xff'`` is)."""
    return subprocess.run(
        [sys.executable, "-m", "lakehouse_assets.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a refused command (no traceback)."""
    assert res.returncode != 0, res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.stderr
    return lines[0]


# --- foreign commits ----------------------------------------------------------------


def test_a_foreign_delete_commit_is_read_correctly(spark: SparkSession, lake: Lakehouse) -> None:
    """delta-rs's ``delete()`` rewrites the file with ``string_view`` columns; pyarrow
    has no filter kernels for them, so every later read that pushed a filter
    down (the graph rebuild, the readers after the next flush) failed with
    ``no kernel matching input types (string, string_view)``."""
    from deltalake import DeltaTable

    ds = lake.create_dataset("foreign")
    entities = sample_entities()
    ds.write_entities([orjson.dumps(e) for e in entities])
    ds.make()
    victim = str(entities[0]["id"])
    assert ds.get_entity(victim, flush=False) is not None
    location = ds.statements_table
    table = DeltaTable(location.uri, storage_options=dict(location.storage_options) or None)
    deleted = table.delete(f"entity_id = '{victim}'")
    assert deleted["num_deleted_rows"] > 0
    # a later write: the next flush publishes the statements version with the delete
    ds.write_entities(
        [orjson.dumps({"id": "late-1", "schema": "Person", "properties": {"name": ["Zed"]}})]
    )
    made = ds.make()
    assert made.written["statements"]["rows"] == sum(
        1 for e in ds.query(flush=False) for _ in e.statements
    )
    assert ds.get_entity(victim, flush=False) is None  # the deleted rows are gone
    assert ds.get_entity("late-1", flush=False) is not None
    assert victim not in {str(e.id) for e in ds.query(flush=False)}
    rebuilt = graph.rebuild(ds)
    assert rebuilt.edges == len(
        {s.id for e in ds.query(flush=False) for s in e.statements if s.prop_type == "entity"}
    )
    # and through the CLI: exit 0, no traceback
    env = lakehouse_env(lake)
    for args in (["graph", "rebuild"], ["make"], ["get", "late-1"]):
        res = lakehouse(*cli_args(ds), *args, env=env)
        assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr


# --- locks ------------------------------------------------------------------------


def _lock_file(ds: Dataset) -> str:
    return cv.dataset_path(ds.name, cv.LOCK)


def _forged(**fields: object) -> bytes:
    doc: dict[str, object] = {
        "state": "held",
        "generation": 7,
        "token": "forged",
        "host": socket.gethostname(),
        "boot_id": boot_id(),
        "tenant": "mallory",
        "operation": "flush",
        "acquired_at": cv.utcnow().isoformat(),
    }
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


#: Lock documents naming this host that no live holder here wrote.
FORGED = {
    "pid 2**70": {"pid": 2**70},
    "pid 1, no start time": {"pid": 1},
    "pid 1, another start time": {"pid": 1, "pid_start": (process_start(1) or 0) + 1},
    "pid -1": {"pid": -1, "pid_start": 5},
    "pid 0": {"pid": 0},
    "pid true": {"pid": True},
    "pid_start 2**70": {"pid": os.getppid(), "pid_start": 2**70},
    "no boot id": {"pid": 1, "pid_start": process_start(1), "boot_id": None},
    "generation 2**70": {"pid": 1, "pid_start": process_start(1), "generation": 2**70},
}


@pytest.mark.parametrize("kind", sorted(FORGED))
def test_a_forged_lock_of_this_host_is_stale(local_lake: Lakehouse, kind: str) -> None:
    """Before: the 70-bit pid overflowed ``os.kill`` (a traceback in flush and
    unlock); pid 1, -1 and ``true`` are "alive" (-1 signals every process) and
    blocked every writer for the 6-hour TTL, and ``unlock`` refused them."""
    ds = local_lake.create_dataset("forged")
    local_lake.store.write_bytes(_lock_file(ds), _forged(**FORGED[kind]))
    with ds.table_lock("flush", wait=0) as lock:  # taken over, no error
        assert lock.state().token == lock.token
    local_lake.store.write_bytes(_lock_file(ds), _forged(**FORGED[kind]))
    env = lakehouse_env(local_lake)
    res = lakehouse(*cli_args(ds), "unlock", env=env)
    assert res.returncode == 0 and "unlocked" in res.stdout, res.stderr
    assert not ds.lock().state().held
    local_lake.store.write_bytes(_lock_file(ds), _forged(**FORGED[kind]))
    res = lakehouse(*cli_args(ds), "flush", env=env)  # nothing to flush: no Spark
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr


def test_the_live_holder_of_this_host_still_holds(local_lake: Lakehouse) -> None:
    """The other side: a lock naming a running process with its start time holds."""
    ds = local_lake.create_dataset("held")
    me = os.getpid()
    local_lake.store.write_bytes(_lock_file(ds), _forged(pid=me, pid_start=process_start(me)))
    res = lakehouse(*cli_args(ds), "unlock", env=lakehouse_env(local_lake))
    assert "refusing to unlock" in one_line_error(res)
    assert ds.lock().state().held


def test_unlock_with_an_empty_operation_never_clears_the_dataset_lock(
    local_lake: Lakehouse,
) -> None:
    """Before: ``--operation ''`` was taken as no operation and cleared ``.LOCK``."""
    ds = local_lake.create_dataset("unlocking")
    elsewhere = _forged(host="elsewhere", pid=4242, pid_start=1)
    local_lake.store.write_bytes(_lock_file(ds), elsewhere)
    env = lakehouse_env(local_lake)
    for name in ("", "../.LOCK", ".LOCK"):
        res = lakehouse(*cli_args(ds), "unlock", "--operation", name, env=env)
        assert "Invalid job type" in one_line_error(res)
        assert ds.lock().state().held  # untouched
    res = lakehouse(*cli_args(ds), "unlock", env=env)  # the dataset lock, by intent
    assert res.returncode == 0 and not ds.lock().state().held


# --- staging --------------------------------------------------------------------------


def test_the_clean_up_sees_an_empty_staging_area(lake: Lakehouse) -> None:
    """A killed export leaves ``_staging/export-<id>/`` empty; the local store's
    listing skipped empty folders, so the clean-up never removed it. (S3 has no
    empty folders: there the area holds a file and must go the same way.)"""
    ds = lake.create_dataset("staged")
    dead = cv.dataset_path(ds.name, cv.STAGING, "export-killed")
    other = cv.dataset_path(ds.name, cv.STAGING, "flush-running")
    store = ds.store
    if isinstance(store, LocalStore):
        store.local_path(dead).mkdir(parents=True)
        store.local_path(other).mkdir(parents=True)
    else:
        store.write_bytes(f"{dead}/part-0.parquet", b"half")
        store.write_bytes(f"{other}/part-0.parquet", b"kept")
    cleaned = staging.clean_stale(ds, "export")
    assert cleaned.areas == 1
    if isinstance(store, LocalStore):
        assert not store.local_path(dead).exists()
        assert store.local_path(other).exists()  # another operation's area stays
    else:
        assert list(store.list(f"{dead}/")) == []
        assert store.exists(f"{other}/part-0.parquet")


# --- arguments that are not UTF-8 -------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["get", b"\xff"], "ENTITY_ID"),
        (["trace", b"ab\xffcd"], "KEY"),
        (["refs", b"\xff"], "ENTITY_ID"),
        (["query", "--id", b"\xff"], "--id"),
        (["get", "x", "--origin", b"o\xff"], "--origin"),
    ],
)
def test_an_argument_that_is_not_utf8_is_one_line(
    local_lake: Lakehouse, args: list[str | bytes], named: str
) -> None:
    """Before: ``get``/``trace`` of ``$'\\xff'`` raised UnicodeEncodeError (a traceback)."""
    ds = local_lake.create_dataset("bytes")
    res = lakehouse(*cli_args(ds), *args, env=lakehouse_env(local_lake))
    line = one_line_error(res)
    assert named in line and "not valid UTF-8" in line
    assert res.returncode == 2


def test_a_dataset_option_that_is_not_utf8_is_one_line(local_lake: Lakehouse) -> None:
    env = lakehouse_env(local_lake)
    res = lakehouse("--lake", local_lake.store.uri, "-d", b"d\xff", "get", "x", env=env)
    line = one_line_error(res)
    assert "--dataset" in line and "not valid UTF-8" in line


# --- misleading messages ------------------------------------------------------------------


def test_an_unsupported_lake_scheme_is_named_up_front(tmp_path: Path) -> None:
    """Before: "no lake at …: create one with datasets create", and then ``datasets
    create`` said the scheme is unsupported."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE_")}
    for args in (["datasets", "list"], ["-d", "x", "get", "e1"], ["datasets", "create", "x"]):
        line = one_line_error(lakehouse("--lake", "ftp://example.org/lake", *args, env=env))
        assert "Unsupported lake URI" in line and "datasets create" not in line


def test_an_http_lake_says_what_runs_over_http_and_what_it_needs(tmp_path: Path) -> None:
    """An http(s) lake is a server (the CLI over HTTP): a lake command names itself as
    one that needs the storage, a tenant command without a token says how to get one;
    neither suggests creating a lake there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE_")}
    uri = "http://127.0.0.1:9/lake"
    for args in (["datasets", "list"], ["datasets", "create", "x"]):
        line = one_line_error(lakehouse("--lake", uri, *args, env=env))
        assert f"`lakehouse {' '.join(args[:2])}` works on the lake's storage itself" in line
    line = one_line_error(lakehouse("--lake", uri, "-d", "x", "get", "e1", env=env))
    assert "needs a token: set LAKEHOUSE_TOKEN" in line and "datasets create" not in line


def test_trace_of_an_unknown_id_fails(local_lake: Lakehouse) -> None:
    """Before: "no entity or statement" on stderr, exit 0."""
    ds = local_lake.create_dataset("tracing")
    res = lakehouse(*cli_args(ds), "trace", "nobody", env=lakehouse_env(local_lake))
    line = one_line_error(res)
    assert res.returncode == 1
    assert "no statements for id 'nobody' in dataset 'tracing'" in line


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--prop", "wings", "unknown property 'wings'"),
        ("--prop", "ownershipOwner", "unknown property 'ownershipOwner'"),  # a reverse one
        ("--schema", "Persn", "unknown schema 'Persn'"),
    ],
)
def test_refs_with_an_unknown_property_or_schema_fails(
    local_lake: Lakehouse, option: str, value: str, message: str
) -> None:
    """Before: "no edges" (exit 0), a wrong answer that looked right."""
    ds = local_lake.create_dataset("refs_filters")
    graph.rebuild(ds)  # an index (empty): the filters, not a missing index, are wrong
    env = lakehouse_env(local_lake)
    res = lakehouse(*cli_args(ds), "refs", "someone", option, value, env=env)
    assert message in one_line_error(res)
    keyword = {"--prop": "props", "--schema": "schemata"}[option]
    with pytest.raises(InvalidNameError, match=message):
        graph.refs(ds, "someone", **{keyword: [value]})  # type: ignore[arg-type]
    # real names still answer (no edges here: exit 0)
    res = lakehouse(*cli_args(ds), "refs", "someone", "--prop", "owner", "-s", "Person", env=env)
    assert res.returncode == 0 and "no edges" in res.stderr, res.stderr
