"""Compact and optimize rewrite tables but never change what reads and exports see."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lakehouse_assets import conventions as cv
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.tables import Snapshot
from lakehouse_assets_tests.conftest import sample_entities
from lakehouse_assets_tests.test_flush import table_rows

ENTITIES = sample_entities()

#: An operation: ("write", entity index, origin) | ("delete", entity index) | ("flush",)
operation = st.one_of(
    st.tuples(st.just("write"), st.integers(0, len(ENTITIES) - 1), st.sampled_from(["a", "b"])),
    st.tuples(st.just("delete"), st.integers(0, len(ENTITIES) - 1)),
    st.just(("flush",)),
)


def apply(ds: Dataset, ops: list[tuple[Any, ...]]) -> None:
    for op in ops:
        if op[0] == "write":
            ds.add_entity(ENTITIES[op[1]], origin=op[2])
        elif op[0] == "delete":
            ds.delete_entity(str(ENTITIES[op[1]]["id"]))
        else:
            ds.flush()


def observe(ds: Dataset) -> tuple[Any, ...]:
    """Everything a reader can see: query results, every export, single gets."""
    entities = sorted(json.dumps(e.to_dict(), sort_keys=True) for e in ds.query())
    ds.export(["statements", "entities", "statistics"], force=True)
    files = tuple(
        ds.store.read_bytes(cv.dataset_path(ds.name, p))
        for p in (cv.STATEMENTS_CSV, cv.ENTITIES_JSON, cv.STATISTICS_JSON)
    )
    gets = tuple(bool(ds.get_entity(str(e["id"]))) for e in ENTITIES)
    return entities, files, gets


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(operation, min_size=3, max_size=12))
def test_compact_and_optimize_change_nothing_visible(spark, tmp_path: Path, ops) -> None:  # type: ignore[no-untyped-def]
    lake = Lakehouse(tmp_path / f"lake-{abs(hash(tuple(ops)))}")
    ds = lake.create_dataset("property")
    apply(ds, [*ops, ("flush",)])
    before = observe(ds)
    result = ds.compact()
    log = table_rows(ds, "translog")
    assert all(r["deleted_at"] is None for r in log)  # deleted rows are gone from both
    assert result.live == len(table_rows(ds)) == len(log)
    assert observe(ds) == before
    ds.optimize(vacuum=True, retention_hours=0)
    assert observe(ds) == before


def test_optimize_merges_files_and_tags(spark, local_lake: Lakehouse) -> None:  # type: ignore[no-untyped-def]
    ds = local_lake.create_dataset("optimizing")
    for e in ENTITIES:  # one flush per entity: many small files
        ds.add_entity(e)
        ds.flush()
    files_before = len(Snapshot.load(ds.statements_table).files)
    assert files_before == len(ENTITIES)
    entities_before = [e.to_dict() for e in ds.query(flush=False)]
    result = ds.optimize()
    assert result.files_removed >= files_before and result.files_added >= 1
    assert len(Snapshot.load(ds.statements_table).files) < files_before
    assert [e.to_dict() for e in ds.query(flush=False)] == entities_before
    assert ds.core_tags.get(cv.STATEMENTS_OPTIMIZED) is not None
    # the replaced files stay for older readers until vacuum removes them
    vacuumed = ds.optimize(vacuum=True, retention_hours=0)
    assert vacuumed.vacuumed >= files_before


def test_compact_on_empty_dataset_is_a_no_op(spark, local_lake: Lakehouse) -> None:  # type: ignore[no-untyped-def]
    ds = local_lake.create_dataset("nothing")
    assert ds.compact().live == 0
    assert ds.optimize().files_added == 0
