"""The graph index: "who points at this entity" as a pruned lookup (GraphLake seed).

An **edge** is a live statement whose property type is ``entity``: source =
its entity (``canonical_id``), property, target = its value, edge id = the
statement id (GraphLake's reification hash), plus the origin and the source's
schema. Each edge is stored twice, as GraphLake does, in two Delta tables
partitioned by property (GraphLake's predicate partitions)::

    {dataset}/graph/by_source/prop={prop}/*.parquet   sorted by source
    {dataset}/graph/by_target/prop={prop}/*.parquet   sorted by target
    {dataset}/graph/tombstones/*.parquet              (origin, edge_id) deleted since the rebuild
    {dataset}/graph/state.json                        what the index reflects

Files are written by delta-rs with Parquet bloom filters on the lookup
column, small row groups and small files; the Delta log keeps each file's
min/max of the lookup column, so a lookup opens only the files whose range
holds the id (one per property after a rebuild) and, within them, the row
groups whose statistics and bloom filters do.

**Rebuild.** One DuckDB pass over the snapshot's files: the entity-typed
statements that have no deletion time in the translog, sorted both ways.

**Incremental.** :func:`update` reads what the flushes since the state the
index reflects appended and tombstoned (or, after compact / optimize,
compares the two translogs): statements that became live are appended as
edges, statements that stopped being live get tombstones, which lookups
apply and :func:`rebuild` folds in.

**Generations.** Every update writes its rows with a new generation number;
``state.json`` lists the generations that completed and is written last.
Lookups ignore rows of any other generation, so an update killed midway
leaves rows nobody reads, and the next update (from the state before it)
redoes its work: no edge is lost or doubled. A rebuild marks the state
``rebuilding`` first; an update that finds that mark rebuilds.

Interactive reads never start Spark: DuckDB reads the pruned files (pyarrow on
S3, where DuckDB would need an extension downloaded at run time).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import (
    BloomFilterProperties,
    ColumnProperties,
    CommitProperties,
    WriterProperties,
    write_deltalake,
)

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults
from lakehouse_assets.errors import InvalidNameError, LakehouseError
from lakehouse_assets.tables.delta import DeltaLocation
from lakehouse_assets.tables.lookups import point_lookup
from lakehouse_assets.tables.schemas import STATEMENTS_PARTITION, STATEMENTS_SCHEMA, TRANSLOG_SCHEMA
from lakehouse_assets.tables.snapshot import DataFile, DatasetSnapshot, arrow_dataset

if TYPE_CHECKING:
    from lakehouse_assets.lake import Dataset

#: One edge as stored (both directions hold the same columns).
EDGE_SCHEMA: Final = pa.schema(
    [
        ("prop", pa.string()),
        ("source", pa.string()),
        ("target", pa.string()),
        ("edge_id", pa.string()),
        ("origin", pa.string()),
        ("source_schema", pa.string()),
        ("generation", pa.int64()),
    ]
)
TOMBSTONE_SCHEMA: Final = pa.schema(
    [("origin", pa.string()), ("edge_id", pa.string()), ("generation", pa.int64())]
)
BY_SOURCE: Final = cv.GRAPH_BY_SOURCE
BY_TARGET: Final = cv.GRAPH_BY_TARGET
TOMBSTONES: Final = cv.GRAPH_TOMBSTONES
STATE: Final = cv.GRAPH_STATE
#: Rows per row group and bytes per file: small, so a lookup opens one file per
#: property (the files of a property hold disjoint id ranges, each file's range
#: in the Delta log) and decodes one short row group in it. Measured at 10M
#: statements (2.3M edges): 16k rows in 64 MB files took 9 ms a lookup, 4k rows
#: in 4 MB files 3.6 ms; smaller row groups in large files were slower (DuckDB
#: pays per row group), smaller files only add files.
ROW_GROUP_ROWS: Final = 4096
FILE_BYTES: Final = 4 * 1024 * 1024
#: FtM entity ids: printable, no whitespace, at most this long.
MAX_ID_LENGTH: Final = 1024

DIRECTIONS: Final = ("in", "out", "both")


class GraphNotBuiltError(LakehouseError):
    """The dataset has no graph index yet."""


# --- state -----------------------------------------------------------------------


@dataclass(slots=True)
class GraphState:
    """What the index reflects (``graph/state.json``)."""

    translog_version: int | None = None
    statements_version: int | None = None
    generations: list[int] = field(default_factory=list)
    edges: int = 0
    by_prop: dict[str, int] = field(default_factory=dict)
    dangling: int | None = None
    tombstones: int = 0
    rebuilding: bool = False
    updated_at: str | None = None
    #: the files of each table when the state was written, with the min/max of the
    #: lookup column (GraphLake's snapshot manifest): a lookup reads this one small
    #: file instead of two Delta logs
    files: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def record_files(self, ds: Dataset) -> None:
        self.files = {
            table: _table_files(ds, table, column)
            for table, column in (
                (BY_SOURCE, "source"),
                (BY_TARGET, "target"),
                (TOMBSTONES, "edge_id"),
            )
        }

    @classmethod
    def load(cls, ds: Dataset) -> GraphState | None:
        path = cv.dataset_path(ds.name, STATE)
        if not ds.store.exists(path):
            return None
        data = json.loads(ds.store.read_text(path))
        return cls(**{k: v for k, v in data.items() if k in cls.__slots__})

    def save(self, ds: Dataset) -> None:
        self.updated_at = cv.utcnow().isoformat()
        data = {k: getattr(self, k) for k in self.__slots__}
        ds.store.write_text(cv.dataset_path(ds.name, STATE), json.dumps(data, indent=1))


def _table_files(ds: Dataset, table: str, column: str) -> list[dict[str, Any]]:
    """A table's files with their property partition and min/max of ``column``."""
    dt = table_location(ds, table).table()
    if dt is None:
        return []
    return [
        {
            "path": str(a["path"]),
            "prop": a.get("partition.prop"),
            "min": a.get(f"min.{column}"),
            "max": a.get(f"max.{column}"),
        }
        for a in pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    ]


