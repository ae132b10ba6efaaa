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
"""

from __future__ import annotations

import csv
import io
import shutil
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

import pyarrow as pa
from followthemoney import model
from followthemoney.export.graph import GraphExporter
from followthemoney.export.neo4j import CypherGraphExporter
from followthemoney.property import Property
from followthemoney.proxy import EntityProxy
from followthemoney.schema import Schema
from followthemoney.types import registry
from followthemoney.types.common import PropertyType
from followthemoney.util import const_case

from lakehouse_assets import conventions as cv
from lakehouse_assets.freshness import graph_exports_fresh
from lakehouse_assets.storage import LocalStore

if TYPE_CHECKING:
    from lakehouse_assets.lake import Dataset

#: Elements per UNWIND list.
BATCH: Final = 1000
#: The label every entity node gets, so the uniqueness constraint applies.
ENTITY_LABEL: Final = "Entity"
CYPHER: Final = cv.GRAPH_CYPHER
#: followthemoney's choice of exported properties (not hidden, not entity-typed)
_EXPORTER: Final = GraphExporter()
GRAPHML: Final = cv.GRAPH_GRAPHML
NEO4J: Final = cv.GRAPH_NEO4J


def _entities(ds: Dataset) -> Iterator[EntityProxy]:
    from lakehouse_assets.query import stream_entities

    for data in stream_entities(ds):
        yield model.get_proxy(data)


# --- graph.cypher, written by SQL --------------------------------------------------
#
# followthemoney's graph model (``followthemoney.graph.Graph``), stated as SQL over
# the entities export so that DuckDB builds the script instead of a Python loop
# over proxies (tests replay this script and followthemoney's own with Neo4j's
# MERGE/SET semantics and compare the graphs they leave):
#
# - an entity of a non-edge schema is a node ``entity:{id}``, labelled with its
#   schema's names, its attributes the exportable properties joined with "; ",
#   plus ``id`` and the caption ``EntityProxy.caption`` gives;
# - each entity-typed value of such an entity is a relationship of the
#   property's name (CONST_CASE) to the node ``entity:{value}``, id
#   ``entity:{id}<>entity:{value}`` (one per pair: the last property wins, as in
#   the graph's edge dict), when the property is matchable;
# - an entity of an edge schema (Ownership, ...) is a relationship of its schema
#   name per (source, target) pair, id ``entity:{s}<{id}>entity:{t}``, with its
#   exportable properties;
# - a referenced id is a stub captioned with the id, labelled with the range of
#   the first reference to it in each entity's own graph (followthemoney makes
#   one graph per entity); where the id is a node entity further down the file,
#   those stubs' labels land on the entity (each ``MERGE`` adds its labels);
#   stubs of ids that are no node entity only create.


def _labels(names: Iterable[str]) -> str:
    return ":".join(f"`{name}`" for name in [ENTITY_LABEL, *sorted(names)])


#: typed empty lists (an untyped ``[]`` cannot be unnested)
_NO_VALUES: Final = "[]::VARCHAR[]"
_NO_ENTRIES: Final = "[]::STRUCT(key VARCHAR, value VARCHAR[])[]"


def _sql_text(value: str) -> str:
    """A SQL string literal (model names: letters only, but quoted safely)."""
    return "'" + value.replace("'", "''") + "'"


def _sql_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(_sql_text(v) for v in values) + "]"


def _caption(schema: str, properties: dict[str, list[str]]) -> str:
    """followthemoney's own caption, for entities whose caption is a pick among
    several names (the SQL takes the first value everywhere else)."""
    return str(model.get_proxy({"id": "x", "schema": schema, "properties": properties}).caption)


def _own_join(schema: str, prop: str, values: list[str]) -> str:
    """A type's own join of several values (followthemoney's, for json)."""
    return str(model.get(schema).properties[prop].type.join(values))  # type: ignore[union-attr]


def _by_schema(schemata: Iterable[Schema], branch: Callable[[Schema], str], default: str) -> str:
    """``CASE schema WHEN ... END`` with one branch per schema: the model is
    known when the query is written, so each row evaluates only its schema's
    expression (no join against a table of the model)."""
    whens = " ".join(f"WHEN {_sql_text(s.name)} THEN {branch(s)}" for s in schemata)
    return f"CASE schema {whens} ELSE {default} END" if whens else default


def _fields_sql(schema: Schema, render: str, sep: str, skip: Iterable[str] = ()) -> str:
    """The exportable properties of an entity that have values, as one string:
    each rendered by the SQL expression ``render`` over ``x.key`` (the name) and
    ``x.value`` (the values joined as followthemoney joins them), joined by
    ``sep``. ``skip`` names attributes the format sets itself."""
    exportable = [p for p in _EXPORTER.exportable_properties(schema) if p.name not in skip]
    if not exportable:
        return "''"
    own = [p.name for p in exportable if type(p.type).join is not PropertyType.join]
    joined = "array_to_string(x.value, '; ')"
    if own:
        joined = (
            f"CASE WHEN x.key IN ({', '.join(map(_sql_text, own))}) "
            f"THEN ftm_join({_sql_text(schema.name)}, x.key, x.value) ELSE {joined} END"
        )
    names = ", ".join(_sql_text(p.name) for p in exportable)
    return (
        "array_to_string(list_transform(list_filter(list_transform("
        f"list_filter(map_entries(properties), x -> x.key IN ({names})), "
        f"x -> struct_pack(key := x.key, value := {joined})), x -> x.value <> ''), "
        f"x -> {render}), {_sql_text(sep)})"
    )


def _cypher_attrs_sql(schema: Schema) -> str:
    """Exportable properties as Cypher map entries."""
    return _fields_sql(schema, "'`' || x.key || '`: ' || cypher_text(x.value)", ", ")


def _columns_sql(schema: Schema) -> str:
    """Every exportable property as one quoted CSV cell each (empty ones too),
    in followthemoney's column order, each preceded by a comma."""
    cells = []
    for prop in _EXPORTER.exportable_properties(schema):
        values = f"properties[{_sql_text(prop.name)}]"
        if type(prop.type).join is not PropertyType.join:
            joined = f"ftm_join({_sql_text(schema.name)}, {_sql_text(prop.name)}, {values})"
        else:
            joined = f"array_to_string({values}, '; ')"
        cells.append(f"',' || csv_cell(coalesce({joined}, ''))")
    return " || ".join(cells) if cells else "''"


