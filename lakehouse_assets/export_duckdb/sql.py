"""The rules of :mod:`lakehouse_assets.spark.ftm_sql` as DuckDB SQL, byte for byte.

The same results as the Spark plan, over a relation ``main`` of the snapshot's
statements (plus ``log``, its translog, where that changes a stored row):

- ``stmts``: the live statements, each once per entity (:func:`statements_view`,
  Spark's ``live_frame`` and ``ftm_sql.dedupe``);
- statements.csv through DuckDB's own CSV writer (:func:`csv_select`): every
  field quoted, ``"`` doubled, ``NULL`` as an empty field, booleans ``t``/``f``,
  the header followthemoney's ``CSV_COLUMNS`` (the bytes of its
  ``CSVStatementWriter``; sorted as ``query.SORT``);
- ``entity_lines`` (:func:`entity_lines_view`): one row per entity, sorted by
  ``canonical_id``, with its entities.ftm.json line and what the statistics and
  the incremental state need.

Where Spark aggregates twice (per property, then per entity) this aggregates
once, per entity, into a sorted list of the entity's (prop, value, id, lang)
and builds the properties from it with list lambdas: at 1M statements the
per-property group (891k groups of one statement, mostly) cost more than the
rest of the pass. JSON text is DuckDB's ``to_json`` of each value, whose
escapes are Jackson's (Spark's ``to_json``): ``\\b \\t \\n \\f \\r``, ``\\u00XX``
in upper-case hex for the other control characters, ``\\"`` and ``\\\\``,
everything else as it is (``test_export_duckdb.py`` holds the two equal on
any text). Null fields are left out, as Jackson leaves them out.

Two rules are not SQL: the common schema of an entity's schemata (computed
once per distinct set of schemata in Python, from followthemoney's model, and
joined), and rigour's pick of a caption among several names (the caller picks
for the rows that carry ``_pick_names``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from followthemoney.dataset import Dataset as FtmDataset
from followthemoney.statement.util import BASE_ID

from lakehouse_assets.entity_lines import _rules

if TYPE_CHECKING:
    import duckdb


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


#: the order of statements.csv (``query.SORT``), Spark's nulls first
CSV_ORDER = "canonical_id, prop, value, origin, id"


def statements_view(con: duckdb.DuckDBPyConnection, *, origins: int, translog: bool) -> None:
    """``stmts``: the live statements of ``main`` (and ``log``), each statement
    once per entity, with ``_copies_first_seen`` (the latest ``first_seen`` of
    its copies: followthemoney's ``last_change`` takes every origin's).

    With ``translog`` the rows the translog deletes are left out and the seen
    range comes from it (Spark's ``live_frame``); without, the main rows are
    the live ones (:func:`.tables.translog.main_is_live`). With one origin
    there are no copies (the table holds a statement once per origin)."""
    live = "main"
    if translog:
        con.execute(
            """
            CREATE TEMP VIEW live AS
            SELECT m.* EXCLUDE (first_seen, last_seen),
                   coalesce(t.first_seen, m.first_seen) AS first_seen,
                   coalesce(t.last_seen, m.last_seen) AS last_seen
            FROM main m LEFT JOIN log t ON t.origin = m.origin AND t.id = m.id
            WHERE t.deleted_at IS NULL
            """
        )
        live = "live"
    if origins <= 1:
        con.execute(
            f"CREATE TEMP VIEW stmts AS SELECT *, first_seen AS _copies_first_seen FROM {live}"
        )
        return
    con.execute(
        f"""
        CREATE TEMP VIEW stmts AS
        SELECT * EXCLUDE (_copy) FROM (
            SELECT *,
                row_number() OVER (PARTITION BY canonical_id, id ORDER BY prop, value, origin)
                    AS _copy,
                max(first_seen) OVER (PARTITION BY canonical_id, id) AS _copies_first_seen
            FROM {live}
        ) WHERE _copy = 1
        """
    )


def _csv_columns() -> tuple[str, ...]:
    from followthemoney.statement.serialize import CSV_COLUMNS

    return tuple(CSV_COLUMNS)


def _csv_field(name: str) -> str:
    if name == "external":
        return "CASE WHEN external THEN 't' ELSE 'f' END"
    return f"coalesce({name}, '')"


def csv_select() -> str:
    """The statements.csv rows for DuckDB's writer (``FORCE_QUOTE *``, header)."""
    fields = ", ".join(f"{_csv_field(c)} AS {c}" for c in _csv_columns())
    return f"SELECT {fields} FROM stmts ORDER BY {CSV_ORDER}"


def csv_line_bytes() -> str:
    """The bytes of a statement's statements.csv line, its ``\\n`` included,
    without making the line: each field quoted (2) with its quotes doubled,
    the commas between them."""
    columns = _csv_columns()
    parts = []
    for name in columns:
        field = _csv_field(name)
        quotes = (
            f"(CASE WHEN contains({field}, '\"') "
            f"THEN strlen({field}) - strlen(replace({field}, '\"', '')) ELSE 0 END)"
        )
        parts.append(f"strlen({field}) + {quotes}")
    return f"({' + '.join(parts)} + {3 * len(columns)})"


def schema_rules(con: duckdb.DuckDBPyConnection) -> None:
    """``schema_rules``: each schema's label and caption properties (name-typed or
    not), from followthemoney's model (the literals :mod:`.spark.ftm_sql` takes)."""
    rules = _rules()
    names = sorted(rules.captions)
    captions = pa.array(
        [[{"prop": p, "is_name": n} for p, n in rules.captions[name]] for name in names],
        pa.list_(pa.struct([("prop", pa.string()), ("is_name", pa.bool_())])),
    )
    table = pa.table(
        {"schema": names, "label": [rules.labels.get(n) for n in names], "captions": captions}
    )
    con.register("schema_rules", table)


def merged_schemata(combinations: Iterable[list[str]]) -> pa.Table:
    """``merged``: the common schema of each distinct sorted set of schemata
    (``key``: joined by ``|``), NULL where there is none (followthemoney's
    ``common_schema`` folded left, as :func:`.spark.ftm_sql.entity_frame`)."""
    common = _rules().common
    keys: list[str] = []
    schemas: list[str | None] = []
    for names in combinations:
        merged: str | None = names[0] if names else None
        for other in names[1:]:
            merged = common.get((merged, other)) if merged is not None else None
        keys.append("|".join(names))
        schemas.append(merged)
    return pa.table({"key": pa.array(keys, pa.string()), "schema": pa.array(schemas, pa.string())})


#: A range of canonical ids, ``[low, high)`` (None: unbounded), an entity pass
#: aggregates at a time: each range's entities fit DuckDB's memory, and the
#: ranges in order give the entities in order.
IdRange = tuple[str | None, str | None]


def id_filter(ids: IdRange) -> str:
    """The SQL condition on ``canonical_id`` of a range (``TRUE`` for all)."""
    low, high = ids
    parts = []
    if low is not None:
        parts.append(f"canonical_id >= {_literal(low)}")
    if high is not None:
        parts.append(f"canonical_id < {_literal(high)}")
    return " AND ".join(parts) or "TRUE"


def schema_sets(ids: IdRange) -> str:
    """The distinct sorted sets of schemata the range's entities have."""
    return (
        "SELECT DISTINCT list_sort(list_distinct(list(schema))) FROM stmts "
        f"WHERE {id_filter(ids)} GROUP BY canonical_id"
    )


#: the columns of an entity line's row besides ``canonical_id`` and ``json``
INDEX_COLUMNS = ("schema", "countries", "start", "end", "statements", "pick", "csv_bytes")


def entity_lines_view(con: duckdb.DuckDBPyConnection, ids: IdRange = (None, None)) -> None:
    """``entity_lines`` over ``stmts``, ``merged`` and ``schema_rules``, of the
    entities whose canonical id is in ``ids``: per entity
    ``canonical_id``, ``json`` (its entities.ftm.json line, no line end, with the
    caption SQL gives), :data:`INDEX_COLUMNS`, ``_caption`` and ``_pick_names``
    (the (value, lang) names rigour picks the caption among, NULL where it has
    no say); sorted by ``canonical_id``.

    An entity whose schemata have no common schema fails the query with
    ``entity ID: no common schema of A, B`` (Spark's ``raise_error``)."""
    not_base = f"prop <> {_literal(BASE_ID)}"
    undefined = _literal(FtmDataset.UNDEFINED)
    con.execute(
        f"""
        CREATE OR REPLACE TEMP VIEW entity_lines AS
        WITH e AS (
          SELECT canonical_id,
            list_sort(list_distinct(list(schema))) AS schemas,
            coalesce(list_sort(list({{'p': prop, 'v': value, 'i': id, 'l': lang}})
                FILTER (WHERE {not_base})), []) AS pv,
            coalesce(list_distinct(list(prop)
                FILTER (WHERE prop_type = 'country' AND {not_base})), []) AS country_props,
            coalesce(list_sort(list_distinct(list(entity_id)
                FILTER (WHERE {not_base} AND entity_id <> canonical_id))), []) AS referents,
            coalesce(list_sort(list_distinct(list(dataset)
                FILTER (WHERE {not_base} AND dataset <> {undefined}))), []) AS datasets,
            coalesce(list_sort(list_distinct(list(origin) FILTER (WHERE {not_base}))), [])
                AS origins,
            min(first_seen) FILTER (WHERE {not_base}) AS first_seen,
            max(last_seen) FILTER (WHERE {not_base}) AS last_seen,
            max(_copies_first_seen) FILTER (WHERE NOT ({not_base})) AS last_change,
            count(*) AS statements,
            sum({csv_line_bytes()})::BIGINT AS csv_bytes,
            min(value) FILTER (WHERE prop IN ('startDate', 'date')) AS start,
            max(value) FILTER (WHERE prop IN ('endDate', 'date')) AS "end"
          FROM stmts WHERE {id_filter(ids)} GROUP BY canonical_id
        ), m AS (
          SELECT e.*, merged.schema, r.label,
            list_filter(coalesce(r.captions, []),
                c -> list_contains(list_transform(pv, x -> x.p), c.prop))[1] AS cap_prop
          FROM e
          LEFT JOIN merged ON merged.key = array_to_string(e.schemas, '|')
          LEFT JOIN schema_rules r ON r.schema = merged.schema
        ), c AS (
          SELECT m.*, list_filter(pv, x -> x.p = cap_prop.prop) AS cap,
            list_transform(list_filter(pv,
                x -> list_contains(country_props, x.p) AND x.v IS NOT NULL), x -> x.v) AS cv
          FROM m
        ), f AS (
          SELECT c.* EXCLUDE (schema),
            CASE WHEN schema IS NOT NULL THEN schema
                 ELSE error('entity ' || canonical_id || ': no common schema of '
                            || array_to_string(schemas, ', ')) END AS schema,
            CASE WHEN cap_prop IS NULL THEN label
                 ELSE list_reduce(cap, (a, b) -> CASE WHEN b.i < a.i THEN b ELSE a END).v
            END AS _caption,
            CASE WHEN cap_prop.is_name AND len(cap) > 1
                 THEN list_transform(cap, x -> {{'value': x.v, 'lang': x.l}}) END AS _pick_names
          FROM c
        )
        SELECT canonical_id,
          '{{"id":' || to_json(canonical_id)::VARCHAR
          || coalesce(',"caption":' || to_json(_caption)::VARCHAR, '')
          || ',"schema":' || to_json(schema)::VARCHAR
          || ',"referents":' || to_json(referents)::VARCHAR
          || ',"datasets":' || to_json(datasets)::VARCHAR
          || CASE WHEN len(origins) > 0 THEN ',"origin":' || to_json(origins)::VARCHAR
                  ELSE '' END
          || coalesce(',"first_seen":' || to_json(first_seen)::VARCHAR, '')
          || coalesce(',"last_seen":' || to_json(last_seen)::VARCHAR, '')
          || coalesce(',"last_change":' || to_json(last_change)::VARCHAR, '')
          || ',"properties":{{' || array_to_string(list_transform(pv, (x, k) ->
               CASE WHEN k = 1 OR x.p <> pv[k - 1].p
                      THEN (CASE WHEN k = 1 THEN '' ELSE '],' END) || to_json(x.p)::VARCHAR
                           || ':[' || coalesce(to_json(x.v)::VARCHAR, '')
                    WHEN x.v IS NULL OR x.v = pv[k - 1].v THEN ''
                    WHEN pv[k - 1].v IS NULL THEN to_json(x.v)::VARCHAR
                    ELSE ',' || to_json(x.v)::VARCHAR END), '')
          || CASE WHEN len(pv) > 0 THEN ']' ELSE '' END || '}}}}' AS json,
          schema,
          list_filter(cv, (x, i) -> list_position(cv, x) = i) AS countries,
          start, "end", statements, (_pick_names IS NOT NULL)::BIGINT AS pick, csv_bytes,
          _caption, _pick_names
        FROM f ORDER BY canonical_id
        """
    )


def connection_settings() -> dict[str, Any]:
    """What the pass needs of its DuckDB connection: Spark's order of nulls."""
    return {"default_null_order": "nulls_first"}


def entity_csv_view(con: duckdb.DuckDBPyConnection, ids: IdRange = (None, None)) -> None:
    """``entity_csv``: per entity its statements.csv lines, each ended by ``\\n``,
    in export order (what an incremental export splices in)."""
    from lakehouse_assets.spark.sql import csv_line_sql

    line = csv_line_sql(lambda name: name)
    con.execute(
        f"""
        CREATE OR REPLACE TEMP VIEW entity_csv AS
        SELECT canonical_id,
            string_agg({line} || chr(10), '' ORDER BY prop, value, origin, id) AS csv
        FROM stmts WHERE {id_filter(ids)} GROUP BY canonical_id
        """
    )
