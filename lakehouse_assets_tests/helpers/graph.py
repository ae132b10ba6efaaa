"""The graph exports' test oracles: a Cypher script replayed into the graph it leaves
in Neo4j, and followthemoney's own GraphML (in networkx) and Neo4j CSV exports,
compared as sets and multisets."""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import networkx as nx
from followthemoney import model
from followthemoney.export.graph import GraphExporter
from followthemoney.export.neo4j import Neo4JCSVExporter


def _cypher_json(text: str) -> Any:
    """A Cypher list/map literal as JSON: quote the keys outside strings."""
    out, i, in_string = [], 0, False
    while i < len(text):
        c = text[i]
        if in_string:
            out.append(c)
            if c == "\\":
                out.append(text[i + 1])
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
            out.append(c)
        elif c == "`" or c.isalpha() or c == "_":
            j = i
            while j < len(text) and (text[j].isalnum() or text[j] in "_`"):
                j += 1
            out.append(json.dumps(text[i:j].strip("`")))
            i = j - 1
        else:
            out.append(c)
        i += 1
    return json.loads("".join(out))


def _graph_of(script: str) -> tuple[dict[str, tuple[frozenset[str], dict[str, str]]], set[Any]]:
    """The graph a Cypher script leaves in Neo4j, by replaying its statements in
    order with Neo4j's semantics: ``MERGE`` finds or creates a node by id, ``SET
    n += map`` adds properties, ``SET n:Labels`` adds labels, ``ON CREATE`` only
    acts on a new node, and a relationship needs both ends (``MATCH``).
    Returns nodes (id → labels without ``Entity``, properties) and
    relationships (type, source, target, properties)."""
    import re

    nodes: dict[str, tuple[set[str], dict[str, str]]] = {}
    rels: set[Any] = set()

    def node(props: dict[str, str], labels: list[str], on_create: bool) -> None:
        named = {label for label in labels if label != "Entity"}
        known = nodes.get(props["id"])
        if known is None:
            nodes[props["id"]] = (named, dict(props))
        elif not on_create:
            known[0].update(named)
            known[1].update(props)

    def rel(kind: str, source: str, target: str, props: dict[str, str]) -> None:
        if source in nodes and target in nodes:
            rels.add((kind, source, target, frozenset(props.items())))

    for line in script.splitlines():
        if m := re.match(r"MERGE \(p \{ .* \}\) SET p \+= (\{.*\}) SET p :(.*);$", line):
            node(_cypher_json(m.group(1)), m.group(2).split(":"), False)
        elif m := re.match(
            r"MATCH \(s (\{.*?\})\), \(t (\{.*?\})\) MERGE \(s\)-\[:(\w+) (\{.*\})\]->\(t\);$", line
        ):
            rel(
                m.group(3),
                _cypher_json(m.group(1))["id"],
                _cypher_json(m.group(2))["id"],
                _cypher_json(m.group(4)),
            )
        elif m := re.match(
            r"UNWIND (\[.*\]) AS row MERGE \(n:Entity \{id: row.id\}\) (?:ON CREATE )?SET n \+= row,? (?:SET )?n:(.*);$",
            line,
        ):
            labels = m.group(2).replace("`", "").split(":")
            for props in _cypher_json(m.group(1)):
                node(props, labels, "ON CREATE" in line)
        elif m := re.match(r"UNWIND (\[.*\]) AS row MATCH .* MERGE \(s\)-\[r:`(\w+)` .*$", line):
            for row in _cypher_json(m.group(1)):
                rel(m.group(2), row["source"], row["target"], row["props"])
        elif line.strip() and not line.startswith("CREATE CONSTRAINT"):
            raise AssertionError(f"unparsed line: {line[:120]}")
    return {k: (frozenset(v[0]), v[1]) for k, v in nodes.items()}, rels


#: what XML 1.0 cannot hold (the export leaves it out)
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def followthemoney_networkx(lines: list[dict[str, Any]]) -> nx.MultiDiGraph:
    """followthemoney's graph of the whole file in networkx, attributes as
    networkx's exporters give them (exportable properties, schema, label,
    weight)."""
    exporter = GraphExporter()
    for data in lines:
        exporter.graph.add(model.get_proxy(data))
    graph = nx.MultiDiGraph()
    for node in exporter.graph.iternodes():
        attributes = exporter.get_attributes(node)
        attributes["schema"] = node.schema.name if node.schema else node.type.name
        if node.caption is not None:
            attributes["label"] = node.caption
        graph.add_node(node.id, **attributes)
    for edge in exporter.graph.iteredges():
        attributes = exporter.get_attributes(edge)
        attributes["schema"] = edge.type_name
        attributes["weight"] = str(edge.weight)
        graph.add_edge(edge.source_id, edge.target_id, key=edge.id, **attributes)
    return graph


def _elements(graph: nx.MultiDiGraph) -> tuple[dict[Any, Any], dict[Any, Any]]:
    """Nodes and edges with their attributes, as XML can hold them (no empty
    attribute, no character XML 1.0 lacks)."""

    def clean(data: dict[str, Any]) -> dict[str, str]:
        out = {k: _NOT_XML.sub("", v) for k, v in data.items()}
        return {k: v for k, v in out.items() if v}

    nodes = {n: clean(d) for n, d in graph.nodes(data=True)}
    edges = {(u, v, k): clean(d) for u, v, k, d in graph.edges(keys=True, data=True)}
    return nodes, edges


def followthemoney_neo4j(folder: Path, lines: list[dict[str, Any]]) -> Path:
    exporter = Neo4JCSVExporter(folder)
    for data in lines:
        exporter.write(model.get_proxy(data))
    exporter.finalize()
    return folder


def _csv_files(folder: Path) -> dict[str, Any]:
    """Each CSV's header and rows (a multiset; label cells with their names
    sorted, since followthemoney's order is a set's), and the script's lines."""
    found: dict[str, Any] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix != ".csv":
            found[path.name] = sorted(path.read_text(encoding="utf-8").splitlines())
            continue
        with path.open(encoding="utf-8", newline="") as fh:
            header, *rows = list(csv.reader(fh))
        if header[:2] == ["id:ID", ":LABEL"]:
            rows = [[r[0], ";".join(sorted(r[1].split(";"))), *r[2:]] for r in rows]
        found[path.name] = (header, Counter(tuple(r) for r in rows))
    return found
