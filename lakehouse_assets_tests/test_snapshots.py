"""Readers see one snapshot: during a flush, compact or optimize a reader sees the
dataset as it was before or as it is after, never half of it; a pinned reader
keeps reading its version while writers commit and vacuum runs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from lakehouse_assets import faults
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.query import live_statements
from lakehouse_assets_tests.conftest import sample_entities

#: the data-plane group: ``make test`` runs it with Spark Connect and in process
#: what a reader sees is decided by the commits and the snapshot reads, both the
#: driver's: the cluster pass, whose executors change nothing of it, leaves it out
pytestmark = [pytest.mark.spark_modes, pytest.mark.driver]

ENTITIES = sample_entities()


def visible(ds: Dataset) -> list[str]:
    """Everything query and get show, flush off (a reader, not a writer)."""
    seen = [json.dumps(e.to_dict(), sort_keys=True) for e in ds.query(flush=False)]
    for e in ENTITIES:
        got = ds.get_entity(str(e["id"]))
        seen.append(f"get {e['id']}: {got is not None and len(list(got.statements))}")
    return sorted(seen)


def prepared(lake: Lakehouse) -> Dataset:
    """A flushed dataset, and a journal whose flush adds AND deletes statements."""
    ds = lake.create_dataset("readers")
    for e in ENTITIES[:8]:
        ds.add_entity(e, origin="a")
    ds.flush()
    for e in ENTITIES[8:]:
        ds.add_entity(e, origin="a")
    ds.delete_entity(str(ENTITIES[0]["id"]))
    ds.delete_entity(str(ENTITIES[1]["id"]))
    return ds


def test_a_reader_during_a_flush_sees_before_or_after(spark: Any, lake: Lakehouse) -> None:
    ds = prepared(lake)
    before = visible(ds)
    seen: dict[str, list[str]] = {}

    def look(name: str) -> None:
        seen[name] = visible(ds)

    with (
        faults.on("flush.after_statements_commit", lambda: look("appended")),
        faults.on("flush.after_translog_commit", lambda: look("published")),
    ):
        ds.flush()
    after = visible(ds)
    assert before != after
    # the new statements are committed, but not yet published with their translog
    assert seen["appended"] == before
    assert seen["published"] == after


def test_readers_during_compact_and_optimize_see_the_same(spark: Any, lake: Lakehouse) -> None:
    ds = prepared(lake)
    ds.flush()
    for e in ENTITIES[2:5]:  # more files, more deletes
        ds.delete_entity(str(e["id"]))
        ds.flush()
    expected = visible(ds)
    seen: list[list[str]] = []
    points = (
        "compact.after_statements_commit",
        "compact.after_translog_commit",
        "optimize.after_statements_commit",
        "optimize.after_translog_commit",
        "optimize.before_vacuum",
    )
    hooks = [faults.on(p, lambda: seen.append(visible(ds))) for p in points]
    for hook in hooks:
        hook.__enter__()
    try:
        ds.compact()
        ds.optimize(vacuum=True)
    finally:
        for hook in hooks:
            hook.__exit__(None, None, None)
    assert len(seen) == len(points)
    assert all(s == expected for s in seen)
    assert visible(ds) == expected


def test_a_pinned_reader_keeps_its_version(spark: Any, lake: Lakehouse) -> None:
    ds = prepared(lake)
    pinned = ds.snapshot()
    rows = live_statements(ds, snapshot=pinned).to_pylist()
    ds.flush()  # appends and tombstones
    ds.compact()  # rewrites the main table without the deleted rows
    ds.optimize(vacuum=True)  # default retention: the pinned version's files stay
    assert live_statements(ds, snapshot=pinned).to_pylist() == rows
    assert live_statements(ds).to_pylist() != rows
