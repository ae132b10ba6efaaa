"""The GraphML export (``graph.graphml``): the key declarations and the query
that writes one element per row, nodes first."""

from __future__ import annotations

from typing import Final

from lakehouse_assets.graph.exports.model_sql import (
    _EXPORTER,
    _by_schema,
    _caption_sql,
    _fields_sql,
    _Present,
)

# --- GraphML --------------------------------------------------------------------------
#
# One graph of the whole file (as networkx's exporters build it): an entity
# of a non-edge schema is a node with its exportable properties, ``schema`` and
# ``label`` (the caption); an id referred to without an entity is a node with
# ``schema`` the range of the first reference to it in the file and ``label``
# the id; references and edge entities are edges keyed by their
# followthemoney edge id, with ``schema`` (the property or schema name),
# ``weight`` and, for edge entities, their exportable properties. Empty
# attributes are left out (networkx reads an empty one back as absent).

_GRAPHML_HEAD: Final = (
    '<?xml version="1.0" encoding="utf-8"?>\n'
    '<graphml xmlns="http://graphml.graphdrawing.org/xmlns" '
    'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
    'xsi:schemaLocation="http://graphml.graphdrawing.org/xmlns '
    'http://graphml.graphdrawing.org/xmlns/1.0/graphml.xsd">\n'
)
#: attributes the GraphML sets itself, over properties of the same name
_NODE_OWN: Final = ("schema", "label")
_EDGE_OWN: Final = ("schema", "weight")


def _graphml_data(prefix: str) -> str:
    return f"'<data key=\"{prefix}_' || x.key || '\">' || xml_text(x.value) || '</data>'"


def _graphml_keys(present: _Present) -> str:
    """The ``<key>`` declarations: every attribute the present schemata can have."""
    node_attrs = {*_NODE_OWN}
    for schema in present.nodes:
        node_attrs.update(p.name for p in _EXPORTER.exportable_properties(schema))
    edge_attrs = {*_EDGE_OWN}
    for schema in present.edges:
        edge_attrs.update(p.name for p in _EXPORTER.exportable_properties(schema))
    lines = [
        f'  <key id="{prefix}_{name}" for="{kind}" attr.name="{name}" attr.type="string"/>\n'
        for prefix, kind, names in (("n", "node", node_attrs), ("e", "edge", edge_attrs))
        for name in sorted(names)
    ]
    return "".join(lines)


def _graphml_sql(present: _Present) -> str:
    """The query behind graph.graphml: one row per element, nodes first."""
    nodes, edges = present.nodes, present.edges

    def data(prefix: str, key: str, value: str) -> str:
        return f"'<data key=\"{prefix}_{key}\">' || xml_text({value}) || '</data>'"

    return f"""
SELECT 0 AS kind, ord AS o1, 0 AS o2,
       '<node id="' || xml_text('entity:' || id) || '">'
       || {data("n", "schema", "schema")}
       || {data("n", "label", _by_schema(nodes, _caption_sql, "NULL"))}
       || {_by_schema(nodes, lambda s: _fields_sql(s, _graphml_data("n"), "", _NODE_OWN), "''")}
       || '</node>' AS line
FROM node_ent
UNION ALL
SELECT 1, 0, 0,
       '<node id="' || xml_text('entity:' || id) || '">'
       || {data("n", "schema", "range_name")} || {data("n", "label", "id")} || '</node>'
FROM (
    SELECT id, arg_min(range_name, {{'o': ord, 'k': k}}) AS range_name
    FROM stub_refs r
    WHERE NOT EXISTS (SELECT 1 FROM node_ent e WHERE e.id = r.id)
    GROUP BY id
)
UNION ALL
SELECT 2, ord, pos * 1000000 + vpos,
       '<edge source="' || xml_text('entity:' || source) || '" target="'
       || xml_text('entity:' || target) || '" id="'
       || xml_text('entity:' || source || '<>entity:' || target) || '">'
       || {data("e", "schema", "prop")} || {data("e", "weight", "weight::VARCHAR")} || '</edge>'
FROM links
UNION ALL
SELECT 3, ord, (i - 1) * nt + j,
       '<edge source="' || xml_text('entity:' || source) || '" target="'
       || xml_text('entity:' || target) || '" id="'
       || xml_text('entity:' || source || '<' || id || '>entity:' || target) || '">'
       || {data("e", "schema", "schema")} || {data("e", "weight", "'1.0'")}
       || attrs || '</edge>'
FROM pairs JOIN (
    SELECT ord,
           {_by_schema(edges, lambda s: _fields_sql(s, _graphml_data("e"), "", _EDGE_OWN), "''")}
           AS attrs
    FROM edge_ent
) USING (ord)
ORDER BY kind, o1, o2, line
"""
