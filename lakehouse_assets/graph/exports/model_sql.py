"""followthemoney's graph model stated as SQL: the DuckDB tables every graph
export reads (entities, their references, the pairs of edge entities, stubs,
links), and the SQL helpers the format modules share.

The model is known when a query is written, so each helper expands into one
``CASE`` branch per schema present in the entities file.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from followthemoney import model
from followthemoney.export.graph import GraphExporter
from followthemoney.property import Property
from followthemoney.schema import Schema
from followthemoney.types import registry
from followthemoney.types.common import PropertyType
from followthemoney.util import const_case

#: followthemoney's choice of exported properties (not hidden, not entity-typed)
_EXPORTER: Final = GraphExporter()


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
