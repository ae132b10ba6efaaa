"""The DuckDB connection that reads one entities file into the graph tables
once and runs each format's query on them (:class:`GraphSQL`)."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from lakehouse_assets.graph.exports.cypher import (
    BATCH,
    ENTITY_LABEL,
    _cypher_line,
    _cypher_sql,
    _escape_line_breaks,
)
from lakehouse_assets.graph.exports.graphml import _GRAPHML_HEAD, _graphml_keys, _graphml_sql
from lakehouse_assets.graph.exports.model_sql import (
    _caption,
    _own_join,
    _Present,
    _props_table,
    _tables_sql,
)
from lakehouse_assets.graph.exports.neo4j import (
    _LINKS,
    _NODES,
    _csv_line,
    _neo4j_header,
    _neo4j_script,
    _neo4j_sql,
)


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
