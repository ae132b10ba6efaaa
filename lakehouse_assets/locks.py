"""Dataset and per-operation locks stored in the lake itself.

A lock is a small JSON file created with ``put_if_absent`` (atomic on a local
disk and on S3). It records who holds it (host, pid, tenant, operation, time),
so that a lock left behind by a dead process can be recognised and broken:
on the same host when the pid is gone, anywhere when it is older than the TTL.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import LockedError, SourceNotFoundError
from lakehouse_assets.storage import Store


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Lock:
    """One lock file; use as a context manager or via acquire/release."""

    def __init__(
        self,
        store: Store,
        path: str,
        *,
        tenant: str,
        operation: str,
        ttl_seconds: int,
    ) -> None:
        self.store = store
        self.path = path
        self.tenant = tenant
        self.operation = operation
        self.ttl = timedelta(seconds=ttl_seconds)
        self.held = False

    def _payload(self) -> bytes:
        return json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "tenant": self.tenant,
                "operation": self.operation,
                "acquired_at": cv.utcnow().isoformat(),
            }
        ).encode()

    def holder(self) -> dict[str, object] | None:
        """What the lock file says about its holder, or None if free."""
        try:
            data: dict[str, object] = json.loads(self.store.read_bytes(self.path))
            return data
        except SourceNotFoundError:
            return None
        except ValueError:
            return {"unreadable": True}

    def is_stale(self, holder: dict[str, object]) -> bool:
        """A lock is stale if its process died (same host) or it outlived the TTL."""
        acquired = holder.get("acquired_at")
        if isinstance(acquired, str) and cv.utcnow() - datetime.fromisoformat(acquired) > self.ttl:
            return True
        pid = holder.get("pid")
        if holder.get("host") == socket.gethostname() and isinstance(pid, int):
            return not _pid_alive(pid)
        return False

    def acquire(self) -> None:
        """Take the lock or raise ``LockedError`` naming the holder."""
        for _ in range(3):
            if self.store.put_if_absent(self.path, self._payload()):
                self.held = True
                return
            holder = self.holder()
            if holder is None:
                continue  # released meanwhile: try again
            if self.is_stale(holder):
                self.store.delete(self.path)
                continue
            raise LockedError(
                f"Lock {self.path} is held by pid {holder.get('pid')} on "
                f"{holder.get('host')} ({holder.get('tenant')}/{holder.get('operation')}) "
                f"since {holder.get('acquired_at')}"
            )
        raise LockedError(f"Lock {self.path} is contended; try again")

    def release(self) -> None:
        if self.held:
            self.store.delete(self.path)
            self.held = False

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def dataset_lock(store: Store, dataset: str, tenant: str, ttl_seconds: int) -> Lock:
    """The dataset-wide ``.LOCK`` (schema changes, destructive rewrites)."""
    return Lock(
        store,
        cv.dataset_path(dataset, cv.LOCK),
        tenant=tenant,
        operation="dataset",
        ttl_seconds=ttl_seconds,
    )


def operation_lock(
    store: Store, dataset: str, tenant: str, operation: str, ttl_seconds: int
) -> Lock:
    """``locks/{tenant}/{operation}``: one run of an operation at a time."""
    return Lock(
        store,
        cv.lock_path(dataset, tenant, operation),
        tenant=tenant,
        operation=operation,
        ttl_seconds=ttl_seconds,
    )


@contextmanager
def held(*locks: Lock) -> Iterator[None]:
    """Hold several locks, releasing those taken if a later one fails."""
    taken: list[Lock] = []
    try:
        for lock in locks:
            lock.acquire()
            taken.append(lock)
        yield
    finally:
        for lock in reversed(taken):
            lock.release()
