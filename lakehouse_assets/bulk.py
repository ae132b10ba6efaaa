"""The bulk writer: many entities or statements into the journal, in one transaction.

A ``BulkWriter`` (``Dataset.bulk``) validates what it is given, inserts the
rows in batches on one open transaction of the journal and commits once on
exit, so a bulk is written whole or not at all. It needs of its dataset only
the name, settings, journal, tenant and tags (:class:`~lakehouse_assets.context.DatasetContext`).
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, RootTransaction

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidInputError
from lakehouse_assets.journal import Row, Write, iso, statement_row

if TYPE_CHECKING:
    # followthemoney is imported where an entity or statement is made or read
    from followthemoney.proxy import EntityProxy
    from followthemoney.statement import Statement

    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.entities import InputNotes


class BulkWriter:
    """Writes many entities/statements to the journal in one transaction.

    Rows are inserted in batches as they come (bounded memory) on a single
    open transaction, committed once on exit; any exception rolls back the
    whole bulk, so a bad line 900,000 leaves the journal as it was.
    """

    def __init__(self, dataset: DatasetContext, origin: str) -> None:
        dataset.check_not_a_collection()
        self.dataset = dataset
        self.origin = cv.origin(origin)
        self.journal = dataset.journal
        self.batch_size = dataset.settings.journal_batch_size
        self.seen = iso(cv.utcnow())
        #: who writes and this write's id: every row is stamped with them
        self.write = Write.new(dataset.tenant)
        self.count = 0
        self.entities = 0
        #: values followthemoney's cleaning dropped and entity fields not kept,
        #: made on first use (followthemoney is imported where an entity is made)
        self._notes: InputNotes | None = None
        self._rows: list[Row] = []
        self._conn: Connection | None = None
        self._tx: RootTransaction | None = None

    def __enter__(self) -> BulkWriter:
        return self

    def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = self.journal.engine.connect()
            self._tx = self._conn.begin()
        return self._conn

    def _flush_batch(self) -> None:
        if not self._rows:
            return
        self.journal.insert_rows(self._connection(), self._rows, self.write)
        self._rows = []

    @property
    def notes(self) -> InputNotes:
        """What the written entities carried that the lake does not store as given:
        values followthemoney's cleaning dropped (per property) and entity fields
        the statement model has no place for (:class:`~lakehouse_assets.entities.InputNotes`)."""
        if self._notes is None:
            from lakehouse_assets.entities import InputNotes

            self._notes = InputNotes()
        return self._notes

    def add_entity(self, entity: EntityProxy | dict[str, Any]) -> int:
        from lakehouse_assets.entities import entity_statements, validate_entity

        name, origin, notes = self.dataset.name, self.origin, self.notes
        proxy = validate_entity(entity, dataset=name, notes=notes)
        stmts = entity_statements(proxy, dataset=name, origin=origin, seen=self.seen, notes=notes)
        self._rows.extend(statement_row(s, name, origin) for s in stmts)
        self.count += len(stmts)
        self.entities += 1
        if len(self._rows) >= self.batch_size:
            self._flush_batch()
        return len(stmts)

    def add_rows(self, rows: list[Row], entities: int = 0, notes: InputNotes | None = None) -> None:
        """Add journal rows made by :mod:`ingest` (already validated), with the
        notes made of their entities."""
        if notes:
            self.notes.update(notes)
        self._rows.extend(rows)
        self.count += len(rows)
        self.entities += entities
        if len(self._rows) >= self.batch_size:
            self._flush_batch()

    def add_copy(
        self, data: bytes, *, count: int, entities: int = 0, notes: InputNotes | None = None
    ) -> None:
        """Add ``count`` rows of this write already encoded as ``COPY`` input by
        :mod:`ingest` (validated; PostgreSQL), after the rows added before."""
        if notes:
            self.notes.update(notes)
        self._flush_batch()
        self.journal.insert_copy(self._connection(), data)
        self.count += count
        self.entities += entities

    def add_statement(self, stmt: Statement | dict[str, Any]) -> None:
        from followthemoney import model

        from lakehouse_assets.entities import check_statement, make_statement

        if isinstance(stmt, dict):
            stmt = make_statement(stmt, dataset=self.dataset.name, origin=self.origin)
        elif model.get(stmt.schema) is None:
            raise InvalidInputError(f"unknown schema {stmt.schema!r}", dataset=self.dataset.name)
        else:
            problem = check_statement(stmt)
            if problem:
                raise InvalidInputError(
                    f"statement {stmt.id}: {problem}", dataset=self.dataset.name
                )
        if stmt.first_seen is None:
            stmt = stmt.clone(first_seen=self.seen, last_seen=self.seen)
        self._rows.append(statement_row(stmt, self.dataset.name, self.origin))
        self.count += 1
        if len(self._rows) >= self.batch_size:
            self._flush_batch()

    def rollback(self) -> None:
        self._rows = []
        if self._tx is not None:
            self._tx.rollback()
        self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._tx = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.rollback()
            return
        try:
            self._flush_batch()
            if self._tx is not None:
                self._tx.commit()
        except BaseException:
            self.rollback()
            raise
        self._close()
        if self.count:
            self.dataset.core_tags.touch(cv.JOURNAL_LAST_UPDATED)


__all__ = ["BulkWriter"]
