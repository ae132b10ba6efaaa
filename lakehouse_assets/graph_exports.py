"""Graph exports of the entities: Cypher (batched), Neo4j bulk CSVs, GraphML.

followthemoney defines what the graph of a set of entities is (its
``followthemoney.graph.Graph``: entities as nodes, edge schemata such as
Ownership as relationships between their source and target, entity-typed
properties as relationships); these exports use that model on the entities
of ``entities.ftm.json`` so they match ``ftm export-cypher`` and
``ftm export-neo4j-bulk`` element for element:

- ``exports/graph.cypher``: a uniqueness constraint first, then ``UNWIND``
  lists of up to :data:`BATCH` nodes (one statement per label set) and
  relationships (one per type) instead of one ``MERGE`` per element;
  ``ftm_compatible=True`` writes exactly what ``ftm export-cypher`` writes;
- ``exports/neo4j/``: followthemoney's own ``neo4j-admin import`` layout;
- ``exports/graph.graphml``: the same graph through networkx.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

from followthemoney import model
from followthemoney.export.graph import GraphExporter
from followthemoney.export.neo4j import CypherGraphExporter, Neo4JCSVExporter
from followthemoney.graph import Edge, Node
from followthemoney.proxy import EntityProxy
from followthemoney.util import const_case

from lakehouse_assets import conventions as cv

if TYPE_CHECKING:
    from lakehouse_assets.lake import Dataset

#: Elements per UNWIND list.
BATCH: Final = 1000
#: The label every entity node gets, so the uniqueness constraint applies.
ENTITY_LABEL: Final = "Entity"
CYPHER: Final = cv.GRAPH_CYPHER
GRAPHML: Final = "exports/graph.graphml"
NEO4J: Final = "exports/neo4j"


def _entities(ds: Dataset) -> Iterator[EntityProxy]:
    from lakehouse_assets.query import stream_entities

    for data in stream_entities(ds):
        yield model.get_proxy(data)


def _cypher_map(data: dict[str, Any]) -> str:
    """A Cypher map literal (keys are FtM property names, values JSON strings)."""
    return "{" + ", ".join(f"`{k}`: {json.dumps(v)}" for k, v in data.items() if v) + "}"


class BatchedCypherExporter(GraphExporter):
    """followthemoney's graph model, written as batched ``UNWIND`` statements."""

    def __init__(self, fh: TextIO, batch: int = BATCH) -> None:
        super().__init__()
        self.fh = fh
        self.batch = batch
        self.nodes: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.edges: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.proxy_nodes: set[str] = set()
        self.counts = {"nodes": 0, "relationships": 0}
        fh.write(
            f"CREATE CONSTRAINT entity_id IF NOT EXISTS FOR (n:{ENTITY_LABEL}) "
            "REQUIRE n.id IS UNIQUE;\n"
        )

    def _node(self, node: Node) -> None:
        if node.id is None or node.value in self.proxy_nodes:
            return
        if node.proxy is not None:
            self.proxy_nodes.add(node.value)
        attributes = self.get_attributes(node)
        attributes["id"] = node.id
        if node.caption is not None:
            attributes["caption"] = node.caption
        labels = list(node.schema.names) if node.schema else [node.type.name]
        # stubs (a referenced id without its entity) apart: they only create
        key = ("+" if node.proxy is not None else "-") + ":".join(sorted(labels))
        self.nodes[key].append(attributes)
        if len(self.nodes[key]) >= self.batch:
            self._flush_nodes(key)

    def _edge(self, edge: Edge) -> None:
        attributes = self.get_attributes(edge)
        attributes["id"] = edge.id
        attributes["weight"] = str(edge.weight)
        key = const_case(edge.type_name)
        self.edges[key].append(
            {"source": edge.source_id, "target": edge.target_id, "props": attributes}
        )

    def _flush_nodes(self, key: str) -> None:
        rows = self.nodes.pop(key, [])
        if not rows:
            return
        items = ", ".join(_cypher_map(r) for r in rows)
        labels = ":".join(f"`{label}`" for label in [ENTITY_LABEL, *key[1:].split(":")])
        # a stub only creates: it never overwrites the entity it names
        kind = "ON CREATE SET n += row, n" if key[0] == "-" else "SET n += row SET n"
        self.fh.write(
            f"UNWIND [{items}] AS row MERGE (n:{ENTITY_LABEL} {{id: row.id}}) {kind}:{labels};\n"
        )
        self.counts["nodes"] += len(rows)

    def _flush_edges(self, key: str) -> None:
        rows = self.edges.pop(key, [])
        for start in range(0, len(rows), self.batch):
            part = rows[start : start + self.batch]
            items = ", ".join(
                "{"
                + f"source: {json.dumps(r['source'])}, target: {json.dumps(r['target'])}, "
                + f"props: {_cypher_map(r['props'])}"
                + "}"
                for r in part
            )
            self.fh.write(
                f"UNWIND [{items}] AS row MATCH (s:{ENTITY_LABEL} {{id: row.source}}), "
                f"(t:{ENTITY_LABEL} {{id: row.target}}) "
                f"MERGE (s)-[r:`{key}` {{id: row.props.id}}]->(t) SET r += row.props;\n"
            )
            self.counts["relationships"] += len(part)

    def write_graph(self) -> None:
        for node in self.graph.iternodes():
            self._node(node)
        for edge in self.graph.iteredges():
            self._edge(edge)
        self.graph.flush()

    def finalize_graph(self) -> None:
        for key in list(self.nodes):
            self._flush_nodes(key)
        # relationships after every node: MATCH needs both ends
        for key in list(self.edges):
            self._flush_edges(key)


