"""Incremental exports are byte for byte the full rebuild, as a property (issue 34).

:class:`IncrementalMachine` writes entities (two origins), writes them again
with one more value, deletes them, deletes and re-adds them before one flush,
writes every entity of the pool again at once, flushes (in one batch or in a
batch per bucket or two), compacts and optimizes, and kills a flush or an
export (SIGKILL, in a child process) at any of their fault points, the
incremental export's own included, in any order; an export after any of that
(incremental where the change feed allows, chained over several flushes and
crashes) must write exactly the bytes a forced full pass writes for the same
snapshot, and hold every acknowledged statement and nothing else (the model
of :mod:`.helpers.model`).

Statements that cross buckets: an entity's statements are in its bucket
(:func:`.journal.bucket_of`); the 13 entities of the pool are in 13
buckets, so a flush with a small batch size runs batch after batch (each its
own translog version and change-feed commit, a crash between them leaving
some done), and a change of the whole pool makes the incremental export's
point read span more buckets than it queries one by one
(:data:`.query.POINT_BUCKETS`).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults
from lakehouse_assets.journal import bucket_of
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.query import POINT_BUCKETS
from lakehouse_assets_tests.conftest import PROFILE, examples, sample_entities
from lakehouse_assets_tests.helpers.crash import crash
from lakehouse_assets_tests.helpers.model import Model, seen_in_exports

THREE = ["statements", "entities", "statistics"]
FILES = (cv.STATEMENTS_CSV, cv.ENTITIES_JSON, cv.STATISTICS_JSON)
POOL: list[dict[str, Any]] = sample_entities()
ORIGINS = ("crawl", "enrich")
OPS = (
    "write",
    "write again with one more value",
    "delete",
    "delete then add again",
    "write the whole pool again with one more value",
)
CHANGES = st.tuples(st.sampled_from(OPS), st.sampled_from(POOL), st.sampled_from(ORIGINS))
#: a flush's batch size: about a bucket a batch (several translog versions and
#: change-feed commits per flush), or the whole journal in one batch
BATCH_ROWS = {"a batch per bucket or two": 4, "one batch": 1_000_000}
#: (operation, fault point) a child process is killed at; the first is what the
#: simplest example draws (Hypothesis tries it first: ``make test`` runs two):
#: an incremental export's files replaced, its state not yet written
KILLS = [("export_incremental", p) for p in reversed(faults.EXPORT_POINTS)] + [
    ("flush", p) for p in faults.FLUSH_POINTS
]
#: kills per run: few in ``make test`` (a child process costs its start and Spark's
#: connection), more in the thorough profile
KILLS_PER_RUN = examples(1, 3)


def more(entity: dict[str, Any], value: str) -> dict[str, Any]:
    """The entity written again with one more value."""
    props = {k: list(v) for k, v in entity["properties"].items()}
    props.setdefault("description", []).append(value)  # Thing and Interval have it
    return {**entity, "properties": props}


class IncrementalMachine(RuleBasedStateMachine):
    """Changes, flushes, maintenance and kills; every export equals the full
    rebuild and what was acknowledged."""

    calls: Counter[str] = Counter()

    @initialize(work=st.sampled_from(["driver", "spark"]))
    def start(self, work: str) -> None:
        """``work``: who flushes a small batch and makes an incremental export's
        lines: the driver (a small change, the default), or Spark (as for a large
        one; the settings go to the killed children too)."""
        self.tmp = Path(tempfile.mkdtemp(prefix="incremental-"))
        lake = Lakehouse(self.tmp / "lake", journal_url=f"sqlite:///{self.tmp / 'j.sqlite'}")
        if work == "spark":
            lake.settings.flush_driver_rows = lake.settings.export_driver_statements = 0
        self.calls[f"work: {work}"] += 1
        self.ds = lake.create_dataset("incremental")
        self.model = Model(self.ds.name)
        #: entities changed since the last export that saved its state
        self.touched: set[str] = set()
        self.kills = 0
        self.killed = False  # since the last export (which is then compared)
        for entity in POOL[:3]:
            self.apply("write", entity, ORIGINS[0])
        self.ds.flush()
        self.ds.export(THREE)  # the first export: full, leaves the state
        self.touched.clear()

    def apply(self, op: str, entity: dict[str, Any], origin: str) -> None:
        """One change, to the dataset and to the model of what it acknowledged."""
        entity_id = str(entity["id"])
        if op == "write":
            self.ds.add_entity(entity, origin=origin)
            self.model.write(entity, origin)
        elif op == "write again with one more value":
            self.ds.add_entity(more(entity, "one more"), origin=origin)
            self.model.write(more(entity, "one more"), origin)
        elif op == "delete":
            self.ds.delete_entity(entity_id)
            self.model.delete_entity(entity_id)
        elif op == "delete then add again":  # before one flush
            self.ds.delete_entity(entity_id)
            self.ds.add_entity(entity, origin=origin)
            self.model.delete_entity(entity_id)
            self.model.write(entity, origin)
        else:  # every entity, so the change spans every bucket of the pool
            for each in POOL:
                self.ds.add_entity(more(each, "the whole pool"), origin=origin)
                self.model.write(more(each, "the whole pool"), origin)
            self.touched |= {str(each["id"]) for each in POOL}
        self.touched.add(entity_id)
        self.calls[op] += 1

    @rule(
        changes=st.lists(CHANGES, min_size=1, max_size=4),
        flush=st.sampled_from([None, *BATCH_ROWS]),
        maintenance=st.sampled_from([None, "compact", "optimize"]),
        check=st.booleans(),
        data=st.data(),
    )
    def change_and_export(
        self,
        changes: list[tuple[str, dict[str, Any], str]],
        flush: str | None,
        maintenance: str | None,
        check: bool,
        data: st.DataObject,
    ) -> None:
        """Some changes; maybe a kill (:meth:`kill`); a flush (or the export's own
        flush-first), maybe a compaction or an optimize; an export (incremental
        where it can be); with ``check`` or after a kill, a forced full pass of
        the same snapshot must write the same bytes (and leaves its own state:
        without it the next export chains on this one's)."""
        with self.noted():
            self.step(changes, flush, maintenance, check, data)

    def step(
        self,
        changes: list[tuple[str, dict[str, Any], str]],
        flush: str | None,
        maintenance: str | None,
        check: bool,
        data: st.DataObject,
    ) -> None:
        for op, entity, origin in changes:
            self.apply(op, entity, origin)
        if self.kills < KILLS_PER_RUN:
            kill = data.draw(st.tuples(st.sampled_from(KILLS), st.integers(1, 2)) | st.none())
            if kill is not None:
                self.kill(*kill[0], hit=kill[1], batch_rows=BATCH_ROWS[flush or "one batch"])
        if flush is not None:
            flushed = self.ds.flush(batch_rows=BATCH_ROWS[flush])
            batches = "several batches" if flushed.batches > 1 else "one or none"
            self.calls[f"flush in {batches}"] += 1
        if maintenance == "compact":
            self.ds.compact()
        elif maintenance == "optimize":
            self.ds.optimize(vacuum=True, retention_hours=0)
        self.export(check=check or self.killed)

    def kill(self, operation: str, point: str, *, hit: int, batch_rows: int) -> None:
        """A flush or an export (its flush-first included) in a child process that
        SIGKILLs itself the ``hit``-th time it reaches ``point``; the machine
        carries on with whatever that left (the changes before it were acknowledged)."""
        self.kills += 1
        died = crash(self.ds, operation, point, hit, batch_rows=batch_rows)
        self.calls[f"killed at {point}" if died else f"{point} not reached"] += 1
        if died:
            self.killed = True
        elif operation == "export_incremental":  # it ran to its end, state saved
            self.touched.clear()

    def export(self, *, check: bool) -> None:
        # with index.json: its published version is a translog commit of no data
        result = self.ds.export([*THREE, "index"])
        self.calls[f"export_{result.mode}"] += 1
        buckets = {bucket_of(entity_id) for entity_id in self.touched}
        if result.mode == "incremental" and len(buckets) > POINT_BUCKETS:
            self.calls[f"incremental export over more than {POINT_BUCKETS} buckets"] += 1
        self.touched.clear()
        if check:
            self.compare()
        self.killed = False

    def compare(self) -> None:
        """The exports hold what was acknowledged, and are the full rebuild's bytes."""
        entities, rows = seen_in_exports(self.ds)
        assert entities == self.model.entities(), "the entities differ from the acknowledged"
        assert rows == self.model.csv_rows(), "the statements differ from the acknowledged"
        snapshot = self.ds.snapshot().versions
        made = {p: self.ds.store.read_bytes(cv.dataset_path(self.ds.name, p)) for p in FILES}
        full = self.ds.export(THREE, force=True)
        assert tuple(full.snapshot) == snapshot
        for path in FILES:
            rebuilt = self.ds.store.read_bytes(cv.dataset_path(self.ds.name, path))
            assert made[path] == rebuilt, f"{path} differs from the full rebuild"
        self.calls["compared"] += 1

    @contextmanager
    def noted(self) -> Iterator[None]:
        """A failure is counted and printed when it happens: a long thorough run's
        log shows it before Hypothesis has shrunk it."""
        try:
            yield
        except Exception as exc:
            self.calls["failed"] += 1
            print(f"IncrementalMachine failed: {exc!r}"[:3000], file=sys.stderr)
            raise

    def teardown(self) -> None:
        if hasattr(self, "ds"):
            try:
                with self.noted():
                    self.export(check=True)  # every run ends compared, whatever it drew
            finally:
                shutil.rmtree(self.tmp, ignore_errors=True)
                self.calls["runs"] += 1
                # a long thorough run shows how far it got (with ``-s``)
                print(f"IncrementalMachine: {dict(self.calls)}", file=sys.stderr)


def test_incremental_exports_equal_the_full_rebuild(spark: Any) -> None:
    IncrementalMachine.calls.clear()
    runs = examples(2, 100)
    run_state_machine_as_test(
        IncrementalMachine,
        settings=settings(max_examples=runs, stateful_step_count=examples(3, 6), deadline=None),
    )
    calls = IncrementalMachine.calls
    assert calls["compared"] >= runs, calls
    # the property is about incremental exports: some of them were
    assert calls["export_incremental"] > 0, calls
    # and about kills between the steps: some processes died at a fault point (the
    # few examples of make test may draw none, nor the cases below)
    if PROFILE == "thorough":
        assert any(k.startswith("killed at ") for k in calls), calls
        # statements across buckets: flushes batch by batch, point reads over a span
        assert calls["flush in several batches"] > 0, calls
        assert calls[f"incremental export over more than {POINT_BUCKETS} buckets"] > 0, calls
