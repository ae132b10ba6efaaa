"""Reading the graph index: the edges at an entity (``refs``, ``edges_at``), its
neighbourhood (``neighbours``), every edge (``all_edges``), and the checks on
the ids and filters a lookup takes.

A lookup reads only the files whose id range holds the entity (from the
state's file list) and applies the completed generations and tombstones.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets.errors import InvalidNameError, LakehouseError
from lakehouse_assets.graph.state import GraphState
from lakehouse_assets.graph.tables import (
    BY_SOURCE,
    BY_TARGET,
    EDGE_SCHEMA,
    TOMBSTONE_SCHEMA,
    TOMBSTONES,
    _edges_of,
    _table_files,
    table_location,
)
from lakehouse_assets.tables.arrays import values_array
from lakehouse_assets.tables.lookups import point_lookup
from lakehouse_assets.tables.snapshot import DataFile

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.tables.snapshot import DatasetSnapshot


#: FtM entity ids: printable, no whitespace, at most this long.
MAX_ID_LENGTH: Final = 1024

DIRECTIONS: Final = ("in", "out", "both")


class GraphNotBuiltError(LakehouseError):
    """The dataset has no graph index yet."""


def check_id(entity_id: str) -> str:
    """An entity id a lookup can take (a clear error for anything else)."""
    if (
        not entity_id
        or len(entity_id) > MAX_ID_LENGTH
        or any(c.isspace() or not c.isprintable() for c in entity_id)
    ):
        raise InvalidNameError(
            f"not an entity id: {entity_id[:60]!r} (1–{MAX_ID_LENGTH} printable "
            "characters, no whitespace)"
        )
    return entity_id


def check_filters(props: Sequence[str] | None, schemata: Sequence[str] | None) -> None:
    """Refuse property and schema names the FollowTheMoney model does not have.

    A misspelt filter (``--prop wings``, ``--schema Persn``) would otherwise
    match nothing and read as "no edges", a wrong answer that looks right.
    Properties must be ones that link entities (the forward, stored ones: the
    index holds statements, and the model's reverse properties have none).
    """
    if not props and not schemata:
        return
    from followthemoney import model
    from followthemoney.types import registry

    for name in schemata or ():
        if model.get(name) is None:
            raise InvalidNameError(
                f"unknown schema {name[:60]!r}: not a FollowTheMoney schema (e.g. Person, Company)"
            )
    linking = {
        p.name
        for schema in model.schemata.values()
        for p in schema.properties.values()
        if p.type == registry.entity and not p.stub
    }
    for name in props or ():
        if name not in linking:
            raise InvalidNameError(
                f"unknown property {name[:60]!r}: not a FollowTheMoney property that links "
                "entities (e.g. owner, asset, director, organization)"
            )


def _lookup(
    ds: DatasetContext,
    table: str,
    column: str,
    entity_id: str,
    props: Sequence[str] | None,
    state: GraphState | None = None,
) -> pa.Table:
    """Rows of one direction whose lookup column is ``entity_id`` (pruned by each
    file's min/max, from the state's file list or the Delta log, then by Parquet
    statistics and bloom filters per row group)."""
    location = table_location(ds, table)
    listed = state.files.get(table) if state is not None and state.files else None
    if listed is None:
        listed = _table_files(ds, table, column)
    root = location.uri.rstrip("/")
    files = []
    for f in listed:
        low, high = f.get("min"), f.get("max")
        if low is not None and high is not None and not (low <= entity_id <= high):
            continue
        prop = f.get("prop")
        if props and prop not in props:
            continue
        files.append(DataFile(f"{root}/{f['path']}", str(f["path"]), 0, {"prop": prop}, None, None))
    # bloom filters on the lookup column skip the row groups min/max cannot
    return point_lookup(
        files,
        EDGE_SCHEMA,
        location.storage_options,
        {column: [entity_id]},
        partition="prop",
        same_schema=True,  # every file of the index is written with EDGE_SCHEMA
    )


def _visible(ds: DatasetContext, rows: pa.Table, state: GraphState) -> pa.Table:
    """Rows of completed generations, minus tombstoned ones, one per (origin, edge).

    No Acero join or group-by (nor ``pa.array`` of Python lists): they import
    pyarrow.dataset and pandas, a quarter of a ``refs``; the edges at an entity
    are few, so the tombstones' latest generations are a dict.
    """
    if rows.num_rows == 0:
        return rows
    done = values_array(state.generations, pa.int64())
    rows = rows.filter(pc.is_in(rows.column("generation"), done))
    latest: dict[tuple[str, str], int] = {}
    if state.tombstones and rows.num_rows:
        location = table_location(ds, TOMBSTONES)
        listed = state.files.get(TOMBSTONES) or _table_files(ds, TOMBSTONES, "edge_id")
        if listed:
            root = location.uri.rstrip("/")
            files = [
                DataFile(f"{root}/{f['path']}", str(f["path"]), 0, {}, None, None) for f in listed
            ]
            # the table's types whoever wrote the files (see tables.arrow_dataset)
            tombs = point_lookup(
                files,
                TOMBSTONE_SCHEMA,
                location.storage_options,
                {"edge_id": pc.unique(rows.column("edge_id")).to_pylist()},
            )
            tombs = tombs.filter(pc.is_in(tombs.column("generation"), done))
            for origin, edge, generation in zip(
                tombs.column("origin").to_pylist(),
                tombs.column("edge_id").to_pylist(),
                tombs.column("generation").to_pylist(),
                strict=True,
            ):
                latest[(origin, edge)] = max(generation, latest.get((origin, edge), generation))
    # an edge tombstoned by a later generation than its row's: gone; an edge
    # written twice (a rebuild racing nothing, a retried update): once
    seen: set[tuple[str, str]] = set()
    keep = []
    for i, (origin, edge, generation) in enumerate(
        zip(
            rows.column("origin").to_pylist(),
            rows.column("edge_id").to_pylist(),
            rows.column("generation").to_pylist(),
            strict=True,
        )
    ):
        tombstoned = latest.get((origin, edge))
        if tombstoned is not None and generation < tombstoned:
            continue
        if (origin, edge) not in seen:
            seen.add((origin, edge))
            keep.append(i)
    return rows.take(values_array(keep, pa.int64()))


def all_edges(ds: DatasetContext) -> pa.Table:
    """Every visible edge (one direction read in full: for checks and exports)."""
    state = GraphState.load(ds)
    if state is None:
        return EDGE_SCHEMA.empty_table()
    dt = table_location(ds, BY_SOURCE).table()
    if dt is None:
        return EDGE_SCHEMA.empty_table()
    rows = dt.to_pyarrow_dataset().to_table().select(EDGE_SCHEMA.names).cast(EDGE_SCHEMA)
    return _visible(ds, rows, state)


def edge_count(ds: DatasetContext) -> int:
    return int(all_edges(ds).num_rows)


def refs(
    ds: DatasetContext,
    entity_id: str,
    *,
    direction: str = "in",
    props: Sequence[str] | None = None,
    schemata: Sequence[str] | None = None,
    snapshot: DatasetSnapshot | None = None,
) -> list[dict[str, Any]]:
    """The edges at an entity: ``in`` (who points at it), ``out`` (what it points
    at) or ``both``; each with the other entity's id, schema and caption (``None``
    for a target outside the dataset). Sorted by direction, property, other id.

    ``snapshot`` (a published version's, see
    :func:`lakehouse_assets.versions.version_snapshot`) answers for that version
    from the tables as they were then (the index holds the current edges only, so
    this is a scan of that version).
    """

    check_id(entity_id)
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
    check_filters(props, schemata)
    if snapshot is not None:
        scanned = _scan_edges(ds, entity_id, direction, props, snapshot)
        return _describe(ds, scanned, schemata, snapshot)
    state = GraphState.load(ds)
    if state is None:
        raise GraphNotBuiltError(
            f"Dataset {ds.name!r} has no graph index yet; run `lakehouse -d {ds.name} graph "
            "update` (or materialize the `graph` asset)"
        )
    found: list[tuple[str, dict[str, Any]]] = []
    for way in ("in", "out"):
        if direction not in (way, "both"):
            continue
        other = "source" if way == "in" else "target"
        for row in edges_at(ds, entity_id, way, props, state).to_pylist():
            found.append((way, {**row, "other": row[other]}))
    return _describe(ds, found, schemata, None)


def edges_at(
    ds: DatasetContext,
    entity_id: str,
    direction: str = "in",
    props: Sequence[str] | None = None,
    state: GraphState | None = None,
) -> pa.Table:
    """The index's visible edges into (``in``) or out of (``out``) an entity: the
    lookup ``refs`` makes, without the other entities' captions."""
    state = state or GraphState.load(ds)
    if state is None:
        return EDGE_SCHEMA.empty_table()
    table, column = (BY_TARGET, "target") if direction == "in" else (BY_SOURCE, "source")
    return _visible(ds, _lookup(ds, table, column, entity_id, props, state), state)