def write_cypher(ds: Dataset, out: TextIO, *, ftm_compatible: bool = False) -> dict[str, int]:
    """The Cypher script of the dataset's entities (see the module docstring)."""
    exporter: GraphExporter
    exporter = CypherGraphExporter(out) if ftm_compatible else BatchedCypherExporter(out)
    count = 0
    for proxy in _entities(ds):
        exporter.write(proxy)
        count += 1
    exporter.finalize()
    counts = {"entities": count}
    if isinstance(exporter, BatchedCypherExporter):
        counts.update(exporter.counts)
    return counts


def is_fresh(ds: Dataset) -> bool:
    """The spec's freshness rule: newer than the entities export they are made of."""
    return ds.core_tags.is_latest(cv.EXPORTS_GRAPH, [cv.EXPORTS_ENTITIES])


def export_graph(ds: Dataset, *, force: bool = False) -> dict[str, Any]:
    """Write ``graph.cypher``, ``graph.graphml`` and the Neo4j bulk CSVs from the
    entities export (atomically each: a crash leaves the previous files), unless
    they are fresh."""
    import networkx as nx

    if not force and is_fresh(ds):
        return {"skipped": "fresh"}
    read = ds.core_tags.get(cv.EXPORTS_ENTITIES)
    written: dict[str, Any] = {}
    text = io.StringIO()
    written["cypher"] = write_cypher(ds, text)
    ds.store.write_text(cv.dataset_path(ds.name, CYPHER), text.getvalue())

    exporter = GraphExporter()
    for proxy in _entities(ds):
        exporter.graph.add(proxy)
    digraph = nx.MultiDiGraph()
    for node in exporter.graph.iternodes():
        attributes = exporter.get_attributes(node)
        attributes["schema"] = node.schema.name if node.schema else node.type.name
        if node.caption is not None:
            attributes["label"] = node.caption
        digraph.add_node(node.id, **attributes)
    for edge in exporter.graph.iteredges():
        attributes = exporter.get_attributes(edge)
        attributes["schema"] = edge.type_name
        attributes["weight"] = str(edge.weight)
        digraph.add_edge(edge.source_id, edge.target_id, key=edge.id, **attributes)
    buffer = io.BytesIO()
    nx.write_graphml(digraph, buffer)
    ds.store.write_bytes(cv.dataset_path(ds.name, GRAPHML), buffer.getvalue())
    written["graphml"] = {
        "nodes": digraph.number_of_nodes(),
        "edges": digraph.number_of_edges(),
    }

    folder = Path(tempfile.mkdtemp(prefix="lakehouse-neo4j-"))
    try:
        neo4j = Neo4JCSVExporter(folder)
        for proxy in _entities(ds):
            neo4j.write(proxy)
        neo4j.finalize()
        names = sorted(p.name for p in folder.iterdir())
        for name in names:
            ds.store.put_file(cv.dataset_path(ds.name, NEO4J, cv.file_id(name)), folder / name)
        written["neo4j"] = {"files": names}
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    # stamped with what it read (the entities export's tag), not the clock at its end
    if read is not None:
        ds.core_tags.set(cv.EXPORTS_GRAPH, read + timedelta(microseconds=1))
    return written