def _caption_sql(schema: Schema) -> str:
    """``EntityProxy.caption``: the first value of the first caption property
    that has one; followthemoney picks among several names itself."""
    whens = []
    for name in schema.caption:
        prop = schema.properties[name]
        values = f"properties[{_sql_text(name)}]"
        first = f"{values}[1]"
        if prop.type == registry.name:
            first = (
                f"CASE WHEN len({values}) > 1 THEN ftm_caption({_sql_text(schema.name)}, "
                f"properties) ELSE {first} END"
            )
        whens.append(f"WHEN len({values}) > 0 THEN {first}")
    label = _sql_text(schema.label)
    return f"CASE {' '.join(whens)} ELSE {label} END" if whens else label


def _refs_sql(schema: Schema) -> str:
    """The entity-typed properties of a node entity, in the entity's order."""
    names = [p.name for p in schema.properties.values() if p.type == registry.entity]
    if not names:
        return _NO_ENTRIES
    return (
        f"list_filter(map_entries(properties), x -> x.key IN ({', '.join(map(_sql_text, names))}))"
    )


def _props_table() -> pa.Table:
    """Per (schema, entity-typed property): the relationship type, the weight and
    the labels (and name) of a stub of the property's range."""
    rows: dict[str, list[Any]] = defaultdict(list)
    for schema in model.schemata.values():
        for prop in schema.properties.values():
            if prop.type != registry.entity:
                continue
            rows["schema"].append(schema.name)
            rows["prop"].append(prop.name)
            rows["rel_type"].append(const_case(prop.name))
            # the entity type's specificity does not depend on the value
            rows["weight"].append(prop.specificity("x"))
            rows["range_names"].append(sorted(prop.range.names) if prop.range else [])
            rows["range_name"].append(prop.range.name if prop.range else registry.entity.name)
    return pa.table(rows)


def _is_edge(schema: Schema) -> bool:
    return bool(schema.edge and schema.source_prop and schema.target_prop)


class _Present:
    """The schemata of an entities file, split as followthemoney's graph splits them."""

    def __init__(self, names: Iterable[str]) -> None:
        known = [s for s in (model.get(name) for name in sorted(names)) if s is not None]
        self.nodes = [s for s in known if not _is_edge(s)]
        self.edges = [s for s in known if _is_edge(s)]

    def node_names(self) -> str:
        return ", ".join(_sql_text(s.name) for s in self.nodes) or "NULL"

    def edge_names(self) -> str:
        return ", ".join(_sql_text(s.name) for s in self.edges) or "NULL"


