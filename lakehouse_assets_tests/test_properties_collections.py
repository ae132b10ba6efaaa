"""A collection's incremental exports are byte for byte its full rebuild, as a property (issue 51).

:class:`CollectionMachine` keeps a collection of two leaves — the sample pool
as it is, and the same pool under ``b-`` ids with its references rewritten —
and, in any order, writes an entity of a leaf again with one more value,
deletes one, adds it back, flushes the leaf and maybe publishes it (its own
``make``), and decides judgements between ids of one schema (positive,
negative, unsure: a merge, a chain across both leaves, a split when a
positive is overruled). After each step the collection's ``make`` rebuilds
its tables and exports them, incrementally where its change feed allows
(:mod:`lakehouse_assets.collections.changes`); with ``check``, and always at
the end, a forced ``make`` (a full build and a full export of the same
inputs) must write exactly the same ``statements.csv``, ``entities.ftm.json``
and ``statistics.json``, and the entities must be one per cluster of the
judgements' positive edges (nomenklatura's components, checked here
independently of the lake's own union-find).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
from followthemoney import model
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

from lakehouse_assets import conventions as cv
from lakehouse_assets.collections import judgements
from lakehouse_assets.collections.make import make
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets_tests.conftest import examples, sample_entities

FILES = (cv.STATEMENTS_CSV, cv.ENTITIES_JSON, cv.STATISTICS_JSON)
POOL: list[dict[str, Any]] = sample_entities()
IDS = {str(e["id"]) for e in POOL}


def renamed(entity: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The entity under ``prefix``-ed ids, its references to the pool too."""
    props = {
        k: [f"{prefix}{v}" if v in IDS else v for v in values]
        for k, values in entity["properties"].items()
    }
    return {**entity, "id": f"{prefix}{entity['id']}", "properties": props}


def text_property(schema: str) -> str:
    """A free-text property of the schema (the pool's schemata each have one)."""
    props = model.get(schema).properties  # type: ignore[union-attr]
    return next(p for p in ("notes", "summary", "description") if p in props)


#: leaf name -> the prefix of its ids
LEAVES = {"leaf_a": "", "leaf_b": "b-"}
#: ids of each schema across both leaves: the pairs a judgement is drawn from
BY_SCHEMA: dict[str, list[str]] = defaultdict(list)
for _entity in POOL:
    for _prefix in LEAVES.values():
        BY_SCHEMA[str(_entity["schema"])].append(f"{_prefix}{_entity['id']}")
MERGEABLE = sorted(s for s, ids in BY_SCHEMA.items() if len(ids) > 1)
OPS = ("write again with one more value", "delete", "add back")


@st.composite
def judgement_pairs(draw: st.DrawFn) -> tuple[str, str, str]:
    ids = BY_SCHEMA[draw(st.sampled_from(MERGEABLE))]
    left = draw(st.sampled_from(ids))
    right = draw(st.sampled_from([i for i in ids if i != left]))
    return left, right, draw(st.sampled_from(["positive", "positive", "negative", "unsure"]))