def table_location(ds: Dataset, table: str) -> DeltaLocation:
    """Where one of the index's Delta tables lives (``graph/by_source``, ...)."""
    return DeltaLocation(
        ds.store.full_uri(cv.dataset_path(ds.name, table)), ds.store.storage_options()
    )


def _writer(lookup: str) -> WriterProperties:
    bloom = ColumnProperties(bloom_filter_properties=BloomFilterProperties(True, 0.01))
    return WriterProperties(
        max_row_group_size=ROW_GROUP_ROWS,
        compression="ZSTD",
        column_properties={lookup: bloom, "edge_id": bloom},
    )


def _write(
    ds: Dataset,
    table: str,
    data: pa.Table,
    mode: str,
    reflects: int | None,
    *,
    presorted: bool = False,
) -> None:
    """Append or overwrite one of the index's tables (sorted by property and
    lookup column, unless ``presorted`` says the rows already are)."""
    lookup = "source" if table == BY_SOURCE else "target"
    props = CommitProperties(custom_metadata={"lakehouse.graph.reflects_translog": str(reflects)})
    location = table_location(ds, table)
    # one call for both modes (delta-rs's overloads split them by a literal)
    write: Any = write_deltalake
    if table == TOMBSTONES:
        write(
            location.uri,
            data,
            mode=mode,
            storage_options=dict(location.storage_options),
            commit_properties=props,
        )
        return
    write(
        location.uri,
        data if presorted else data.sort_by([("prop", "ascending"), (lookup, "ascending")]),
        mode=mode,
        partition_by=["prop"],
        storage_options=dict(location.storage_options),
        writer_properties=_writer(lookup),
        commit_properties=props,
        target_file_size=FILE_BYTES,
    )


# --- building ----------------------------------------------------------------------


def _edges_of(rows: pa.Table, generation: int) -> pa.Table:
    """Edges from statement rows (entity-typed ones only)."""
    rows = rows.filter(pc.equal(rows.column("prop_type"), "entity"))
    return pa.table(
        {
            "prop": rows.column("prop").cast(pa.string()),
            "source": rows.column("canonical_id").cast(pa.string()),
            "target": rows.column("value").cast(pa.string()),
            "edge_id": rows.column("id").cast(pa.string()),
            "origin": rows.column("origin").cast(pa.string()),
            "source_schema": rows.column("schema").cast(pa.string()),
            "generation": pa.array([generation] * rows.num_rows, pa.int64()),
        },
        schema=EDGE_SCHEMA,
    )