def _end(schema: Schema, end: str) -> Property:
    """An edge schema's source or target property."""
    prop = schema.source_prop if end == "source" else schema.target_prop
    assert prop is not None and prop.range is not None
    return prop


def _range(schema: Schema, end: str) -> Schema:
    """The schema an edge schema's source or target points at."""
    found = _end(schema, end).range
    assert found is not None
    return found


def _tables_sql(present: _Present, entities_file: Path) -> list[str]:
    """The tables every graph export reads: the entities (in file order), the
    entity-typed values of node entities, the (source, target) pairs of edge
    entities, and each entity's first reference to every id it refers to."""
    edges = present.edges
    return [
        f"""
CREATE TEMP TABLE ent AS
SELECT id, schema, properties, row_number() OVER () AS ord
FROM read_json({_sql_text(str(entities_file))}, format = 'newline_delimited',
               maximum_object_size = 1073741824,
               columns = {{id: 'VARCHAR', schema: 'VARCHAR', properties: 'MAP(VARCHAR, VARCHAR[])'}})
WHERE id IS NOT NULL AND id <> ''
""",
        f"CREATE TEMP VIEW node_ent AS SELECT * FROM ent WHERE schema IN ({present.node_names()})",
        f"CREATE TEMP VIEW edge_ent AS SELECT * FROM ent WHERE schema IN ({present.edge_names()})",
        # entity-typed values of node entities (unnest in the select list with
        # generate_subscripts for the positions: a lateral join costs 3x)
        f"""
CREATE TEMP TABLE refs AS
SELECT source, schema, ord, entry.key AS prop, unnest(entry.value) AS target, pos,
       generate_subscripts(entry.value, 1) AS vpos
FROM (
    SELECT id AS source, schema, ord, unnest(entries) AS entry,
           generate_subscripts(entries, 1) AS pos
    FROM (SELECT id, schema, ord, {_by_schema(present.nodes, _refs_sql, _NO_ENTRIES)} AS entries
          FROM node_ent)
)
""",
        # (source, target) of edge entities
        f"""
CREATE TEMP TABLE pairs AS
SELECT id, schema, ord, source, unnest(targets) AS target, source_names, target_names,
       source_range, target_range, i, generate_subscripts(targets, 1) AS j, len(targets) AS nt
FROM (
    SELECT *, unnest(sources) AS source, generate_subscripts(sources, 1) AS i
    FROM (
        SELECT id, schema, ord,
               {_by_schema(edges, lambda s: f"properties[{_sql_text(_end(s, 'source').name)}]", _NO_VALUES)} AS sources,
               {_by_schema(edges, lambda s: f"properties[{_sql_text(_end(s, 'target').name)}]", _NO_VALUES)} AS targets,
               {_by_schema(edges, lambda s: _sql_list(sorted(_range(s, "source").names)), _NO_VALUES)} AS source_names,
               {_by_schema(edges, lambda s: _sql_list(sorted(_range(s, "target").names)), _NO_VALUES)} AS target_names,
               {_by_schema(edges, lambda s: _sql_text(_range(s, "source").name), "NULL")} AS source_range,
               {_by_schema(edges, lambda s: _sql_text(_range(s, "target").name), "NULL")} AS target_range
        FROM edge_ent
    )
)
""",
        # followthemoney makes a stub of the first reference to an id (with that
        # property's range): for a node entity the first in property and value
        # order, for an edge entity the first in (source, target) pair order,
        # source before target; ``k`` orders the references within one entity
        """
CREATE TEMP TABLE stub_refs AS
SELECT r.target AS id, r.ord, {'a': r.pos, 'b': r.vpos} AS k,
       p.range_names AS names, p.range_name
FROM refs r JOIN props p ON p.schema = r.schema AND p.prop = r.prop
QUALIFY row_number() OVER (PARTITION BY r.source, r.target ORDER BY r.pos, r.vpos) = 1
UNION ALL
SELECT ref, ord, min(k), arg_min(names, k), arg_min(range_name, k) FROM (
    SELECT id, ord, source AS ref, source_names AS names, source_range AS range_name,
           {'a': (i - 1) * nt, 'b': 0::BIGINT} AS k FROM pairs
    UNION ALL
    SELECT id, ord, target, target_names, target_range, {'a': j - 1, 'b': 1::BIGINT} FROM pairs
) GROUP BY id, ord, ref
""",
        # one relationship per (source, target) of a node entity's references:
        # the last property wins, as in followthemoney's edge dict
        """
CREATE TEMP TABLE links AS
SELECT r.source, r.target, r.ord, r.pos, r.vpos, p.rel_type, p.prop, p.weight
FROM refs r JOIN props p ON p.schema = r.schema AND p.prop = r.prop
WHERE p.weight > 0
QUALIFY row_number() OVER (PARTITION BY r.source, r.target ORDER BY r.pos DESC, r.vpos DESC) = 1
""",
    ]


