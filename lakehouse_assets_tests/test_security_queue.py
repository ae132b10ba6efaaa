"""The queue against planted items and bad ids (:mod:`lakehouse_assets.queue`).

Items are planted the way a tenant with write access to the lake's queue
folder would: raw JSON written straight into storage, on a local lake and on
the loopback S3 lake, with a real SQLite journal. No Spark.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidInputError, InvalidNameError
from lakehouse_assets.journal import journal_table
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.queue import MAX_CLOCK_SKEW, MAX_ITEM_BYTES, uuid7
from lakehouse_assets.storage import LocalStore
from lakehouse_assets_tests.conftest import cli_args, lakehouse_env


def person(entity_id: str, name: str = "Ann") -> dict[str, Any]:
    return {"id": entity_id, "schema": "Person", "properties": {"name": [name]}}


def plant(ds: Dataset, tenant: str = "evil", **changes: Any) -> str:
    """Write an item straight into the queue folder; its id."""
    item_id = changes.pop("id", None) or uuid7()
    data = {
        "id": item_id,
        "tenant": tenant,
        "action": "UPSERT",
        "resource": "entity",
        "payload": {"entity": person(f"p-{item_id[-6:]}")},
        "created_at": cv.utcnow().isoformat(),
    }
    data.update(changes)
    ds.store.write_bytes(cv.queue_item(ds.name, tenant, item_id), json.dumps(data).encode())
    return item_id


def seen_times(ds: Dataset) -> list[str]:
    """Every first/last seen of the dataset's journal rows."""
    table = journal_table
    query = select(table.c.first_seen, table.c.last_seen).where(table.c.dataset == ds.name)
    with ds.journal.engine.connect() as conn:
        rows = conn.execute(query).all()
    return [value for row in rows for value in row]


def test_a_planted_created_at_cannot_date_statements(lake: Lakehouse) -> None:
    """``created_at`` becomes first/last seen: 9999-12-31 (with or without a zone),
    an id whose time is years ahead or beyond any date, all set aside with the
    reason; an item a little off (another host's clock) is applied."""
    ds = lake.create_dataset("dated")
    now = cv.utcnow()
    far = plant(ds, created_at="9999-12-31T23:59:59+00:00")
    naive = plant(ds, created_at="9999-12-31T00:00:00")
    past = plant(ds, created_at="1970-01-01T00:00:00+00:00")
    ahead_ms = int((now + timedelta(days=365)).timestamp() * 1000)
    ahead_id = f"{ahead_ms:012x}"[:8] + "-" + f"{ahead_ms:012x}"[8:] + "-7000-8000-000000000001"
    ahead = plant(ds, id=ahead_id, created_at=(now + timedelta(days=365)).isoformat())
    beyond = plant(ds, id="ffffffff-ffff-7fff-bfff-ffffffffffff")
    skewed = plant(ds, created_at=(now + MAX_CLOCK_SKEW / 2).isoformat())

    result = ds.queue.consume()

    errors = {f["id"]: f["error"] for f in result.failed}
    assert set(errors) == {far, naive, past, ahead, beyond}
    for item in (far, naive, past):
        assert "is not the time of its id" in errors[item]
    assert "in the future" in errors[ahead]
    assert "beyond the year 9999" in errors[beyond]
    assert result.applied == 1
    assert [i["id"] for i in result.items if i["outcome"] == "applied"] == [skewed]
    latest = (cv.utcnow() + MAX_CLOCK_SKEW).isoformat()
    assert seen_times(ds) and all(value <= latest for value in seen_times(ds))
    assert not any(value.startswith(("9999", "1970")) for value in seen_times(ds))


def test_items_outside_any_tenant_folder_are_reported_as_invalid(lake: Lakehouse) -> None:
    """``queue/App_Bad/{uuid7}.json`` and a stray ``queue/x.json``: never consumed,
    never silently ignored either: consume, list and ``invalid()`` report them;
    they stay where they are, and the sensor does not ask for a consume for them."""
    ds = lake.create_dataset("folders")
    prefix = cv.queue_prefix(ds.name)
    body = json.dumps({"id": uuid7(), "tenant": "App_Bad"}).encode()
    ds.store.write_bytes(f"{prefix}App_Bad/{uuid7()}.json", body)
    ds.store.write_bytes(f"{prefix}x.json", b"{}")

    assert not ds.queue.has_pending()
    good = ds.queue.push("UPSERT", "entity", person("ok"), tenant="app")
    result = ds.queue.consume()

    assert result.applied == 1 and result.failed == []
    invalid = {i["folder"]: i["error"] for i in result.invalid}
    assert set(invalid) == {f"{prefix}App_Bad", f"{prefix}x.json"}
    assert "not a tenant name" in invalid[f"{prefix}App_Bad"]
    assert "outside any tenant folder" in invalid[f"{prefix}x.json"]
    assert result.as_dict()["invalid"] == result.invalid
    entries = ds.queue.list(state="all")
    assert sorted(e.id for e in entries if e.state == "invalid") == ["App_Bad", "x.json"]
    assert good.id in {e.id for e in entries if e.state == "done"}
    assert ds.queue.invalid() == result.invalid
    assert len([p for p in ds.store.list(prefix) if "/_" not in p]) == 2  # left in place


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"entity_id": "x" * 10_000}, "10000 characters long \\(at most 1024\\)"),
        ({"entity_id": "p\x00"}, "NUL"),
        ({"entity_id": "\udcff"}, "unicode"),
    ],
)
def test_push_delete_validates_the_id_like_every_entry_point(
    local_lake: Lakehouse, payload: dict[str, Any], message: str
) -> None:
    ds = local_lake.create_dataset("ids")
    with pytest.raises(InvalidInputError, match=message):
        ds.queue.push("DELETE", "entity", payload)
    assert ds.queue.pending_count() == 0


