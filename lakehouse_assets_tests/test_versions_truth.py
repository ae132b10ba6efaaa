"""What a version publishes is what the tables hold, and verify says only the truth (issue 52).

Each test reproduces a way the adversarial run of issue 52 found in which
``make`` published, or ``verify`` said, something untrue; each failed on the
code before the fix:

- a false alarm: ``make``, graph rebuild, a delete, ``make``, ``compact``,
  ``make`` left a graph state ``verify`` called tampered, and a graph index
  rebuilt after the head was never published by ``make``;
- a foreign delete (delta-rs ``delete()`` on the statements table) published
  with a diff that said nothing was deleted, so yente never deleted it;
- the incremental export's state (``exports/_state``) trusted unverified: a
  forged aggregate became the published statistics;
- a rewritten change feed passed plain ``verify`` and hid an update from the
  next incremental export.

The journal URL, ``latest.json``, the diffs' index and the Connect server's
cache folder are covered in ``test_security_journal``, ``test_security_tamper``
and ``test_security_connect``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lakehouse_assets import conventions as cv
from lakehouse_assets import graph
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets_tests.conftest import sample_entities
from lakehouse_assets_tests.helpers.data import entities_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark_modes

ENTITIES = sample_entities()


def apply(before: dict[str, dict[str, Any]], diff: bytes) -> dict[str, dict[str, Any]]:
    """A diff's lines applied to entities by id, as yente applies a delta."""
    after = dict(before)
    for line in diff.splitlines():
        if not line.strip():
            continue
        change = json.loads(line)
        eid = change["entity"]["id"]
        if change["op"] == "DEL":
            after.pop(eid, None)
        else:
            after[eid] = entities_of(json.dumps(change["entity"]).encode())[eid]
    return after


def head_diff(ds: Dataset) -> tuple[dict[str, Any], bytes]:
    version = ds.version()
    assert version is not None
    diff = version.manifest["diff"]
    return diff, ds.store.read_bytes(cv.dataset_path(ds.name, diff["path"]))


def entities_file(ds: Dataset) -> bytes:
    return ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON))


def assert_verified(ds: Dataset, *, deep: bool = False) -> None:
    report = ds.verify(deep=deep)
    assert report.ok, report.problems


# --- false alarms ---------------------------------------------------------------