# --- graph.cypher ---------------------------------------------------------------------


def _cypher_sql(present: _Present) -> str:
    """The query behind graph.cypher: one row per ``UNWIND`` batch."""
    nodes, edges = present.nodes, present.edges
    return f"""
WITH
-- a stub written before its entity's own line adds its labels to the entity
-- (followthemoney skips the stubs of entities it has written already)
early_refs AS (
    SELECT r.id, flatten(list(r.names)) AS names
    FROM stub_refs r JOIN node_ent e ON e.id = r.id AND r.ord < e.ord
    GROUP BY r.id
),
stubs AS (
    SELECT id, list_sort(list_distinct(flatten(list(names)))) AS names
    FROM stub_refs r
    WHERE NOT EXISTS (SELECT 1 FROM node_ent e WHERE e.id = r.id)
    GROUP BY id
),
nodes AS (
    SELECT CASE WHEN x.names IS NULL
                THEN {_by_schema(nodes, lambda s: _sql_text(_labels(s.names)), "NULL")}
                ELSE labels(list_concat(
                    {_by_schema(nodes, lambda s: _sql_list(sorted(s.names)), _NO_VALUES)},
                    x.names))
           END AS key,
           0 AS kind, id AS sort,
           '{{`id`: ' || cypher_text('entity:' || id)
           || ', `caption`: ' || cypher_text({_by_schema(nodes, _caption_sql, "NULL")})
           || coalesce(', ' || nullif({_by_schema(nodes, _cypher_attrs_sql, "''")}, ''), '') || '}}'
           AS item
    FROM node_ent LEFT JOIN early_refs x USING (id)
),
stub_nodes AS (
    SELECT labels(names) AS key, 1 AS kind, id AS sort,
           '{{`id`: ' || cypher_text('entity:' || id) || ', `caption`: ' || cypher_text(id) || '}}' AS item
    FROM stubs
),
rels AS (
    SELECT rel_type AS key, 2 AS kind, source || '<>' || target AS sort,
           '{{source: ' || cypher_text('entity:' || source)
           || ', target: ' || cypher_text('entity:' || target)
           || ', props: {{`id`: ' || cypher_text('entity:' || source || '<>entity:' || target)
           || ', `weight`: ' || cypher_text(weight::VARCHAR) || '}}}}' AS item
    FROM links
    UNION ALL
    SELECT {_by_schema(edges, lambda s: _sql_text(const_case(s.name)), "NULL")}, 2,
           id || '<' || source || '>' || target,
           '{{source: ' || cypher_text('entity:' || source) || ', target: ' || cypher_text('entity:' || target)
           || ', props: {{`id`: ' || cypher_text('entity:' || source || '<' || id || '>entity:' || target)
           || ', `weight`: "1.0"'
           || coalesce(', ' || nullif(attrs, ''), '') || '}}}}'
    FROM pairs JOIN (SELECT ord, {_by_schema(edges, _cypher_attrs_sql, "''")} AS attrs
                     FROM edge_ent) USING (ord)
),
elements AS (
    SELECT * FROM nodes UNION ALL SELECT * FROM stub_nodes UNION ALL SELECT * FROM rels
),
batched AS (
    SELECT kind, key, (row_number() OVER (PARTITION BY kind, key ORDER BY sort) - 1) // ? AS batch,
           sort, item
    FROM elements
)
SELECT kind, key, count(*) AS n, string_agg(item, ', ' ORDER BY sort) AS items
FROM batched
GROUP BY kind, key, batch
ORDER BY kind, key, batch
"""


