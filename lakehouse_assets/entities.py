"""FollowTheMoney input: entities and statements, validated, with locations.

Tenants hand us FtM JSON lines or followthemoney's statement CSV. Everything
is validated against the FtM model before it reaches the journal, and every
error names the dataset, file and line. Validation is stricter than
``model.get_proxy``, which silently drops unknown properties: an unknown
property is an error here, because it is almost always a mapping bug.
"""

from __future__ import annotations

import csv
import io
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import UTC, datetime
from typing import IO, Any, TextIO, cast

import orjson
from followthemoney import model
from followthemoney.exc import InvalidData
from followthemoney.proxy import EntityProxy
from followthemoney.statement import Statement
from followthemoney.statement.serialize import CSV_COLUMNS, CSVStatementWriter
from followthemoney.statement.util import BASE_ID, get_prop_type
from followthemoney.util import sanitize_text
from rigour.boolean import text_bool

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidInputError

#: followthemoney's own column order of the statement CSV format.
STATEMENT_COLUMNS: tuple[str, ...] = tuple(CSV_COLUMNS)

#: Text fields of a statement that must not hold a NUL character (PostgreSQL
#: refuses it; followthemoney would strip it from ids, so two ids could collide).
TEXT_FIELDS = (
    "entity_id",
    "canonical_id",
    "prop",
    "schema",
    "value",
    "origin",
    "lang",
    "original_value",
    "first_seen",
    "last_seen",
)


#: What the statement CSV's ``external`` column may say (followthemoney writes
#: ``t``/``f``; rigour's reader would take any word starting with t, y or 1).
BOOLEAN_WORDS = frozenset({"", "t", "true", "y", "yes", "1", "f", "false", "n", "no", "0"})


def check_text(field: str, value: str | None) -> str | None:
    """What is wrong with one field's value (None: nothing).

    The rule of :func:`conventions.text` for stored text: valid Unicode (a lone
    surrogate, such as Python makes of a non-UTF-8 byte, cannot be encoded for
    the journal; followthemoney would drop it silently), no NUL character, at
    most the journal's limit of the field.
    """
    if value is None:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{field} is not valid UTF-8 ({exc.reason} at character {exc.start})"
    if "\x00" in value:
        return f"{field} contains a NUL character"
    limit = cv.FIELD_LIMITS.get(field)
    if limit is not None and len(value) > limit:
        return f"{field} is {len(value)} characters long (at most {limit})"
    return None


def check_timestamp(field: str, value: str | None) -> str | None:
    """A seen time must be an ISO 8601 date-time (as followthemoney writes them)."""
    if value is None:
        return None
    try:
        datetime.fromisoformat(value)
    except ValueError:
        return f"{field} {value!r} is not an ISO 8601 date-time"
    return None


def check_statement(stmt: Statement) -> str | None:
    """The first thing about a statement the journal would not store as given."""
    for field in TEXT_FIELDS:
        problem = check_text(field, getattr(stmt, field))
        if problem:
            return problem
    return check_timestamp("first_seen", stmt.first_seen) or check_timestamp(
        "last_seen", stmt.last_seen
    )


