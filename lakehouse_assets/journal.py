"""The journal: a durable SQL buffer of statement writes and tombstones.

Every tenant write lands here first; ``flush`` later moves it into the Delta
tables. The journal is append-only: a write is a row, a delete is a row with
``deleted_at`` set (a tombstone), and ``seq`` keeps insert order so that the
last event for a statement wins when it is flushed.

Hand-off to a flush is by *claim*: the flush stamps its ``flush_id`` on the
rows committed at that moment, reads and commits exactly those, and deletes
exactly those. ``seq`` is no bound for that: PostgreSQL hands out sequence
numbers at insert time, not commit time (a bulk opened earlier commits rows
with lower numbers later), and SQLite re-uses the row ids a clear freed.
Rows committed after the claim keep ``flush_id`` NULL and wait for the next
flush; rows of a flush that died keep its id and are claimed again by the
next one (flushes of a dataset are serialised by the dataset lock).

SQLite (a file, WAL mode, ``synchronous=FULL``) is the embedded default;
PostgreSQL is used when the URL says so. One table serves all datasets of a
lake (``dataset`` column), indexed by ``(dataset, bucket)`` so that flush can
read a bounded slice of entities at a time.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pyarrow as pa
from followthemoney.statement import Statement
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
    # the flush that claimed the row (NULL: not claimed yet)
    Column("flush_id", String(32)),
    Index("ix_lakehouse_journal_dataset_bucket", "dataset", "bucket"),
)

#: Columns the journal keeps for itself, not part of a written row.
BOOKKEEPING = ("seq", "flush_id")
#: Column order of the tuples written and read by the journal.
COLUMNS: tuple[str, ...] = tuple(c.name for c in journal_table.columns if c.name not in BOOKKEEPING)

Row = tuple[Any, ...]

#: Arrow types of the rows flush reads (``seq`` then ``COLUMNS``).
EVENTS_SCHEMA = pa.schema(
    [("seq", pa.int64())]
    + [
        (
            name,
            pa.int32() if name == "bucket" else pa.bool_() if name == "external" else pa.string(),
        )
        for name in COLUMNS
    ]
)


def bucket_of(canonical_id: str) -> int:
    """The flush bucket of an entity (stable across processes and hosts)."""
    return zlib.crc32(canonical_id.encode("utf-8")) % BUCKETS


def _record_batch(rows: Sequence[Sequence[Any]]) -> pa.RecordBatch:
    """Rows ``(seq, *COLUMNS)`` from a DB-API cursor as one Arrow batch."""
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


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    # FULL: a committed bulk survives power loss, not only a process crash.
    # One commit per bulk makes the extra fsync negligible.
    cur.execute("PRAGMA synchronous=FULL")
    cur.execute("PRAGMA busy_timeout=300000")
    cur.close()


class Journal:
    """The SQL buffer of one lake (all datasets, one table)."""

    def __init__(self, url: str) -> None:
        self.url = url
        if url.startswith("postgresql://"):
            url = "postgresql+psycopg2://" + url.removeprefix("postgresql://")
        if url == "sqlite://" or url.endswith(":memory:"):
            raise ValueError(
                "An in-memory journal loses acknowledged writes between processes; "
                "use a SQLite file or PostgreSQL."
            )
        kwargs: dict[str, Any] = {"hide_parameters": True}
        if url.startswith("sqlite"):
            kwargs["connect_args"] = {"timeout": 300}
        self.engine: Engine = create_engine(url, **kwargs)
        self.dialect = self.engine.dialect.name
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self._create()

    def _create(self) -> None:
        # Several processes may race to create the table; losing is fine.
        for attempt in range(5):
            try:
                metadata.create_all(self.engine, checkfirst=True)
                self._migrate()
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

    def _migrate(self) -> None:
        """Bring a journal made by an earlier version up to this schema."""
        present = {c["name"] for c in inspect(self.engine).get_columns(journal_table.name)}
        if "flush_id" not in present:
            with self.engine.begin() as conn:
                conn.exec_driver_sql(
                    f"ALTER TABLE {journal_table.name} ADD COLUMN flush_id VARCHAR(32)"
                )

    # --- writing --------------------------------------------------------

    def insert_rows(self, conn: Connection, rows: Sequence[Row]) -> None:
        """Insert rows (``COLUMNS`` order) on an open transaction, fast."""
        if not rows:
            return
        if self.dialect == "sqlite":
            cols = ", ".join(f'"{c}"' for c in COLUMNS)
            marks = ", ".join("?" for _ in COLUMNS)
            conn.exec_driver_sql(
                f"INSERT INTO {journal_table.name} ({cols}) VALUES ({marks})", list(rows)
            )
        elif self.dialect == "postgresql":
            from psycopg2.extras import execute_values

            cols = ", ".join(f'"{c}"' for c in COLUMNS)
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            cur = dbapi.cursor()
            try:
                execute_values(
                    cur,
                    f"INSERT INTO {journal_table.name} ({cols}) VALUES %s",
                    rows,
                    page_size=5000,
                )
            finally:
                cur.close()
        else:
            conn.execute(journal_table.insert(), [dict(zip(COLUMNS, r, strict=True)) for r in rows])

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One transaction: committed on success, rolled back on any error."""
        with self.engine.begin() as conn:
            yield conn

    def write(self, rows: Iterable[Row], batch_size: int = 10_000) -> int:
        """Insert rows in one transaction; returns how many were written."""
        count = 0
        with self.transaction() as conn:
            batch: list[Row] = []
            for row in rows:
                batch.append(row)
                if len(batch) >= batch_size:
                    self.insert_rows(conn, batch)
                    count += len(batch)
                    batch = []
            self.insert_rows(conn, batch)
            count += len(batch)
        return count

    # --- reading --------------------------------------------------------

    def count(self, dataset: str | None = None) -> int:
        q = select(func.count()).select_from(journal_table)
        if dataset is not None:
            q = q.where(journal_table.c.dataset == dataset)
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar() or 0)

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
        latest: dict[tuple[str, str], Row] = {}
        for row in self.entity_rows(dataset, entity_id):
            data = row[1:]
            latest[(data[COLUMNS.index("id")], data[COLUMNS.index("origin")])] = data
        deleted = COLUMNS.index("deleted_at")
        return [row_statement(r) for r in latest.values() if r[deleted] is None]

    def has_pending(self, dataset: str) -> bool:
        """Whether any row of the dataset waits for a flush (claimed or not)."""
        q = select(journal_table.c.seq).where(journal_table.c.dataset == dataset).limit(1)
        with self.engine.connect() as conn:
            return conn.execute(q).first() is not None

    # --- the hand-off to a flush ------------------------------------------

    def claim(self, dataset: str, flush_id: str) -> int:
        """Stamp ``flush_id`` on every row of the dataset committed by now.

        The caller holds the dataset's lock, so any other flush id on a row is
        that of a flush that died: its rows are claimed again. Returns how
        many rows were claimed.
        """
        t = journal_table
        q = update(t).where(t.c.dataset == dataset).values(flush_id=flush_id)
        with self.engine.begin() as conn:
            return int(conn.execute(q).rowcount or 0)

    def claimed_buckets(self, dataset: str, flush_id: str) -> list[tuple[int, int]]:
        """(bucket, row count) of the rows a flush claimed."""
        t = journal_table
        q = (
            select(t.c.bucket, func.count())
            .where(t.c.dataset == dataset, t.c.flush_id == flush_id)
            .group_by(t.c.bucket)
            .order_by(t.c.bucket)
        )
        with self.engine.connect() as conn:
            return [(int(b), int(n)) for b, n in conn.execute(q)]

    def read_claimed(self, dataset: str, flush_id: str, buckets: Sequence[int]) -> pa.Table:
        """Claimed rows ``(seq, *COLUMNS)`` of a range of buckets as Arrow
        (:data:`EVENTS_SCHEMA`), in no particular order (flush reduces them in Spark).

        Flush reads millions of rows, so this bypasses SQLAlchemy's row
        objects: PostgreSQL streams them with ``COPY ... TO STDOUT`` into
        Arrow's CSV reader (no Python row at all); SQLite's cursor hands
        chunks of tuples that become Arrow columns at once. (ADBC's SQLite
        driver would avoid even that but links a second SQLite library into
        the process, which breaks SQLite's file locking: it was seen reading
        a stale snapshot of the WAL journal.)
        """
        low, high = min(buckets), max(buckets)
        columns = ", ".join(f'"{c}"' for c in ("seq", *COLUMNS))
        where = "dataset = {p} AND flush_id = {p} AND bucket BETWEEN {p} AND {p}"
        if self.dialect == "postgresql":
            return self._copy_out(columns, where, (dataset, flush_id, low, high))
        marks = "?" if self.dialect == "sqlite" else "%s"
        sql = f"SELECT {columns} FROM {journal_table.name} WHERE {where.format(p=marks)}"
        chunks = []
        with self.engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            cursor = dbapi.cursor()
            try:
                cursor.execute(sql, (dataset, flush_id, low, high))
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

    def release_claimed(self, dataset: str, flush_id: str, buckets: Sequence[int]) -> int:
        """Delete the claimed rows of some buckets: they are in the Delta tables now."""
        t = journal_table
        q = delete(t).where(
            t.c.dataset == dataset,
            t.c.flush_id == flush_id,
            t.c.bucket.between(min(buckets), max(buckets)),
        )
        with self.engine.begin() as conn:
            return int(conn.execute(q).rowcount or 0)

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
