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
- ``exports/neo4j/``: followthemoney's own ``neo4j-admin import`` layout;
- ``exports/graph.graphml``: the same graph through networkx.
"""

from __future__ import annotations

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
from followthemoney.export.neo4j import CypherGraphExporter, Neo4JCSVExporter
from followthemoney.proxy import EntityProxy
from followthemoney.schema import Schema
from followthemoney.types import registry
from followthemoney.types.common import PropertyType
from followthemoney.util import const_case

from lakehouse_assets import conventions as cv
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
GRAPHML: Final = "exports/graph.graphml"
NEO4J: Final = "exports/neo4j"


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


def _attrs_sql(schema: Schema) -> str:
    """The exportable properties of an entity as Cypher map entries, sorted by
    name, each value list joined as followthemoney joins it."""
    exportable = list(_EXPORTER.exportable_properties(schema))
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
        "x -> '`' || x.key || '`: ' || cypher_text(x.value)), ', ')"
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
    the labels of a stub of the property's range."""
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
    return pa.table(rows)


def _is_edge(schema: Schema) -> bool:
    return bool(schema.edge and schema.source_prop and schema.target_prop)


def _cypher_sql(present: Iterable[str]) -> str:
    """The query behind graph.cypher, for the schemata present in the file."""
    schemata = [model.get(name) for name in sorted(present)]
    known = [s for s in schemata if s is not None]
    nodes = [s for s in known if not _is_edge(s)]
    edges = [s for s in known if _is_edge(s)]

    def ends(schema: Schema, end: str) -> str:
        prop = schema.source_prop if end == "source" else schema.target_prop
        assert prop is not None
        return f"properties[{_sql_text(prop.name)}]"

    def end_names(schema: Schema, end: str) -> str:
        prop = schema.source_prop if end == "source" else schema.target_prop
        assert prop is not None and prop.range is not None
        return _sql_list(sorted(prop.range.names))

    node_names = ", ".join(_sql_text(s.name) for s in nodes) or "NULL"
    edge_names = ", ".join(_sql_text(s.name) for s in edges) or "NULL"
    return f"""
WITH ent AS MATERIALIZED (
    SELECT id, schema, properties, row_number() OVER () AS ord
    FROM read_json(?, format = 'newline_delimited', maximum_object_size = 1073741824,
                   columns = {{id: 'VARCHAR', schema: 'VARCHAR',
                              properties: 'MAP(VARCHAR, VARCHAR[])'}})
    WHERE id IS NOT NULL AND id <> ''
),
node_ent AS (SELECT * FROM ent WHERE schema IN ({node_names})),
edge_ent AS (SELECT * FROM ent WHERE schema IN ({edge_names})),
refs AS MATERIALIZED (  -- entity-typed values of node entities
    SELECT e.id AS source, e.schema, e.ord, r.entry.key AS prop, u.value AS target, r.pos, u.vpos
    FROM (SELECT id, schema, ord, {_by_schema(nodes, _refs_sql, _NO_ENTRIES)} AS entries
          FROM node_ent) e,
         unnest(e.entries) WITH ORDINALITY AS r(entry, pos),
         unnest(r.entry.value) WITH ORDINALITY AS u(value, vpos)
),
pairs AS MATERIALIZED (  -- (source, target) of edge entities
    SELECT e.id, e.ord, e.rel_type, e.attrs, s.value AS source, t.value AS target,
           e.source_names, e.target_names, s.i, t.j, len(e.targets) AS nt
    FROM (
        SELECT id, ord,
               {_by_schema(edges, lambda s: _sql_text(const_case(s.name)), "NULL")} AS rel_type,
               {_by_schema(edges, _attrs_sql, "''")} AS attrs,
               {_by_schema(edges, lambda s: ends(s, "source"), _NO_VALUES)} AS sources,
               {_by_schema(edges, lambda s: ends(s, "target"), _NO_VALUES)} AS targets,
               {_by_schema(edges, lambda s: end_names(s, "source"), _NO_VALUES)} AS source_names,
               {_by_schema(edges, lambda s: end_names(s, "target"), _NO_VALUES)} AS target_names
        FROM edge_ent
    ) e, unnest(e.sources) WITH ORDINALITY AS s(value, i),
         unnest(e.targets) WITH ORDINALITY AS t(value, j)
),
-- followthemoney makes one graph per entity, in which the first reference to
-- an id makes its stub (with that property's range): for a node entity the
-- first in property and value order, for an edge entity the first in
-- (source, target) pair order, source before target
stub_refs AS MATERIALIZED (
    SELECT r.target AS id, r.ord, p.range_names AS names
    FROM refs r JOIN props p ON p.schema = r.schema AND p.prop = r.prop
    QUALIFY row_number() OVER (PARTITION BY r.source, r.target ORDER BY r.pos, r.vpos) = 1
    UNION ALL
    SELECT ref, ord, arg_min(names, k) FROM (
        SELECT id, ord, source AS ref, source_names AS names, ((i - 1) * nt, 0) AS k FROM pairs
        UNION ALL SELECT id, ord, target, target_names, (j - 1, 1) FROM pairs
    ) GROUP BY id, ord, ref
),
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
           || coalesce(', ' || nullif({_by_schema(nodes, _attrs_sql, "''")}, ''), '') || '}}'
           AS item
    FROM node_ent LEFT JOIN early_refs x USING (id)
),
stub_nodes AS (
    SELECT labels(names) AS key, 1 AS kind, id AS sort,
           '{{`id`: ' || cypher_text('entity:' || id) || ', `caption`: ' || cypher_text(id) || '}}' AS item
    FROM stubs
),
rels AS (
    SELECT p.rel_type AS key, 2 AS kind, r.source || '<>' || r.target AS sort,
           '{{source: ' || cypher_text('entity:' || r.source)
           || ', target: ' || cypher_text('entity:' || r.target)
           || ', props: {{`id`: ' || cypher_text('entity:' || r.source || '<>entity:' || r.target)
           || ', `weight`: ' || cypher_text(p.weight::VARCHAR) || '}}}}' AS item
    FROM refs r JOIN props p ON p.schema = r.schema AND p.prop = r.prop
    WHERE p.weight > 0
    -- one relationship per pair: the last property wins, as in followthemoney's dict
    QUALIFY row_number() OVER (PARTITION BY r.source, r.target ORDER BY r.pos DESC, r.vpos DESC) = 1
    UNION ALL
    SELECT rel_type, 2, id || '<' || source || '>' || target,
           '{{source: ' || cypher_text('entity:' || source) || ', target: ' || cypher_text('entity:' || target)
           || ', props: {{`id`: ' || cypher_text('entity:' || source || '<' || id || '>entity:' || target)
           || ', `weight`: "1.0"' || coalesce(', ' || nullif(attrs, ''), '') || '}}}}'
    FROM pairs
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


def write_batched_cypher(entities_file: Path, out: TextIO, batch: int = BATCH) -> dict[str, int]:
    """The batched Cypher script of an entities file (JSON lines), built by DuckDB:
    a uniqueness constraint, then ``UNWIND`` lists of up to ``batch`` nodes per
    label set, stubs, and relationships per type."""
    import duckdb

    con = duckdb.connect(config={"threads": 2})
    try:
        con.register("props", _props_table())
        con.execute(
            f"CREATE MACRO labels(names) AS '`{ENTITY_LABEL}`' || array_to_string("
            "list_transform(list_sort(list_distinct(names)), x -> ':`' || x || '`'), '')"
        )
        con.execute("CREATE MACRO cypher_text(v) AS to_json(v)::VARCHAR")
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
        counts = {"entities": sum(n for _, n in found), "nodes": 0, "relationships": 0}
        out.write(
            f"CREATE CONSTRAINT entity_id IF NOT EXISTS FOR (n:{ENTITY_LABEL}) "
            "REQUIRE n.id IS UNIQUE;\n"
        )
        present = [str(name) for name, _ in found if name is not None]
        result = con.execute(_cypher_sql(present), [str(entities_file), batch])
        while rows := result.fetchmany(64):
            for kind, key, n, items in rows:
                out.write(_cypher_line(kind, key, _escape_line_breaks(items)))
                counts["relationships" if kind == 2 else "nodes"] += n
        return counts
    finally:
        con.close()


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
    fd, name = tempfile.mkstemp(prefix="lakehouse-", suffix=".cypher")
    local = Path(name)
    try:  # written beside, then moved (or uploaded) whole: a crash leaves the old one
        with open(fd, "w", encoding="utf-8") as fh:
            written["cypher"] = write_cypher(ds, fh)
        ds.store.put_file(cv.dataset_path(ds.name, CYPHER), local)
    finally:
        local.unlink(missing_ok=True)

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
