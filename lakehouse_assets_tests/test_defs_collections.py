"""Collections in the asset graph: lineage to the leaves, real builds, the sensor.

A real local lake with two collections (``coll`` of ``leaf_a`` and ``leaf_b``;
``solo`` of ``leaf_c``) and a dataset in none (``plain``); the definitions are
built from that lake's catalog as ``definitions.py`` builds them from the
environment's; runs are real materializations on a real Dagster instance.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.remote_representation.external_data import RepositorySnap
from dagster._utils.test.data_versions import get_stale_status_resolver

from lakehouse_assets import conventions as cv
from lakehouse_assets.collections import judgements
from lakehouse_assets.definitions import COMPUTED
from lakehouse_assets.definitions import defs as loaded
from lakehouse_assets.defs.assets import ASSETS
from lakehouse_assets.defs.checks import CHECKS
from lakehouse_assets.defs.collections import (
    catalog_collections,
    collection_assets,
    collection_key,
    collection_sensor,
)
from lakehouse_assets.defs.collections import judgements as judgements_asset
from lakehouse_assets.defs.freshness import CHECKS as FRESHNESS_CHECKS
from lakehouse_assets.defs.maintenance import ASSETS as MAINTENANCE
from lakehouse_assets.defs.partitions import DATASETS, datasets
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets_tests.helpers.defs import KEYS
from lakehouse_assets_tests.test_defs_assets import LINEAGE

LEAVES = {"leaf_a": "a", "leaf_b": "b", "leaf_c": "c", "plain": "p"}
COLLECTIONS = {"coll": ["leaf_a", "leaf_b"], "solo": ["leaf_c"]}


def person(eid: str, name: str) -> dict[str, Any]:
    return {"id": eid, "schema": "Person", "properties": {"name": [name]}}


def create(lake: Lakehouse) -> None:
    for name in LEAVES:
        lake.create_dataset(name)
    for name, children in COLLECTIONS.items():
        lake.create_dataset(name, children=children)


def definitions(lake: Lakehouse) -> dg.Definitions:
    """The dataset assets and the lake's collections, as ``definitions.py`` composes them."""
    found = catalog_collections(lake.store)
    return dg.Definitions(
        assets=[*ASSETS, *MAINTENANCE, judgements_asset, *collection_assets(found)],
        sensors=[collection_sensor(found)],
        resources=resources(lake),
    )


def resources(lake: Lakehouse) -> dict[str, Any]:
    return {
        "lakehouse": LakehouseResource(
            lake_uri=lake.settings.lake_uri, journal_url=lake.settings.journal_url
        ),
        "spark": SparkResource(),
    }


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as instance:
        yield instance


def test_the_code_location_has_the_sensor_and_the_judgements() -> None:
    """Loaded from the environment's lake (here one without collections)."""
    sensor = loaded.resolve_sensor_def("collection_changes")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    node = loaded.resolve_asset_graph().get(dg.AssetKey("judgements"))
    assert node.partitions_def == datasets and not node.is_executable