@dataclass(slots=True)
class GraphResult:
    """What a rebuild or update did."""

    mode: str
    added: int = 0
    tombstoned: int = 0
    edges: int = 0
    dangling: int | None = None
    reflects: tuple[int | None, int | None] = (None, None)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "added": self.added,
            "tombstoned": self.tombstoned,
            "edges": self.edges,
            "dangling": self.dangling,
            "reflects": {"statements": self.reflects[0], "translog": self.reflects[1]},
            "seconds": round(self.seconds, 3),
        }


def rebuild(ds: Dataset) -> GraphResult:
    """Build both directions from the live statements of the current snapshot."""
    with ds.table_lock("graph"):
        return _rebuild(ds)


def _rebuild(ds: Dataset) -> GraphResult:
    clock = time.monotonic()
    # the caller holds the dataset's table lock
    snapshot = ds.snapshot()
    state = GraphState.load(ds) or GraphState()
    state.rebuilding = True
    state.save(ds)
    generation = 0
    by_source, by_target, dangling = _live_edges(ds, snapshot)
    reflects = snapshot.translog.version
    _write(ds, BY_SOURCE, by_source, "overwrite", reflects, presorted=True)
    faults.point("graph.after_source")
    del by_source
    _write(ds, BY_TARGET, by_target, "overwrite", reflects, presorted=True)
    _write(ds, TOMBSTONES, TOMBSTONE_SCHEMA.empty_table(), "overwrite", reflects)
    faults.point("graph.after_target")
    state = GraphState(
        translog_version=snapshot.translog.version,
        statements_version=snapshot.statements.version,
        generations=[generation],
        edges=by_target.num_rows,
        by_prop=_count_by_prop(by_target),
        dangling=dangling,
    )
    state.record_files(ds)
    state.save(ds)
    return GraphResult(
        "rebuild",
        added=by_target.num_rows,
        edges=state.edges,
        dangling=dangling,
        reflects=snapshot.versions,
        seconds=time.monotonic() - clock,
    )


def _live_edges(ds: Dataset, snapshot: DatasetSnapshot) -> tuple[pa.Table, pa.Table, int]:
    """The snapshot's live entity-typed statements as edges (generation 0),
    sorted by (prop, source) and by (prop, target), and how many of them point
    at no live entity of the dataset.

    One DuckDB pass over the snapshot's files as pyarrow datasets: only the
    columns an edge needs are decoded, and only the translog rows that carry a
    deletion time (Parquet statistics skip the rest); live means "no deletion
    time in the translog", as :func:`query.live_statements` has it. Nothing is
    read a row at a time in Python.
    """
    import duckdb

    options = ds.statements_table.storage_options
    main = arrow_dataset(
        snapshot.statements.files, STATEMENTS_SCHEMA, options, partition=STATEMENTS_PARTITION
    )
    log = arrow_dataset(snapshot.translog.files, TRANSLOG_SCHEMA, options)
    con = duckdb.connect(config={"threads": 2})
    try:
        con.register("main", main)
        con.register("log", log)
        con.execute(
            "CREATE TEMP TABLE dead AS SELECT DISTINCT origin, id FROM log "
            "WHERE deleted_at IS NOT NULL"
        )
        live = "NOT EXISTS (SELECT 1 FROM dead d WHERE d.origin = m.origin AND d.id = m.id)"
        if not con.execute("SELECT count(*) FROM dead").fetchone()[0]:  # type: ignore[index]
            live = "true"
        con.execute(
            "CREATE TEMP TABLE edges AS SELECT prop, canonical_id AS source, value AS target, "
            "id AS edge_id, origin, schema AS source_schema, 0::BIGINT AS generation "
            f"FROM main m WHERE prop_type = 'entity' AND {live}"
        )
        found = con.execute(
            "SELECT count(*) FROM edges WHERE target NOT IN "
            f"(SELECT canonical_id FROM main m WHERE {live})"
        ).fetchone()
        dangling = int(found[0]) if found else 0
        names = ", ".join(EDGE_SCHEMA.names)
        by_source = con.execute(f"SELECT {names} FROM edges ORDER BY prop, source").to_arrow_table()
        by_target = con.execute(f"SELECT {names} FROM edges ORDER BY prop, target").to_arrow_table()
    finally:
        con.close()
    return by_source.cast(EDGE_SCHEMA), by_target.cast(EDGE_SCHEMA), dangling


