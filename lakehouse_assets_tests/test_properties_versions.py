"""Every published version true, as a property (issue 52).

:class:`VersionsMachine` drives one local lake (SQLite journal) through random
sequences of what users, the lakehouse and other Delta writers do to a
dataset, in any order:

- **writes** of entities of a small pool (the 13 sample entities: companies,
  people, ownerships and a directorship, so the graph index has edges),
  **writes again with a changed value** (one more ``description``),
  **deletes** (the facade's ``delete_entity``);
- **foreign delta-rs commits** on the statements table, as another Delta
  writer makes them: ``DeltaTable.delete("canonical_id = '…'")`` of one
  entity's rows, and ``write_deltalake(mode="append")`` of a statement copied
  from one of an entity's rows with another value (and so another id);
- **flush**, **make** (the publish), **compact**, **optimize** with a vacuum
  of retention 0, **graph rebuild** and **graph update** (what ``lakehouse
  graph rebuild`` / ``update`` call). A change or a foreign commit may be
  followed by a flush, make, compact, optimize or graph update in the same
  step (rules are drawn about evenly; this makes "change, then publish" or
  "change, then maintenance" likely in few examples).

After every step (:meth:`VersionsMachine.check`):

1. **verify passes on every untampered lake**: ``ds.verify(deep=True)``
   (``lakehouse verify --deep``: the head's logical hash and statistics
   recomputed from the tables as well) reports no problem. Foreign commits are the one exception, by design: verify reports
   a Delta commit after the head that no lakehouse operation made ("a
   foreign writer changed the table") and the data files only such a commit
   added ("covered by no version"). While a foreign commit is not published
   (the head names an older statements table version), the only problems
   allowed are those naming its log entry or a file it added; once a version
   covers it, verify must pass with no problem at all. Nothing else touches
   the lake: any other problem is a false alarm, or damage the lakehouse did
   itself.
2. **make publishes what the tables hold**: after ``make`` the head covers
   every foreign commit made before it (its statements table version is at
   least theirs); otherwise verify would report them for ever and the exports
   would not hold them.
3. **yente's contract**: the published diffs compose to the diff of the full
   exports. For every version the machine keeps the ``entities.ftm.json`` that
   version published (read right after the step that published it, held to
   the SHA-256 its manifest records); for every older version ``v``,
   ``changes_between(ds, v, head)`` applied to ``v``'s entities (ADD/MOD set
   the entity by id, DEL removes it) must give the head's entities, and each
   version's own diff file applied to its parent's entities must give its own.
   Entities are compared normalised (list values sorted, as
   :func:`lakehouse_assets.versions.diffs._normal` does).
4. **a version publishes what its tables hold**: a new version's
   ``entities.ftm.json`` equals the entities rendered from the tables at the
   versions its manifest names (``export --as-of``), and the head's
   ``statistics.json`` counts as many entities as its ``entities.ftm.json``
   has lines.

A version whose diff was skipped (its parent's files vacuumed before it was
published: the manifest's ``diff`` says ``skipped``) breaks the chain of
diffs: compositions across it are not checked, only counted.

Each kind of failure is asserted on a line of its own, so Hypothesis shrinks
and reports each as a distinct failure. A failure is also printed when it
happens (``-s``), before Hypothesis shrinks it. In ``make test`` (the ``ci``
profile) a few short runs; ``make test-thorough`` runs 100 longer ones.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    rule,
    run_state_machine_as_test,
)

from lakehouse_assets import conventions as cv
from lakehouse_assets import graph
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.tables.schemas import STATEMENTS_SCHEMA
from lakehouse_assets.tables.snapshot import Snapshot, read_files
from lakehouse_assets.versions import Version, changes_between
from lakehouse_assets_tests.conftest import PROFILE, examples, sample_entities
from lakehouse_assets_tests.helpers.data import normal

POOL: list[dict[str, Any]] = sample_entities()
IDS = [str(e["id"]) for e in POOL]
BY_ID = {str(e["id"]): e for e in POOL}
ORIGIN = "crawl"
#: what a change or a foreign commit is followed by in the same step
THEN = st.sampled_from([None, "flush", "make", "compact", "optimize", "graph update"])


def changed(entity: dict[str, Any], value: str) -> dict[str, Any]:
    """The entity written again with one more value (every schema of the pool is
    a Thing or an Interval: both have ``description``)."""
    props = {k: list(v) for k, v in entity["properties"].items()}
    props.setdefault("description", []).append(value)
    return {**entity, "properties": props}


def parse_entities(raw: bytes) -> dict[str, dict[str, Any]]:
    """An ``entities.ftm.json`` as normalised entities by id (each id once)."""
    out: dict[str, dict[str, Any]] = {}
    for line in raw.splitlines():
        if line.strip():
            data = orjson.loads(line)
            assert data["id"] not in out, f"entity {data['id']} twice in entities.ftm.json"
            out[str(data["id"])] = normal(data)
    return out


def apply_changes(
    entities: Mapping[str, dict[str, Any]], changes: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """``entities`` after a diff's lines, as yente applies them."""
    out = dict(entities)
    for change in changes:
        eid = str(change["entity"]["id"])
        if change["op"] in ("ADD", "MOD"):
            out[eid] = normal(change["entity"])
        elif change["op"] == "DEL":
            out.pop(eid, None)
        else:
            raise AssertionError(f"unknown op in a diff: {change!r}")
    return out


