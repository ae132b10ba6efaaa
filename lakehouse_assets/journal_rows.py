"""The journal's rows: its table, columns and Arrow schemas, a write's stamp,
the rows made from statements and back, and PostgreSQL's COPY input.

What the journal stores, apart from how it stores it (:mod:`.journal`): the
flush's Spark tasks, the mappings' bulk ingest and the queue's ledger need
these without the journal's engine.
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

if TYPE_CHECKING:
    from followthemoney.statement import Statement

#: Statements are spread over this many buckets by canonical id; flush reads
#: whole buckets, so an entity's statements always arrive in the same batch.
BUCKETS = 256

metadata = MetaData()

journal_table = Table(
    "lakehouse_journal",
    metadata,
    Column(
        "seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("dataset", String(128), nullable=False),
    Column("bucket", Integer, nullable=False),
    Column("origin", String(255), nullable=False),
    Column("canonical_id", String(1024), nullable=False),
    Column("entity_id", String(1024), nullable=False),
    Column("id", String(64), nullable=False),
    Column("prop", String(255), nullable=False),
    Column("prop_type", String(64), nullable=False),
    Column("schema", String(255), nullable=False),
    Column("value", Text, nullable=False),
    Column("lang", String(16)),
    Column("original_value", Text),
    Column("external", Boolean, nullable=False, default=False),
    Column("first_seen", String(32)),
    Column("last_seen", String(32)),
    Column("deleted_at", String(32)),
    # provenance, stamped by the journal on every row of a write (NULL: a row
    # written before provenance was recorded)
    Column("tenant", String(128)),
    Column("write_id", String(40)),
    # the flush that claimed the row (NULL: not claimed yet)
    Column("flush_id", String(32)),
    Index("ix_lakehouse_journal_dataset_bucket", "dataset", "bucket"),
    # SQLite: row ids are never re-used (the claim of a flush relies on it)
    sqlite_autoincrement=True,
)

#: Columns the journal keeps for itself, not part of a written row.
BOOKKEEPING = ("seq", "flush_id")
#: Who wrote a row and in which write: stamped by :meth:`Journal.insert_rows`
#: from the :class:`Write` it is given, never by the row's maker.
PROVENANCE = ("tenant", "write_id")
#: Column order of the tuples written and read by the journal.
COLUMNS: tuple[str, ...] = tuple(
    c.name for c in journal_table.columns if c.name not in (*BOOKKEEPING, *PROVENANCE)
)

Row = tuple[Any, ...]

#: Arrow types of the rows flush reads (``seq``, ``COLUMNS``, then ``PROVENANCE``).
EVENTS_SCHEMA = pa.schema(
    [("seq", pa.int64())]
    + [
        (
            name,
            pa.int32() if name == "bucket" else pa.bool_() if name == "external" else pa.string(),
        )
        for name in (*COLUMNS, *PROVENANCE)
    ]
)


@dataclass(frozen=True, slots=True)
class Write:
    """One acknowledged write to the journal (a bulk, a delete): who made it and its id.

    The id sorts by time and says when the write began
    (``20261124T101500Z-3f2a9c1b7d4e``); every row of the write carries it and
    the tenant, and flush keeps both in the translog (first and last write of
    each statement), so ``trace`` can answer who wrote a statement, and in
    which write.
    """

    tenant: str
    write_id: str

    @classmethod
    def new(cls, tenant: str) -> Write:
        import uuid

        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        return cls(tenant, f"{stamp}-{uuid.uuid4().hex[:12]}")

    @property
    def started_at(self) -> str | None:
        """When the write began (from its id), ISO 8601, UTC."""
        return write_time(self.write_id)


def write_time(write_id: str | None) -> str | None:
    """The start time a write id carries (None for an id of another form)."""
    if not write_id or len(write_id) < 16:
        return None
    try:
        when = datetime.strptime(write_id[:16], "%Y%m%dT%H%M%SZ")
    except ValueError:
        return None
    return when.strftime("%Y-%m-%dT%H:%M:%S")


#: Arrow types of the journal rows written (``COLUMNS``, then ``PROVENANCE``).
ROWS_SCHEMA = pa.schema([EVENTS_SCHEMA.field(n) for n in (*COLUMNS, *PROVENANCE)])


def copy_csv(rows: Sequence[Row], write: Write) -> bytes:
    """Rows (``COLUMNS`` order) of ``write`` as PostgreSQL's ``COPY ... (FORMAT csv)``
    input: strings quoted where needed, an empty string as ``""``, NULL as nothing.
    COPY's end-of-data marker (a backslash and a dot alone on a line) can only
    occur inside a quoted multi-line value, where COPY does not take it for the
    end (tested with such values)"""
    n = len(rows)
    arrays = [
        pa.array(values, field.type)
        for values, field in zip(zip(*rows, strict=True), ROWS_SCHEMA, strict=False)
    ]
    return _csv([*arrays, *_stamp(write, n)])


def statements_copy_csv(
    entities: Sequence[tuple[int, Sequence[Statement]]],
    *,
    dataset: str,
    origin: str,
    write: Write,
) -> bytes:
    """The statements of entities (each with its bucket) as :func:`copy_csv` of
    their :func:`statement_row` rows would encode them, built column by column.

    Bulk writes to PostgreSQL call this in the worker processes that validate
    the input, so the writer's process only hands bytes to ``COPY``: made by
    the writer from rows, the CSV took as long as PostgreSQL's own insert, in
    series with it (see README, "Journal writes")."""
    stmts = [s for _, group in entities for s in group]
    n = len(stmts)
    columns: dict[str, pa.Array] = {
        "dataset": pa.repeat(pa.scalar(dataset, pa.string()), n),
        "bucket": pa.array([bucket for bucket, group in entities for _ in group], pa.int32()),
        "origin": pa.array([s.origin or origin for s in stmts], pa.string()),
        "external": pa.array([bool(s.external) for s in stmts], pa.bool_()),
        "deleted_at": pa.nulls(n, pa.string()),
    }
    for name in COLUMNS:
        if name not in columns:
            columns[name] = pa.array([getattr(s, name) for s in stmts], pa.string())
    return _csv([*(columns[name] for name in COLUMNS), *_stamp(write, n)])


def _stamp(write: Write, n: int) -> list[pa.Array]:
    """The ``PROVENANCE`` columns of ``n`` rows of ``write``."""
    return [
        pa.repeat(pa.scalar(write.tenant, pa.string()), n),
        pa.repeat(pa.scalar(write.write_id, pa.string()), n),
    ]


def _csv(arrays: Sequence[pa.Array]) -> bytes:
    import pyarrow.csv as pacsv

    table = pa.Table.from_arrays(list(arrays), schema=ROWS_SCHEMA)
    sink = io.BytesIO()
    pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False, quoting_style="needed"))
    return sink.getvalue()


def bucket_of(canonical_id: str) -> int:
    """The flush bucket of an entity (stable across processes and hosts)."""
    return zlib.crc32(canonical_id.encode("utf-8")) % BUCKETS


def _record_batch(rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """Rows (:data:`EVENTS_SCHEMA` order) from a DB-API cursor as one Arrow batch."""
    columns = list(zip(*rows, strict=True))
    external = EVENTS_SCHEMA.get_field_index("external")
    columns[external] = tuple(bool(v) for v in columns[external])
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=f.type) for c, f in zip(columns, EVENTS_SCHEMA, strict=True)],
        schema=EVENTS_SCHEMA,
    )


def statement_row(
    stmt: Statement,
    dataset: str,
    origin: str,
    deleted_at: str | None = None,
    bucket: int | None = None,
) -> Row:
    """A journal row for a statement (origin is required in the journal).

    ``bucket`` may be passed when the caller already computed it for the entity.
    """
    return (
        dataset,
        bucket_of(stmt.canonical_id) if bucket is None else bucket,
        stmt.origin or origin,
        stmt.canonical_id,
        stmt.entity_id,
        stmt.id,
        stmt.prop,
        stmt.prop_type,
        stmt.schema,
        stmt.value,
        stmt.lang,
        stmt.original_value,
        bool(stmt.external),
        stmt.first_seen,
        stmt.last_seen,
        deleted_at,
    )


def row_statement(row: Sequence[Any]) -> Statement:
    """Back from a journal row (in ``COLUMNS`` order) to a ``Statement``."""
    return statement_from_mapping(dict(zip(COLUMNS, row, strict=False)))


def statement_from_mapping(data: Mapping[str, Any]) -> Statement:
    """A ``Statement`` from a mapping of our column names (journal or table row)."""
    from followthemoney.statement import Statement

    return Statement(
        id=data["id"],
        entity_id=data["entity_id"],
        canonical_id=data["canonical_id"],
        prop=data["prop"],
        schema=data["schema"],
        value=data["value"],
        dataset=data["dataset"],
        lang=data["lang"],
        original_value=data["original_value"],
        external=bool(data["external"]),
        first_seen=data["first_seen"],
        last_seen=data["last_seen"],
        origin=data["origin"],
    )