class CollectionMachine(RuleBasedStateMachine):
    """Leaf writes, flushes, publishes and judgements; every collection export
    equals its full rebuild."""

    calls: Counter[str] = Counter()

    @initialize()
    def start(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="collection-property-"))
        self.lake = Lakehouse(self.tmp / "lake")
        self.leaves = {}
        for name, prefix in LEAVES.items():
            leaf = self.lake.create_dataset(name)
            leaf.write_entities([orjson.dumps(renamed(e, prefix)) for e in POOL], origin="crawl")
            leaf.flush()
            self.leaves[name] = leaf
        self.coll = self.lake.create_dataset("coll", children=list(LEAVES))
        judgements.decide(self.coll, "p-anna-berg", "b-p-anna-berg", "positive", user="t")
        self.deleted: set[tuple[str, str]] = set()
        self.make(check=False)

    @rule(
        leaf=st.sampled_from(sorted(LEAVES)),
        entity=st.sampled_from(POOL),
        op=st.sampled_from(OPS),
        publish=st.booleans(),
        check=st.booleans(),
    )
    def change_a_leaf(
        self, leaf: str, entity: dict[str, Any], op: str, publish: bool, check: bool
    ) -> None:
        """A leaf's entity changed, the leaf flushed (and maybe published), then
        the collection's make."""
        with self.noted():
            ds, item = self.leaves[leaf], renamed(entity, LEAVES[leaf])
            if op == "delete":
                ds.delete_entity(item["id"])
                self.deleted.add((leaf, item["id"]))
            else:
                if op == "write again with one more value":
                    item["properties"] = {
                        **item["properties"],
                        text_property(item["schema"]): [f"one more ({self.calls['steps']})"],
                    }
                ds.add_entity(item, origin="crawl")
                self.deleted.discard((leaf, item["id"]))
            ds.make() if publish else ds.flush()
            self.calls[op] += 1
            self.make(check=check)

    @rule(pairs=st.lists(judgement_pairs(), min_size=1, max_size=3), check=st.booleans())
    def judge(self, pairs: list[tuple[str, str, str]], check: bool) -> None:
        """Some judgements decided (each superseding its pair's), then make."""
        with self.noted():
            for left, right, judgement in pairs:
                judgements.decide(self.coll, left, right, judgement, user="t")
                self.calls[f"judgement {judgement}"] += 1
            self.make(check=check)

    def make(self, *, check: bool) -> None:
        result = make(self.coll)
        self.calls["steps"] += 1
        self.calls[f"export {result.exported.mode}"] += 1
        if check:
            self.compare()

    def compare(self) -> None:
        """The incremental files are the full rebuild's bytes; one entity per cluster."""
        made = {p: self.coll.store.read_bytes(cv.dataset_path(self.coll.name, p)) for p in FILES}
        make(self.coll, force=True)
        for path in FILES:
            rebuilt = self.coll.store.read_bytes(cv.dataset_path(self.coll.name, path))
            assert made[path] == rebuilt, f"{path} differs from the full rebuild"
        entities = [orjson.loads(line) for line in made[cv.ENTITIES_JSON].splitlines()]
        # a merged entity's id is its cluster's canonical id (``NK-``), its
        # referents the ids of the cluster that have statements
        got = {frozenset(e.get("referents") or [e["id"]]) for e in entities}
        live = {
            f"{prefix}{e['id']}"
            for leaf, prefix in LEAVES.items()
            for e in POOL
            if (leaf, f"{prefix}{e['id']}") not in self.deleted
        }
        assert got == self.clusters(live), "the entities are not the judgements' clusters"
        self.calls["compared"] += 1

    def clusters(self, live: set[str]) -> set[frozenset[str]]:
        """The live ids grouped by the live positive edges of the resolver table
        (connected components, computed here, not by the lake's union-find): a
        positive ``decide`` links ids through an ``NK-`` id, a deleted entity
        still joins a chain, but only ids with statements are referents."""
        parent = {i: i for i in live}

        def root(i: str) -> str:
            parent.setdefault(i, i)
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for edge in judgements.live(judgements.rows(self.coll)):
            if edge.judgement == "positive":
                parent[root(edge.source)] = root(edge.target)
        groups: dict[str, set[str]] = defaultdict(set)
        for i in live:
            groups[root(i)].add(i)
        return {frozenset(g) for g in groups.values()}

    @contextmanager
    def noted(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            self.calls["failed"] += 1
            print(f"CollectionMachine failed: {exc!r}"[:3000], file=sys.stderr)
            raise

    def teardown(self) -> None:
        if hasattr(self, "coll"):
            try:
                with self.noted():
                    self.compare()  # every run ends compared, whatever it drew
            finally:
                shutil.rmtree(self.tmp, ignore_errors=True)
                self.calls["runs"] += 1
                print(f"CollectionMachine: {dict(self.calls)}", file=sys.stderr)


def test_incremental_collection_exports_equal_the_full_rebuild(spark: Any) -> None:
    CollectionMachine.calls.clear()
    runs = examples(2, 50)
    run_state_machine_as_test(
        CollectionMachine,
        settings=settings(max_examples=runs, stateful_step_count=examples(3, 8), deadline=None),
    )
    calls = CollectionMachine.calls
    assert calls["compared"] >= runs, calls
    # the property is about incremental exports of a collection: some of them were
    assert calls["export incremental"] > 0, calls