def test_make_after_a_compaction_leaves_a_lake_verify_passes(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """The sequence of issue 52: the graph update after a compaction changed no
    edge but wrote a new generation into graph/state.json, which no version
    covered; verify failed for good."""
    ds = local_lake.create_dataset("graph_alarm")
    for entity in ENTITIES[:10]:
        ds.add_entity(entity)
    ds.make()
    graph.rebuild(ds)
    ds.delete_entity("own-anna-acme")  # an entity with edges
    for entity in ENTITIES[10:]:
        ds.add_entity(entity)
    ds.make()
    assert ds.compact().published is not None  # compact publishes its rewrite
    ds.make()
    assert_verified(ds)


def test_make_publishes_a_graph_index_rebuilt_after_the_head(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """What make changes it publishes: a rebuild after the head (fresh exports,
    nothing else to do) is covered by the next make's version, not left a note."""
    ds = local_lake.create_dataset("graph_rebuilt")
    for entity in ENTITIES:
        ds.add_entity(entity)
    ds.make()
    before = ds.version()
    graph.rebuild(ds)
    assert ds.verify().notes  # unpublished work, said as such
    ds.make()
    after = ds.version()
    assert before is not None and after is not None
    assert after.sequence == before.sequence + 1
    assert after.manifest["diff"]["counts"] == {"ADD": 0, "MOD": 0, "DEL": 0}
    report = ds.verify()
    assert report.ok and not report.notes, (report.problems, report.notes)
    ds.make()  # and nothing more to publish
    assert ds.version() == after


# --- foreign writers -----------------------------------------------------------


def test_a_foreign_delete_is_in_the_next_versions_diff(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """A delta-rs delete() of one entity, then a write and make: the version no
    longer holds the entity, and its diff says DEL (yente deletes it)."""
    ds = local_lake.create_dataset("foreign_delete")
    for entity in ENTITIES[:8]:
        ds.add_entity(entity)
    ds.make()
    before = entities_of(entities_file(ds))
    assert "p-omar-haddad" in before
    table = DeltaTable(ds.statements_table.uri, storage_options=ds.statements_table.storage_options)
    table.delete("canonical_id = 'p-omar-haddad'")
    ds.add_entity(ENTITIES[8])
    ds.make()
    after = entities_of(entities_file(ds))
    assert "p-omar-haddad" not in after
    diff, lines = head_diff(ds)
    assert diff["counts"]["DEL"] == 1 and diff["counts"]["ADD"] == 1, diff
    assert apply(before, lines) == after
    assert_verified(ds, deep=True)


def test_a_foreign_append_is_in_the_next_versions_diff(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """Rows a foreign writer appended to the statements table: the version that
    publishes them says how the entities got there."""
    ds = local_lake.create_dataset("foreign_append")
    for entity in ENTITIES[:8]:
        ds.add_entity(entity)
    ds.make()
    before = entities_of(entities_file(ds))
    location = ds.statements_table
    rows = DeltaTable(location.uri, storage_options=location.storage_options).to_pyarrow_dataset()
    one = rows.to_table(filter=pa.compute.field("canonical_id") == "acme-holding").slice(0, 1)
    forged = one.set_column(
        one.schema.get_field_index("id"), "id", pa.array(["f" * 40], pa.string())
    ).set_column(one.schema.get_field_index("value"), "value", pa.array(["Foreign"], pa.string()))
    write_deltalake(
        location.uri, forged, mode="append", storage_options=location.storage_options or None
    )
    ds.make()
    after = entities_of(entities_file(ds))
    diff, lines = head_diff(ds)
    assert apply(before, lines) == after, diff
    assert_verified(ds)


# --- caches --------------------------------------------------------------------


def _forge_state_count(ds: Dataset) -> None:
    """What issue 52 did: 1000 added to a schema count of the export state."""
    path = cv.dataset_path(ds.name, cv.EXPORT_STATE, "state.json")
    state = json.loads(ds.store.read_text(path))
    schema = sorted(state["aggregates"]["schemas"])[0]
    state["aggregates"]["schemas"][schema][0] += 1000
    ds.store.write_text(path, json.dumps(state, sort_keys=True))


def test_a_forged_export_state_is_caught_and_never_published(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    ds = local_lake.create_dataset("forged_state")
    for entity in ENTITIES[:10]:
        ds.add_entity(entity)
    ds.make()
    assert_verified(ds)
    _forge_state_count(ds)
    report = ds.verify()
    assert any("export state differs" in p.message for p in report.problems), report.problems
    ds.add_entity(ENTITIES[10])
    result = ds.make()
    assert result.mode == "full" and "export state" in str(result.reason), result.reason
    stats = json.loads(ds.store.read_text(cv.dataset_path(ds.name, cv.STATISTICS_JSON)))
    assert stats["entity_count"] == len(entities_of(entities_file(ds))) == 11
    assert_verified(ds, deep=True)
    # the next change is incremental again: the state the new version covers
    ds.add_entity(ENTITIES[11])
    assert ds.make().mode == "incremental"
    assert_verified(ds, deep=True)


def test_deep_verify_recomputes_the_statistics(spark: SparkSession, local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("deep_statistics")
    for entity in ENTITIES:
        ds.add_entity(entity)
    ds.make()
    assert_verified(ds, deep=True)
    path = cv.dataset_path(ds.name, cv.STATISTICS_JSON)
    stats = json.loads(ds.store.read_text(path))
    stats["entity_count"] += 1000
    ds.store.write_text(path, json.dumps(stats, indent=2))
    problems = [p.message for p in ds.verify(deep=True).problems]
    assert any("statistics differ from those of the published entities" in m for m in problems)


def test_a_rewritten_change_feed_is_caught_and_hides_nothing(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """A delta-rs delete() of an entity's rows in the change feed after its update
    was flushed: plain verify says so, and the next make does not trust the
    feed (a full pass), so the version holds the update and its diff says MOD."""
    ds = local_lake.create_dataset("feed_rewritten")
    for entity in ENTITIES[:10]:
        ds.add_entity(entity)
    ds.make()
    before = entities_of(entities_file(ds))
    changed = json.loads(json.dumps(ENTITIES[0]))
    changed["properties"]["name"].append("ACME Renamed")
    ds.add_entity(changed)
    ds.flush()
    feed = ds.changes_table
    table = DeltaTable(feed.uri, storage_options=feed.storage_options)
    table.delete(f"canonical_id = '{changed['id']}'")
    problems = [p.message for p in ds.verify().problems]
    assert any("not made by a lakehouse operation" in m for m in problems), problems
    result = ds.make()
    assert result.mode == "full" and "change feed" in str(result.reason), result.reason
    after = entities_of(entities_file(ds))
    assert "ACME Renamed" in after[changed["id"]]["properties"]["name"]
    diff, lines = head_diff(ds)
    assert diff["counts"]["MOD"] == 1, diff
    assert apply(before, lines) == after
    assert_verified(ds, deep=True)


def test_the_change_feed_is_covered_by_each_version(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """A feed file rewritten in place (no commit at all) fails plain verify."""
    ds = local_lake.create_dataset("feed_covered")
    for entity in ENTITIES[:6]:
        ds.add_entity(entity)
    ds.make()
    for entity in ENTITIES[6:]:
        ds.add_entity(entity)
    ds.make()
    version = ds.version()
    assert version is not None and version.manifest["tables"]["changes"]["files"]
    assert_verified(ds)
    entry = version.manifest["tables"]["changes"]["files"][0]
    path = cv.dataset_path(ds.name, cv.CHANGES_TABLE, entry["path"])
    data = bytearray(ds.store.read_bytes(path))
    data[len(data) // 2] ^= 0xFF
    ds.store.write_bytes(path, bytes(data))
    problems = [(p.file, p.message) for p in ds.verify().problems]
    assert (path, "data file content differs") in problems, problems