#: characters JSON leaves raw that break lines for line-based readers
_LINE_BREAKS: Final = {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _escape_line_breaks(items: str) -> str:
    """A JSON string is a Cypher string literal, once NEL, U+2028 and U+2029 are
    escaped too (they can only occur inside string literals here)."""
    for char, escaped in _LINE_BREAKS.items():
        if char in items:
            items = items.replace(char, escaped)
    return items


def _cypher_line(kind: int, key: str, items: str) -> str:
    if kind == 0:  # entities: their properties win
        return (
            f"UNWIND [{items}] AS row MERGE (n:{ENTITY_LABEL} {{id: row.id}}) "
            f"SET n += row SET n:{key};\n"
        )
    if kind == 1:  # stubs (a referenced id without its entity) only create
        return (
            f"UNWIND [{items}] AS row MERGE (n:{ENTITY_LABEL} {{id: row.id}}) "
            f"ON CREATE SET n += row, n:{key};\n"
        )
    # relationships after every node: MATCH needs both ends
    return (
        f"UNWIND [{items}] AS row MATCH (s:{ENTITY_LABEL} {{id: row.source}}), "
        f"(t:{ENTITY_LABEL} {{id: row.target}}) "
        f"MERGE (s)-[r:`{key}` {{id: row.props.id}}]->(t) SET r += row.props;\n"
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


# --- Neo4j bulk-import CSVs -----------------------------------------------------------
#
# followthemoney's ``export-neo4j-bulk`` layout (``Neo4JCSVExporter``): one file
# per schema of entities (node schemata: ``id:ID``, ``:LABEL``, ``caption``;
# edge schemata: ``id``, ``:TYPE``, ``:START_ID``, ``:END_ID``; then the
# exportable properties), ``_links.csv`` for the references of node entities,
# ``_nodes.csv`` for reified values (none: only entity references are
# edges), and ``neo4j_import.sh``. Every cell is quoted (``csv.unix_dialect``).
# A label cell lists the schema's names sorted (followthemoney's set order
# varies between runs).

_LINKS: Final = "_links"
_NODES: Final = "_nodes"


def _csv_line(cells: list[str]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, dialect=csv.unix_dialect).writerow(cells)
    return buffer.getvalue()


def _neo4j_header(schema: Schema) -> str:
    own = (
        ["id:ID", ":LABEL", "caption"]
        if not schema.edge
        else ["id", ":TYPE", ":START_ID", ":END_ID"]
    )
    return _csv_line(own + [p.name for p in _EXPORTER.exportable_properties(schema)])


def _neo4j_sql(present: _Present) -> str:
    """The query behind the Neo4j CSVs: (file, line) in file order."""
    nodes, edges = present.nodes, present.edges
    return f"""
SELECT schema AS file, ord AS o1, 0 AS o2,
       csv_cell('entity:' || id)
       || ',' || csv_cell({_by_schema(nodes, lambda s: _sql_text(";".join(sorted(s.names))), "NULL")})
       || ',' || csv_cell({_by_schema(nodes, _caption_sql, "NULL")})
       || {_by_schema(nodes, _columns_sql, "''")} AS line
FROM node_ent
UNION ALL
SELECT schema, ord, (i - 1) * nt + j,
       csv_cell(id) || ',' || csv_cell({_by_schema(edges, lambda s: _sql_text(const_case(s.name)), "NULL")})
       || ',' || csv_cell('entity:' || source) || ',' || csv_cell('entity:' || target)
       || columns
FROM pairs JOIN (SELECT ord, {_by_schema(edges, _columns_sql, "''")} AS columns FROM edge_ent)
     USING (ord)
UNION ALL
SELECT '{_LINKS}', ord, pos * 1000000 + vpos,
       csv_cell(rel_type) || ',' || csv_cell('entity:' || source) || ','
       || csv_cell('entity:' || target) || ',' || csv_cell(weight::VARCHAR)
FROM links
ORDER BY file, o1, o2
"""


def _neo4j_script(files: list[str]) -> str:
    """``neo4j_import.sh`` as followthemoney writes it (its admin path and
    database name from the same environment variables)."""
    from followthemoney.export.neo4j import NEO4J_ADMIN_PATH, NEO4J_DATABASE_NAME

    lines = [
        f"{NEO4J_ADMIN_PATH} import --id-type=STRING --database={NEO4J_DATABASE_NAME} \\\n",
        "\t--multiline-fields=true \\\n",
        f"\t--relationships={_LINKS}.csv \\\n",
        f"\t--nodes={_NODES}.csv \\\n",
    ]
    for name in files:
        schema = model.get(name)
        if schema is None:
            continue
        kind = "relationships" if schema.edge else "nodes"
        lines.append(f"\t--{kind}={name}.csv \\\n")
    return "".join(lines)


# --- running the queries ----------------------------------------------------------------


class GraphSQL:
    """A DuckDB connection holding the graph tables of one entities file (read
    once, for all three exports)."""

    def __init__(self, entities_file: Path) -> None:
        import duckdb

        self.con = duckdb.connect(config={"threads": 2})
        try:
            self._load(entities_file)
        except BaseException:
            self.con.close()
            raise

    def _load(self, entities_file: Path) -> None:
        con = self.con
        con.register("props", _props_table())
        con.execute(
            f"CREATE MACRO labels(names) AS '`{ENTITY_LABEL}`' || array_to_string("
            "list_transform(list_sort(list_distinct(names)), x -> ':`' || x || '`'), '')"
        )
        con.execute("CREATE MACRO cypher_text(v) AS to_json(v)::VARCHAR")
        con.execute("CREATE MACRO csv_cell(v) AS '\"' || replace(v, '\"', '\"\"') || '\"'")
        # XML 1.0 cannot hold most control characters at all; markup characters are
        # escaped, and so are tab, line feed and carriage return (parsers normalise them)
        con.execute(
            "CREATE MACRO xml_text(v) AS "
            "replace(replace(replace(replace(replace(replace(replace(regexp_replace(v, "
            r"'[\x00-\x08\x0B\x0C\x0E-\x1F\x{FFFE}\x{FFFF}]', '', 'g'), "
            "'&', '&amp;'), '<', '&lt;'), '>', '&gt;'), '\"', '&quot;'), "
            "chr(9), '&#9;'), chr(10), '&#10;'), chr(13), '&#13;')"
        )
        con.create_function(
            "ftm_caption",
            _caption,
            ["VARCHAR", "MAP(VARCHAR, VARCHAR[])"],
            "VARCHAR",
            side_effects=False,
        )
        con.create_function(
            "ftm_join",
            _own_join,
            ["VARCHAR", "VARCHAR", "VARCHAR[]"],
            "VARCHAR",
            side_effects=False,
        )
        found = con.execute(
            "SELECT schema, count(*) FROM read_json(?, format = 'newline_delimited', "
            "maximum_object_size = 1073741824, columns = {id: 'VARCHAR', schema: 'VARCHAR'}) "
            "WHERE id IS NOT NULL AND id <> '' GROUP BY schema",
            [str(entities_file)],
        ).fetchall()
        self.entities = sum(n for _, n in found)
        self.present = _Present(str(name) for name, _ in found if name is not None)
        for statement in _tables_sql(self.present, entities_file):
            con.execute(statement)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> GraphSQL:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cypher(self, out: TextIO, batch: int = BATCH) -> dict[str, int]:
        """The batched Cypher script: a uniqueness constraint, then ``UNWIND`` lists
        of up to ``batch`` nodes per label set, stubs, and relationships per type."""
        counts = {"entities": self.entities, "nodes": 0, "relationships": 0}
        out.write(
            f"CREATE CONSTRAINT entity_id IF NOT EXISTS FOR (n:{ENTITY_LABEL}) "
            "REQUIRE n.id IS UNIQUE;\n"
        )
        result = self.con.execute(_cypher_sql(self.present), [batch])
        while rows := result.fetchmany(64):
            for kind, key, n, items in rows:
                out.write(_cypher_line(kind, key, _escape_line_breaks(items)))
                counts["relationships" if kind == 2 else "nodes"] += n
        return counts

    def graphml(self, out: TextIO) -> dict[str, int]:
        """The GraphML document of the whole graph."""
        counts = {"nodes": 0, "edges": 0}
        out.write(_GRAPHML_HEAD)
        out.write(_graphml_keys(self.present))
        out.write('  <graph edgedefault="directed">\n')
        result = self.con.execute(_graphml_sql(self.present))
        while rows := result.fetchmany(4096):
            for kind, _, _, line in rows:
                out.write(f"    {line}\n")
                counts["edges" if kind >= 2 else "nodes"] += 1
        out.write("  </graph>\n</graphml>\n")
        return counts

    def neo4j(self, folder: Path) -> list[str]:
        """The ``neo4j-admin import`` files, written into ``folder``; their names."""
        folder.mkdir(parents=True, exist_ok=True)
        schemata = {s.name: s for s in (*self.present.nodes, *self.present.edges)}
        links = (folder / f"{_LINKS}.csv").open("w", encoding="utf-8", newline="")
        links.write(_csv_line([":TYPE", ":START_ID", ":END_ID", "weight"]))
        (folder / f"{_NODES}.csv").write_text(
            _csv_line(["id:ID", ":LABEL", "caption"]), encoding="utf-8"
        )
        handles: dict[str, TextIO] = {_LINKS: links}
        try:
            result = self.con.execute(_neo4j_sql(self.present))
            while rows := result.fetchmany(4096):
                for name, _, _, line in rows:
                    handle = handles.get(name)
                    if handle is None:
                        handle = (folder / f"{name}.csv").open("w", encoding="utf-8", newline="")
                        handle.write(_neo4j_header(schemata[name]))
                        handles[name] = handle
                    handle.write(line)
                    handle.write("\n")
        finally:
            for handle in handles.values():
                handle.close()
        files = sorted(name for name in handles if name != _LINKS)
        (folder / "neo4j_import.sh").write_text(_neo4j_script(files), encoding="utf-8")
        return sorted(p.name for p in folder.iterdir())


def write_batched_cypher(entities_file: Path, out: TextIO, batch: int = BATCH) -> dict[str, int]:
    """The batched Cypher script of an entities file (JSON lines), built by DuckDB."""
    with GraphSQL(entities_file) as db:
        return db.cypher(out, batch)


@contextmanager
def _local_entities(ds: Dataset) -> Iterator[Path]:
    """The entities export as a local file (downloaded from object storage)."""
    from lakehouse_assets.query import entities_export

    path = entities_export(ds)
    if isinstance(ds.store, LocalStore):
        yield ds.store.local_path(path)
        return
    with tempfile.TemporaryDirectory(prefix="lakehouse-graph-") as tmp:
        local = Path(tmp) / "entities.ftm.json"
        with ds.store.open_read(path) as src, local.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        yield local


def write_cypher(ds: Dataset, out: TextIO, *, ftm_compatible: bool = False) -> dict[str, int]:
    """The Cypher script of the dataset's entities export (see the module
    docstring): batched, or exactly what ``ftm export-cypher`` writes."""
    if not ftm_compatible:
        with _local_entities(ds) as entities:
            return write_batched_cypher(entities, out)
    exporter = CypherGraphExporter(out)
    count = 0
    for proxy in _entities(ds):
        exporter.write(proxy)
        count += 1
    exporter.finalize()
    return {"entities": count}


def export_graph(ds: Dataset, *, force: bool = False) -> dict[str, Any]:
    """Write ``graph.cypher``, ``graph.graphml`` and the Neo4j bulk CSVs from the
    entities export, unless they are fresh. Each file is written beside the lake
    and then moved (or uploaded) whole, so a crash leaves the previous one;
    Neo4j files of schemata no longer present are removed after."""
    if not force and graph_exports_fresh(ds):
        return {"skipped": "fresh"}
    read = ds.core_tags.get(cv.EXPORTS_ENTITIES)
    written: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="lakehouse-graph-") as tmp,
        _local_entities(ds) as entities,
        GraphSQL(entities) as db,
    ):
        folder = Path(tmp)
        with (folder / "graph.cypher").open("w", encoding="utf-8") as fh:
            written["cypher"] = db.cypher(fh)
        ds.store.put_file(cv.dataset_path(ds.name, CYPHER), folder / "graph.cypher")
        with (folder / "graph.graphml").open("w", encoding="utf-8") as fh:
            written["graphml"] = db.graphml(fh)
        ds.store.put_file(cv.dataset_path(ds.name, GRAPHML), folder / "graph.graphml")
        names = db.neo4j(folder / "neo4j")
        for name in names:
            ds.store.put_file(
                cv.dataset_path(ds.name, NEO4J, cv.file_id(name)), folder / "neo4j" / name
            )
        prefix = cv.dataset_path(ds.name, NEO4J)
        for stale in sorted(set(ds.store.list(prefix + "/")) - {f"{prefix}/{n}" for n in names}):
            ds.store.delete(stale)
        written["neo4j"] = {"files": names}
    # stamped with what it read (the entities export's tag), not the clock at its end
    if read is not None:
        ds.core_tags.set(cv.EXPORTS_GRAPH, read + timedelta(microseconds=1))
    return written