def _scan_edges(
    ds: DatasetContext,
    entity_id: str,
    direction: str,
    props: Sequence[str] | None,
    snapshot: DatasetSnapshot,
) -> list[tuple[str, dict[str, Any]]]:
    """The edges at an entity in a published version, by scanning its live statements."""
    from lakehouse_assets.query import live_chunks

    found: list[tuple[str, dict[str, Any]]] = []
    seen: set[tuple[str, str, str]] = set()
    for chunk in live_chunks(ds, snapshot=snapshot):
        edges = _edges_of(chunk, 0)
        if props:
            edges = edges.filter(pc.is_in(edges.column("prop"), pa.array(list(props))))
        for way, column, other in (("in", "target", "source"), ("out", "source", "target")):
            if direction not in (way, "both"):
                continue
            for row in edges.filter(pc.equal(edges.column(column), entity_id)).to_pylist():
                key = (way, row["origin"], row["edge_id"])
                if key not in seen:
                    seen.add(key)
                    found.append((way, {**row, "other": row[other]}))
    return found


def _describe(
    ds: DatasetContext,
    found: list[tuple[str, dict[str, Any]]],
    schemata: Sequence[str] | None,
    snapshot: DatasetSnapshot | None,
) -> list[dict[str, Any]]:
    """Edges with the other entity's schema and caption, filtered and sorted."""
    from lakehouse_assets.query import query

    others = sorted({row["other"] for _, row in found})
    entities = (
        {str(e.id): e for e in query(ds, entity_ids=others, snapshot=snapshot)} if others else {}
    )
    out = []
    for way, row in found:
        entity = entities.get(row["other"])
        schema = entity.schema.name if entity is not None else None
        if schemata and schema not in schemata:
            continue
        out.append(
            {
                "direction": way,
                "prop": row["prop"],
                "source": row["source"],
                "target": row["target"],
                "edge_id": row["edge_id"],
                "origin": row["origin"],
                "other_id": row["other"],
                "other_schema": schema,
                "other_caption": entity.caption if entity is not None else None,
            }
        )
    out.sort(key=lambda r: (r["direction"], r["prop"], r["other_id"], r["edge_id"]))
    return out


def neighbours(
    ds: DatasetContext, entity_id: str, *, depth: int = 1, limit: int = 100
) -> Iterator[dict[str, Any]]:
    """Entities around ``entity_id`` (itself first), breadth first over edges in
    both directions, up to ``depth`` hops and ``limit`` entities, as FtM JSON."""
    from lakehouse_assets.query import query

    check_id(entity_id)
    seen = {entity_id}
    frontier = [entity_id]
    order = [entity_id]
    for _ in range(max(depth, 0)):
        following = []
        for eid in frontier:
            for edge in refs(ds, eid, direction="both"):
                other = edge["other_id"]
                if other not in seen and len(seen) < limit:
                    seen.add(other)
                    following.append(other)
                    order.append(other)
        frontier = following
        if not frontier or len(seen) >= limit:
            break
    entities = {str(e.id): e for e in query(ds, entity_ids=order)}
    for eid in order:
        if eid in entities:
            yield entities[eid].to_dict()