def _live_keys(rows: pa.Table) -> pa.Table:
    live = rows.filter(pc.equal(rows.column("deleted_at"), ""))
    return live.select(["origin", "id", "bucket"])


def update(ds: Dataset) -> GraphResult:
    """Bring the index up to the current snapshot: append new edges, tombstone
    removed ones (a rebuild if there is no index, or a rebuild was cut off)."""
    from lakehouse_assets.versions import changed_translog_rows

    clock = time.monotonic()
    with ds.table_lock("graph"):
        state = GraphState.load(ds)
        if state is None or state.rebuilding or state.translog_version is None:
            return _rebuild(ds)
        try:
            old = DatasetSnapshot.load(
                ds.statements_table, ds.translog_table, state.translog_version
            )
        except Exception:  # the version the index reflects was cleaned up
            return _rebuild(ds)
        new = ds.snapshot()
        result = GraphResult("update", reflects=new.versions)
        if new.content_key != old.content_key:
            generation = max(state.generations, default=0) + 1
            # a killed update may have written rows of ``generation``: skip past them
            generation = max(generation, _max_generation(ds) + 1)
            appended = _appended_changes(ds, old, new)
            if appended is not None:  # the flushes' own footprint: new files, tombstones
                fresh, revived, removed = appended
                edges = pa.concat_tables(
                    [
                        _edges_of(fresh, generation),
                        _edges_of(_statement_rows(ds, new, revived), generation),
                    ]
                )
            else:  # anything else (compact, optimize): compare the translogs
                new_rows, old_rows = changed_translog_rows(ds, old, new)
                after, before = _live_keys(new_rows), _live_keys(old_rows)
                added = after.join(before, keys=["origin", "id"], join_type="left anti")
                removed = before.join(after, keys=["origin", "id"], join_type="left anti")
                edges = _edges_of(_statement_rows(ds, new, added), generation)
            try:  # which of the removed statements were edges (for the counts)
                gone = _edges_of(_statement_rows(ds, old, removed), generation)
            except (OSError, LakehouseError):  # the old files were vacuumed
                return _rebuild(ds)
            if edges.num_rows:
                _write(ds, BY_SOURCE, edges, "append", new.translog.version)
                faults.point("graph.after_source")
                _write(ds, BY_TARGET, edges, "append", new.translog.version)
            if gone.num_rows:
                tombs = pa.table(
                    {
                        "origin": gone.column("origin"),
                        "edge_id": gone.column("edge_id"),
                        "generation": pa.array([generation] * gone.num_rows, pa.int64()),
                    },
                    schema=TOMBSTONE_SCHEMA,
                )
                _write(ds, TOMBSTONES, tombs, "append", new.translog.version)
            faults.point("graph.after_target")
            state.generations.append(generation)
            for prop, n in _count_by_prop(edges).items():
                state.by_prop[prop] = state.by_prop.get(prop, 0) + n
            for prop, n in _count_by_prop(gone).items():
                state.by_prop[prop] = state.by_prop.get(prop, 0) - n
            state.by_prop = {k: v for k, v in state.by_prop.items() if v > 0}
            state.edges += edges.num_rows - gone.num_rows
            state.tombstones += gone.num_rows
            state.dangling = None  # known after a rebuild
            result.added, result.tombstoned = edges.num_rows, gone.num_rows
        state.translog_version = new.translog.version
        state.statements_version = new.statements.version
        state.record_files(ds)
        state.save(ds)
        result.edges = state.edges
        result.seconds = time.monotonic() - clock
        return result


_KEYS: Final = ["origin", "id", "bucket"]


