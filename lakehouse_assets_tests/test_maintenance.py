"""Compact and optimize rewrite tables (that they change nothing visible is a property:
test_properties_dataset)."""

from __future__ import annotations

from lakehouse_assets import conventions as cv
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.tables import Snapshot
from lakehouse_assets_tests.conftest import sample_entities

ENTITIES = sample_entities()


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
