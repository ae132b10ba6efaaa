"""The batched Cypher export (``graph.cypher``): the query that builds one
``UNWIND`` line per batch of nodes or relationships, and the lines around it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from followthemoney.schema import Schema
from followthemoney.util import const_case

from lakehouse_assets.graph.exports.model_sql import (
    _NO_VALUES,
    _by_schema,
    _caption_sql,
    _fields_sql,
    _Present,
    _sql_list,
    _sql_text,
)

#: Elements per UNWIND list.
BATCH: Final = 1000
#: The label every entity node gets, so the uniqueness constraint applies.
ENTITY_LABEL: Final = "Entity"


def _labels(names: Iterable[str]) -> str:
    return ":".join(f"`{name}`" for name in [ENTITY_LABEL, *sorted(names)])


def _cypher_attrs_sql(schema: Schema) -> str:
    """Exportable properties as Cypher map entries."""
    return _fields_sql(schema, "'`' || x.key || '`: ' || cypher_text(x.value)", ", ")


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
