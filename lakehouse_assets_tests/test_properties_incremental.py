"""Incremental exports are byte for byte the full rebuild, as a property (issue 34).

:class:`IncrementalMachine` writes entities (two origins), writes them again
with one more value, deletes them, deletes and re-adds them before one flush,
flushes, compacts and optimizes, in any order; an export after any of that
(incremental where the change feed allows, chained over several flushes)
must write exactly the bytes a forced full pass writes for the same snapshot.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from lakehouse_assets import conventions as cv
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets_tests.conftest import examples, sample_entities

THREE = ["statements", "entities", "statistics"]
FILES = (cv.STATEMENTS_CSV, cv.ENTITIES_JSON, cv.STATISTICS_JSON)
POOL: list[dict[str, Any]] = sample_entities()[:8]
ORIGINS = ("crawl", "enrich")


def more(entity: dict[str, Any], value: str) -> dict[str, Any]:
    """The entity written again with one more value."""
    props = {k: list(v) for k, v in entity["properties"].items()}
    props.setdefault("notes", []).append(value)
    return {**entity, "properties": props}


class IncrementalMachine(RuleBasedStateMachine):
    """Changes, flushes and maintenance; every export equals the full rebuild."""

    calls: Counter[str] = Counter()

    @initialize()
    def start(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="incremental-"))
        lake = Lakehouse(self.tmp / "lake", journal_url=f"sqlite:///{self.tmp / 'j.sqlite'}")
        self.ds = lake.create_dataset("incremental")
        for entity in POOL[:3]:
            self.ds.add_entity(entity, origin=ORIGINS[0])
        self.ds.flush()
        self.ds.export(THREE)  # the first export: full, leaves the state

    @rule(entity=st.sampled_from(POOL), origin=st.sampled_from(ORIGINS))
    def write(self, entity: dict[str, Any], origin: str) -> None:
        self.ds.add_entity(entity, origin=origin)
        self.calls["write"] += 1

    @rule(
        entity=st.sampled_from(POOL),
        origin=st.sampled_from(ORIGINS),
        value=st.sampled_from(["one more", "yet another"]),
    )
    def write_again_with_one_more_value(
        self, entity: dict[str, Any], origin: str, value: str
    ) -> None:
        self.ds.add_entity(more(entity, value), origin=origin)
        self.calls["rewrite"] += 1

    @rule(entity=st.sampled_from(POOL))
    def delete(self, entity: dict[str, Any]) -> None:
        self.ds.delete_entity(str(entity["id"]))
        self.calls["delete"] += 1

    @rule(entity=st.sampled_from(POOL), origin=st.sampled_from(ORIGINS))
    def delete_then_add_again(self, entity: dict[str, Any], origin: str) -> None:
        self.ds.delete_entity(str(entity["id"]))
        self.ds.add_entity(entity, origin=origin)
        self.calls["readd"] += 1

    @rule()
    def flush(self) -> None:
        self.ds.flush()
        self.calls["flush"] += 1

    @rule()
    def compact(self) -> None:
        self.ds.compact()
        self.calls["compact"] += 1

    @rule()
    def optimize(self) -> None:
        self.ds.optimize(vacuum=True, retention_hours=0)
        self.calls["optimize"] += 1

    @rule(check=st.booleans())
    def export(self, check: bool) -> None:
        """An export (incremental where it can be); with ``check``, then a forced full
        pass of the same snapshot, which must write the same bytes (and leaves its
        own state: without ``check`` the next export chains on this one's)."""
        result = self.ds.export(THREE)
        self.calls[f"export_{result.mode}"] += 1
        if check:
            self.compare()

    def compare(self) -> None:
        snapshot = self.ds.snapshot().versions
        made = {p: self.ds.store.read_bytes(cv.dataset_path(self.ds.name, p)) for p in FILES}
        full = self.ds.export(THREE, force=True)
        assert tuple(full.snapshot) == snapshot
        for path in FILES:
            rebuilt = self.ds.store.read_bytes(cv.dataset_path(self.ds.name, path))
            assert made[path] == rebuilt, f"{path} differs from the full rebuild"
        self.calls["compared"] += 1

    def teardown(self) -> None:
        if hasattr(self, "ds"):
            try:
                self.calls[f"export_{self.ds.export(THREE).mode}"] += 1
                self.compare()  # every run ends compared, whatever it drew
            finally:
                shutil.rmtree(self.tmp, ignore_errors=True)


def test_incremental_exports_equal_the_full_rebuild(spark: Any) -> None:
    IncrementalMachine.calls.clear()
    runs = examples(2, 100)
    run_state_machine_as_test(
        IncrementalMachine,
        settings=settings(max_examples=runs, stateful_step_count=examples(8, 12), deadline=None),
    )
    calls = IncrementalMachine.calls
    assert calls["compared"] >= runs, calls
    # the property is about incremental exports: some of them were
    assert calls["export_incremental"] > 0, calls
