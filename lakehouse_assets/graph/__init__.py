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

The package, one concern per module:

- :mod:`~lakehouse_assets.graph.tables`: the edge rows, the three Delta tables
  and their writer;
- :mod:`~lakehouse_assets.graph.state`: ``state.json`` and the status report;
- :mod:`~lakehouse_assets.graph.index`: rebuild and incremental update;
- :mod:`~lakehouse_assets.graph.lookups`: refs, neighbours, every edge;
- :mod:`~lakehouse_assets.graph.exports`: the Cypher, GraphML and Neo4j
  exports of the entities (imported on their own: they need followthemoney,
  which this package's index keeps out of start-up).

The names callers use (``graph.refs``, ``graph.update``, ...) are re-exported
here.
"""

from lakehouse_assets.graph.index import GraphResult, rebuild, update
from lakehouse_assets.graph.lookups import (
    DIRECTIONS,
    MAX_ID_LENGTH,
    GraphNotBuiltError,
    all_edges,
    check_filters,
    check_id,
    edge_count,
    edges_at,
    neighbours,
    refs,
)
from lakehouse_assets.graph.state import GraphState, status
from lakehouse_assets.graph.tables import (
    BY_SOURCE,
    BY_TARGET,
    EDGE_SCHEMA,
    FILE_BYTES,
    ROW_GROUP_ROWS,
    STATE,
    TOMBSTONE_SCHEMA,
    TOMBSTONES,
    table_location,
)

__all__ = [
    "BY_SOURCE",
    "BY_TARGET",
    "DIRECTIONS",
    "EDGE_SCHEMA",
    "FILE_BYTES",
    "MAX_ID_LENGTH",
    "ROW_GROUP_ROWS",
    "STATE",
    "TOMBSTONES",
    "TOMBSTONE_SCHEMA",
    "GraphNotBuiltError",
    "GraphResult",
    "GraphState",
    "all_edges",
    "check_filters",
    "check_id",
    "edge_count",
    "edges_at",
    "neighbours",
    "rebuild",
    "refs",
    "status",
    "table_location",
    "update",
]
