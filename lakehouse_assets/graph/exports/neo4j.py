"""The Neo4j bulk-import export (``neo4j/``): followthemoney's
``export-neo4j-bulk`` layout, its CSV headers, the query that writes the
lines, and ``neo4j_import.sh``."""

from __future__ import annotations

import csv
import io
from typing import Final

from followthemoney import model
from followthemoney.schema import Schema
from followthemoney.types.common import PropertyType
from followthemoney.util import const_case

from lakehouse_assets.graph.exports.model_sql import (
    _EXPORTER,
    _by_schema,
    _caption_sql,
    _Present,
    _sql_text,
)

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