def test_each_collection_depends_on_exactly_its_leaves(
    local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    create(local_lake)
    # a collection of a collection: its leaves, resolved
    local_lake.create_dataset("nest", children=["coll", "leaf_c"])
    nested = {**COLLECTIONS, "nest": ["leaf_a", "leaf_b", "leaf_c"]}
    defs = definitions(local_lake)
    graph = defs.resolve_asset_graph()
    instance.add_dynamic_partitions(DATASETS, [*LEAVES, *nested])
    with partition_loading_context(dynamic_partitions_store=instance):
        for name, children in nested.items():
            key = collection_key(name)
            assert graph.get(key).partitions_def.get_partition_keys() == [name]  # type: ignore[union-attr]
            parents = graph.get_parents_partitions(key, name).parent_partitions
            assert {(p.asset_key.to_user_string(), p.partition_key) for p in parents} == {
                *(("index", leaf) for leaf in children),
                ("judgements", name),
            }
        for leaf, parents_of in (
            ("leaf_a", ["coll", "nest"]),
            ("leaf_b", ["coll", "nest"]),
            ("leaf_c", ["nest", "solo"]),
        ):
            children_of = graph.get_children_partitions(dg.AssetKey("index"), leaf)
            assert {(c.asset_key, c.partition_key) for c in children_of} == {
                (collection_key(parent), parent) for parent in parents_of
            }, leaf
        assert not graph.get_children_partitions(dg.AssetKey("index"), "plain")
        # a collection's own partitions of the dataset assets feed no collection asset
        assert not graph.get_children_partitions(dg.AssetKey("index"), "coll")
    # what the webserver and the daemon receive keeps the mapping (a custom mapping
    # would be dropped there, and the UI would show index[coll] → collection/coll)
    snap = RepositorySnap.from_def(defs.get_repository_def())
    node = next(n for n in snap.asset_nodes if n.asset_key == collection_key("coll"))
    edges = {e.parent_asset_key.to_user_string(): e.partition_mapping for e in node.parent_edges}
    assert edges == {
        "index": dg.SpecificPartitionsPartitionMapping(["leaf_a", "leaf_b"]),
        "judgements": dg.SpecificPartitionsPartitionMapping(["coll"]),
    }
    # the dataset assets are those of every lake: no collection changes them
    for asset, upstream in LINEAGE.items():
        dataset_node = graph.get(dg.AssetKey(asset))
        assert {k.to_user_string() for k in dataset_node.parent_keys} == upstream, asset
        assert dataset_node.partitions_def == datasets, asset


class Sensor:
    """The ``collection_changes`` sensor of a lake's definitions, ticked as the
    daemon does (events reported, the cursor kept)."""

    def __init__(self, lake: Lakehouse, instance: dg.DagsterInstance) -> None:
        self.lake, self.instance = lake, instance
        self.cursor: str | None = None
        self.defs = definitions(lake)
        self.sensor = self.defs.resolve_sensor_def("collection_changes")

    def tick(self) -> tuple[list[dg.RunRequest], list[dg.AssetObservation]]:
        with dg.build_sensor_context(
            instance=self.instance,
            cursor=self.cursor,
            resources=resources(self.lake),
            definitions=self.defs,
        ) as ctx:
            result = self.sensor(ctx)
        if isinstance(result, dg.SkipReason):
            return [], []
        assert isinstance(result, dg.SensorResult)
        self.cursor = result.cursor or self.cursor
        events = [e for e in result.asset_events or [] if isinstance(e, dg.AssetObservation)]
        for event in events:
            self.instance.report_runless_asset_event(event)
        return list(result.run_requests or []), events

    def stale(self) -> dict[str, set[tuple[str, str | None]]]:
        """Each collection's stale causes, as the UI computes them: (asset, partition)."""
        resolver = get_stale_status_resolver(
            self.instance, list(self.defs.resolve_asset_graph().assets_defs)
        )
        return {
            name: {
                (c.dependency.asset_key.to_user_string(), c.dependency.partition_key)
                for c in resolver.get_stale_causes(collection_key(name), name)
                if c.dependency is not None
            }
            for name in COLLECTIONS
        }

    def run(self, request: dg.RunRequest) -> dict[str, Any]:
        """Materialize what the request asks for; the materialization's metadata."""
        assert request.asset_selection and request.partition_key
        result = dg.materialize(
            [*ASSETS, judgements_asset, *collection_assets(catalog_collections(self.lake.store))],
            selection=request.asset_selection,
            partition_key=request.partition_key,
            instance=self.instance,
            resources=resources(self.lake),
            tags=request.tags,
        )
        assert result.success
        if request.asset_selection != [collection_key(request.partition_key)]:
            return {}
        (event,) = result.get_asset_materialization_events()
        assert event.materialization is not None
        return {k: v.value for k, v in event.materialization.metadata.items()}


def index_of(name: str) -> dg.RunRequest:
    return dg.RunRequest(asset_selection=[dg.AssetKey("index")], partition_key=name)


def requested(runs: list[dg.RunRequest]) -> dict[str, str]:
    """Partition → stale reason of each request (each asks for its own collection)."""
    out = {}
    for run in runs:
        assert run.partition_key is not None
        assert run.asset_selection == [collection_key(run.partition_key)]
        out[run.partition_key] = run.tags["lakehouse/stale_reason"]
    return out


def test_collections_build_when_a_leaf_or_a_judgement_changes(
    spark: Any, local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    create(local_lake)
    for name, prefix in LEAVES.items():
        ds = local_lake.dataset(name)
        ds.add_entity(person(f"{prefix}-1", f"Person {prefix} one"))
        ds.add_entity(person(f"{prefix}-2", f"Person {prefix} two"))
        ds.make()
    instance.add_dynamic_partitions(DATASETS, [*LEAVES, *COLLECTIONS])
    sensor = Sensor(local_lake, instance)
    for name in LEAVES:  # the leaves' published index, as Dagster's runs record it
        sensor.run(index_of(name))

    # never built: both collections are asked for, nothing else
    runs, events = sensor.tick()
    assert requested(runs) == {"coll": "never built", "solo": "never built"}
    # ... and their judgements observed (none yet), so the first one is a change
    assert {(e.partition, e.tags["dagster/data_version"]) for e in events} == {
        ("coll", "none"),
        ("solo", "none"),
    }
    assert sensor.tick() == ([], [])  # asked once, not again while it runs
    coll = local_lake.dataset("coll")
    mats = {run.partition_key: sensor.run(run) for run in runs}
    meta = mats["coll"]
    assert meta["built"] is True and meta["reason"] == "never built"
    assert meta["leaves"] == 2 and meta["statements"] == 8  # id + name of 4 persons
    assert meta["entities"] == 4 and meta["version"] == 1
    assert meta["graph_mode"] == "rebuild" and meta["graph_edges"] == 0  # persons: no edges
    assert "| leaf_a | 0 |" in meta["leaf_versions"] and "| leaf_b | 0 |" in meta["leaf_versions"]
    for path in (cv.ENTITIES_JSON, cv.STATEMENTS_CSV, cv.INDEX):
        assert coll.store.exists(cv.dataset_path("coll", path)), path
    head = coll.version()
    assert head is not None and head.sequence == 1 and meta["version_hash"] == head.hash
    assert mats["solo"]["entities"] == 2
    assert sensor.tick()[0] == []  # both current

    # a leaf changes (a write and its make, outside Dagster): only its collection
    leaf_a = local_lake.dataset("leaf_a")
    leaf_a.add_entity(person("a-3", "Person a three"))
    leaf_a.make()
    runs, _ = sensor.tick()
    assert requested(runs) == {"coll": "leaves changed: leaf_a"}
    # ... and once Dagster records the leaf's new index, the UI shows why it is stale
    sensor.run(index_of("leaf_a"))
    assert sensor.stale() == {"coll": {("index", "leaf_a")}, "solo": set()}
    (run,) = runs
    meta = sensor.run(run)
    assert meta["built"] is True and meta["reason"] == "leaves changed: leaf_a"
    assert meta["entities"] == 5 and meta["version"] == 2
    assert "| leaf_a | 1 |" in meta["leaf_versions"]
    assert sensor.tick()[0] == []
    assert sensor.stale() == {"coll": set(), "solo": set()}
    # materialized again with nothing new: kept, and it says so
    again = sensor.run(run)
    assert again["built"] is False and again["reason"].startswith("current")
    assert again["version"] == 2 and again["entities"] == 5

    # a judgement: observed as the collection's judgements, and only it is asked for
    # (that the build then merges is test_collections')
    judgements.decide(coll, "a-1", "b-1", "positive", user="test")
    runs, events = sensor.tick()
    assert requested(runs) == {"coll": "the judgements changed"}
    (event,) = events
    assert event.asset_key == dg.AssetKey("judgements") and event.partition == "coll"
    assert sensor.stale() == {"coll": {("judgements", "coll")}, "solo": set()}
    assert sensor.tick() == ([], [])  # asked once

    # a dataset in no collection: its chain runs as before, and asks for no collection
    plain = local_lake.dataset("plain")
    plain.add_entity(person("p-3", "Person p three"))
    result = dg.materialize(
        ASSETS,
        selection=COMPUTED,
        partition_key="plain",
        instance=instance,
        resources=resources(local_lake),
    )
    assert result.success
    flushed = {
        e.materialization.asset_key.to_user_string(): e.materialization.metadata
        for e in result.get_asset_materialization_events()
        if e.materialization is not None
    }
    assert flushed["statements"]["new_statements"].value == 2
    assert sensor.tick()[0] == []
    # ... and a collection's partition of the chain is not flushed
    result = dg.materialize(
        ASSETS,
        selection=dg.AssetSelection.assets("statements", "translog"),
        partition_key="coll",
        instance=instance,
        resources=resources(local_lake),
    )
    assert result.success
    for done in result.get_asset_materialization_events():
        assert done.materialization is not None
        meta = {k: v.value for k, v in done.materialization.metadata.items()}
        assert str(meta["outcome"]).startswith("a collection")
    built = json.loads(coll.store.read_text(cv.dataset_path("coll", cv.COLLECTION_BUILT_FROM)))
    assert sorted(built["leaves"]) == ["leaf_a", "leaf_b"]


def test_a_new_collection_partition_publishes_nothing_before_its_build(
    spark: Any, local_lake: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """What automation runs when a collection's partition appears (its dataset
    chain, newly missing) writes nothing: before, it published an empty version 1."""
    create(local_lake)
    instance.add_dynamic_partitions(DATASETS, [*LEAVES, *COLLECTIONS])
    result = dg.materialize(
        [*ASSETS, *CHECKS, *FRESHNESS_CHECKS],
        selection=COMPUTED,
        partition_key="coll",
        instance=instance,
        resources=resources(local_lake),
        raise_on_error=False,
    )
    assert result.success
    outcomes = {
        e.materialization.asset_key.to_user_string(): str(
            e.materialization.metadata["outcome"].value
        )
        for e in result.get_asset_materialization_events()
        if e.materialization is not None
    }
    assert set(outcomes) == KEYS - {"archive", "mappings", "journal", "optimize", "compact"}
    assert all(o.startswith("a collection") for o in outcomes.values()), outcomes
    coll = local_lake.dataset("coll")
    assert coll.version() is None
    for path in (cv.ENTITIES_JSON, cv.STATEMENTS_CSV, cv.INDEX):
        assert not coll.store.exists(cv.dataset_path("coll", path)), path
