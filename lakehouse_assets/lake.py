"""The tenant-facing API: a ``Lakehouse`` of ``Dataset`` objects.

This is the one public module the CLI and the Dagster assets use. Tenants
archive files and write entities/statements; they never see the side effects
(tags, journal bookkeeping) their writes trigger.

Example:
    >>> lake = Lakehouse("./lake")
    >>> ds = lake.create_dataset("my_dataset", title="My dataset")
    >>> with ds.bulk(origin="import") as bulk:
    ...     bulk.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import yaml

from lakehouse_assets import conventions as cv
from lakehouse_assets.archive import FileMeta
from lakehouse_assets.bulk import BulkWriter
from lakehouse_assets.catalog import (
    CatalogConfig,
    Source,
    apply_catalog_config,
    dataset_names,
    load_catalog_config,
    load_dataset_config,
)
from lakehouse_assets.context import DatasetContext
from lakehouse_assets.errors import DatasetNotFoundError
from lakehouse_assets.journal import Journal, Write, iso, statement_row
from lakehouse_assets.settings import Settings
from lakehouse_assets.storage import Store, open_store
from lakehouse_assets.tables.snapshot import DatasetSnapshot

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    # followthemoney is imported where an entity or statement is made or read:
    # about 0.5 s of every CLI command and Spark worker that does neither
    from followthemoney.proxy import EntityProxy
    from followthemoney.statement import Statement
    from followthemoney.statement.entity import StatementEntity
    from ftmq.query import Query

    from lakehouse_assets.crawl import CrawlResult
    from lakehouse_assets.exports import ExportResult
    from lakehouse_assets.flush import FlushResult
    from lakehouse_assets.maintenance import CompactResult, OptimizeResult
    from lakehouse_assets.mappings import MappingResult, StoredMapping
    from lakehouse_assets.queue import Queue
    from lakehouse_assets.versions import VerifyReport, Version


class Lakehouse:
    """A lake at a URI (local folder or ``s3://``) with its journal.

    The lake's catalog ``config.yml`` (:mod:`lakehouse_assets.catalog`) fills
    the settings neither an argument nor the environment set (the journal
    URL, vacuum retention); ``setting_sources`` says where each came from.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str] | None = None,
        *,
        settings: Settings | None = None,
        journal_url: str | None = None,
        tenant: str | None = None,
    ) -> None:
        updates: dict[str, Any] = {}
        if uri is not None:
            updates["lake_uri"] = str(uri)
        if journal_url is not None:
            updates["journal_url"] = journal_url
        if tenant is not None:
            updates["tenant"] = tenant
        base = settings or Settings()
        self.settings = base.model_copy(update=updates)
        self.tenant = cv.tenant_name(self.settings.tenant)
        self.store: Store = open_store(self.settings)
        #: The catalog config.yml (None: the lake has none yet).
        self.catalog_config: CatalogConfig | None = load_catalog_config(self.store)
        self.settings, sources = apply_catalog_config(
            self.settings, self.catalog_config, explicit=set(updates)
        )
        #: Where the settings the catalog config may fill came from.
        self.setting_sources: dict[str, Source] = sources

    @cached_property
    def journal(self) -> Journal:
        """The SQL buffer, connected on first use."""
        return Journal(self.settings.resolved_journal_url())

    # --- catalog --------------------------------------------------------

    def datasets(self) -> list[str]:
        """Names of the datasets in this lake (folders with a config.yml)."""
        return dataset_names(self.store)

    def create_dataset(self, name: str, *, title: str | None = None, **fields: Any) -> Dataset:
        """Create a dataset (idempotent: an existing config is updated).

        A new dataset starts from the catalog config.yml's ``dataset_defaults``;
        the fields given here win over them.
        """
        name = cv.dataset_name(name)
        path = cv.dataset_path(name, cv.CONFIG)
        current: dict[str, Any] = {}
        if self.store.exists(path):
            current = load_dataset_config(self.store, name)
        elif self.catalog_config is not None:
            current = copy.deepcopy(self.catalog_config.dataset_defaults)
        current.update({k: v for k, v in fields.items() if v is not None})
        current["name"] = name
        current["title"] = title or current.get("title") or name
        from followthemoney.dataset.dataset import DatasetModel

        config = DatasetModel.model_validate(current)
        self.store.write_text(
            path,
            yaml.safe_dump(config.model_dump(mode="json", exclude_defaults=True), sort_keys=False),
        )
        self.write_catalog()
        return Dataset(self, name)

    def dataset(self, name: str) -> Dataset:
        """An existing dataset; ``DatasetNotFoundError`` if it was never created."""
        name = cv.dataset_name(name)
        if not self.store.exists(cv.dataset_path(name, cv.CONFIG)):
            raise DatasetNotFoundError(
                f"Dataset {name!r} does not exist in lake {self.store.uri}; "
                f"create it with `lakehouse datasets create {name}`"
            )
        return Dataset(self, name)

    def delete_dataset(self, name: str, *, force: bool = False) -> DeletedDataset:
        """Remove a dataset from the lake: every file under its folder (tables,
        archive, exports, versions, queue, tags), its change marker and its
        journal rows; the catalog ``index.json`` is rewritten without it.

        Refused while its ``.LOCK`` or an operation lock is held by a live
        process (``LockedError``) or journal rows wait for a flush
        (``DatasetBusyError``), unless ``force``: then those writes are lost.
        The dataset's ``.LOCK`` is held while its files go; its ``config.yml``
        goes last but the lock, so a delete that died half-way is still a
        dataset, and deleting it again finishes the work.
        """
        from lakehouse_assets.errors import DatasetBusyError, LakehouseError, LockedError

        ds = self.dataset(name)
        lock = ds.lock("delete")
        holder = lock.try_acquire()
        busy = [f"{lock.path} ({holder.describe()})"] if holder is not None else []
        for path in self.store.list(cv.dataset_path(ds.name, cv.LOCKS) + "/"):
            tenant, operation = path.split("/")[-2:]
            try:
                state = ds.operation_lock(operation, tenant=tenant).state()
            except LakehouseError:  # not a lock file
                continue
            if state.held:
                busy.append(f"{path} ({state.describe()})")
        if busy and not force:
            if holder is None:
                lock.release()
            raise LockedError(
                f"dataset {ds.name} was not deleted: {'; '.join(busy)} is held; "
                "wait for it, or delete anyway with --force"
            )
        pending = self.journal.count(ds.name)
        if pending and not force:
            if holder is None:
                lock.release()
            raise DatasetBusyError(
                f"dataset {ds.name} was not deleted: {pending:,} journal rows wait for a "
                f"flush (`lakehouse -d {ds.name} flush`), or delete them too with --force"
            )
        config = cv.dataset_path(ds.name, cv.CONFIG)
        kept = {config, lock.path}
        files = [p for p in self.store.list(cv.dataset_path(ds.name) + "/") if p not in kept]
        removed = self.store.delete_many(files)
        self.store.delete(config)
        self.store.delete(cv.change_marker(ds.name))
        self.store.delete(cv.queue_marker(ds.name))
        rows = self.journal.clear(ds.name)
        self.store.delete(lock.path)  # the lock last: no writer started meanwhile
        self.store.remove_empty_folders(cv.dataset_path(ds.name))
        self.write_catalog()
        log.info("deleted dataset %s: %d files, %d journal rows", ds.name, removed + 1, rows)
        return DeletedDataset(ds.name, removed + 1, rows, busy)

    def write_catalog(self, *, snapshot: bool = False) -> None:
        """Rewrite the catalog ``index.json`` (see :mod:`lakehouse_assets.versions.catalog_index`)."""
        from lakehouse_assets.versions.catalog_index import write_catalog

        write_catalog(self.store, self.dataset, snapshot=snapshot)