def describe_difference(
    got: Mapping[str, dict[str, Any]], want: Mapping[str, dict[str, Any]]
) -> str:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    return f"missing {missing}, extra {extra}, different {differ}"


@dataclass
class Foreign:
    """A commit another Delta writer made on the statements table."""

    kind: str
    version: int
    log: str  # the log entry, as verify names it
    files: set[str] = field(default_factory=set)  # the data files it added (lake paths)

    def named_by(self, problem: Any) -> bool:
        if problem.file == self.log:
            return "foreign writer" in problem.message
        return problem.file in self.files and "covered by no version" in problem.message


@dataclass
class Published:
    """One version as the machine saw it published."""

    entities: dict[str, dict[str, Any]]
    lines: int
    source: str  # "export" (the file it published) or "as-of" (rendered again)


class VersionsMachine(RuleBasedStateMachine):
    """Writes, deletes, foreign Delta commits, flush, make, compact, optimize with
    vacuum and the graph index; every version verifies and its diffs compose."""

    calls: Counter[str] = Counter()

    @initialize(first=st.lists(st.sampled_from(IDS), min_size=2, max_size=5, unique=True))
    def start(self, first: list[str]) -> None:
        """A lake with a first version: ``first`` written and made."""
        self.tmp = Path(tempfile.mkdtemp(prefix="versions-"))
        lake = Lakehouse(self.tmp / "lake", journal_url=f"sqlite:///{self.tmp / 'j.sqlite'}")
        self.ds = lake.create_dataset("published")
        self.published: dict[int, Published] = {}
        self.foreign: list[Foreign] = []
        self.steps = 0
        for eid in first:
            self.ds.add_entity(BY_ID[eid], origin=ORIGIN)
        self.ds.make()
        self.count("make")
        self.check("start")

    # --- rules -----------------------------------------------------------------

    @rule(
        changes=st.lists(
            st.tuples(st.sampled_from(["write", "write changed", "delete"]), st.sampled_from(IDS)),
            min_size=1,
            max_size=3,
        ),
        then=THEN,
    )
    def change(self, changes: list[tuple[str, str]], then: str | None) -> None:
        """Journal writes: an entity, the entity with one more value, a delete."""
        for op, eid in changes:
            if op == "write":
                self.ds.add_entity(BY_ID[eid], origin=ORIGIN)
            elif op == "write changed":
                self.steps += 1
                self.ds.add_entity(changed(BY_ID[eid], f"change {self.steps}"), origin=ORIGIN)
            else:
                self.ds.delete_entity(eid)
            self.count(op)
        self.check("change")
        self.then(then)

    @rule()
    def flush(self) -> None:
        self.ds.flush()
        self.count("flush")
        self.check("flush")

    @rule()
    def make(self) -> None:
        """The publish; it publishes what the tables hold, foreign commits included."""
        waiting = [(f.kind, f.version) for f in self.foreign]
        self.ds.make()
        self.count("make")
        self.check("make")
        with self.noted("make"):
            assert not self.foreign, (
                f"make published no version covering the foreign commits {waiting} "
                f"(statements table versions; the head names "
                f"{self.ds.versions()[-1].table_version('statements')}): verify keeps "
                "reporting them and the exports do not hold them"
            )

    @rule()
    def compact(self) -> None:
        self.ds.compact()
        self.count("compact")
        self.check("compact")

    @rule()
    def optimize_and_vacuum(self) -> None:
        self.ds.optimize(vacuum=True, retention_hours=0)
        self.count("optimize")
        self.check("optimize")

    @rule()
    def graph_rebuild(self) -> None:
        graph.rebuild(self.ds)
        self.count("graph rebuild")
        self.check("graph rebuild")

    @rule()
    def graph_update(self) -> None:
        graph.update(self.ds)
        self.count("graph update")
        self.check("graph update")

    @rule(eid=st.sampled_from(IDS), then=THEN)
    def foreign_delete(self, eid: str, then: str | None) -> None:
        """Another writer's delta-rs ``delete()`` of one entity's rows."""
        rows = self.table_rows()
        target = None if rows is None else self.target(eid, rows, "delete")
        if target is None:
            self.count("foreign delete of nothing (skipped)")
            return
        from deltalake import DeltaTable

        uri = self.ds.statements_table.uri
        before = DeltaTable(uri).version()
        DeltaTable(uri).delete(f"canonical_id = '{target}'")
        self.noted_foreign("delete", before)
        self.count("foreign delete")
        self.check("foreign delete")
        self.then(then)

    @rule(eid=st.sampled_from(IDS), then=THEN)
    def foreign_append(self, eid: str, then: str | None) -> None:
        """Another writer's delta-rs append: a statement copied from one of the
        entity's rows (not an entity reference) with another value and id."""
        from deltalake import DeltaTable, write_deltalake
        from followthemoney.statement import Statement

        rows = self.table_rows()
        target = None if rows is None else self.target(eid, rows, "append")
        if rows is None or target is None:
            self.count("foreign append of nothing (skipped)")
            return
        mine = rows.filter(
            pc.and_(
                pc.equal(rows.column("canonical_id"), target),
                pc.not_equal(rows.column("prop_type"), "entity"),
            )
        )
        self.steps += 1
        row = mine.slice(0, 1).to_pylist()[0]
        row["value"] = f"{row['value']} (foreign {self.steps})"
        row["original_value"] = None
        row["id"] = Statement.make_key(
            row["dataset"],
            row["entity_id"],
            row["prop"],
            row["value"],
            row["external"],
            row["lang"],
        )
        uri = self.ds.statements_table.uri
        before = DeltaTable(uri).version()
        write_deltalake(
            uri,
            pa.Table.from_pylist([row], schema=STATEMENTS_SCHEMA),
            mode="append",
            partition_by=["origin"],
        )
        self.noted_foreign("append", before)
        self.count("foreign append")
        self.check("foreign append")
        self.then(then)

    # --- helpers ---------------------------------------------------------------

    def then(self, step: str | None) -> None:
        """What follows a change or a foreign commit in the same step (rules are
        drawn about evenly: this makes a change followed by its publish or by
        maintenance likelier in the few examples of ``make test``)."""
        if step is not None:
            {
                "flush": self.flush,
                "make": self.make,
                "compact": self.compact,
                "optimize": self.optimize_and_vacuum,
                "graph update": self.graph_update,
            }[step]()

    def count(self, name: str) -> None:
        VersionsMachine.calls[name] += 1

    def table_rows(self) -> pa.Table | None:
        """Every row of the statements table at its latest version, as another
        Delta writer sees it (None before the first flush). Readers of the
        lakehouse see the version the translog last published, which a foreign
        commit is not until the next flush."""
        snapshot = Snapshot.load(self.ds.statements_table)
        if snapshot.version is None:
            return None
        return read_files(
            snapshot.files,
            STATEMENTS_SCHEMA,
            self.ds.statements_table.storage_options,
            partition="origin",
        )

    def target(self, eid: str, rows: pa.Table, kind: str) -> str | None:
        """``eid`` if the table holds rows of it that ``kind`` can change, else the
        next entity of the pool that it holds (noted in a failing example), so
        that a foreign commit is seldom drawn in vain."""
        present = set(rows.column("canonical_id").to_pylist())
        if kind == "append":
            present &= set(
                rows.filter(pc.not_equal(rows.column("prop_type"), "entity"))
                .column("canonical_id")
                .to_pylist()
            )
        start = IDS.index(eid)
        for other in IDS[start:] + IDS[:start]:
            if other in present:
                if other != eid:
                    note(f"foreign {kind}: {eid} is not in the table, so {other}")
                return other
        return None

    def noted_foreign(self, kind: str, before: int) -> None:
        """Remember the foreign commits after table version ``before``."""
        table_dir = cv.STATEMENTS_TABLE
        latest = self.ds.statements_table.table()
        assert latest is not None
        for version in range(before + 1, latest.version() + 1):
            log = cv.dataset_path(self.ds.name, table_dir, "_delta_log", f"{version:020d}.json")
            commit = Foreign(kind, version, log)
            for line in self.ds.store.read_text(log).splitlines():
                action = json.loads(line)
                if "add" in action:
                    commit.files.add(
                        cv.dataset_path(self.ds.name, table_dir, action["add"]["path"])
                    )
            self.foreign.append(commit)

    # --- the invariants --------------------------------------------------------

    def check(self, step: str) -> None:
        with self.noted(step):
            versions = self.ds.versions()
            self.record_new(versions)
            self.check_verify(versions)
            self.check_compositions(versions)
            self.check_statistics(versions)

    def record_new(self, versions: list[Version]) -> None:
        """Keep the entities of each version published since the last step: the
        live export where it is the one the version recorded (the head's, right
        after the step that published it), else rendered again as of it."""
        new = [v for v in versions if v.sequence not in self.published]
        for version in new:
            self.count("versions published")
            entry = next(e for e in version.manifest["exports"] if e["path"] == cv.ENTITIES_JSON)
            path = cv.dataset_path(self.ds.name, cv.ENTITIES_JSON)
            raw = self.ds.store.read_bytes(path) if self.ds.store.exists(path) else b""
            if hashlib.sha256(raw).hexdigest() == entry["sha256"]:
                source = "export"
            else:
                assert version is not versions[-1], (
                    f"version {version.sequence} (the head) was published with an "
                    "entities.ftm.json that is not the live export"
                )
                out = io.BytesIO()
                self.ds.export_as_of(version.sequence, "entities", out)
                raw, source = out.getvalue(), "as-of"
                self.count("version recorded as of it")
            entities = parse_entities(raw)
            self.published[version.sequence] = Published(
                entities, sum(1 for line in raw.splitlines() if line.strip()), source
            )
            # what it published is what its tables hold
            if source == "export":
                out = io.BytesIO()
                self.ds.export_as_of(version.sequence, "entities", out)
                held = parse_entities(out.getvalue())
                assert entities == held, (
                    f"version {version.sequence} ({(version.manifest.get('metadata') or {})}) "
                    "published an entities.ftm.json that differs from its tables: "
                    + describe_difference(entities, held)
                )
        # a version covers the foreign commits up to the table version it names
        head = versions[-1] if versions else None
        covered = head.table_version("statements") if head is not None else None
        self.foreign = [f for f in self.foreign if covered is None or f.version > int(covered)]

    def check_verify(self, versions: list[Version]) -> None:
        report = self.ds.verify(deep=True)
        unexplained = [
            str(p) for p in report.problems if not any(f.named_by(p) for f in self.foreign)
        ]
        if self.foreign and report.problems:
            self.count("verify named an unpublished foreign commit")
        if not unexplained:
            return
        pending = [(f.kind, f.version) for f in self.foreign]
        message = (
            "verify failed an untampered lake"
            + (f" (unpublished foreign commits: {pending})" if pending else "")
            + ": "
            + "; ".join(unexplained)
        )
        # one assertion per kind of problem: Hypothesis shrinks and reports
        # failures at different lines as distinct failures
        graph_state = [p for p in unexplained if cv.GRAPH_STATE in p]
        data_files = [p for p in unexplained if "data file" in p]
        assert not graph_state, message
        assert not data_files, message
        assert not unexplained, message

    def own_diff(self, version: Version) -> list[dict[str, Any]] | None:
        diff = version.manifest.get("diff") or {}
        if "path" not in diff:
            return None
        raw = self.ds.store.read_bytes(cv.dataset_path(self.ds.name, diff["path"]))
        assert hashlib.sha256(raw).hexdigest() == diff["sha256"]
        return [orjson.loads(line) for line in raw.splitlines() if line.strip()]

    def check_compositions(self, versions: list[Version]) -> None:
        if not versions:
            return
        by_seq = {v.sequence: v for v in versions}
        broken = set()  # versions whose own diff was skipped
        for version in versions:
            lines = self.own_diff(version)
            if lines is None:
                broken.add(version.sequence)
                self.count("diff skipped")
                continue
            parent = self.published[version.sequence - 1].entities if version.sequence > 1 else {}
            got = apply_changes(parent, lines)
            want = self.published[version.sequence].entities
            counts = (version.manifest.get("diff") or {}).get("counts")
            assert got == want, (
                f"version {version.sequence}'s diff ({counts}) applied to version "
                f"{version.sequence - 1}'s entities is not version {version.sequence}'s "
                f"entities.ftm.json: {describe_difference(got, want)}"
            )
        head = versions[-1]
        for version in versions[:-1]:
            if any(s in broken for s in range(version.sequence + 1, head.sequence + 1)):
                self.count("composition across a skipped diff (not checked)")
                continue
            changes = changes_between(self.ds, by_seq[version.sequence], head)
            got = apply_changes(self.published[version.sequence].entities, changes)
            want = self.published[head.sequence].entities
            assert got == want, (
                f"the diffs composed from version {version.sequence} to the head "
                f"{head.sequence}, applied to version {version.sequence}'s entities, are not "
                f"the head's entities.ftm.json: {describe_difference(got, want)}"
            )
            self.count("compositions checked")

    def check_statistics(self, versions: list[Version]) -> None:
        if not versions:
            return
        head = versions[-1]
        entry = next(e for e in head.manifest["exports"] if e["path"] == cv.STATISTICS_JSON)
        raw = self.ds.store.read_bytes(cv.dataset_path(self.ds.name, cv.STATISTICS_JSON))
        if hashlib.sha256(raw).hexdigest() != entry["sha256"]:
            return  # verify says so (an export rewritten after the head)
        stats = json.loads(raw)
        lines = self.published[head.sequence].lines
        assert stats["entity_count"] == lines, (
            f"version {head.sequence}'s statistics.json counts {stats['entity_count']} "
            f"entities, its entities.ftm.json has {lines}"
        )

    @contextmanager
    def noted(self, step: str) -> Iterator[None]:
        """A failure is counted and printed when it happens: a long thorough run's
        log shows it before Hypothesis has shrunk it."""
        try:
            yield
        except Exception as exc:
            self.count("failed")
            print(f"VersionsMachine failed after {step}: {exc!r}"[:3000], file=sys.stderr)
            raise

    def teardown(self) -> None:
        if hasattr(self, "tmp"):
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.count("runs")
            print(f"VersionsMachine: {dict(VersionsMachine.calls)}", file=sys.stderr)


def test_every_published_version_is_true(spark: Any) -> None:
    VersionsMachine.calls.clear()
    runs = examples(10, 100)
    run_state_machine_as_test(
        VersionsMachine,
        settings=settings(max_examples=runs, stateful_step_count=examples(8, 15), deadline=None),
    )
    calls = VersionsMachine.calls
    assert calls["runs"] >= runs, calls
    assert calls["versions published"] >= runs, calls
    if PROFILE == "thorough":
        assert calls["compositions checked"] > 0, calls
        assert calls["foreign delete"] > 0 and calls["foreign append"] > 0, calls
