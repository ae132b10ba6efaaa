"""graph.cypher written by SQL equals followthemoney's own Cypher export.

The batched script is built by DuckDB from the model (no Python loop over
proxies), so its contract is followthemoney's ``CypherGraphExporter`` on the
same entities file: as sets of nodes (id, labels, properties) and
relationships (type, ends, properties), parsed from both scripts. Hypothesis
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

from followthemoney import model
from followthemoney.export.neo4j import CypherGraphExporter
from followthemoney.types import registry
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse_assets.graph_exports import write_batched_cypher
from lakehouse_assets_tests.conftest import PROFILE
from lakehouse_assets_tests.test_graph import _graph_of

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
