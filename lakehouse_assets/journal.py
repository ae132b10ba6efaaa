"""The journal: a durable SQL buffer of statement writes and tombstones.

Every tenant write lands here first; ``flush`` later moves it into the Delta
tables. The journal is append-only: a write is a row, a delete is a row with
``deleted_at`` set (a tombstone), and ``seq`` keeps insert order so that the
last event for a statement wins when it is flushed.

Hand-off to a flush is by *claim* (:class:`Claim`): the flush fixes the set
of rows committed at that moment, reads and commits exactly those, and
deletes exactly those; rows committed later wait for the next flush, and
the rows of a flush that died are claimed again by the next one (flushes of
a dataset are serialised by the dataset lock).

* PostgreSQL hands out sequence numbers at insert time, not commit time (a
  bulk opened earlier commits rows with lower numbers later), so no bound on
  ``seq`` can say what was committed: the flush stamps its ``flush_id`` on
  the rows visible to it (one UPDATE) and works on those.
* SQLite has one writer at a time and the table is ``AUTOINCREMENT`` (row ids
  are never re-used, not even after a clear), so every row committed after
  the flush read ``max(seq)`` has a larger ``seq``: the bound is the claim,
  and costs nothing.

SQLite (a file, WAL mode, ``synchronous=FULL``) is the embedded default;
PostgreSQL is used when the URL says so. One table serves all datasets of a
lake (``dataset`` column), indexed by ``(dataset, bucket)`` so that flush can
read a bounded slice of entities at a time.
"""

from __future__ import annotations

import io
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Engine,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    delete,
    event,
    func,
    inspect,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from lakehouse_assets.journal_sqlite import _sqlite_engines, _sqlite_pragmas
from lakehouse_assets.journal_urls import check_tables_durable, checked_journal_url

if TYPE_CHECKING:
    # imported where a Statement is made: a flush task's worker reads the
    # journal without followthemoney (0.5 s and about 90 MB per worker)
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


@dataclass(frozen=True, slots=True)
class Claim:
    """The rows one flush works on: those stamped with its ``flush_id``
    (PostgreSQL), or those up to ``bound`` in ``seq`` (SQLite)."""

    dataset: str
    flush_id: str
    bound: int | None


#: Entity ids a journal query of many entities asks for at once (SQLite's
#: bound-parameter limit is 32,766 since 3.32; two lists of these each).
IDS_PER_QUERY = 500


