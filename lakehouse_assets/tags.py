"""Per-tenant tags: UTC timestamps that record when something last happened.

A tag lives at ``{dataset}/tags/{tenant}/{key}`` and holds one ISO-8601 UTC
timestamp. Tags are a runtime cache for freshness decisions ("is the export
newer than the data it was made from?"); Dagster keeps the authoritative
history of materializations, the tags let tenants and the CLI decide too.

Every move of a core (``lakehouse`` tenant) tag then rewrites the dataset's
change marker ``.changes/{dataset}`` at the lake's top: the sensors list that
one folder per tick and look only at the datasets whose marker moved, instead
of reading every dataset's tags. The marker is written after the tag, so a
sensor that sees the marker move reads the moved tag.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import SourceNotFoundError
from lakehouse_assets.storage import Store


class Tags:
    """The tags of one tenant in one dataset."""

    __slots__ = ("store", "dataset", "tenant")

    def __init__(self, store: Store, dataset: str, tenant: str = cv.LAKEHOUSE_TENANT) -> None:
        self.store = store
        self.dataset = cv.dataset_name(dataset)
        self.tenant = cv.tenant_name(tenant)

    def get(self, key: str) -> datetime | None:
        """The timestamp stored under ``key``, or None when never set."""
        try:
            raw = self.store.read_text(cv.tag_path(self.dataset, self.tenant, key))
        except SourceNotFoundError:
            return None
        return datetime.fromisoformat(raw.strip())

    def set(self, key: str, ts: datetime | None = None) -> datetime:
        """Store ``ts`` (default: now, UTC) under ``key`` and return it."""
        ts = ts or cv.utcnow()
        self.store.write_text(cv.tag_path(self.dataset, self.tenant, key), ts.isoformat())
        self.mark_changed(f"{key} {ts.isoformat()}")
        return ts

    def touch(self, key: str) -> datetime:
        """Set ``key`` to now, never moving backwards (clock skew between hosts)."""
        now = cv.utcnow()
        prev = self.get(key)
        if prev is not None and prev >= now:
            now = prev + timedelta(microseconds=1)
        return self.set(key, now)

    def delete(self, key: str) -> None:
        self.store.delete(cv.tag_path(self.dataset, self.tenant, key))
        self.mark_changed(f"{key} deleted {cv.utcnow().isoformat()}")

    def mark_changed(self, what: str) -> None:
        """Rewrite the dataset's change marker (core tags only: what the sensors watch).

        Called by every tag move, and by writers of state the sensors judge that
        moves no tag (the graph index's ``state.json``).
        """
        if self.tenant == cv.LAKEHOUSE_TENANT:
            self.store.write_text(cv.change_marker(self.dataset), what)

    def items(self) -> Iterator[tuple[str, datetime]]:
        """All (key, timestamp) pairs of this tenant, sorted by key."""
        prefix = cv.tags_prefix(self.dataset, self.tenant)
        for path in self.store.list(prefix):
            key = path[len(prefix) :]
            ts = self.get(key)
            if ts is not None:
                yield key, ts

    def is_latest(self, key: str, dependencies: Iterable[str]) -> bool:
        """True if ``key`` is set and newer than every dependency that is set.

        A dependency that was never set cannot make ``key`` stale; a ``key``
        that was never set is never latest.
        """
        ts = self.get(key)
        if ts is None:
            return False
        for dep in dependencies:
            dep_ts = self.get(dep)
            if dep_ts is not None and dep_ts >= ts:
                return False
        return True
