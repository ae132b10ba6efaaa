"""The export lines of a few entities, made on the driver: the rules of
:mod:`.spark.ftm_sql` in Python, byte for byte.

An incremental export (:mod:`.incremental`) needs the statements.csv lines,
the entities.ftm.json line and the statistics contribution of the entities a
change touched: after a daily change, a few thousand. Spark makes them with
the full pass's own SQL, but for so few rows the Spark jobs, and in a fresh
process the JVM they need, cost seconds more than the work (at 1M statements,
a 1% change: 7.8 s of a 12.9 s export were Spark's, the lines of 1,749
entities). Here the same rules run in Python over the changed entities' live
statements, for batches of at most ``export_driver_statements``:

- each statement once per entity (of the copies two origins wrote, the first
  by ``prop``, ``value``, ``origin``; ``last_change`` over every copy), as
  :func:`.spark.ftm_sql.dedupe`;
- the entity's CSV lines (``CSVStatementWriter``'s bytes) in export order;
- :func:`.spark.ftm_sql.entity_frame`'s aggregations (schemata merged by
  followthemoney's ``common_schema``, caption, referents, datasets, origins,
  seen range, ``last_change``, sorted distinct values per property, countries,
  start and end), the caption picked by rigour where the SQL calls its UDF;
- :func:`.spark.ftm_sql.entity_json`'s line as Spark's JSON writer (Jackson)
  renders it: no spaces, null fields left out, ``\\b \\t \\n \\f \\r`` and
  ``\\u00XX`` (upper-case hex) for the other control characters, the rest as is.

A Hypothesis test holds the two equal on arbitrary statements
(``test_entity_lines.py``); the incremental property test compares the
result with the full pass's files.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import pyarrow as pa
from followthemoney.dataset import Dataset as FtmDataset
from followthemoney.statement.util import BASE_ID

#: the order of an entity's lines in statements.csv (``query.SORT`` within the entity)
_SORT_IN_ENTITY = ("prop", "value", "origin", "id")
#: of a statement's copies (one per origin), the one kept comes first in this order
_COPY_ORDER = ("prop", "value", "origin")


def _escapes() -> dict[int, str]:
    table = {ord('"'): '\\"', ord("\\"): "\\\\"}
    short = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
    for code in range(0x20):
        table[code] = short.get(chr(code), f"\\u{code:04X}")
    return table


_JSON_ESCAPES = _escapes()


def json_string(value: str) -> str:
    """A JSON string as Jackson (Spark's ``to_json``) writes it."""
    return '"' + value.translate(_JSON_ESCAPES) + '"'


def _json_array(values: Iterable[str]) -> str:
    return "[" + ",".join(json_string(v) for v in values) + "]"


def _csv_field(value: Any) -> str:
    text = "" if value is None else str(value)
    return '"' + text.replace('"', '""') + '"'


@cache
def _csv_columns() -> tuple[str, ...]:
    from followthemoney.statement.serialize import CSV_COLUMNS

    return tuple(CSV_COLUMNS)


def csv_line(statement: dict[str, Any]) -> str:
    """A statement as followthemoney's ``CSVStatementWriter`` writes it (the SQL of
    :func:`.spark.sql.csv_line_sql`), without the line end."""
    fields = []
    for name in _csv_columns():
        if name == "external":
            fields.append('"t"' if statement.get("external") else '"f"')
        else:
            fields.append(_csv_field(statement.get(name)))
    return ",".join(fields)


@dataclass(frozen=True)
class _Rules:
    """The model's rules :mod:`.spark.ftm_sql` takes as SQL literals."""

    common: dict[tuple[str, str], str]
    captions: dict[str, list[tuple[str, bool]]]
    labels: dict[str, str]


@cache
def _rules() -> _Rules:
    import itertools

    from followthemoney import model
    from followthemoney.exc import InvalidData
    from followthemoney.types import registry

    common: dict[tuple[str, str], str] = {}
    for left, right in itertools.permutations(sorted(model.schemata), 2):
        try:
            common[(left, right)] = model.common_schema(left, right).name
        except InvalidData:
            continue
    captions = {
        name: [
            (p, schema.properties[p].type == registry.name)
            for p in schema.caption
            if p in schema.properties
        ]
        for name, schema in model.schemata.items()
    }
    labels = {name: schema.label for name, schema in model.schemata.items()}
    return _Rules(common, captions, labels)


class NoCommonSchema(ValueError):
    """An entity's statements name schemata with no common schema."""


def _dedupe(statements: list[dict[str, Any]], origins: int) -> list[dict[str, Any]]:
    """:func:`.spark.ftm_sql.dedupe`: each statement id once per entity."""
    if origins <= 1:
        for row in statements:
            row["_copies_first_seen"] = row["first_seen"]
        return statements
    copies: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in statements:
        copies[row["id"]].append(row)
    kept = []
    for rows in copies.values():
        rows.sort(key=lambda r: tuple((r[c] is not None, r[c] or "") for c in _COPY_ORDER))
        first = rows[0]
        seen = [r["first_seen"] for r in rows if r["first_seen"] is not None]
        first["_copies_first_seen"] = max(seen) if seen else None
        kept.append(first)
    return kept


def _pick(names: list[tuple[str, str | None]]) -> str | None:
    from rigour.langs import LangStr
    from rigour.names.pick import pick_lang_name

    return pick_lang_name([LangStr(value, lang=lang) for value, lang in names])


def _entity(
    canonical_id: str, statements: list[dict[str, Any]], rules: _Rules
) -> tuple[dict[str, Any], str, str]:
    """One entity's index row (:data:`.export_state.SPARK_INDEX_COLUMNS`), its CSV
    lines and its JSON line (both with their line ends)."""
    ordered = sorted(
        statements, key=lambda r: tuple((r[c] is not None, r[c] or "") for c in _SORT_IN_ENTITY)
    )
    lines = [csv_line(r) for r in ordered]
    csv = "".join(line + "\n" for line in lines)
    props: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in statements:
        props[row["prop"]].append(row)
    schemas = sorted({r["schema"] for r in statements if r["schema"] is not None})
    by_prop: dict[str, dict[str, Any]] = {}
    referents: set[str] = set()
    datasets: set[str] = set()
    origin_set: set[str] = set()
    first_seen: list[str] = []
    last_seen: list[str] = []
    last_change: list[str] = []
    countries: list[str] = []
    starts: list[str] = []
    ends: list[str] = []
    for prop, rows in props.items():
        values = sorted({r["value"] for r in rows if r["value"] is not None})
        if prop == BASE_ID:
            last_change += [r["_copies_first_seen"] for r in rows if r["_copies_first_seen"]]
            continue
        with_id = [r for r in rows if r["id"] is not None]
        by_prop[prop] = {
            "values": values,
            "n": len(rows),
            "first": min(with_id, key=lambda r: r["id"])["value"] if with_id else None,
            "names": [(r["value"], r["lang"]) for r in rows],
        }
        referents.update(
            r["entity_id"]
            for r in rows
            if r["entity_id"] is not None and r["entity_id"] != canonical_id
        )
        datasets.update(r["dataset"] for r in rows if r["dataset"] is not None)
        origin_set.update(r["origin"] for r in rows if r["origin"] is not None)
        first_seen += [r["first_seen"] for r in rows if r["first_seen"] is not None]
        last_seen += [r["last_seen"] for r in rows if r["last_seen"] is not None]
        if any(r["prop_type"] == "country" for r in rows):
            countries += [v for v in values if v not in countries]
        if values and prop in ("startDate", "date"):
            starts.append(values[0])
        if values and prop in ("endDate", "date"):
            ends.append(values[-1])
    if not schemas:
        raise NoCommonSchema(f"entity {canonical_id}: no schema")
    schema: str | None = schemas[0]
    for other in schemas[1:]:
        schema = rules.common.get((schema, other)) if schema is not None else None
    if schema is None:
        raise NoCommonSchema(f"entity {canonical_id}: no common schema of {', '.join(schemas)}")
    caption_prop = next(
        ((p, is_name) for p, is_name in rules.captions.get(schema, []) if p in by_prop), None
    )
    pick = 0
    if caption_prop is None:
        caption = rules.labels.get(schema)
    else:
        chosen = by_prop[caption_prop[0]]
        caption = chosen["first"]
        if caption_prop[1] and chosen["n"] > 1:
            pick = 1
            caption = _pick(sorted(chosen["names"], key=lambda n: (n[0], n[1] or ""))) or caption
    index = {
        "canonical_id": canonical_id,
        "csv_bytes": len(csv.encode("utf-8")),
        "schema": schema,
        "countries": countries,
        "start": min(starts) if starts else None,
        "end": max(ends) if ends else None,
        "statements": len(statements),
        "pick": pick,
    }
    fields = [f'"id":{json_string(canonical_id)}']
    if caption is not None:
        fields.append(f'"caption":{json_string(caption)}')
    fields.append(f'"schema":{json_string(schema)}')
    fields.append(f'"referents":{_json_array(sorted(referents))}')
    undefined = FtmDataset.UNDEFINED
    fields.append(f'"datasets":{_json_array(d for d in sorted(datasets) if d != undefined)}')
    if origin_set:
        fields.append(f'"origin":{_json_array(sorted(origin_set))}')
    for name, seen in (
        ("first_seen", min(first_seen) if first_seen else None),
        ("last_seen", max(last_seen) if last_seen else None),
        ("last_change", max(last_change) if last_change else None),
    ):
        if seen is not None:
            fields.append(f'"{name}":{json_string(seen)}')
    properties = ",".join(
        f"{json_string(prop)}:{_json_array(by_prop[prop]['values'])}" for prop in sorted(by_prop)
    )
    fields.append(f'"properties":{{{properties}}}')
    return index, csv, "{" + ",".join(fields) + "}\n"


def entity_rows(live: pa.Table, *, origins: int, columns: Sequence[str]) -> pa.Table:
    """The changed entities' rows as :func:`.incremental._changed_rows` makes them
    with Spark: ``columns`` of the index, then ``csv`` and ``json``, one row per
    entity, sorted by ``canonical_id``."""
    rules = _rules()
    by_entity: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in live.to_pylist():
        by_entity[row["canonical_id"]].append(row)
    out: dict[str, list[Any]] = {name: [] for name in (*columns, "csv", "json")}
    for canonical_id in sorted(by_entity):
        statements = _dedupe(by_entity[canonical_id], origins)
        index, csv, line = _entity(canonical_id, statements, rules)
        for name in columns:
            out[name].append(index[name])
        out["csv"].append(csv)
        out["json"].append(line)
    return pa.table(out)