def validate_entity(
    data: Any,
    *,
    dataset: str | None = None,
    source: str | None = None,
    line: int | None = None,
    notes: InputNotes | None = None,
) -> EntityProxy:
    """Turn a dict into a fully validated and normalised ``EntityProxy``.

    Raises ``InvalidInputError`` for a missing id, unknown or abstract schema,
    malformed properties, a property the schema does not have or a
    ``first_seen``/``last_seen``/``last_change`` that is not a date-time. The
    entity's other top-level keys stay in ``proxy.context`` (the seen times
    normalised) for :func:`entity_statements`; values followthemoney's cleaning
    drops are counted into ``notes`` per property.
    """

    def fail(msg: str) -> InvalidInputError:
        return InvalidInputError(msg, dataset=dataset, source=source, line=line)

    if isinstance(data, EntityProxy):
        data = data.to_dict()
    if not isinstance(data, dict):
        raise fail(f"expected a JSON object, got {type(data).__name__}")
    entity_id = data.get("id")
    if not entity_id or not isinstance(entity_id, str):
        raise fail("entity has no id")
    problem = check_text("entity_id", entity_id)
    if problem:
        raise fail(f"entity id: {problem.removeprefix('entity_id ')}")
    schema_name = data.get("schema")
    schema = model.get(schema_name) if isinstance(schema_name, str) else None
    if schema is None:
        raise fail(f"entity {entity_id!r}: unknown schema {schema_name!r}")
    if schema.abstract:
        raise fail(f"entity {entity_id!r}: schema {schema.name!r} is abstract")
    props = data.get("properties") or {}
    if not isinstance(props, dict):
        raise fail(f"entity {entity_id!r}: 'properties' must be an object")
    for name, values in props.items():
        if name not in schema.properties:
            raise fail(f"entity {entity_id!r}: schema {schema.name} has no property {name!r}")
        if not isinstance(values, (list, str)):
            raise fail(f"entity {entity_id!r}: values of {name!r} must be a list of strings")
        for index, value in enumerate([values] if isinstance(values, str) else values):
            if not isinstance(value, str):
                kind = "null" if value is None else type(value).__name__
                raise fail(
                    f"entity {entity_id!r}: value {index + 1} of {name!r} is a {kind}, "
                    "not a string (nothing is converted or dropped silently)"
                )
            problem = check_text("value", value)
            if problem:
                raise fail(
                    f"entity {entity_id!r}: a value of {name!r} {problem.removeprefix('value ')}"
                )
    context = {k: v for k, v in data.items() if k != "properties"}
    try:
        context.update(seen_fields(context))
        proxy = model.get_proxy(context, cleaned=False)
    except (ValueError, InvalidData) as exc:
        raise fail(f"entity {entity_id!r}: {exc}") from exc
    if proxy.id is None:
        raise fail("entity has no usable id")
    # followthemoney's own cleaning, value by value (what ``EntityProxy.add`` does),
    # so that a value it drops (a phone number that does not parse, a stub
    # property, a value over the type's size limit) is counted, not lost unseen
    for name, values in props.items():
        prop = schema.properties[name]
        for value in [values] if isinstance(values, str) else values:
            clean = sanitize_text(value)
            kept = None
            if clean and not prop.stub:
                kept = proxy.unsafe_add(prop, clean, cleaned=False)
            if kept is None and notes is not None:
                notes.dropped[name] += 1
    return proxy


def read_entities(
    fh: IO[bytes],
    *,
    dataset: str | None = None,
    source: str | None = None,
    notes: InputNotes | None = None,
) -> Iterator[EntityProxy]:
    """Validated entities from FtM JSON lines (one entity per line).

    Blank lines are skipped; anything else that is not a valid entity raises
    with its line number. Input must be UTF-8.
    """
    for lineno, raw in enumerate(fh, start=1):
        proxy = parse_line(raw, dataset=dataset, source=source, lineno=lineno, notes=notes)
        if proxy is not None:
            yield proxy


def parse_line(
    raw: bytes,
    *,
    dataset: str | None,
    source: str | None,
    lineno: int,
    notes: InputNotes | None = None,
) -> EntityProxy | None:
    """One FtM JSON line to a validated entity (None for a blank line)."""
    if not raw.strip():
        return None
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"not UTF-8 ({exc.reason} at byte {exc.start})",
            dataset=dataset,
            source=source,
            line=lineno,
        ) from exc
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(
            f"malformed JSON: {exc}", dataset=dataset, source=source, line=lineno
        ) from exc
    return validate_entity(data, dataset=dataset, source=source, line=lineno, notes=notes)


def entity_statements(
    proxy: EntityProxy,
    *,
    dataset: str,
    origin: str,
    seen: str | None = None,
    notes: InputNotes | None = None,
) -> list[Statement]:
    """The statements of an entity, ids as followthemoney computes them.

    The entity's own ``first_seen``/``last_seen`` (as OpenSanctions' FtM JSON
    carries them, normalised by :func:`validate_entity`) become its statements'
    seen times; without them the write's time ``seen`` stands in (a missing
    ``last_seen`` is the later of ``first_seen`` and ``seen``: the entity is seen
    now). ``last_change`` goes where followthemoney's statement model keeps it:
    the first_seen of the entity's ``id`` statement (``StatementEntity`` takes
    its ``last_change`` from there). What the statement model has no place for
    is counted into ``notes`` (:func:`not_kept`).
    """
    context = proxy.context
    given: dict[str, str | None] = {k: context.get(k) for k in SEEN_FIELDS}
    first = given["first_seen"] or given["last_seen"] or seen
    last = given["last_seen"]
    if last is None:
        last = first if seen is None or (first is not None and first > seen) else seen
    change = given["last_change"]
    stmts = list(
        Statement.from_entity(proxy, dataset, first_seen=first, last_seen=last, origin=origin)
    )
    if change is not None and change != first:
        stmts = [
            s.clone(first_seen=change, last_seen=max(last or change, change))
            if s.prop == BASE_ID
            else s
            for s in stmts
        ]
    if notes is not None:
        notes.not_kept.update(not_kept(context, dataset=dataset, origin=origin))
    return stmts