@dataclass
class DeletedDataset:
    """What ``delete_dataset`` removed: files, journal rows (not flushed: lost),
    and the locks it deleted anyway (with ``force``)."""

    name: str
    files: int
    journal_rows: int
    forced_locks: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Dataset(DatasetContext):
    """One dataset of a lake: archive, journal writes, tags, locks, job runs."""

    def __init__(self, lake: Lakehouse, name: str) -> None:
        super().__init__(
            name,
            store=lake.store,
            settings=lake.settings,
            tenant=lake.tenant,
            journal=lambda: lake.journal,
        )
        self.lake = lake

    @cached_property
    def queue(self) -> Queue:
        """The dataset's action queue (``queue/{tenant}/{uuid7}.json``, see :mod:`queue`)."""
        from lakehouse_assets.queue import Queue

        return Queue(self)

    # --- archive --------------------------------------------------------

    def add_file(
        self,
        uri: str,
        *,
        checksum: str | None = None,
        create_document: bool = False,
        follow_symlinks: bool = True,
        **kwargs: Any,
    ) -> FileMeta:
        """Archive a file (see :func:`lakehouse_assets.crawl.archive_file`)."""
        from lakehouse_assets.crawl import archive_file

        return archive_file(
            self,
            uri,
            checksum=checksum,
            create_document=create_document,
            follow_symlinks=follow_symlinks,
            **kwargs,
        )

    def crawl(
        self,
        source_uri: str,
        *,
        prefix: str | None = None,
        glob: str | None = None,
        exclude: str | None = None,
        skip_existing: bool = True,
        follow_symlinks: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> CrawlResult:
        """Archive every matching file under a source prefix (see :mod:`crawl`)."""
        from lakehouse_assets.crawl import crawl

        return crawl(
            self,
            source_uri,
            prefix=prefix,
            glob=glob,
            exclude=exclude,
            skip_existing=skip_existing,
            follow_symlinks=follow_symlinks,
            progress=progress,
        )

    # --- mappings -------------------------------------------------------

    def add_mapping(self, content_hash: str, config: str | dict[str, Any]) -> StoredMapping:
        """Validate and store a mapping for an archived CSV (see :mod:`mappings`)."""
        from lakehouse_assets.mappings import store_mapping

        return store_mapping(self, content_hash, config)

    def mappings(self) -> list[dict[str, Any]]:
        from lakehouse_assets.mappings import list_mappings

        return list_mappings(self)

    def process_mapping(
        self, content_hash: str, *, force: bool = False, spark: bool | None = None
    ) -> MappingResult:
        """Map the archived CSV into the journal, unless the result is fresh."""
        from lakehouse_assets.mappings import process_mapping

        return process_mapping(self, content_hash, force=force, spark=spark)

    # --- entities and statements ---------------------------------------

    def bulk(self, origin: str = cv.DEFAULT_ORIGIN) -> BulkWriter:
        """A bulk writer: everything commits at once on exit, or nothing."""
        return BulkWriter(self, origin)

    def add_entity(
        self, entity: EntityProxy | dict[str, Any], origin: str = cv.DEFAULT_ORIGIN
    ) -> int:
        """Validate an entity and write its statements; returns their number (what
        it carried that is not stored as given is logged: :attr:`BulkWriter.notes`)."""
        with self.bulk(origin) as bulk:
            count = bulk.add_entity(entity)
        if bulk.notes:
            log.warning("%s: entity written; %s", self.name, bulk.notes.describe())
        return count

    def write_entities(
        self,
        lines: IO[bytes] | Iterable[bytes],
        *,
        origin: str = cv.DEFAULT_ORIGIN,
        source: str | None = None,
        progress: Callable[[int], None] | None = None,
        workers: int | None = None,
    ) -> BulkWriter:
        """Bulk-write FtM JSON lines (validated in parallel); all or nothing.

        ``progress`` is called with the number of input lines of each chunk.
        Returns the finished writer (``.entities``, ``.count`` statements and
        ``.notes``: values followthemoney's cleaning dropped, per property, and
        entity fields not kept).
        """
        from lakehouse_assets.ingest import convert_lines

        with self.bulk(origin) as bulk:
            for result in convert_lines(
                lines,
                dataset=self.name,
                origin=bulk.origin,
                source=source,
                seen=bulk.seen,
                workers=workers,
                copy_for=bulk.write if self.journal.takes_copy else None,
            ):
                if result.copy is not None:
                    bulk.add_copy(
                        result.copy,
                        count=result.count,
                        entities=result.entities,
                        notes=result.notes,
                    )
                else:
                    bulk.add_rows(result.rows, entities=result.entities, notes=result.notes)
                if progress is not None:
                    progress(result.lines)
        return bulk

    def add_statements(
        self, statements: Iterable[Statement], origin: str = cv.DEFAULT_ORIGIN
    ) -> int:
        with self.bulk(origin) as bulk:
            for stmt in statements:
                bulk.add_statement(stmt)
            return bulk.count

    def stored_statements(self, entity_id: str) -> list[Statement]:
        """Live statements of an entity: in the Delta table and still in the journal."""
        from lakehouse_assets.query import stored_statements

        return stored_statements(self, entity_id)

    def delete_entity(self, entity_id: str, origin: str | None = None) -> int:
        """Tombstone every statement of an entity; returns how many."""
        return self.delete_entities([entity_id], origin=origin)[entity_id]

    def delete_entities(
        self, entity_ids: Sequence[str], origin: str | None = None
    ) -> dict[str, int]:
        """Tombstone every statement of each entity (of ``origin`` only, if given),
        in one journal write; returns how many per entity."""
        from lakehouse_assets.query import stored_statements_of

        ids = list(dict.fromkeys(entity_ids))
        found = stored_statements_of(self, ids)
        now = iso(cv.utcnow())
        rows = []
        counts = {}
        for entity_id in ids:
            stmts = [s for s in found[entity_id] if origin is None or s.origin == origin]
            counts[entity_id] = len(stmts)
            rows += [
                statement_row(s, self.name, s.origin or cv.DEFAULT_ORIGIN, deleted_at=now)
                for s in stmts
            ]
        if rows:
            self.check_not_a_collection()
            self.journal.write(rows, Write.new(self.lake.tenant))
            self.core_tags.touch(cv.JOURNAL_LAST_UPDATED)
        return counts

    def delete_statement(self, stmt: Statement, origin: str | None = None) -> None:
        """Tombstone a single statement."""
        origin = cv.origin(stmt.origin or origin or cv.DEFAULT_ORIGIN)
        row = statement_row(stmt, self.name, origin, deleted_at=iso(cv.utcnow()))
        self.check_not_a_collection()
        self.journal.write([row], Write.new(self.lake.tenant))
        self.core_tags.touch(cv.JOURNAL_LAST_UPDATED)

    # --- data plane (Spark for batch work, pyarrow for point reads) ------

    def flush(self, batch_rows: int | None = None) -> FlushResult:
        """Move the journal into the Delta statements table and translog."""
        from lakehouse_assets.flush import flush

        return flush(self, batch_rows=batch_rows)

    def compact(self) -> CompactResult:
        from lakehouse_assets.maintenance import compact

        return compact(self)

    def optimize(
        self, *, vacuum: bool = False, retention_hours: int | None = None
    ) -> OptimizeResult:
        from lakehouse_assets.maintenance import optimize

        return optimize(self, vacuum=vacuum, retention_hours=retention_hours)

    def export(self, kinds: Sequence[str], force: bool = False) -> ExportResult:
        """Run exports by kind (``statements``, ``entities``, ``statistics``, ``index``)."""
        from lakehouse_assets.exports import export

        return export(self, kinds, force=force)

    def make(self, force: bool = False) -> ExportResult:
        """Flush if needed, then every export that is not fresh. A collection
        (children in its config.yml) is first built from its leaves and
        judgements when either changed (:mod:`lakehouse_assets.collections`)."""
        from lakehouse_assets.collections.leaves import is_collection

        if is_collection(self.store, self.name):
            from lakehouse_assets.collections.make import make as make_collection

            return make_collection(self, force=force).exported
        from lakehouse_assets.exports import make

        return make(self, force=force)

    def query(
        self,
        q: Query | None = None,
        *,
        entity_ids: Sequence[str] | None = None,
        origin: str | None = None,
        schemata: Sequence[str] | None = None,
        flush: bool = True,
        as_of: str | int | None = None,
    ) -> Iterator[StatementEntity]:
        """Entities matching the filters (see :func:`lakehouse_assets.query.query`):
        ``schemata`` is read from the tables, ``q`` (ftmq) checked on each entity.

        ``as_of`` reads a published version (a sequence number, snapshot id or
        time; see :func:`lakehouse_assets.versions.resolve`) and never flushes.
        Otherwise flushes the journal first unless ``flush=False`` (then
        unflushed writes are not visible); see :meth:`_read_snapshot`."""
        from lakehouse_assets.query import check_schemata, query

        for entity_id in entity_ids or ():
            cv.entity_id(entity_id)

        def read() -> Iterator[StatementEntity]:  # lazy, as the read itself
            check_schemata(self, schemata)
            snapshot = self._read_snapshot(flush=flush, as_of=as_of)
            yield from query(
                self, q, entity_ids=entity_ids, origin=origin, schemata=schemata, snapshot=snapshot
            )

        return read()

    def _read_snapshot(self, *, flush: bool, as_of: str | int | None) -> DatasetSnapshot | None:
        """What a read sees, decided here and not by the reads (a read never
        flushes): the snapshot of the published version ``as_of`` names, or
        (``None``) the current tables, after a flush of the journal unless
        ``flush=False``. If another writer holds the dataset's lock for longer
        than ``LAKEHOUSE_READ_WAIT_SECONDS``, the read gets the current snapshot
        instead (and the log says how many journal rows are pending): a reader
        never fails because of a writer."""
        if as_of is not None:
            from lakehouse_assets.versions import version_snapshot

            return version_snapshot(self, as_of)
        if flush:
            from lakehouse_assets.flush import flush_for_reading

            flush_for_reading(self, wait=self.settings.read_wait_seconds)
        return None

    def get_entity(
        self,
        entity_id: str,
        *,
        origin: str | None = None,
        flush: bool = False,
        as_of: str | int | None = None,
    ) -> StatementEntity | None:
        from lakehouse_assets.query import get_entity

        cv.entity_id(entity_id)
        snapshot = self._read_snapshot(flush=flush, as_of=as_of)
        return get_entity(self, entity_id, origin=origin, snapshot=snapshot)

    def stream_entities(self, as_of: str | int | None = None) -> Iterator[dict[str, Any]]:
        from lakehouse_assets.query import stream_entities

        def read() -> Iterator[dict[str, Any]]:  # lazy, as the read itself
            snapshot = None if as_of is None else self._read_snapshot(flush=False, as_of=as_of)
            yield from stream_entities(self, snapshot=snapshot)

        return read()

    # --- versions (see lakehouse_assets.versions) ---

    def versions(self) -> list[Version]:
        """Every published version, oldest first."""
        from lakehouse_assets.versions import history

        return history(self)

    def version(self, as_of: str | int | None = None) -> Version | None:
        """The version ``as_of`` names (sequence, snapshot id or time); the head by default."""
        from lakehouse_assets import versions

        return versions.head(self) if as_of is None else versions.resolve(self, as_of)

    def verify(self, *, deep: bool = False, trusted_head: str | None = None) -> VerifyReport:
        from lakehouse_assets.versions import verify

        return verify(self, deep=deep, trusted_head=trusted_head)

    def trace(self, key: str) -> list[dict[str, Any]]:
        """Provenance of an entity's statements (or of one statement, by its id)."""
        from lakehouse_assets.versions import trace

        cv.entity_id(key, "entity or statement id")
        return trace(self, key)

    def export_as_of(self, as_of: str | int, kind: str, out: IO[bytes]) -> int:
        """Re-make export ``kind`` of a published version into ``out``."""
        from lakehouse_assets import versions

        snapshot = versions.snapshot_at(self, versions.resolve(self, as_of))
        return versions.render_export(self, snapshot, kind, out)


__all__ = ["Dataset", "Lakehouse"]


def warm_up(url: str, settings: Settings) -> None:
    """Run once what every real job runs on the new Spark Connect server at ``url``,
    on a throwaway lake, so no user pays for the first time: a flush (the journal
    data source, reduce, Spark's Parquet writer, delta-rs commits) and the exports.
    On a fresh server the first flush of 26k journal rows took 17 s, the next ones
    4 s: JIT compilation, class loading and Python workers, not data. Passed to
    :func:`lakehouse_assets.spark.connect.start` by whoever starts the server."""
    import time

    from lakehouse_assets import progress

    # one line instead of a throwaway dataset's flush and export stages, which
    # looked like work on the person's data
    progress.stage(
        "spark start: warming the new server up with a throwaway flush and export "
        "(the first job on a fresh JVM is 4x slower); no data of yours is touched"
    )
    clock = time.monotonic()
    with (
        progress.quiet(),
        tempfile.TemporaryDirectory(prefix="warm-up-", dir=settings.cache_path) as tmp,
    ):
        lake = Lakehouse(
            str(Path(tmp) / "lake"),
            settings=settings.model_copy(update={"spark_remote": url, "journal_url": None}),
        )
        ds = lake.create_dataset("warm_up")
        sample = Path(__file__).parent / "sample" / "entities.ftm.json"
        with sample.open("rb") as fh:
            ds.write_entities(fh, origin="warm_up")
        ds.make()
    progress.stage("spark start: warm after %.0f s", time.monotonic() - clock)
