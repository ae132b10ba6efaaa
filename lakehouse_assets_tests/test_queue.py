"""The queue: order across tenants, exactly once across a SIGKILL, bad items set aside.

Everything runs on real lakes (a local folder and the loopback S3 server) with a
real SQLite journal; applying an entity upsert means writing its statements to
the journal, so no test here needs Spark.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidInputError, InvalidNameError, LockedError
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.queue import QUEUE_POINTS, uuid7, uuid7_time, write_id
from lakehouse_assets.queue_ledger import applied_items
from lakehouse_assets_tests.conftest import free_port


def person(entity_id: str, name: str) -> dict[str, object]:
    return {"id": entity_id, "schema": "Person", "properties": {"name": [name]}}


def journal_rows(ds: Dataset, entity_id: str) -> list[tuple[object, ...]]:
    return ds.journal.entity_rows(ds.name, entity_id)


def pending_files(ds: Dataset) -> list[str]:
    return [p for p in ds.store.list(cv.queue_prefix(ds.name)) if "/_" not in p]


# --- ids ------------------------------------------------------------------------


def test_uuid7_ids_are_rfc_9562_and_increase() -> None:
    ids = [uuid7() for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for value in ids[:50]:
        parsed = uuid.UUID(value)
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert cv.queue_item_id(value) == value
    made = uuid7_time(ids[0])
    assert abs((cv.utcnow() - made).total_seconds()) < 60
    # the journal write id of an item: deterministic, fits the column, carries the time
    wid = write_id(ids[0])
    assert wid == write_id(ids[0]) and len(wid) <= 40 and wid.startswith(made.strftime("%Y%m%dT"))


# --- order and the basic actions -------------------------------------------------------


def test_items_of_two_tenants_are_applied_in_uuid7_order(lake: Lakehouse) -> None:
    """Interleaved pushes of two tenants: one sequence by id; the last write wins."""
    ds = lake.create_dataset("queued")
    pushed = [
        ds.queue.push("UPSERT", "entity", person("p1", "Ann"), tenant="app-a"),
        ds.queue.push("UPSERT", "entity", person("p2", "Bob"), tenant="app-b"),
        ds.queue.push("DELETE", "entity", {"entity_id": "p1"}, tenant="app-b"),
        ds.queue.push("UPSERT", "entity", person("p3", "Cy"), tenant="app-a"),
    ]
    ids = [i.id for i in pushed]
    assert ids == sorted(ids)
    listed = ds.queue.list()
    assert [(e.id, e.tenant, e.state) for e in listed] == [
        (i.id, i.tenant, "pending") for i in pushed
    ]
    assert [e.id for e in ds.queue.list("app-a")] == [ids[0], ids[3]]
    assert lake.store.exists(cv.queue_item("queued", "app-b", ids[1]))

    result = ds.queue.consume()
    assert (result.applied, result.recovered, result.failed, result.remaining) == (4, 0, [], 0)
    assert [i["id"] for i in result.items] == ids
    # p1 was written, then tombstoned by the later item of the other tenant
    rows = journal_rows(ds, "p1")
    deleted = [r for r in rows if r[-1] is not None]  # deleted_at: the last column
    assert len(rows) == 4 and len(deleted) == 2
    assert ds.journal.live_entity_statements("queued", "p1") == []
    assert {s.value for s in ds.journal.live_entity_statements("queued", "p3")} >= {"Cy"}
    assert ds.core_tags.get(cv.JOURNAL_LAST_UPDATED) is not None
    # everything is done; a second consume has nothing to do
    assert pending_files(ds) == []
    assert [e.state for e in ds.queue.list(state="all")] == ["done"] * 4
    assert ds.queue.consume().applied == 0
    assert applied_items(ds.journal, "queued") == []


def test_each_row_says_which_tenant_and_item_wrote_it(local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("provenance")
    item = ds.queue.push("UPSERT", "entity", person("p1", "Ann"), tenant="open-aleph")
    ds.queue.consume()
    from sqlalchemy import select

    from lakehouse_assets.journal import journal_table as t

    with ds.journal.engine.connect() as conn:
        stamps = set(conn.execute(select(t.c.tenant, t.c.write_id, t.c.first_seen)).all())
    (tenant, wid, seen) = stamps.pop()
    assert tenant == "open-aleph" and wid == write_id(item.id)
    assert seen == item.created_at.strftime("%Y-%m-%dT%H:%M:%S")


def test_file_upsert_and_delete(lake: Lakehouse, tmp_path: Path) -> None:
    ds = lake.create_dataset("files")
    source = tmp_path / "memo.txt"
    source.write_text("a memo")
    up = ds.queue.push("UPSERT", "file", {"uri": str(source), "document": True})
    ds.queue.consume()
    (meta,) = list(ds.archive.list())
    assert meta.key == str(source) and ds.archive.exists(meta.checksum)
    assert {s.schema for s in ds.journal.live_entity_statements("files", meta.checksum)} == {
        "Document"
    }
    done = [e for e in ds.queue.list(state="done") if e.id == up.id]
    assert done and done[0].result is not None and done[0].result["checksum"] == meta.checksum
    ds.queue.push("DELETE", "file", {"file_id": meta.file_id, "checksum": meta.checksum})
    # deleting what is already gone is what the tenant asked for: done, not failed
    ds.queue.push("DELETE", "file", {"file_id": meta.file_id})
    result = ds.queue.consume()
    assert result.applied == 2 and result.failed == []
    assert [i["deleted"] for i in result.items] == [True, False]
    assert list(ds.archive.list()) == []
    assert ds.archive.exists(meta.checksum)  # the blob stays, as archive delete does


def test_a_relative_path_is_queued_absolute(
    local_lake: Lakehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = local_lake.create_dataset("paths")
    monkeypatch.chdir(tmp_path)
    Path("here.txt").write_text("here")
    item = ds.queue.push("UPSERT", "file", {"uri": "here.txt"})
    assert item.payload["uri"] == str(tmp_path / "here.txt")


# --- exactly once across a crash ------------------------------------------------------

CONSUME = """
import json, sys
from lakehouse_assets.lake import Lakehouse
lake = Lakehouse(sys.argv[1], journal_url=sys.argv[2])
print(json.dumps(lake.dataset(sys.argv[3]).queue.consume().as_dict()))
"""


def consume_killed(ds: Dataset, point: str) -> None:
    """Consume in a child process that SIGKILLs itself at ``point`` (like a power cut)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CONSUME,
            ds.store.uri,
            ds.settings.resolved_journal_url(),
            ds.name,
        ],
        env={**os.environ, "LAKEHOUSE_CRASH_AT": point},
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]