class Journal:
    """The SQL buffer of one lake (all datasets, one table)."""

    def __init__(self, url: str) -> None:
        # a SQLite file or a PostgreSQL server, nothing that forgets acknowledged
        # writes: the one rule of every entry point (journal_urls)
        self.url = checked_journal_url(url)
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg2://" + url.removeprefix("postgresql://")
        kwargs: dict[str, Any] = {"hide_parameters": True}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"timeout": 300}
        self.engine: Engine = create_engine(url, **kwargs)
        self.dialect = self.engine.dialect.name
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
            _sqlite_engines.add(self.engine)
        self._create()

    def _create(self) -> None:
        # Several processes may race to create the table; losing is fine.
        for attempt in range(5):
            try:
                metadata.create_all(self.engine, checkfirst=True)
                self._migrate()
                if self.dialect == "postgresql":
                    self.check_durable([journal_table.name])
                return
            except OperationalError as exc:
                if attempt == 4:
                    raise
                if "duplicate column" in str(exc):
                    continue  # another process added it
                time.sleep(0.2 * (attempt + 1))
            except Exception as exc:  # PostgreSQL: duplicate type/relation/column
                if "already exists" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.1)

    def check_durable(self, names: Sequence[str]) -> None:
        """Refuse a PostgreSQL journal whose tables ``names`` would not outlive the
        session (the journal's own here; the queue's ledger checks its table too):
        :func:`.journal_urls.check_tables_durable`."""
        check_tables_durable(self.engine, names, self.url)

    def _migrate(self) -> None:
        """Bring a journal made by an earlier version up to this schema."""
        present = {c["name"] for c in inspect(self.engine).get_columns(journal_table.name)}
        added = {"flush_id": "VARCHAR(32)", "tenant": "VARCHAR(128)", "write_id": "VARCHAR(40)"}
        for name, sql_type in added.items():
            if name not in present:
                with self.engine.begin() as conn:
                    conn.exec_driver_sql(
                        f"ALTER TABLE {journal_table.name} ADD COLUMN {name} {sql_type}"
                    )
        if self.dialect == "sqlite":
            self._migrate_autoincrement()

    def _migrate_autoincrement(self) -> None:
        """Rebuild an old SQLite journal as AUTOINCREMENT (rows and their seq kept)."""
        name = journal_table.name
        with self.engine.begin() as conn:
            sql = conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE type='table' AND name=?", (name,)
            ).scalar()
            if sql is None or "AUTOINCREMENT" in str(sql).upper():
                return
            columns = ", ".join(f'"{c.name}"' for c in journal_table.columns)
            conn.exec_driver_sql(f"ALTER TABLE {name} RENAME TO {name}_old")
            for index in journal_table.indexes:
                conn.exec_driver_sql(f"DROP INDEX IF EXISTS {index.name}")
            metadata.create_all(conn, tables=[journal_table])
            conn.exec_driver_sql(
                f"INSERT INTO {name} ({columns}) SELECT {columns} FROM {name}_old ORDER BY seq"
            )
            conn.exec_driver_sql(f"DROP TABLE {name}_old")

    # --- writing --------------------------------------------------------

    def insert_rows(self, conn: Connection, rows: Sequence[Row], write: Write) -> None:
        """Insert rows (``COLUMNS`` order) of ``write`` on an open transaction, fast."""
        if not rows:
            return
        if self.dialect == "postgresql":
            # COPY: one round trip per batch and no per-row statement parsing
            # (about 6x INSERT ... VALUES pages), its CSV written by Arrow: making
            # COPY's text in Python, field by field, took two thirds of a bulk
            # write's time (42.7k statements/s; Arrow's CSV writer: see README)
            self.insert_copy(conn, copy_csv(rows, write))
            return
        stamp = (write.tenant, write.write_id)
        rows = [(*r, *stamp) for r in rows]
        names = (*COLUMNS, *PROVENANCE)
        if self.dialect == "sqlite":
            cols = ", ".join(f'"{c}"' for c in names)
            marks = ", ".join("?" for _ in names)
            conn.exec_driver_sql(
                f"INSERT INTO {journal_table.name} ({cols}) VALUES ({marks})", rows
            )
        else:
            conn.execute(journal_table.insert(), [dict(zip(names, r, strict=True)) for r in rows])

    @property
    def takes_copy(self) -> bool:
        """Whether bulk rows may come as :func:`copy_csv` bytes (:meth:`insert_copy`)."""
        return self.dialect == "postgresql"

    def insert_copy(self, conn: Connection, data: bytes) -> None:
        """Insert rows encoded by :func:`copy_csv` or :func:`statements_copy_csv`
        (PostgreSQL only) on an open transaction."""
        if not self.takes_copy:
            raise TypeError(f"a {self.dialect} journal takes rows, not COPY input")
        if not data:
            return
        cols = ", ".join(f'"{c}"' for c in (*COLUMNS, *PROVENANCE))
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        cur = dbapi.cursor()
        try:
            cur.copy_expert(
                f"COPY {journal_table.name} ({cols}) FROM STDIN WITH (FORMAT csv)",
                io.BytesIO(data),
            )
        finally:
            cur.close()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One transaction: committed on success, rolled back on any error."""
        with self.engine.begin() as conn:
            yield conn

    def write(self, rows: Iterable[Row], write: Write, batch_size: int = 10_000) -> int:
        """Insert the rows of ``write`` in one transaction; returns how many were written."""
        count = 0
        with self.transaction() as conn:
            batch: list[Row] = []
            for row in rows:
                batch.append(row)
                if len(batch) >= batch_size:
                    self.insert_rows(conn, batch, write)
                    count += len(batch)
                    batch = []
            self.insert_rows(conn, batch, write)
            count += len(batch)
        return count

    # --- reading --------------------------------------------------------

    def count(self, dataset: str | None = None) -> int:
        q = select(func.count()).select_from(journal_table)
        if dataset is not None:
            q = q.where(journal_table.c.dataset == dataset)
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar() or 0)

    def counts(self) -> dict[str, int]:
        """Rows waiting to be flushed, by dataset (one grouped query for the lake)."""
        q = select(journal_table.c.dataset, func.count()).group_by(journal_table.c.dataset)
        with self.engine.connect() as conn:
            return {str(name): int(n) for name, n in conn.execute(q)}

    def datasets(self) -> list[str]:
        """Datasets with rows waiting to be flushed."""
        q = select(journal_table.c.dataset).distinct()
        with self.engine.connect() as conn:
            return sorted(r[0] for r in conn.execute(q))

    def entity_rows(self, dataset: str, entity_id: str) -> list[Row]:
        """All journal rows about one entity (by entity or canonical id), in order."""
        t = journal_table
        cols = [t.c[c] for c in COLUMNS]
        q = (
            select(t.c.seq, *cols)
            .where(t.c.dataset == dataset)
            .where((t.c.entity_id == entity_id) | (t.c.canonical_id == entity_id))
            .order_by(t.c.seq)
        )
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(q)]

    def rows(self, dataset: str) -> Iterator[Row]:
        """All rows of a dataset (``COLUMNS`` order) in insert order, streamed."""
        t = journal_table
        q = select(*[t.c[c] for c in COLUMNS]).where(t.c.dataset == dataset).order_by(t.c.seq)
        with self.engine.connect() as conn:
            for row in conn.execution_options(stream_results=True, yield_per=20_000).execute(q):
                yield tuple(row)

    def live_entity_statements(self, dataset: str, entity_id: str) -> list[Statement]:
        """Statements of an entity whose last journal event is not a tombstone."""
        return self.live_statements_of(dataset, [entity_id])[entity_id]

    def live_statements_of(
        self, dataset: str, entity_ids: Sequence[str]
    ) -> dict[str, list[Statement]]:
        """:meth:`live_entity_statements` of many entities, a query per
        :data:`IDS_PER_QUERY` of them: the journal is indexed by dataset and
        bucket only, so each query reads the dataset's rows once (a delete of
        4,351 entities asked 4,351 times, each a scan of the pending rows)."""
        ids = list(dict.fromkeys(entity_ids))
        t = journal_table
        cols = [t.c[c] for c in COLUMNS]
        at_id, at_canonical = COLUMNS.index("entity_id"), COLUMNS.index("canonical_id")
        key = (COLUMNS.index("id"), COLUMNS.index("origin"))
        deleted = COLUMNS.index("deleted_at")
        latest: dict[str, dict[tuple[str, str], Row]] = {e: {} for e in ids}
        with self.engine.connect() as conn:
            for start in range(0, len(ids), IDS_PER_QUERY):
                chunk = ids[start : start + IDS_PER_QUERY]
                q = (
                    select(t.c.seq, *cols)
                    .where(t.c.dataset == dataset)
                    .where(t.c.entity_id.in_(chunk) | t.c.canonical_id.in_(chunk))
                    .order_by(t.c.seq)
                )
                for row in conn.execute(q):
                    data = tuple(row)[1:]
                    # a row is about its entity and its canonical entity, both if asked
                    for owner in {data[at_id], data[at_canonical]}:
                        if owner in latest:
                            latest[owner][(data[key[0]], data[key[1]])] = data
        return {
            e: [row_statement(r) for r in rows.values() if r[deleted] is None]
            for e, rows in latest.items()
        }

    def has_pending(self, dataset: str) -> bool:
        """Whether any row of the dataset waits for a flush (claimed or not)."""
        q = select(journal_table.c.seq).where(journal_table.c.dataset == dataset).limit(1)
        with self.engine.connect() as conn:
            return conn.execute(q).first() is not None

    # --- the hand-off to a flush ------------------------------------------

    def claim(self, dataset: str, flush_id: str) -> Claim:
        """Fix the rows of the dataset committed by now as this flush's (see module doc).

        The caller holds the dataset's lock, so rows a dead flush had claimed
        are claimed again.
        """
        t = journal_table
        if self.dialect == "sqlite":
            q = select(func.max(t.c.seq)).where(t.c.dataset == dataset)
            with self.engine.connect() as conn:
                bound = conn.execute(q).scalar()
            return Claim(dataset, flush_id, int(bound) if bound is not None else 0)
        stamp = update(t).where(t.c.dataset == dataset).values(flush_id=flush_id)
        with self.engine.begin() as conn:
            conn.execute(stamp)
        return Claim(dataset, flush_id, None)

    def _claimed(self, claim: Claim) -> Any:
        t = journal_table
        if claim.bound is not None:
            return (t.c.dataset == claim.dataset) & (t.c.seq <= claim.bound)
        return (t.c.dataset == claim.dataset) & (t.c.flush_id == claim.flush_id)

    def claimed_buckets(self, claim: Claim) -> list[tuple[int, int]]:
        """(bucket, row count) of the claimed rows."""
        t = journal_table
        q = (
            select(t.c.bucket, func.count())
            .where(self._claimed(claim))
            .group_by(t.c.bucket)
            .order_by(t.c.bucket)
        )
        with self.engine.connect() as conn:
            return [(int(b), int(n)) for b, n in conn.execute(q)]

    def read_claimed(self, claim: Claim, buckets: Sequence[int]) -> pa.Table:
        """Claimed rows of a range of buckets as Arrow
        (:data:`EVENTS_SCHEMA`), in no particular order (flush reduces them).

        Flush reads millions of rows, so this bypasses SQLAlchemy's row
        objects: PostgreSQL streams them with ``COPY ... TO STDOUT`` into
        Arrow's CSV reader (no Python row at all); SQLite's cursor hands
        chunks of tuples that become Arrow columns at once. (ADBC's SQLite
        driver would avoid even that but links a second SQLite library into
        the process, which breaks SQLite's file locking: it was seen reading
        a stale snapshot of the WAL journal.)
        """
        low, high = min(buckets), max(buckets)
        columns = ", ".join(f'"{c}"' for c in EVENTS_SCHEMA.names)
        if claim.bound is not None:
            where = "dataset = {p} AND seq <= {p} AND bucket BETWEEN {p} AND {p}"
            params: tuple[Any, ...] = (claim.dataset, claim.bound, low, high)
        else:
            where = "dataset = {p} AND flush_id = {p} AND bucket BETWEEN {p} AND {p}"
            params = (claim.dataset, claim.flush_id, low, high)
        if self.dialect == "postgresql":
            return self._copy_out(columns, where, params)
        marks = "?" if self.dialect == "sqlite" else "%s"
        sql = f"SELECT {columns} FROM {journal_table.name} WHERE {where.format(p=marks)}"
        chunks = []
        with self.engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            cursor = dbapi.cursor()
            try:
                cursor.execute(sql, params)
                while rows := cursor.fetchmany(65_536):
                    chunks.append(_record_batch(rows))
            finally:
                cursor.close()
        return pa.Table.from_batches(chunks, schema=EVENTS_SCHEMA)

    def _copy_out(self, columns: str, where: str, params: tuple[Any, ...]) -> pa.Table:
        """PostgreSQL: ``COPY (SELECT ...) TO STDOUT`` as CSV, parsed by Arrow."""
        import tempfile

        import pyarrow.csv as pacsv

        with self.engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            cursor = dbapi.cursor()
            try:
                query = cursor.mogrify(
                    f"SELECT {columns} FROM {journal_table.name} WHERE {where.format(p='%s')}",
                    params,
                ).decode()
                # spooled: in memory up to 64 MB, then on disk (bounded memory)
                with tempfile.SpooledTemporaryFile(max_size=64 * 1024 * 1024) as spool:
                    cursor.copy_expert(f"COPY ({query}) TO STDOUT WITH (FORMAT csv)", spool)
                    spool.seek(0)
                    return pacsv.read_csv(
                        spool,
                        read_options=pacsv.ReadOptions(column_names=EVENTS_SCHEMA.names),
                        parse_options=pacsv.ParseOptions(newlines_in_values=True),
                        convert_options=pacsv.ConvertOptions(
                            column_types=EVENTS_SCHEMA,
                            # COPY writes NULL unquoted and '' quoted: keep them apart
                            null_values=[""],
                            strings_can_be_null=True,
                            quoted_strings_can_be_null=False,
                            true_values=["t"],
                            false_values=["f"],
                        ),
                    )
            finally:
                cursor.close()

    def release_claimed(self, claim: Claim, buckets: Sequence[int]) -> int:
        """Delete the claimed rows of some buckets: they are in the Delta tables now."""
        t = journal_table
        low, high = min(buckets), max(buckets)
        q = delete(t).where(self._claimed(claim), t.c.bucket.between(low, high))
        with self.engine.begin() as conn:
            if claim.bound is not None and self._only_these(conn, claim, low, high):
                # SQLite deletes a table without WHERE by freeing its pages
                # (the truncate optimisation): 1M rows in 0.1 s, where deleting
                # them row by row, indexes and WAL included, takes 4 s (10M:
                # 48 s); 20 s at 10M while freed pages were zeroed (see
                # _sqlite_pragmas)
                return int(conn.execute(delete(t)).rowcount or 0)
            return int(conn.execute(q).rowcount or 0)

    @staticmethod
    def _only_these(conn: Connection, claim: Claim, low: int, high: int) -> bool:
        """Whether the journal holds nothing but the claimed rows of buckets
        ``low``..``high`` (SQLite), checked under the write lock.

        A no-op delete takes the write lock first, so no row can be committed
        between the check and the delete. Each check is one probe of the
        primary key or of the (dataset, bucket) index.
        """
        t = journal_table
        assert claim.bound is not None
        conn.execute(delete(t).where(t.c.seq < 0))  # takes the write lock
        others = (
            t.c.seq > claim.bound,
            t.c.dataset < claim.dataset,
            t.c.dataset > claim.dataset,
            (t.c.dataset == claim.dataset) & (t.c.bucket < low),
            (t.c.dataset == claim.dataset) & (t.c.bucket > high),
        )
        return all(conn.execute(select(t.c.seq).where(o).limit(1)).first() is None for o in others)

    def clear(self, dataset: str) -> int:
        """Remove every row of a dataset (benchmarks and tests; loses unflushed writes)."""
        q = delete(journal_table).where(journal_table.c.dataset == dataset)
        with self.engine.begin() as conn:
            return int(conn.execute(q).rowcount or 0)

    def dispose(self) -> None:
        self.engine.dispose()


def iso(ts: datetime) -> str:
    """Statement timestamps as followthemoney writes them (seconds, UTC)."""
    return ts.strftime("%Y-%m-%dT%H:%M:%S")