def _appended_changes(
    ds: Dataset, old: DatasetSnapshot, new: DatasetSnapshot
) -> tuple[pa.Table, pa.Table, pa.Table] | None:
    """What flushes changed since ``old``, read from their footprint alone:
    ``(new statements, revived keys, removed keys)``, or ``None`` when the
    statements table was rewritten since (compact, optimize, vacuum) and only a
    full translog comparison can tell.

    A flush appends files of statements that are new (never stored), and
    rewrites translog files with the deletion time of what it tombstoned. So
    the statements that became live are those of the appended files (minus
    any a later flush tombstoned) plus stored ones whose tombstone was lifted,
    and those that stopped being live are those tombstoned now and not before;
    tombstones are read from the translog files that changed, and only their
    rows that carry a deletion time (Parquet statistics skip the rest).
    """
    old_files = {f.path for f in old.statements.files}
    new_files = {f.path: f for f in new.statements.files}
    if not old_files <= new_files.keys():
        return None
    options = ds.statements_table.storage_options
    appended = [f for p, f in new_files.items() if p not in old_files]
    fresh = (
        arrow_dataset(appended, STATEMENTS_SCHEMA, options, partition=STATEMENTS_PARTITION)
        .to_table(filter=pc.field("prop_type") == "entity")
        .cast(STATEMENTS_SCHEMA)
        if appended
        else STATEMENTS_SCHEMA.empty_table()
    )
    old_log = {f.path: f for f in old.translog.files}
    new_log = {f.path: f for f in new.translog.files}

    def tombstoned(files: list[DataFile]) -> pa.Table:
        if not files:
            return pa.table({k: pa.array([], TRANSLOG_SCHEMA.field(k).type) for k in _KEYS})
        return arrow_dataset(files, TRANSLOG_SCHEMA, options).to_table(
            columns=_KEYS, filter=pc.field("deleted_at").is_valid()
        )

    dead_now = tombstoned([f for p, f in new_log.items() if p not in old_log])
    dead_before = tombstoned([f for p, f in old_log.items() if p not in new_log])
    keys = ["origin", "id"]
    fresh = fresh.join(dead_now.select(keys), keys=keys, join_type="left anti")
    removed = dead_now.join(dead_before.select(keys), keys=keys, join_type="left anti")
    # a lifted tombstone: dead in a rewritten file before, not dead in its rewrite
    # (a row compacted away has no statement to read, so it adds nothing)
    revived = dead_before.join(dead_now.select(keys), keys=keys, join_type="left anti")
    return fresh.select(STATEMENTS_SCHEMA.names), revived, removed


def _count_by_prop(edges: pa.Table) -> dict[str, int]:
    if edges.num_rows == 0:
        return {}
    counts = edges.group_by("prop").aggregate([("edge_id", "count")])
    return dict(
        zip(
            counts.column("prop").to_pylist(),
            counts.column("edge_id_count").to_pylist(),
            strict=True,
        )
    )


def _max_generation(ds: Dataset) -> int:
    """The highest generation any table holds (rows of killed updates included)."""
    best = 0
    for table in (BY_SOURCE, TOMBSTONES):
        dt = table_location(ds, table).table()
        if dt is None:
            continue
        actions = pa.table(dt.get_add_actions(flatten=True))
        if "max.generation" in actions.column_names and actions.num_rows:
            best = max(best, int(pc.max(actions.column("max.generation")).as_py() or 0))
    return best


def _statement_rows(ds: Dataset, snapshot: DatasetSnapshot, keys: pa.Table) -> pa.Table:
    """The statement rows of (origin, id) keys, read from the buckets they are in."""
    from lakehouse_assets.query import rows_by_id

    rows = rows_by_id(ds, snapshot, keys)
    return rows.join(keys.select(["origin", "id"]), keys=["origin", "id"], join_type="inner")


# --- reads ---------------------------------------------------------------------------


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
    ds: Dataset,
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


def _visible(ds: Dataset, rows: pa.Table, state: GraphState) -> pa.Table:
    """Rows of completed generations, minus tombstoned ones, one per (origin, edge)."""
    if rows.num_rows == 0:
        return rows
    done = pa.array(state.generations, pa.int64())
    rows = rows.filter(pc.is_in(rows.column("generation"), done))
    if state.tombstones and rows.num_rows:
        location = table_location(ds, TOMBSTONES)
        listed = state.files.get(TOMBSTONES) or _table_files(ds, TOMBSTONES, "edge_id")
        if listed:
            root = location.uri.rstrip("/")
            files = [
                DataFile(f"{root}/{f['path']}", str(f["path"]), 0, {}, None, None) for f in listed
            ]
            # the table's types whoever wrote the files (see tables.arrow_dataset)
            tombs = arrow_dataset(files, TOMBSTONE_SCHEMA, location.storage_options).to_table(
                filter=pc.field("edge_id").isin(rows.column("edge_id").combine_chunks())
            )
            tombs = tombs.filter(pc.is_in(tombs.column("generation"), done))
            if tombs.num_rows:
                latest = tombs.group_by(["origin", "edge_id"]).aggregate([("generation", "max")])
                joined = rows.join(latest, keys=["origin", "edge_id"], join_type="left outer")
                dead = pc.fill_null(
                    pc.less(joined.column("generation"), joined.column("generation_max")), False
                )
                rows = joined.filter(pc.invert(dead)).select(EDGE_SCHEMA.names)
    # an edge written twice (a rebuild racing nothing, a retried update): once
    seen: set[tuple[str, str]] = set()
    keep = []
    for i, (origin, edge) in enumerate(
        zip(rows.column("origin").to_pylist(), rows.column("edge_id").to_pylist(), strict=True)
    ):
        if (origin, edge) not in seen:
            seen.add((origin, edge))
            keep.append(i)
    return rows.take(pa.array(keep, pa.int64()))


