"""What an operation needs of one dataset, built from below the operations.

A :class:`DatasetContext` is the dataset's name and the parts every operation
reads or writes: the lake's store and settings, the tenant acting, the journal,
the Delta tables' locations and their consistent snapshot, tags, locks and job
records. Operations (flush, query, exports, maintenance, versions, graph,
mappings...) take one; :class:`lakehouse_assets.lake.Dataset`, the tenant-facing
facade, is one, with the tenant API on top, so an operation never needs the
facade (nor imports it) and the facade composes operations from above.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import cached_property
from typing import TYPE_CHECKING

from lakehouse_assets import conventions as cv
from lakehouse_assets.archive import Archive
from lakehouse_assets.catalog import load_dataset_config
from lakehouse_assets.errors import CollectionError
from lakehouse_assets.jobs import JobRecorder, record_job
from lakehouse_assets.journal import Journal
from lakehouse_assets.locks import Lock, dataset_lock, operation_lock
from lakehouse_assets.settings import Settings
from lakehouse_assets.storage import Store
from lakehouse_assets.tables.delta import DeltaLocation
from lakehouse_assets.tables.snapshot import DatasetSnapshot
from lakehouse_assets.tags import Tags

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from followthemoney.dataset.dataset import DatasetModel


class DatasetContext:
    """One dataset's parts: name, store, settings, tenant, journal, tables, tags, locks, jobs.

    ``journal`` is a callable so the journal connects on first use (a command
    that reads only the tables never opens it) and a lake's datasets share one.
    """

    def __init__(
        self,
        name: str,
        *,
        store: Store,
        settings: Settings,
        tenant: str,
        journal: Callable[[], Journal],
    ) -> None:
        self.name = cv.dataset_name(name)
        self.store = store
        self.settings = settings
        #: The tenant acting: the lake's (writes, jobs, locks record it).
        self.tenant = tenant
        self._journal = journal
        #: the config's children, read on the first write (a collection refuses writes)
        self._children: tuple[str, ...] | None = None

    def sibling(self, name: str) -> DatasetContext:
        """Another dataset of the same lake: same store, settings, tenant and journal."""
        return DatasetContext(
            name,
            store=self.store,
            settings=self.settings,
            tenant=self.tenant,
            journal=self._journal,
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} in {self.store.uri}>"

    # --- parts ----------------------------------------------------------

    @cached_property
    def archive(self) -> Archive:
        return Archive(self.store, self.name, self.settings)

    @property
    def journal(self) -> Journal:
        return self._journal()

    @property
    def statements_table(self) -> DeltaLocation:
        """The Delta statements table (``entities/statements``, partitioned by origin)."""
        return DeltaLocation(
            self.store.full_uri(cv.dataset_path(self.name, cv.STATEMENTS_TABLE)),
            self.store.storage_options(),
        )

    @property
    def translog_table(self) -> DeltaLocation:
        """The Delta translog table (``entities/translog``)."""
        return DeltaLocation(
            self.store.full_uri(cv.dataset_path(self.name, cv.TRANSLOG_TABLE)),
            self.store.storage_options(),
        )

    @property
    def changes_table(self) -> DeltaLocation:
        """The flush's change feed (``entities/changes``, see :mod:`.tables.feed`)."""
        return DeltaLocation(
            self.store.full_uri(cv.dataset_path(self.name, cv.CHANGES_TABLE)),
            self.store.storage_options(),
        )

    def snapshot(self, translog_version: int | None = None) -> DatasetSnapshot:
        """The consistent pair of table versions readers see (the latest by default)."""
        return DatasetSnapshot.load(self.statements_table, self.translog_table, translog_version)

    def tags(self, tenant: str | None = None) -> Tags:
        """Tags of a tenant (default: the lakehouse's own core tags)."""
        return Tags(self.store, self.name, tenant or cv.LAKEHOUSE_TENANT)

    @property
    def core_tags(self) -> Tags:
        return self.tags(cv.LAKEHOUSE_TENANT)

    def config(self) -> DatasetModel:
        from followthemoney.dataset.dataset import DatasetModel

        raw = load_dataset_config(self.store, self.name)
        return DatasetModel.model_validate(raw)

    def check_not_a_collection(self) -> None:
        """Refuse a journal write to a collection: its tables are built from its
        leaves (:mod:`lakehouse_assets.collections`), so a row flushed into them
        would be overwritten, lost, by the next build. Asked once per dataset
        object (one read of its config.yml)."""
        if self._children is None:
            raw = load_dataset_config(self.store, self.name).get("children") or []
            self._children = tuple(sorted(str(c) for c in raw)) if isinstance(raw, list) else ()
        if self._children:
            raise CollectionError(
                f"[dataset {self.name!r}] is a collection of {', '.join(self._children)}: "
                "its statements are built from those datasets; write to one of them"
            )

    def lock(self, operation: str = "tables") -> Lock:
        """The dataset-wide ``.LOCK`` (not taken yet): one writer of the tables, any tenant."""
        return dataset_lock(
            self.store,
            self.name,
            self.tenant,
            self.settings.lock_ttl_seconds,
            operation=operation,
        )

    @contextmanager
    def table_lock(self, operation: str, *, wait: float | None = None) -> Iterator[Lock]:
        """Hold ``.LOCK`` for a write of the dataset's tables (flush, compact, optimize...).

        Waits up to ``wait`` seconds (default ``LAKEHOUSE_LOCK_WAIT_SECONDS``)
        for another writer, saying once on the log whom it waits for.
        """
        lock = self.lock(operation)
        seconds = self.settings.lock_wait_seconds if wait is None else wait
        lock.acquire(
            wait=seconds,
            on_wait=lambda holder: log.warning(
                "%s of %s waits up to %ds for %s: %s",
                operation,
                self.name,
                seconds,
                lock.path,
                holder.describe(),
            ),
        )
        try:
            yield lock
        finally:
            lock.release()

    def operation_lock(self, operation: str, tenant: str | None = None) -> Lock:
        """``locks/{tenant}/{operation}``: one run of a tenant's operation at a time.

        The lakehouse's own operations (export, mapping...) use the tenant
        ``lakehouse`` whoever runs them, so two tenants never run them at once.
        """
        return operation_lock(
            self.store,
            self.name,
            tenant or self.tenant,
            operation,
            self.settings.lock_ttl_seconds,
        )

    def job(self, job_type: str) -> AbstractContextManager[JobRecorder]:
        """Record a run of ``job_type`` under ``jobs/runs/``."""
        return record_job(self.store, self.name, job_type, self.tenant)
