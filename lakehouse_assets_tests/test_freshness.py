"""Freshness from the snapshot an export read, and readers that never fail on a lock."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import orjson

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults
from lakehouse_assets.exports import is_fresh
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets_tests.conftest import sample_entities

ENTITIES = sample_entities()
KINDS = ("statements", "entities", "statistics", "index")


def exported_ids(ds: Dataset) -> set[str]:
    raw = ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON))
    return {orjson.loads(line)["id"] for line in raw.splitlines()}


def test_an_export_that_raced_a_write_and_a_flush_is_stale(spark: Any, lake: Lakehouse) -> None:
    ds = lake.create_dataset("racing")
    for e in ENTITIES[:5]:
        ds.add_entity(e)
    ds.make()
    ds.add_entity(ENTITIES[5])
    late = ENTITIES[6]

    def write_and_flush() -> None:  # lands while the export's Spark pass runs
        ds.add_entity(late)
        ds.flush()

    with faults.on("export.after_parts", write_and_flush):
        raced = ds.make()
    assert set(raced.written) == set(KINDS)
    assert ds.get_entity(str(late["id"])) is not None  # stored ...
    assert str(late["id"]) not in exported_ids(ds)  # ... but not in the export
    # the export is stamped by what it read, so it is stale, not "fresh now"
    assert not any(is_fresh(ds, k) for k in KINDS)
    stamp = ds.core_tags.get(cv.EXPORTS_ENTITIES)
    assert stamp is not None and stamp < ds.core_tags.get(cv.STATEMENTS_LAST_UPDATED)  # type: ignore[operator]
    again = ds.make()
    assert set(again.written) == set(KINDS)
    assert str(late["id"]) in exported_ids(ds)
    assert all(is_fresh(ds, k) for k in KINDS)
    assert ds.make().written == {}  # and now it stays fresh


def test_a_write_after_the_exports_flush_keeps_them_stale(
    spark: Any, local_lake: Lakehouse
) -> None:
    """A write committed after the flush's claim, before the export pins its snapshot.

    ``make`` flushes twice: for its graph step, then for the exports; a write
    after the first claim is flushed by the second, one after the second is
    the case here."""
    ds = local_lake.create_dataset("after_claim")
    for e in ENTITIES[:3]:
        ds.add_entity(e)
    between, late = ENTITIES[3], ENTITIES[4]
    claims: list[str] = []

    def write() -> None:
        claims.append("claim")
        ds.add_entity(between if len(claims) == 1 else late)

    with faults.on("flush.after_claim", write):
        ds.make()
    assert len(claims) == 2 and str(between["id"]) in exported_ids(ds)
    assert str(late["id"]) not in exported_ids(ds)
    assert not is_fresh(ds, "entities")  # its rows wait in the journal
    ds.make()
    assert str(late["id"]) in exported_ids(ds)


HOLD = """
import sys, time
from lakehouse_assets import Lakehouse
ds = Lakehouse(sys.argv[1], journal_url=sys.argv[2]).dataset(sys.argv[3])
with ds.table_lock("compact"):
    print("locked", flush=True)
    time.sleep(120)
"""


def test_readers_do_not_fail_while_a_writer_holds_the_lock(
    spark: Any, local_lake: Lakehouse
) -> None:
    ds = local_lake.create_dataset("busy")
    for e in ENTITIES[:4]:
        ds.add_entity(e)
    ds.make()
    for e in ENTITIES[4:8]:
        ds.add_entity(e)  # pending in the journal
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLD,
            local_lake.store.uri,
            local_lake.settings.resolved_journal_url(),
            ds.name,
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"locked"
        ds.settings.read_wait_seconds = 0.5
        ds.settings.lock_wait_seconds = 1.0
        # query flushes first by default: it reads the current snapshot instead of failing
        seen = {e.id for e in ds.query()}
        assert seen == {str(e["id"]) for e in ENTITIES[:4]}
        made = ds.make()
        assert made.flushed is None and made.pending > 0
        # the graph step too goes on without the lock: skipped, saying why
        assert made.graph is not None and "lock is held" in made.graph["skipped"]
        assert not is_fresh(ds, "entities")  # honest: the journal still holds rows
        assert ds.journal.count(ds.name) == made.pending
    finally:
        holder.kill()
        holder.wait()
    ds.settings.lock_wait_seconds = 30.0
    made = ds.make()  # the dead holder's lock is taken over
    assert made.flushed is not None and made.pending == 0
    assert exported_ids(ds) == {str(e["id"]) for e in ENTITIES[:8]}


def test_reading_freshness_loads_neither_spark_nor_followthemoney(tmp_path: Any) -> None:
    """``lakehouse status`` and the freshness sensor read a few tags and count the
    journal: they must not pay for importing Spark's client or followthemoney
    (about a fifth of ``lakehouse status``). Checked in a fresh interpreter, on a
    dataset with rows in the journal and its exports and graph exports stamped."""
    journal_url = f"sqlite:///{tmp_path}/j.db"
    lake = Lakehouse(tmp_path / "lake", journal_url=journal_url)
    ds = lake.create_dataset("light")
    ds.add_entity(ENTITIES[0])
    ds.core_tags.touch(cv.EXPORTS_ENTITIES)
    ds.core_tags.touch(cv.EXPORTS_GRAPH)
    script = f"""
import sys
from lakehouse_assets.freshness import freshness
from lakehouse_assets.lake import Lakehouse
ds = Lakehouse({str(tmp_path / "lake")!r}, journal_url={journal_url!r}).dataset("light")
found = freshness(ds)
assert not found["entities"].fresh and "journal rows wait" in found["entities"].why, found
print(",".join(m for m in ("pyspark", "followthemoney", "ftmq") if m in sys.modules))
"""
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == ""