@pytest.mark.parametrize("point", QUEUE_POINTS)
def test_killed_consume_then_rerun_applies_each_item_once(
    journal_url: str, dataset_name: str, tmp_path: Path, point: str
) -> None:
    """SIGKILL between applying an item and marking it, on SQLite and PostgreSQL."""
    lake = Lakehouse(tmp_path / "lake", journal_url=journal_url)
    ds = lake.create_dataset(dataset_name)
    source = tmp_path / "scan.txt"
    source.write_text("a scan")
    items = [
        ds.queue.push("UPSERT", "entity", person("p1", "Ann"), tenant="app-a"),
        ds.queue.push("UPSERT", "entity", person("p2", "Bob"), tenant="app-b"),
        ds.queue.push("UPSERT", "file", {"uri": str(source), "document": True}, tenant="app-a"),
    ]
    consume_killed(ds, f"{point}:2")  # dies applying the second item (of app-b)
    # the first item is done; the second applied but not (fully) marked
    assert not ds.store.exists(cv.queue_item(ds.name, "app-a", items[0].id))
    assert ds.store.exists(cv.queue_item(ds.name, "app-b", items[1].id))
    assert len(journal_rows(ds, "p2")) == 2
    assert ds.store.exists(cv.queue_done(ds.name, "app-b", items[1].id)) == (
        point == "queue.after_mark"
    )

    result = ds.queue.consume()  # takes over the dead consumer's lock
    assert (result.applied, result.recovered, result.failed) == (1, 1, [])
    assert [i["outcome"] for i in result.items] == ["recovered", "applied"]
    # in effect once: each entity's statements are in the journal once
    assert len(journal_rows(ds, "p1")) == 2 and len(journal_rows(ds, "p2")) == 2
    (meta,) = list(ds.archive.list())
    assert len(journal_rows(ds, meta.checksum)) == len(
        ds.journal.live_entity_statements(ds.name, meta.checksum)
    )
    assert pending_files(ds) == []
    assert [e.state for e in ds.queue.list(state="all")] == ["done"] * 3
    assert applied_items(ds.journal, ds.name) == []


