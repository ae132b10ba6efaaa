"""Graph exports of the entities: Cypher (batched), Neo4j bulk CSVs, GraphML.

followthemoney defines what the graph of a set of entities is (its
``followthemoney.graph.Graph``: entities as nodes, edge schemata such as
Ownership as relationships between their source and target, entity-typed
properties as relationships); these exports use that model on the entities
of ``entities.ftm.json`` so they match ``ftm export-cypher`` and
``ftm export-neo4j-bulk`` element for element:

- ``exports/graph.cypher``: a uniqueness constraint first, then ``UNWIND``
  lists of up to :data:`BATCH` nodes (one statement per label set) and
  relationships (one per type) instead of one ``MERGE`` per element, built
  by one DuckDB query (see :func:`write_batched_cypher`);
  ``ftm_compatible=True`` writes exactly what ``ftm export-cypher`` writes;
- ``exports/graph.graphml``: the whole graph as networkx's exporters build it
  (networkx reads it back), by a DuckDB query;
- ``exports/neo4j/``: followthemoney's ``neo4j-admin import`` layout
  (``ftm export-neo4j-bulk``), by a DuckDB query.

The entities file is read once into DuckDB tables (:class:`GraphSQL`) that
all three queries share.

The modules: :mod:`~lakehouse_assets.graph.exports.model_sql` (the shared
tables), one per format (:mod:`~lakehouse_assets.graph.exports.cypher`,
:mod:`~lakehouse_assets.graph.exports.graphml`,
:mod:`~lakehouse_assets.graph.exports.neo4j`),
:mod:`~lakehouse_assets.graph.exports.graph_sql` (the connection that runs
them) and :mod:`~lakehouse_assets.graph.exports.write` (a dataset's files).
The names callers use are re-exported here.
"""

from lakehouse_assets.graph.exports.cypher import BATCH, ENTITY_LABEL
from lakehouse_assets.graph.exports.graph_sql import GraphSQL, write_batched_cypher
from lakehouse_assets.graph.exports.write import (
    CYPHER,
    GRAPHML,
    NEO4J,
    export_graph,
    write_cypher,
)

__all__ = [
    "BATCH",
    "CYPHER",
    "ENTITY_LABEL",
    "GRAPHML",
    "NEO4J",
    "GraphSQL",
    "export_graph",
    "write_batched_cypher",
    "write_cypher",
]
