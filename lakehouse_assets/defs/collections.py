"""Collections in the asset graph: one asset per collection, its lineage to its leaves.

A collection (a dataset whose ``config.yml`` names ``children``,
:mod:`lakehouse_assets.collections`) is built from its leaves' tables and its
judgements. Each collection of the catalog is an asset ``collection/{name}``:

    index[leaf_a] ─┐
    index[leaf_b] ─┼→ collection/{name}[{name}]   (build, exports, a version)
    judgements[{name}] ┘

- its one partition is its dataset name (a ``StaticPartitionsDefinition`` of
  that one key), so its runs carry ``dagster/partition = {name}`` and
  ``dagster.yaml``'s one-run-per-dataset limit serialises them with the
  collection's other runs;
- it depends on the ``index`` partitions of exactly its leaves (the published
  output of each) through ``SpecificPartitionsPartitionMapping(leaves)``, and
  on its own partition of ``judgements`` (an external asset: the resolver's
  table, observed by the sensor when ``resolver/last_updated`` moves). The UI
  draws those edges, and a collection whose leaf's ``index`` materialized a
  new version since its build, or whose judgements were observed changed,
  shows as stale naming that partition;
- its materialization is the collection's ``make``
  (:func:`lakehouse_assets.collections.make.make`): build when a leaf's table
  versions or the canonical-id table changed, then the exports and a
  published version; the metadata says whether it built, why, from which
  leaf versions, and what it holds.

Why this shape and not one asset partitioned by ``datasets`` (a collection is
a dataset, so that was the first idea); each tried on Dagster 1.13:

- ``StaticPartitionMapping`` (leaf → collection keys) loads but fails at the
  first evaluation: it accepts only static partitions on both sides, and
  ``datasets`` is dynamic;
- a custom ``PartitionMapping`` is deprecated ("will not work with asset
  reconciliation") and is not sent to the webserver or the daemon: they fall
  back to the identity mapping, so the UI would show ``collection[C]`` fed by
  ``index[C]``;
- ``SpecificPartitionsPartitionMapping`` on a ``datasets``-partitioned asset
  maps *every* partition to the same upstream keys, and a change of any of
  them to every partition (2,000 datasets: 2,000 stale partitions);
  ``AllPartitionMapping`` makes every collection depend on every dataset.

So the mapping is built per collection when the definitions load, from the
lake's catalog (one read of each dataset's ``config.yml``, as the catalog
``index.json`` does). A collection created, or whose children changed, after
the code location loaded is still built (the sensor judges from the lake, and
``make`` reads the children then), but its lineage in the UI is the loaded
one: the sensor says so and asks for a reload.

Automation is the ``collection_changes`` sensor, not an ``AutomationCondition``:
a leaf's tables also change outside Dagster (``lakehouse make``, the server, a
compaction), which no asset event announces (and ``eager()`` beside the sensor
would build twice for a change Dagster did see). The sensor compares what the collection would be built from now
(:func:`~lakehouse_assets.collections.make.sources`) with what it was built
from, for the collections whose own or whose leaves' change markers moved.
"""

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import dagster as dg

from lakehouse_assets import conventions as cv
from lakehouse_assets.catalog import dataset_names, load_dataset_config
from lakehouse_assets.collections.leaves import is_collection, leaves
from lakehouse_assets.collections.make import (
    CollectionResult,
    built_from,
    make,
    sources,
    stale_reason,
)
from lakehouse_assets.defs.assets import GROUP as ASSET_GROUP
from lakehouse_assets.defs.metadata import (
    DATA_VERSION_TAG,
    index_metadata,
    markdown_table,
    table_summary,
    tag_version,
)
from lakehouse_assets.defs.partitions import SWEEP, Watch, changed_partitions, datasets
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
from lakehouse_assets.errors import CollectionError, LakehouseError
from lakehouse_assets.freshness import INDEX
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets.storage import Store

log = logging.getLogger(__name__)

#: The dataset chain's group: one group keeps the lineage page's graph open
#: (with two, Dagster shows each as a collapsed box) and the edges from a
#: collection to its leaves' index in one picture.
GROUP = ASSET_GROUP

#: The first part of every collection asset's key: ``collection/{name}``.
PREFIX = "collection"

judgements = dg.AssetSpec(
    "judgements",
    partitions_def=datasets,
    group_name=GROUP,
    kinds={"delta"},
    description="A collection's judgements (nomenklatura's resolver table, "
    "`{collection}/resolver/judgements`) and the canonical ids they give. Changed by "
    "`lakehouse resolver load|decide`; the `collection_changes` sensor observes each change "
    "(data version: tag `resolver/last_updated`).",
)


def collection_key(name: str) -> dg.AssetKey:
    return dg.AssetKey([PREFIX, name])


def catalog_collections(store: Store) -> dict[str, list[str]]:
    """Each collection of the lake → its leaves (sorted), from the configs.

    A collection whose children are broken (a missing child, a cycle) is left
    out with a warning: its ``make`` names the problem, and the others load."""
    found: dict[str, list[str]] = {}
    for name in dataset_names(store):
        if not load_dataset_config(store, name).get("children"):
            continue
        try:
            found[name] = leaves(store, name)
        except CollectionError as exc:
            log.warning("collection %s has no asset: %s", name, exc)
    return found


