"""Guarantees of a dataset, as properties: a model of what was acknowledged must
equal what get, query and the exports return, whatever happens in between.

The model is a plain dict of acknowledged live statements, keyed by (origin,
statement id). Writes add to it, deletes remove from it; flush, compact,
optimize, vacuum, exports and crashes must not change what readers see.

* :class:`LakeMachine` (stateful): writes by several tenants and origins,
  deletes of entities and statements, flush, compact, optimize + vacuum,
  export, a crash (SIGKILL) at any fault point of flush/export/compact/
  optimize, and a second writer committing in the middle of a flush;
* property 4: compact and optimize never change any query, get or export;
* property 5: kill -9 at any injected point, then a rerun: nothing
  acknowledged lost, nothing doubled.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets.tables.schemas import STATEMENTS_SCHEMA
from lakehouse_assets.tables.snapshot import Snapshot, read_files
from lakehouse_assets_tests.conftest import examples, make_bucket, sample_entities
from lakehouse_assets_tests.helpers.crash import CRASH_POINTS, crash, rerun
from lakehouse_assets_tests.helpers.model import Model, normal, seen_in_exports

BASE = sample_entities()[:8]
#: The entity pool: sample entities and variants of some (other property values).
POOL: list[dict[str, Any]] = [
    *BASE,
    *(
        {"id": e["id"], "schema": e["schema"], "properties": {"notes": [f"variant of {e['id']}"]}}
        for e in BASE[:4]
    ),
]
ORIGINS = ("crawl", "enrich")
TENANTS = ("lakehouse", "aleph")


# --- what readers see -------------------------------------------------------------------


def seen_by_query(ds: Dataset) -> dict[str, dict[str, Any]]:
    return {e.id: normal(e.to_dict()) for e in ds.query()}  # flushes first


def table_keys(ds: Dataset) -> list[tuple[str, str]]:
    snap = Snapshot.load(ds.statements_table)
    table = read_files(
        snap.files, STATEMENTS_SCHEMA, ds.statements_table.storage_options, partition="origin"
    )
    return list(
        zip(table.column("origin").to_pylist(), table.column("id").to_pylist(), strict=True)
    )


def assert_matches(ds: Dataset, model: Model, *, exports: bool = False) -> None:
    expected = model.entities()
    assert seen_by_query(ds) == expected
    keys = table_keys(ds)
    assert len(keys) == len(set(keys)), "a statement is stored twice"
    for entity_id in list(expected)[:3]:
        got = ds.get_entity(entity_id)
        assert got is not None and normal(got.to_dict()) == expected[entity_id]
    if exports:
        entities, rows = seen_in_exports(ds)
        assert entities == expected
        assert rows == model.csv_rows()


# --- the state machine ----------------------------------------------------------------------


def lake_at(where: str, tmp: Path, s3: Settings | None) -> Lakehouse:
    journal = f"sqlite:///{tmp / 'journal.sqlite'}"
    if where == "local" or s3 is None:
        return Lakehouse(tmp / "lake", journal_url=journal)
    return Lakehouse(f"s3://{make_bucket(s3)}/lake", settings=s3, journal_url=journal)


class LakeMachine(RuleBasedStateMachine):
    """Tenants write and delete, the lakehouse flushes, compacts, optimizes,
    exports and crashes; readers always see exactly what was acknowledged."""

    where = "local"
    s3: Settings | None = None
    crashes = True
    #: rules run, by name, over all examples (the test checks real work was done)
    calls: Counter[str] = Counter()

    @initialize()
    def start(self) -> None:
        import tempfile

        self.tmp = Path(tempfile.mkdtemp(prefix="lakemachine-"))
        self.lake = lake_at(self.where, self.tmp, self.s3)
        self.ds = self.lake.create_dataset("machine")
        self.model = Model(self.ds.name)
        self.exported = False
        # every run starts from acknowledged data: with the few examples of the
        # ci profile, Hypothesis may otherwise draw runs without any write
        for entity in BASE[:2]:
            self.write(entity, ORIGINS[0], TENANTS[0])

    def count(self, name: str) -> None:
        LakeMachine.calls[name] += 1

    def dataset(self, tenant: str) -> Dataset:
        return Lakehouse(self.lake.store.uri, settings=self.lake.settings, tenant=tenant).dataset(
            self.ds.name
        )

    @rule(
        entity=st.sampled_from(POOL),
        origin=st.sampled_from(ORIGINS),
        tenant=st.sampled_from(TENANTS),
    )
    def write(self, entity: dict[str, Any], origin: str, tenant: str) -> None:
        self.dataset(tenant).add_entity(entity, origin=origin)
        self.model.write(entity, origin)
        self.count("write")
        self.exported = False

    @rule(entity=st.sampled_from(BASE), tenant=st.sampled_from(TENANTS))
    def delete_entity(self, entity: dict[str, Any], tenant: str) -> None:
        self.dataset(tenant).delete_entity(str(entity["id"]))
        self.count("delete_entity")
        self.model.delete_entity(str(entity["id"]))
        self.exported = False

    @precondition(lambda self: bool(self.model.live))
    @rule(data=st.data())
    def delete_statement(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model.live)))
        self.count("delete_statement")
        self.ds.delete_statement(self.model.live[key])
        self.model.delete_statement(key)
        self.exported = False

    @rule()
    def flush(self) -> None:
        self.ds.flush(batch_rows=20)
        self.count("flush")

    @rule(entity=st.sampled_from(POOL), origin=st.sampled_from(ORIGINS))
    def write_during_a_flush(self, entity: dict[str, Any], origin: str) -> None:
        other = self.dataset("aleph")
        self.count("write_during_a_flush")

        def write() -> None:
            other.add_entity(entity, origin=origin)

        with faults.on("flush.after_claim", write):
            self.ds.flush(batch_rows=20)
        self.model.write(entity, origin)
        self.exported = False

    @rule()
    def compact(self) -> None:
        self.ds.compact()
        self.count("compact")

    @rule()
    def optimize_and_vacuum(self) -> None:
        self.ds.optimize(vacuum=True, retention_hours=0)
        self.count("optimize")

    @rule()
    def export(self) -> None:
        self.ds.export(["statements", "entities", "statistics", "index"], force=True)
        self.exported = True
        self.count("export")

    @precondition(lambda self: self.crashes)
    @rule(data=st.data())
    def crash_and_rerun(self, data: st.DataObject) -> None:
        op = data.draw(st.sampled_from(sorted(CRASH_POINTS)))
        self.count("crash")
        point = data.draw(st.sampled_from(CRASH_POINTS[op]))
        crash(self.ds, op, point)
        rerun(self.ds, op)
        self.exported = op == "export"

    @invariant()
    def readers_see_what_was_acknowledged(self) -> None:
        if hasattr(self, "ds"):
            assert_matches(self.ds, self.model, exports=self.exported)

    def teardown(self) -> None:
        import shutil

        if hasattr(self, "tmp"):
            shutil.rmtree(self.tmp, ignore_errors=True)


def test_lake_machine_local(spark: Any) -> None:
    LakeMachine.where = "local"
    LakeMachine.calls.clear()
    runs = examples(4, 100)
    run_state_machine_as_test(
        LakeMachine,
        settings=settings(max_examples=runs, stateful_step_count=examples(8, 15), deadline=None),
    )
    # the machine did real work: writes, deletes and the lakehouse's operations
    assert sum(LakeMachine.calls.values()) >= runs * 2, LakeMachine.calls
    assert LakeMachine.calls["write"] > 0, LakeMachine.calls


def test_lake_machine_s3(spark: Any, s3_settings: Settings) -> None:
    LakeMachine.where = "s3"
    LakeMachine.s3 = s3_settings
    LakeMachine.crashes = False  # crashes on S3: property 5 below
    LakeMachine.calls.clear()
    runs = examples(3, 20)
    try:
        run_state_machine_as_test(
            LakeMachine,
            settings=settings(
                max_examples=runs, stateful_step_count=examples(6, 10), deadline=None
            ),
        )
    finally:
        LakeMachine.crashes = True
    assert sum(LakeMachine.calls.values()) >= runs * 2, LakeMachine.calls


# --- property 4 and 5 --------------------------------------------------------------------------

operation = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(POOL), st.sampled_from(ORIGINS)),
    st.tuples(st.just("delete"), st.sampled_from(BASE), st.just("")),
    st.tuples(st.just("flush"), st.just({}), st.just("")),
)


def apply(ds: Dataset, model: Model, ops: list[tuple[str, dict[str, Any], str]]) -> None:
    for kind, entity, origin in ops:
        if kind == "write":
            ds.add_entity(entity, origin=origin)
            model.write(entity, origin)
        elif kind == "delete":
            ds.delete_entity(str(entity["id"]))
            model.delete_entity(str(entity["id"]))
        else:
            ds.flush(batch_rows=20)


@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_compact_and_optimize_change_nothing_visible(
    spark: Any, where: str, tmp_path_factory: pytest.TempPathFactory, request: Any
) -> None:
    """**Property 30 (Mini Lakehouse): query result preservation.**"""
    s3 = request.getfixturevalue("s3_settings") if where == "s3" else None
    runs = examples(4, 100) if where == "local" else examples(1, 20)

    @settings(max_examples=runs, deadline=None)
    @given(ops=st.lists(operation, min_size=3, max_size=12))
    def prop(ops: list[tuple[str, dict[str, Any], str]]) -> None:
        lake = lake_at(where, tmp_path_factory.mktemp("p4"), s3)
        ds = lake.create_dataset("preserved")
        model = Model(ds.name)
        apply(ds, model, [*ops, ("flush", {}, "")])
        ds.export(["statements", "entities", "statistics"], force=True)
        assert_matches(ds, model, exports=True)
        before = [
            ds.store.read_bytes(cv.dataset_path(ds.name, p))
            for p in (cv.STATEMENTS_CSV, cv.ENTITIES_JSON, cv.STATISTICS_JSON)
        ]
        ds.compact()
        assert_matches(ds, model)
        ds.optimize(vacuum=True, retention_hours=0)
        assert_matches(ds, model)
        ds.export(["statements", "entities", "statistics"], force=True)
        after = [
            ds.store.read_bytes(cv.dataset_path(ds.name, p))
            for p in (cv.STATEMENTS_CSV, cv.ENTITIES_JSON, cv.STATISTICS_JSON)
        ]
        assert after == before  # byte for byte

    prop()


def test_kill_at_any_point_then_rerun_loses_and_doubles_nothing(
    spark: Any, where: str, tmp_path_factory: pytest.TempPathFactory, request: Any
) -> None:
    """**Property 25 (Mini Lakehouse): operational continuity** — here, of a process
    killed with SIGKILL at any fault point of flush, export, compact and optimize."""
    s3 = request.getfixturevalue("s3_settings") if where == "s3" else None
    runs = examples(3, 100) if where == "local" else examples(1, 20)
    points = [(op, p) for op, ps in sorted(CRASH_POINTS.items()) for p in ps]

    @settings(max_examples=runs, deadline=None)
    @given(
        ops=st.lists(operation, min_size=2, max_size=8),
        target=st.sampled_from(points),
        hit=st.integers(1, 2),
    )
    def prop(ops: list[tuple[str, dict[str, Any], str]], target: tuple[str, str], hit: int) -> None:
        lake = lake_at(where, tmp_path_factory.mktemp("p5"), s3)
        ds = lake.create_dataset("killed")
        model = Model(ds.name)
        apply(ds, model, ops)
        # pending journal rows for the flush to work on; flushed data for the others
        if target[0] != "flush":
            ds.flush()
        op, point = target
        crash(ds, op, point, hit)
        assert_readable(ds)
        rerun(ds, op)
        if op == "export":
            assert_matches(ds, model, exports=True)
        assert_matches(ds, model)

    prop()


def assert_readable(ds: Dataset) -> None:
    """Right after a crash, before any repair: every reader still works."""
    for e in BASE[:3]:
        ds.get_entity(str(e["id"]))
    list(ds.query(flush=False))
    json.dumps(ds.snapshot().versions)