#: Top-level keys of an FtM JSON entity the lake stores (``id``, ``schema``,
#: ``properties``, the seen times) or derives again on export (``caption``).
STORED_KEYS = frozenset(
    {"id", "schema", "properties", "caption", "first_seen", "last_seen", "last_change"}
)


def not_kept(context: dict[str, Any], *, dataset: str, origin: str) -> list[str]:
    """The top-level keys of an entity whose content the lake does not store.

    followthemoney's statement model (4.x) has no place for ``target`` (a
    statement has no such field) nor for ``referents`` (the ids of source
    entities merged into this one: an export derives them from statements
    whose ``entity_id`` differs, which an entity's own lines do not make);
    ``datasets`` and ``origin`` are the write's own. A key counts only where
    something is lost: ``target`` other than false (the default), ``referents`` not empty, ``datasets`` or
    ``origin`` naming another dataset or origin; any other unknown key always.
    """
    lost: list[str] = []
    for key, value in context.items():
        if key in STORED_KEYS or value is None:
            continue
        if key == "target":
            if value is not False:
                lost.append(key)
        elif key in ("referents", "datasets", "origin"):
            own = {"datasets": dataset, "origin": origin}.get(key)
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list) or any(n != own for n in names):
                lost.append(key)
        else:
            lost.append(key)
    return lost


#: The seen times an FtM JSON entity may carry (OpenSanctions' exports do).
SEEN_FIELDS = ("first_seen", "last_seen", "last_change")


def seen_fields(context: dict[str, Any]) -> dict[str, str]:
    """An entity's seen times in followthemoney's wire format (``YYYY-MM-DDTHH:MM:SS``
    in UTC: an offset is converted, a naive time taken as UTC, as rigour does),
    so that the translog's earliest/latest (string comparisons) hold across
    writes; raises ``ValueError`` naming a value that is not a date-time."""
    out: dict[str, str] = {}
    for key in SEEN_FIELDS:
        value = context.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ValueError(f"{key} must be a string, not {type(value).__name__}")
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"{key} {value!r} is not an ISO 8601 date-time") from None
        if parsed.tzinfo is not None:
            parsed = parsed.astimezone(UTC)
        out[key] = parsed.strftime("%Y-%m-%dT%H:%M:%S")
    first, last = out.get("first_seen"), out.get("last_seen")
    change = out.get("last_change")
    if first and last and first > last:
        raise ValueError(f"first_seen {first} is after last_seen {last}")
    if change and last and change > last:
        raise ValueError(f"last_change {change} is after last_seen {last}")
    return out


@dataclass(slots=True)
class InputNotes:
    """What the entities of a write carried that the lake does not store as given.

    ``dropped``: values followthemoney's cleaning dropped, per property (a
    phone number that does not parse); ``not_kept``: entities per top-level key
    the statement model has no place for (:func:`not_kept`). Written in a
    write's summary (API result, CLI line, job record) so nothing is lost unseen.
    """

    dropped: Counter[str] = dataclass_field(default_factory=Counter)
    not_kept: Counter[str] = dataclass_field(default_factory=Counter)

    def update(self, other: InputNotes) -> None:
        self.dropped.update(other.dropped)
        self.not_kept.update(other.not_kept)

    def __bool__(self) -> bool:
        return bool(self.dropped or self.not_kept)

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {
            "dropped_values": dict(sorted(self.dropped.items())),
            "fields_not_kept": dict(sorted(self.not_kept.items())),
        }

    def describe(self) -> str:
        """One line for a summary (empty when nothing was dropped)."""
        parts = []
        if self.dropped:
            counts = ", ".join(f"{k} {n}" for k, n in sorted(self.dropped.items()))
            parts.append(f"values dropped by followthemoney's cleaning: {counts}")
        if self.not_kept:
            counts = ", ".join(f"{k} {n}" for k, n in sorted(self.not_kept.items()))
            parts.append(f"entity fields not kept (entities): {counts}")
        return "; ".join(parts)


