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
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sqlalchemy import (
    Engine,
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

from lakehouse_assets.journal_rows import (  # noqa: F401  (the journal's rows, as before the move)
    BOOKKEEPING as BOOKKEEPING,
)
from lakehouse_assets.journal_rows import (
    BUCKETS as BUCKETS,
)
from lakehouse_assets.journal_rows import (
    COLUMNS as COLUMNS,
)
from lakehouse_assets.journal_rows import (
    EVENTS_SCHEMA as EVENTS_SCHEMA,
)
from lakehouse_assets.journal_rows import (
    PROVENANCE as PROVENANCE,
)
from lakehouse_assets.journal_rows import (
    ROWS_SCHEMA as ROWS_SCHEMA,
)
from lakehouse_assets.journal_rows import (
    Row as Row,
)
from lakehouse_assets.journal_rows import (
    Write as Write,
)
from lakehouse_assets.journal_rows import (
    _record_batch as _record_batch,
)
from lakehouse_assets.journal_rows import (
    bucket_of as bucket_of,
)
from lakehouse_assets.journal_rows import (
    copy_csv as copy_csv,
)
from lakehouse_assets.journal_rows import (
    journal_table as journal_table,
)
from lakehouse_assets.journal_rows import (
    metadata as metadata,
)
from lakehouse_assets.journal_rows import (
    row_statement as row_statement,
)
from lakehouse_assets.journal_rows import (
    statement_from_mapping as statement_from_mapping,
)
from lakehouse_assets.journal_rows import (
    statement_row as statement_row,
)
from lakehouse_assets.journal_rows import (
    statements_copy_csv as statements_copy_csv,
)
from lakehouse_assets.journal_rows import (
    write_time as write_time,
)
from lakehouse_assets.journal_sqlite import _sqlite_engines, _sqlite_pragmas
from lakehouse_assets.journal_urls import check_tables_durable, checked_journal_url

if TYPE_CHECKING:
    # imported where a Statement is made: a flush task's worker reads the
    # journal without followthemoney (0.5 s and about 90 MB per worker)
    from followthemoney.statement import Statement


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