def all_edges(ds: Dataset) -> pa.Table:
    """Every visible edge (one direction read in full: for checks and exports)."""
    state = GraphState.load(ds)
    if state is None:
        return EDGE_SCHEMA.empty_table()
    dt = table_location(ds, BY_SOURCE).table()
    if dt is None:
        return EDGE_SCHEMA.empty_table()
    rows = dt.to_pyarrow_dataset().to_table().select(EDGE_SCHEMA.names).cast(EDGE_SCHEMA)
    return _visible(ds, rows, state)


def edge_count(ds: Dataset) -> int:
    return int(all_edges(ds).num_rows)


def refs(
    ds: Dataset,
    entity_id: str,
    *,
    direction: str = "in",
    props: Sequence[str] | None = None,
    schemata: Sequence[str] | None = None,
    as_of: str | int | None = None,
) -> list[dict[str, Any]]:
    """The edges at an entity: ``in`` (who points at it), ``out`` (what it points
    at) or ``both``; each with the other entity's id, schema and caption (``None``
    for a target outside the dataset). Sorted by direction, property, other id.

    ``as_of`` answers for a published version from the tables as they were then
    (the index holds the current edges only, so this is a scan of that version).
    """

    check_id(entity_id)
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, not {direction!r}")
    check_filters(props, schemata)
    if as_of is not None:
        scanned = _scan_edges(ds, entity_id, direction, props, as_of)
        return _describe(ds, scanned, schemata, as_of)
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
    ds: Dataset,
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
    ds: Dataset, entity_id: str, direction: str, props: Sequence[str] | None, as_of: str | int
) -> list[tuple[str, dict[str, Any]]]:
    """The edges at an entity in a published version, by scanning its live statements."""
    from lakehouse_assets.query import live_chunks, version_snapshot

    snapshot = version_snapshot(ds, as_of)
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
    ds: Dataset,
    found: list[tuple[str, dict[str, Any]]],
    schemata: Sequence[str] | None,
    as_of: str | int | None,
) -> list[dict[str, Any]]:
    """Edges with the other entity's schema and caption, filtered and sorted."""
    from lakehouse_assets.query import query

    others = sorted({row["other"] for _, row in found})
    entities = (
        {str(e.id): e for e in query(ds, entity_ids=others, flush=False, as_of=as_of)}
        if others
        else {}
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
    ds: Dataset, entity_id: str, *, depth: int = 1, limit: int = 100
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
    entities = {str(e.id): e for e in query(ds, entity_ids=order, flush=False)}
    for eid in order:
        if eid in entities:
            yield entities[eid].to_dict()


def status(ds: Dataset) -> dict[str, Any]:
    """What the index reflects, and whether that is the current snapshot."""
    state = GraphState.load(ds)
    if state is None:
        return {"built": False}
    current = ds.snapshot()
    try:
        old = DatasetSnapshot.load(ds.statements_table, ds.translog_table, state.translog_version)
        current_ok = old.content_key == current.content_key
    except Exception:
        current_ok = False
    return {
        "built": True,
        "current": current_ok and not state.rebuilding,
        "reflects": {"statements": state.statements_version, "translog": state.translog_version},
        "latest": {"statements": current.statements.version, "translog": current.translog.version},
        "edges": state.edges,
        "by_prop": state.by_prop,
        "dangling": state.dangling,
        "tombstones": state.tombstones,
        "generations": len(state.generations),
        "updated_at": state.updated_at,
    }