def test_the_applied_mark_survives_a_flush_between_crash_and_rerun(
    local_lake: Lakehouse,
) -> None:
    """The statements leave the journal on flush; the item's mark does not, so a
    rerun after a flush still recognises the item as applied."""
    ds = local_lake.create_dataset("flushed")
    ds.queue.push("UPSERT", "entity", person("p1", "Ann"))
    consume_killed(ds, "queue.after_apply")
    assert len(journal_rows(ds, "p1")) == 2
    ds.journal.clear(ds.name)  # what a flush does to the journal once the rows are in Delta
    result = ds.queue.consume()
    assert (result.applied, result.recovered) == (0, 1)
    assert journal_rows(ds, "p1") == []  # not written a second time
    assert pending_files(ds) == []


def test_only_one_consumer_at_a_time(local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("busy")
    ds.queue.push("UPSERT", "entity", person("p1", "Ann"))
    with (
        ds.operation_lock("queue", tenant=cv.LAKEHOUSE_TENANT),
        pytest.raises(LockedError, match="locks/lakehouse/queue"),
    ):
        ds.queue.consume()
    assert ds.queue.consume().applied == 1


def test_an_unreachable_source_stops_the_queue_before_its_item(local_lake: Lakehouse) -> None:
    """A retryable error keeps the order: the item stays pending and first in line.
    (The queue may reach 127.0.0.1 only as a listed host: LAKEHOUSE_SOURCE_HOSTS.)"""
    settings = local_lake.settings.model_copy(update={"source_hosts": ["127.0.0.1"]})
    ds = Lakehouse(local_lake.store.uri, settings=settings).create_dataset("offline")
    ds.queue.push("UPSERT", "entity", person("p1", "Ann"))
    stuck = ds.queue.push("UPSERT", "file", {"uri": f"http://127.0.0.1:{free_port()}/a.pdf"})
    ds.queue.push("UPSERT", "entity", person("p2", "Bob"))
    result = ds.queue.consume()
    assert result.applied == 1 and result.remaining == 2 and result.failed == []
    assert result.stopped is not None and "Cannot reach" in result.stopped
    assert journal_rows(ds, "p2") == []
    assert [e.id for e in ds.queue.list()][0] == stuck.id


# --- bad items --------------------------------------------------------------------------


def test_malformed_items_are_set_aside_with_their_error(local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("messy")
    store = ds.store
    good = ds.queue.push("UPSERT", "entity", person("ok1", "Ann"), tenant="app-a")

    def raw(tenant: str, body: bytes, item_id: str | None = None) -> str:
        item_id = item_id or uuid7()
        store.write_bytes(cv.queue_item(ds.name, tenant, item_id), body)
        return item_id

    def item(**changes: object) -> bytes:
        data = {
            "id": changes.pop("id", None) or uuid7(),
            "tenant": "app-b",
            "action": "UPSERT",
            "resource": "entity",
            "payload": {"entity": person("x", "X")},
            "created_at": cv.utcnow().isoformat(),
        }
        data.update(changes)
        return json.dumps(data).encode()

    bad_json = raw("app-b", b"{not json")
    bad_utf8 = raw("app-b", b"\xff\xfe")
    unknown_action = uuid7()
    raw("app-b", item(id=unknown_action, action="MERGE"), unknown_action)
    bad_entity = uuid7()
    raw("app-b", item(id=bad_entity, payload={"entity": {"id": "x", "schema": "Nope"}}), bad_entity)
    spoofed = uuid7()  # claims to be another tenant's item
    raw("app-b", item(id=spoofed, tenant="app-a"), spoofed)
    store.write_bytes(f"{cv.queue_prefix(ds.name, 'app-b')}notes.json", b"{}")
    last = ds.queue.push("UPSERT", "entity", person("ok2", "Bob"), tenant="app-b")

    listed = {e.id: e for e in ds.queue.list()}
    assert listed[bad_json].item is None and "not JSON" in (listed[bad_json].error or "")
    assert listed[good.id].error is None

    result = ds.queue.consume()
    assert result.applied == 2 and result.remaining == 0
    errors = {f["id"]: f["error"] for f in result.failed}
    assert len(errors) == 6
    assert "not JSON" in errors[bad_json]
    assert "not UTF-8" in errors[bad_utf8]
    assert "action" in errors[unknown_action] and "MERGE" in errors[unknown_action]
    assert "unknown schema 'Nope'" in errors[bad_entity]
    assert "tenant 'app-a'" in errors[spoofed]
    assert "not a queue item" in errors["notes.json"]
    # the good items on either side were applied; nothing was written for the bad ones
    assert journal_rows(ds, "ok1") and journal_rows(ds, "ok2") and not journal_rows(ds, "x")
    assert last.id in {i["id"] for i in result.items if i["outcome"] == "applied"}
    # set aside, not dropped: each failed record keeps the raw item and its error
    failed = [e for e in ds.queue.list(state="failed")]
    assert len(failed) == 6 and all(e.error for e in failed)
    record = json.loads(store.read_bytes(cv.queue_failed(ds.name, "app-b", bad_json)))
    assert record["raw"] == "{not json" and "not JSON" in record["error"]
    assert pending_files(ds) == []


@pytest.mark.parametrize(
    ("action", "resource", "payload", "message"),
    [
        ("MERGE", "entity", {}, "unknown queue action"),
        ("UPSERT", "statement", {}, "unknown queue action"),
        ("UPSERT", "entity", {"id": "x", "schema": "Nope"}, "unknown schema"),
        ("UPSERT", "entity", {"entity": person("p", "P"), "origin": "../x"}, "Invalid origin"),
        ("DELETE", "entity", {"entity_id": "p", "extra": 1}, "extra: unknown key"),
        ("UPSERT", "file", {"checksum": "0" * 64}, "uri: Field required"),
        ("DELETE", "file", {"file_id": "../../config.yml"}, "Invalid file id"),
        ("DELETE", "file", ["not", "an", "object"], "must be a JSON object"),
    ],
)
def test_push_refuses_bad_actions_and_payloads(
    local_lake: Lakehouse, action: str, resource: str, payload: object, message: str
) -> None:
    ds = local_lake.create_dataset("refusing")
    with pytest.raises(InvalidInputError, match=message):
        ds.queue.push(action, resource, payload)  # type: ignore[arg-type]
    assert pending_files(ds) == []


@pytest.mark.parametrize("tenant", ["../x", "App", "a/b", "_done", "..", "x\x00"])
def test_tenant_names_are_validated_before_any_path(local_lake: Lakehouse, tenant: str) -> None:
    ds = local_lake.create_dataset("tenants")
    with pytest.raises(InvalidNameError, match="Invalid tenant name"):
        ds.queue.push("UPSERT", "entity", person("p1", "Ann"), tenant=tenant)
    with pytest.raises(InvalidNameError):
        ds.queue.list(tenant)
    assert not any(p.startswith("tenants/queue") for p in local_lake.store.list(""))
