"""The graph exports written by SQL equal followthemoney's own.

graph.cypher, graph.graphml and the Neo4j CSVs are built by DuckDB from the
model (no Python loop over proxies), so their contract is followthemoney on
the same entities file: for Cypher, ``CypherGraphExporter`` as sets of nodes
(id, labels, properties) and relationships (type, ends, properties), parsed
from both scripts; for GraphML, followthemoney's graph of the whole file put
into networkx (the way networkx's exporters do) against what networkx reads
back from ours; for the Neo4j CSVs, ``Neo4JCSVExporter``'s files, row for
row. Hypothesis
draws the entities: node and edge schemata, references to entities present
and absent, several names (followthemoney's caption pick), two properties
pointing at one entity, and text with quotes, backslashes, control characters
and non-BMP characters.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import networkx as nx
from followthemoney import model
from followthemoney.export.neo4j import CypherGraphExporter
from followthemoney.types import registry
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse_assets.graph.exports import GraphSQL, write_batched_cypher
from lakehouse_assets_tests.conftest import PROFILE
from lakehouse_assets_tests.helpers.graph import (
    _csv_files,
    _elements,
    _graph_of,
    followthemoney_neo4j,
    followthemoney_networkx,
)

#: node and edge schemata, with entity-typed properties on nodes (Address,
#: Passport's holder, Note's entity) and several edge kinds
SCHEMATA = (
    "Person",
    "Company",
    "Organization",
    "LegalEntity",
    "Address",
    "Passport",
    "Note",
    "Sanction",
    "Ownership",
    "Directorship",
    "Family",
    "Payment",
    "UnknownLink",
)
IDS = [f"e{i}" for i in range(12)] + ["ünï-cødé", 'q"uote', "back\\slash"]
TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=12,
)


@st.composite
def entities(draw: st.DrawFn) -> list[dict[str, Any]]:
    ids = draw(st.lists(st.sampled_from(IDS), min_size=1, max_size=10, unique=True))
    out = []
    for entity_id in ids:
        schema = model.get(draw(st.sampled_from(SCHEMATA)))
        assert schema is not None
        candidates = sorted(
            p.name
            for p in schema.properties.values()
            if p.type in (registry.entity, registry.name, registry.string, registry.date)
            or p.name in ("country", "summary")
        )
        properties: dict[str, list[str]] = {}
        for name in draw(st.lists(st.sampled_from(candidates), max_size=6, unique=True)):
            prop = schema.properties[name]
            values = st.sampled_from(IDS) if prop.type == registry.entity else TEXT
            properties[name] = draw(st.lists(values, min_size=1, max_size=3, unique=True))
        out.append({"id": entity_id, "schema": schema.name, "properties": properties})
    return out


def followthemoney_cypher(lines: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    exporter = CypherGraphExporter(out)
    for data in lines:
        exporter.write(model.get_proxy(data))
    exporter.finalize()
    return out.getvalue()


def ours(tmp: Path, lines: list[dict[str, Any]]) -> tuple[str, dict[str, int]]:
    path = tmp / "entities.ftm.json"
    path.write_text("".join(json.dumps(d) + "\n" for d in lines), encoding="utf-8")
    out = io.StringIO()
    counts = write_batched_cypher(path, out, batch=3)
    return out.getvalue(), counts


@settings(max_examples=300 if PROFILE == "thorough" else 60)
@given(entities())
def test_cypher_sql_equals_followthemoney(
    tmp_path_factory: Any, lines: list[dict[str, Any]]
) -> None:
    script, counts = ours(tmp_path_factory.mktemp("cypher"), lines)
    nodes, rels = _graph_of(script)
    want_nodes, want_rels = _graph_of(followthemoney_cypher(lines))
    assert nodes == want_nodes
    assert rels == want_rels
    assert counts["entities"] == len(lines)
    assert counts["relationships"] == len(rels)


def test_cypher_sql_names_and_references(tmp_path: Path) -> None:
    """The cases a random draw may miss, spelled out: a pick among several
    names, two properties of one entity pointing at the same target (one
    relationship, as followthemoney keeps), a stub referred to by two ranges
    (both labels), and a batch boundary."""
    lines = [
        {
            "id": "p1",
            "schema": "Person",
            "properties": {"name": ["Jane Doe", "Jane  Doe", "J. Doe"]},
        },
        {
            "id": "a1",
            "schema": "Address",
            "properties": {"full": ["1 Main St"], "country": ["de"]},
        },
        {
            "id": "n1",
            "schema": "Note",
            "properties": {"entity": ["p1", "x9"], "description": ['say "hi"\n\\']},
        },
        {
            "id": "o1",
            "schema": "Ownership",
            "properties": {"owner": ["p1", "x9"], "asset": ["c1"], "percentage": ["50"]},
        },
        {
            "id": "d1",
            "schema": "Directorship",
            "properties": {"director": ["x9"], "organization": ["c2"]},
        },
    ]
    script, counts = ours(tmp_path, lines)
    nodes, rels = _graph_of(script)
    want_nodes, want_rels = _graph_of(followthemoney_cypher(lines))
    assert nodes == want_nodes and rels == want_rels
    assert nodes["entity:p1"][1]["caption"] == model.get_proxy(lines[0]).caption
    # x9 is referred to as a Thing (Note.entity), LegalEntity (owner) and Person (director)
    assert {"LegalEntity", "Thing"} <= nodes["entity:x9"][0]
    assert counts == {"entities": 5, "nodes": len(nodes), "relationships": len(rels)}
    assert script.startswith("CREATE CONSTRAINT entity_id IF NOT EXISTS")


# --- GraphML and the Neo4j CSVs ---------------------------------------------------------


def _our_files(tmp: Path, lines: list[dict[str, Any]]) -> tuple[Path, Path, dict[str, int]]:
    path = tmp / "entities.ftm.json"
    path.write_text("".join(json.dumps(d) + "\n" for d in lines), encoding="utf-8")
    with GraphSQL(path) as db:
        with (tmp / "graph.graphml").open("w", encoding="utf-8") as fh:
            counts = db.graphml(fh)
        db.neo4j(tmp / "neo4j")
    return tmp / "graph.graphml", tmp / "neo4j", counts


@settings(max_examples=200 if PROFILE == "thorough" else 40)
@given(entities())
def test_graphml_and_neo4j_sql_equal_followthemoney(
    tmp_path_factory: Any, lines: list[dict[str, Any]]
) -> None:
    tmp = tmp_path_factory.mktemp("graphml")
    graphml, neo4j, counts = _our_files(tmp, lines)
    back = nx.read_graphml(graphml, force_multigraph=True, edge_key_type=str)
    want = followthemoney_networkx(lines)
    assert _elements(back) == _elements(want)
    assert counts == {"nodes": want.number_of_nodes(), "edges": want.number_of_edges()}
    theirs = followthemoney_neo4j(tmp / "ftm-neo4j", lines)
    assert _csv_files(neo4j) == _csv_files(theirs)


def test_graphml_and_neo4j_cases(tmp_path: Path) -> None:
    """Spelled out: markup and line breaks in values and ids, a stub whose
    first reference decides its schema, an edge entity with two owners (two
    edges, two Neo4j rows), a reference that is not matchable (no link), and
    Person's own ``weight`` property beside the edges' weight."""
    lines = [
        {
            "id": "p<1>&",
            "schema": "Person",
            "properties": {"name": ['A "B" <C> & D\r\nE\tF'], "weight": ["80 kg"]},
        },
        {"id": "n1", "schema": "Note", "properties": {"entity": ["x9"], "description": ["d"]}},
        {
            "id": "o1",
            "schema": "Ownership",
            "properties": {"owner": ["p<1>&", "x9"], "asset": ["c1"], "percentage": ["50"]},
        },
        {"id": "c1", "schema": "Company", "properties": {"name": ["C"], "parent": ["x9"]}},
    ]
    graphml, neo4j, counts = _our_files(tmp_path, lines)
    back = nx.read_graphml(graphml, force_multigraph=True, edge_key_type=str)
    want = followthemoney_networkx(lines)
    assert _elements(back) == _elements(want)
    assert back.nodes["entity:p<1>&"]["name"] == 'A "B" <C> & D\r\nE\tF'
    assert back.nodes["entity:p<1>&"]["weight"] == "80 kg"
    # x9 is first referred to by Note.entity (a Thing)
    assert back.nodes["entity:x9"] == {"schema": "Thing", "label": "x9"}
    owned = [k for _, _, k in back.edges(keys=True) if "<o1>" in k]
    assert sorted(owned) == ["entity:p<1>&<o1>entity:c1", "entity:x9<o1>entity:c1"]
    assert counts["edges"] == back.number_of_edges()
    ours, theirs = _csv_files(neo4j), _csv_files(followthemoney_neo4j(tmp_path / "ftm", lines))
    assert ours == theirs
    assert set(ours) == {
        "_links.csv",
        "_nodes.csv",
        "Company.csv",
        "Note.csv",
        "Ownership.csv",
        "Person.csv",
        "neo4j_import.sh",
    }
    assert sum(ours["Ownership.csv"][1].values()) == 2