def make_statement(
    row: dict[str, Any],
    *,
    dataset: str,
    origin: str | None = None,
    source: str | None = None,
    line: int | None = None,
) -> Statement:
    """A validated ``Statement`` from a dict of followthemoney's columns.

    Missing ``dataset``/``origin`` are filled in; a given ``id`` must equal the
    id followthemoney computes, so ids stay stable across every store.
    """

    def fail(msg: str) -> InvalidInputError:
        return InvalidInputError(msg, dataset=dataset, source=source, line=line)

    for col in ("entity_id", "prop", "schema", "value"):
        if not row.get(col):
            raise fail(f"statement has no {col}")
    schema = model.get(row["schema"])
    if schema is None:
        raise fail(f"unknown schema {row['schema']!r}")
    if row["prop"] != BASE_ID and row["prop"] not in schema.properties:
        raise fail(f"schema {schema.name} has no property {row['prop']!r}")
    surplus = cast("dict[Any, Any]", row).get(None)  # csv.DictReader's key for them
    if surplus is not None:
        raise fail(f"{len(surplus)} cell(s) more than the header has columns")
    for col in STATEMENT_COLUMNS:
        value = row.get(col)
        if value is not None and not isinstance(value, str) and col != "external":
            raise fail(f"{col} must be a string, not {type(value).__name__}")
        problem = check_text(col, value) if isinstance(value, str) else None
        if problem:
            raise fail(problem)
    given_dataset = row.get("dataset")
    if given_dataset and given_dataset != dataset:
        raise fail(f"statement of dataset {given_dataset!r}, not {dataset!r}")
    for col in ("first_seen", "last_seen"):
        problem = check_timestamp(col, row.get(col) or None)
        if problem:
            raise fail(problem)
    external = row.get("external")
    if isinstance(external, str):
        word = external.strip().lower()
        if word not in BOOLEAN_WORDS:
            raise fail(f"external {external!r} is not a boolean (t/f, true/false, 1/0, yes/no)")
        external = bool(word) and text_bool(word)
    stmt = Statement(
        entity_id=row["entity_id"],
        prop=row["prop"],
        schema=schema.name,
        value=row["value"],
        dataset=row.get("dataset") or dataset,
        lang=row.get("lang") or None,
        original_value=row.get("original_value") or None,
        first_seen=row.get("first_seen") or None,
        last_seen=row.get("last_seen") or None,
        external=bool(external),
        canonical_id=row.get("canonical_id") or None,
        origin=row.get("origin") or origin,
    )
    given = row.get("id")
    if given and given != stmt.id:
        raise fail(
            f"statement id {given!r} does not match followthemoney's id {stmt.id!r} "
            f"for ({stmt.entity_id}, {stmt.prop}, {stmt.value!r})"
        )
    if row.get("prop_type") and row["prop_type"] != get_prop_type(schema.name, row["prop"]):
        raise fail(f"prop_type {row['prop_type']!r} is wrong for {schema.name}:{row['prop']}")
    return stmt


def read_statements_csv(
    fh: IO[bytes], *, dataset: str, origin: str | None = None, source: str | None = None
) -> Iterator[Statement]:
    """Validated statements from followthemoney's statement CSV format."""
    text = io.TextIOWrapper(fh, encoding="utf-8", errors="strict", newline="")
    reader = csv.DictReader(text, dialect=csv.unix_dialect)
    try:
        header = reader.fieldnames or []
        missing = {"entity_id", "prop", "schema", "value"} - set(header)
        if missing:
            raise InvalidInputError(
                f"statement CSV lacks columns {sorted(missing)}",
                dataset=dataset,
                source=source,
                line=1,
            )
        unknown = [c for c in header if c not in STATEMENT_COLUMNS]
        if unknown:
            raise InvalidInputError(
                f"unknown columns {unknown} (followthemoney's statement CSV has "
                f"{', '.join(STATEMENT_COLUMNS)})",
                dataset=dataset,
                source=source,
                line=1,
            )
        for row in reader:
            yield make_statement(
                row, dataset=dataset, origin=origin, source=source, line=reader.line_num
            )
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"not UTF-8 ({exc.reason})", dataset=dataset, source=source, line=reader.line_num + 1
        ) from exc
    except csv.Error as exc:
        raise InvalidInputError(
            f"malformed CSV: {exc}", dataset=dataset, source=source, line=reader.line_num
        ) from exc
    finally:
        text.detach()


def write_statements_csv(fh: TextIO, statements: Iterable[Statement]) -> int:
    """Write statements with followthemoney's own CSV writer; returns the count."""
    writer = CSVStatementWriter(fh)
    count = 0
    for stmt in statements:
        writer.write(stmt)
        count += 1
    writer.close()
    return count