def loaded_collections(settings: Settings | None = None) -> dict[str, list[str]]:
    """The collections of the environment's lake (``LAKEHOUSE_*``), read when the
    definitions load. A lake that cannot be read then gives none, with a
    warning: the code location still loads (every dataset asset works), and the
    sensor asks for a reload once it sees the collections."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return catalog_collections(Lakehouse(settings=settings or Settings()).store)
    except (LakehouseError, OSError, BotoCoreError, ClientError) as exc:
        log.warning("collections not loaded from the lake: %s", exc)
        return {}


def collection_asset(name: str, leaf_names: Sequence[str]) -> dg.AssetsDefinition:
    """The asset of one collection (see the module docstring)."""

    @dg.asset(
        key=collection_key(name),
        partitions_def=dg.StaticPartitionsDefinition([name]),
        deps=[
            dg.AssetDep(
                "index", partition_mapping=dg.SpecificPartitionsPartitionMapping(list(leaf_names))
            ),
            dg.AssetDep(
                judgements, partition_mapping=dg.SpecificPartitionsPartitionMapping([name])
            ),
        ],
        group_name=GROUP,
        kinds={"delta", "spark"},
        tags={"lakehouse/collection": name},
        description=f"Collection `{name}` of {', '.join(f'`{n}`' for n in leaf_names)}: its "
        "leaves' live statements with the judgements' canonical ids, as its own tables, "
        "then its exports and a published version (`lakehouse -d "
        f"{name} make`). Built when a leaf's tables or the judgements changed since.",
    )
    def _collection(
        context: dg.AssetExecutionContext, lakehouse: LakehouseResource, spark: SparkResource
    ) -> dg.MaterializeResult[None]:
        ds = lakehouse.dataset(name, spark)
        now = leaves(ds.store, name)
        if now != list(leaf_names):
            context.log.warning(
                "collection %s: its leaves are now %s (loaded: %s); built from the lake's, "
                "reload the code location for the lineage",
                name,
                ", ".join(now),
                ", ".join(leaf_names),
            )
        clock = time.monotonic()
        result = make(ds)
        context.log.info("collection %s: %s", name, result.reason or "current, not rebuilt")
        meta = collection_metadata(ds, result)
        meta["duration_seconds"] = round(time.monotonic() - clock, 3)
        return dg.MaterializeResult(metadata=meta, data_version=tag_version(ds, cv.EXPORTS_INDEX))

    return _collection


def collection_metadata(ds: Dataset, result: CollectionResult) -> dict[str, Any]:
    """What a collection's materialization shows: built or not and why, the leaf
    versions its tables hold, its counts, and the version it published."""
    built = result.built
    # the published version first: its file metadata (row count of index.json) is
    # overlaid by the collection's own below
    meta: dict[str, Any] = index_metadata(ds, result.exported.written.get(INDEX))
    meta["built"] = built is not None
    meta["reason"] = result.reason or "current: no leaf and no judgement changed"
    origin = built_from(ds) or {}
    leaf_versions: Mapping[str, Any] = origin.get("leaves") or {}
    meta["leaves"] = len(leaf_versions)
    meta["leaf_versions"] = dg.MetadataValue.md(
        markdown_table(
            ["leaf", "statements version", "translog version"],
            [
                [n, *(_version(v) for v in (list(vs) + [None, None])[:2])]
                for n, vs in sorted(leaf_versions.items())
            ],
        )
    )
    meta["canonical_version"] = _version(origin.get("canonical"))
    if built is not None:
        meta["merged_ids"] = built.merged_ids
        meta["build_seconds"] = round(built.seconds, 3)
    graph = result.exported.graph or {}
    if "mode" in graph:  # the graph index make brought up to date (else why not)
        meta["graph_mode"] = graph["mode"]
        if isinstance(graph.get("edges"), int):
            meta["graph_edges"] = graph["edges"]
    elif "skipped" in graph:
        meta["graph_skipped"] = graph["skipped"]
    table = table_summary(ds.statements_table)  # what it holds, built now or before
    meta["statements"] = table.rows
    meta["dagster/row_count"] = meta["dagster/partition_row_count"] = table.rows
    meta["statements_version"] = _version(table.version)
    index_path = cv.dataset_path(ds.name, cv.INDEX)
    if ds.store.exists(index_path):
        entities = json.loads(ds.store.read_text(index_path)).get("entity_count")
        if isinstance(entities, int):
            meta["entities"] = entities
    meta["dagster/uri"] = ds.store.full_uri(cv.dataset_path(ds.name))
    return meta


def _version(value: Any) -> int:
    return int(value) if isinstance(value, int) else -1


def collection_assets(collections: Mapping[str, Sequence[str]]) -> list[dg.AssetsDefinition]:
    return [collection_asset(name, list(found)) for name, found in sorted(collections.items())]


# --- the sensor ---------------------------------------------------------------


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


#: The data version of a collection's ``judgements`` before its first load or decide.
NO_JUDGEMENTS = "none"


def judgements_event(ds: Dataset, ts: datetime | None) -> dg.AssetObservation:
    """The reported observation of a collection's ``judgements`` (a load or decide,
    or none yet: the sensor's first look at a collection).

    An observation, not a materialization: Dagster judges a dependency on an
    external asset by its observed data version, so this one marks the
    collection stale (naming ``judgements[{name}]``) until it is built again.
    The first look is observed too: a build with no observation before it
    records no pointer, and Dagster then takes the first change for the state
    it was built from."""
    metadata = {} if ts is None else {"last_updated": dg.MetadataValue.timestamp(ts)}
    return dg.AssetObservation(
        asset_key="judgements",
        partition=ds.name,
        tags={DATA_VERSION_TAG: NO_JUDGEMENTS if ts is None else ts.isoformat()},
        metadata=metadata,
    )


def collection_sensor(collections: Mapping[str, Sequence[str]]) -> dg.SensorDefinition:
    """``collection_changes`` over the collections the definitions loaded."""
    loaded = {name: set(found) for name, found in collections.items()}
    targets = [collection_key(name) for name in sorted(loaded)]

    @dg.sensor(
        name="collection_changes",
        asset_selection=targets or None,
        minimum_interval_seconds=Settings().sensor_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Requests the build of each collection whose leaves' tables or judgements "
        "changed since it was built (what it would be built from against "
        "`resolver/built.json`), and observes judgement changes.",
    )
    def collection_changes(
        context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
    ) -> dg.SensorResult | dg.SkipReason:
        """Only collections whose marker or a leaf's marker moved are judged (and
        :data:`SWEEP` datasets in turn, which finds changed children).

        The cursor keeps, per collection, the digest of the sources a run was
        last requested for (no second request while it runs) and the last
        ``resolver/last_updated`` reported."""
        lake = lakehouse.lake()
        state = _load_cursor(context.cursor)
        watch = Watch.load(state.get("watch"))
        requested: dict[str, str] = dict(state.get("requested") or {})
        reported: dict[str, str] = dict(state.get("judgements") or {})
        picked = {ds.name for ds in changed_partitions(context.instance, lake, watch, sweep=SWEEP)}
        runs: list[dg.RunRequest] = []
        events: list[dg.AssetObservation] = []
        unloaded = sorted(n for n in picked - set(loaded) if _is_collection(lake.store, n))
        if unloaded:
            context.log.warning(
                "collections without an asset (created or changed after the code location "
                "loaded): %s; reload the code location",
                ", ".join(unloaded),
            )
        for name, found in sorted(loaded.items()):
            if name not in picked and not found & picked:
                continue
            try:
                ds = lake.dataset(name)
                ts = ds.core_tags.get(cv.RESOLVER_LAST_UPDATED)
                seen = NO_JUDGEMENTS if ts is None else ts.isoformat()
                if reported.get(name) != seen:
                    events.append(judgements_event(ds, ts))
                    reported[name] = seen
                run = _request(ds, found, requested)
            except LakehouseError as exc:
                context.log.warning("collection %s: %s", name, exc)
                continue
            if run is not None:
                runs.append(run)
        cursor = json.dumps(
            {"watch": watch.dump(), "requested": requested, "judgements": reported},
            sort_keys=True,
        )
        if runs or events:
            return dg.SensorResult(run_requests=runs, asset_events=events, cursor=cursor)
        reason = "no collection changed"
        if unloaded:
            reason = f"reload the code location for the collections {', '.join(unloaded)}"
        if cursor == (context.cursor or ""):
            return dg.SkipReason(reason)
        return dg.SensorResult(skip_reason=reason, cursor=cursor)

    return collection_changes


def _request(ds: Dataset, loaded: set[str], requested: dict[str, str]) -> dg.RunRequest | None:
    """A run of the collection's asset if it is stale and not asked for these sources yet."""
    reason = stale_reason(ds)
    if reason is None:
        requested.pop(ds.name, None)
        return None
    now = sources(ds)
    if all(v[0] is None for v in now["leaves"].values()):
        return None  # no leaf flushed yet: nothing to build (its make would say so)
    digest = _digest(now)
    if requested.get(ds.name) == digest:
        return None
    requested[ds.name] = digest
    changed = sorted(set(now["leaves"]) ^ loaded)
    tags = {"lakehouse/trigger": "collection_changes", "lakehouse/stale_reason": reason[:200]}
    if changed:
        tags["lakehouse/lineage"] = "stale: reload the code location"
    return dg.RunRequest(
        run_key=f"{ds.name}:{digest}",
        asset_selection=[collection_key(ds.name)],
        partition_key=ds.name,
        tags=tags,
    )


def _is_collection(store: Store, name: str) -> bool:
    try:
        return is_collection(store, name)
    except LakehouseError:
        return True  # broken children: still a collection, named in the warning


def _load_cursor(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}