def test_non_utf8_ids_and_texts_are_refused_with_one_line(local_lake: Lakehouse) -> None:
    """A lone surrogate (what a ``$'\\xff'`` argument becomes) in any id or text an
    item or a lookup names: one clear error, never a UnicodeEncodeError."""
    ds = local_lake.create_dataset("unicode")
    with pytest.raises(InvalidInputError, match="not valid UTF-8"):
        ds.queue.push("UPSERT", "entity", person("\udcff"))
    with pytest.raises(InvalidInputError, match="a value of 'name' is not valid UTF-8"):
        ds.queue.push("UPSERT", "entity", person("ok", "\udcff"))
    with pytest.raises(InvalidInputError, match="key: .*not valid UTF-8"):
        ds.queue.push("UPSERT", "file", {"uri": "s3://b/a.pdf", "key": "\udcff"})
    assert ds.queue.pending_count() == 0
    for lookup in (
        lambda: ds.get_entity("\udcff"),
        lambda: ds.trace("\udcff"),
        lambda: ds.delete_entity("\udcff"),
        lambda: list(ds.query(entity_ids=["\udcff"], flush=False)),
        lambda: ds.get_entity("x" * 1025),
    ):
        with pytest.raises(InvalidNameError, match="Invalid entity"):
            lookup()


def test_planted_items_with_bad_ids_are_set_aside(lake: Lakehouse) -> None:
    """What push refuses, consume refuses too: a planted 10,000-character id, a
    lone surrogate (JSON ``\\udcff``), a surrogate in a file UPSERT's key."""
    ds = lake.create_dataset("planted_ids")
    long_id = plant(ds, action="DELETE", payload={"entity_id": "x" * 10_000})
    surrogate = plant(ds, payload={"entity": person("\udcff")})
    bad_key = plant(ds, resource="file", payload={"uri": "s3://b/a", "key": "\udcff"})

    result = ds.queue.consume()

    errors = {f["id"]: f["error"] for f in result.failed}
    assert set(errors) == {long_id, surrogate, bad_key} and result.applied == 0
    assert "at most 1024" in errors[long_id]
    assert "not valid UTF-8" in errors[surrogate] and "not valid UTF-8" in errors[bad_key]


def test_deep_and_huge_planted_items_are_set_aside_not_crashing(lake: Lakehouse) -> None:
    """JSON nested 100,000 deep (a RecursionError in the parser) and, on the local
    lake, an item over ``MAX_ITEM_BYTES``: set aside with the reason, unread
    beyond the limit and not copied; the queue goes on."""
    ds = lake.create_dataset("deep")
    deep = uuid7()
    ds.store.write_bytes(cv.queue_item(ds.name, "evil", deep), b"[" * 100_000)
    huge = None
    if isinstance(ds.store, LocalStore):
        huge = uuid7()
        path = ds.store.local_path(cv.queue_item(ds.name, "evil", huge))
        with path.open("wb") as fh:
            fh.truncate(MAX_ITEM_BYTES + 10)  # sparse: all zero bytes
    good = ds.queue.push("UPSERT", "entity", person("fine"), tenant="app")

    result = ds.queue.consume()

    errors = {f["id"]: f["error"] for f in result.failed}
    assert "nested too deeply" in errors[deep]
    if huge is not None:
        assert "larger than 64 MiB" in errors[huge]
        record = json.loads(ds.store.read_bytes(cv.queue_failed(ds.name, "evil", huge)))
        assert record["raw"] is None
    assert [i["id"] for i in result.items if i["outcome"] == "applied"] == [good.id]


def test_cli_get_and_trace_of_a_non_utf8_argument(local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("cli_ids")
    env = lakehouse_env(local_lake)
    for command in ("get", "trace"):
        res = subprocess.run(
            [sys.executable, "-m", "lakehouse_assets.cli", *cli_args(ds), command, b"\xff"],
            capture_output=True,
            env=env,
            timeout=120,
        )
        err = res.stderr.decode()
        # a bad command-line value: click's usage exit (2), refused before the command runs
        assert res.returncode == 2, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert "not valid UTF-8" in err


def test_cli_reports_invalid_queue_folders(local_lake: Lakehouse) -> None:
    """``queue consume``, ``queue ls`` and ``status`` name what is never consumed."""
    from click.testing import CliRunner

    from lakehouse_assets.cli import cli

    ds = local_lake.create_dataset("cli_invalid")
    ds.store.write_bytes(f"{cv.queue_prefix(ds.name)}Bad/{uuid7()}.json", b"{}")
    runner = CliRunner()
    args = cli_args(ds)
    consumed = runner.invoke(cli, [*args, "queue", "consume", "--json"])
    assert consumed.exit_code == 0, consumed.output
    assert json.loads(consumed.stdout)["invalid"][0]["folder"].endswith("/queue/Bad")
    assert "invalid cli_invalid/queue/Bad: 1 file(s)" in consumed.stderr
    listed = runner.invoke(cli, [*args, "queue", "ls", "--json"])
    assert json.loads(listed.stdout)["state"] == "invalid"
    status = runner.invoke(cli, [*args, "status"])
    assert "never consumed: cli_invalid/queue/Bad" in status.stdout
