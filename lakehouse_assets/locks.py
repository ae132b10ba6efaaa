"""Locks stored in the lake itself, safe against dead holders and racing breakers.

A lock is a small JSON document at a lake path: ``{dataset}/.LOCK`` for
everything that writes a dataset's tables (flush, compact, optimize, vacuum,
whoever the tenant), ``{dataset}/locks/{tenant}/{operation}`` for one
operation of one tenant. Every change to it is a conditional write: it is
created put-if-absent and afterwards replaced only if it is still the version
the process read (an ETag ``If-Match`` on S3, a content check under ``flock``
locally, see :mod:`storage`). When four processes find the same stale lock,
exactly one of them takes it over.

The document says whether the lock is ``held`` or ``free`` (a released lock
stays, so its generation survives), a **generation** that grows with every
acquisition, and who holds it: host, boot id, pid and the process's start
time (so a pid re-used after a restart is not mistaken for the holder),
tenant, operation and time.

A lock is **stale**, and is taken over, when

* it cannot be read as a lock (empty, torn, garbage, fields missing): no live
  holder wrote it, since every holder writes a complete document atomically;
* its holder ran on this host and is gone: the pid is dead, or it now belongs
  to a process that started at another time, or the host rebooted since. A
  document that names this host but records no valid start time (or boot id)
  for its pid was not written by a holder here (every holder records both),
  so it is stale too: a forged ``pid: 1`` cannot block the writers;
* it is older than the TTL (``LAKEHOUSE_LOCK_TTL_SECONDS``), wherever the
  holder runs (a holder on another host cannot be checked otherwise).

Anything else is reported in one line naming the holder and the command that
clears it (``lakehouse unlock``, which refuses while the holder is alive on
this host).

A holder that was paused past the TTL and then woke up must not write: table
writers **fence** their commits with the lock (:meth:`Lock.fence`): the Delta
commit carries the generation as an app transaction and the lock is checked
to still be theirs just before committing (see :func:`lakehouse_assets.tables.delta.commit`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any, TypeGuard

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import LockedError, LockLostError
from lakehouse_assets.storage import Store, Versioned

log = logging.getLogger(__name__)

#: The Delta app id under which table writers record their lock generation.
FENCE_APP_ID = "lakehouse.writer"
#: A lock time this far in the future means the writer's clock is off.
CLOCK_SKEW = timedelta(minutes=5)
#: Linux's largest ``pid_max`` (2**22): no process has a larger pid, and 0 or a
#: negative pid names a process group, not a process.
PID_MAX = 2**22
#: Largest generation a lock may carry: the fence stores it as a Delta app
#: transaction version (a signed 64-bit integer) and the next holder adds one.
GENERATION_MAX = 2**62
#: Largest process start time (clock ticks since boot) a lock may record.
START_MAX = 2**63 - 1


def is_int_in(value: object, low: int, high: int) -> TypeGuard[int]:
    """True for an ``int`` (not a bool: JSON ``true`` is no number) in ``low..high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def valid_pid(value: object) -> TypeGuard[int]:
    """Whether ``value`` can be the pid of a process (``1..PID_MAX``, not a bool)."""
    return is_int_in(value, 1, PID_MAX)


# --- who we are -------------------------------------------------------------


@cache
def boot_id() -> str | None:
    """This machine's boot id (changes on every boot; None where unknown)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def process_start(pid: int) -> int | None:
    """When a process started (clock ticks since boot), or None if unknown/gone.

    Together with the boot id this tells a pid's current process from an
    earlier one that had the same number. A value that cannot be a pid (a
    forged lock's ``2**70``, ``-1``) names no process: None.
    """
    if not valid_pid(pid):
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])  # field 22 of proc(5), counted from the state field


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (one we may not signal counts).

    Only a valid pid is asked about: ``os.kill`` overflows on ``2**70`` and
    ``0``/``-1`` would address process groups (``-1``: every process), which
    always "exist".
    """
    if not valid_pid(pid):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the lock document --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LockState:
    """A lock document as read, with what can be said about it."""

    version: Versioned | None
    data: dict[str, Any] | None  # None: unreadable
    problem: str | None = None  # why the document is not a usable lock

    @property
    def held(self) -> bool:
        return self.data is not None and self.data.get("state") == "held"

    @property
    def generation(self) -> int:
        if self.data is None:
            return 0
        gen = self.data.get("generation")
        return gen if is_int_in(gen, 1, GENERATION_MAX) else 0

    @property
    def token(self) -> str | None:
        return None if self.data is None else self.data.get("token")

    def acquired_at(self) -> datetime | None:
        raw = None if self.data is None else self.data.get("acquired_at")
        if not isinstance(raw, str):
            return None
        try:
            ts = datetime.fromisoformat(raw)
        except ValueError:
            return None
        return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)  # naive: UTC

    def describe(self) -> str:
        """``flush by tenant lakehouse, pid 123 on host-a, since … (3 min ago)``."""
        d = self.data or {}
        since = self.acquired_at()
        age = ""
        if since is not None:
            delta = cv.utcnow() - since
            if delta < -CLOCK_SKEW:
                age = " (in the future: the holder's clock is ahead)"
            else:
                age = f" ({_duration(max(delta, timedelta(0)))} ago)"
        when = since.isoformat(timespec="seconds") if since else "an unknown time"
        return (
            f"{d.get('operation', '?')} by tenant {d.get('tenant', '?')}, "
            f"pid {d.get('pid', '?')} on {d.get('host', '?')}, since {when}{age}"
        )


def _duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def parse_state(version: Versioned | None) -> LockState:
    """Read a lock document defensively: anything odd is a ``problem``, not a crash."""
    if version is None:
        return LockState(None, {"state": "free", "generation": 0})
    try:
        data = json.loads(version.data)
    except (ValueError, UnicodeDecodeError):
        what = "empty" if not version.data.strip() else "not JSON"
        return LockState(version, None, f"the lock file is {what}")
    if not isinstance(data, dict) or data.get("state") not in ("held", "free"):
        return LockState(version, None, "the lock file is not a lock document")
    state = LockState(version, data)
    problem = _field_problem(data)
    if problem is None and state.held:
        missing = [k for k in ("pid", "host", "acquired_at", "token") if not data.get(k)]
        if missing:
            problem = f"the lock file lacks {', '.join(missing)}"
        elif state.acquired_at() is None:
            problem = "the lock file's time is not an ISO timestamp"
    return state if problem is None else LockState(version, data, problem)


#: The numbers of a lock document and their ranges.
_RANGES: dict[str, tuple[int, int]] = {
    "generation": (0, GENERATION_MAX),
    "pid": (1, PID_MAX),
    "pid_start": (0, START_MAX),
}


def _field_problem(data: dict[str, Any]) -> str | None:
    """Why a lock document's fields cannot be from a holder (types and ranges), or None.

    Every holder writes them itself (:meth:`Lock._document`), so a value out of
    range is garbage or a forgery: the lock is stale rather than a crash later
    (``os.kill`` overflows on a 70-bit pid) or a writer blocked for the TTL.
    """
    for key, (low, high) in _RANGES.items():
        value = data.get(key)
        if value is not None and not is_int_in(value, low, high):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "…"
            return f"the lock file's {key} {shown} is not an integer in {low}..{high}"
    for key in ("host", "boot_id", "token", "tenant", "operation", "acquired_at"):
        if data.get(key) is not None and not isinstance(data[key], str):
            return f"the lock file's {key} is not text"
    return None


# --- the lock -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fence:
    """What a table commit checks so that a writer that lost its lock cannot write."""

    app_id: str
    generation: int
    lock: Lock

    def check(self) -> None:
        self.lock.check()


class Lock:
    """One lock document; use as a context manager or via acquire/release."""

    def __init__(
        self,
        store: Store,
        path: str,
        *,
        tenant: str,
        operation: str,
        ttl_seconds: int,
        hint: str = "",
    ) -> None:
        self.store = store
        self.path = path
        self.tenant = tenant
        # an operation names the lock (``locks/{tenant}/{operation}``) and is
        # recorded in it: one path segment, never empty
        self.operation = cv.job_type(operation)
        self.ttl = timedelta(seconds=ttl_seconds)
        #: The command that clears this lock, for messages.
        self.hint = hint
        self.token: str | None = None
        self.generation = 0

    @property
    def held(self) -> bool:
        return self.token is not None

    def state(self) -> LockState:
        return parse_state(self.store.read_versioned(self.path))

    def _document(self, generation: int) -> bytes:
        pid = os.getpid()
        return json.dumps(
            {
                "state": "held",
                "generation": generation,
                "token": self.token,
                "host": socket.gethostname(),
                "boot_id": boot_id(),
                "pid": pid,
                "pid_start": process_start(pid),
                "tenant": self.tenant,
                "operation": self.operation,
                "acquired_at": cv.utcnow().isoformat(),
            }
        ).encode()

    def stale_reason(self, state: LockState) -> str | None:
        """Why a held (or unreadable) lock may be taken over, or None if its holder may live."""
        if state.problem is not None:
            return state.problem
        data = state.data or {}
        since = state.acquired_at()
        if since is not None and cv.utcnow() - since > self.ttl:
            return f"it is older than the TTL ({_duration(self.ttl)})"
        if data.get("host") != socket.gethostname():
            return None  # another machine: only the TTL can tell
        # this host: the holder recorded its boot and its process's start time
        # (every holder does, see _document); a document without them, or with
        # other values, names no running holder
        here = boot_id()
        recorded_boot = data.get("boot_id")
        if here is not None and recorded_boot != here:
            if recorded_boot:
                return "this host restarted since it was taken"
            return "it records no boot id of this host"
        pid = data["pid"]  # a valid pid: parse_state checked it
        if not pid_alive(pid):
            return f"its process {pid} is gone"
        if process_start(os.getpid()) is None:
            return None  # no /proc here: a live pid is all that can be known
        started = data.get("pid_start")
        if started is None:
            return f"it records no start time for pid {pid}"
        now = process_start(pid)
        if now is None:
            return f"its process {pid} is gone"
        if now != started:
            return f"pid {pid} now belongs to another process"
        return None

    def _next_generation(self, state: LockState) -> int:
        # grows with every acquisition; the clock keeps it growing even when a
        # garbage document hid the previous number
        return max(state.generation + 1, int(time.time() * 1000))

    def _take(self, state: LockState) -> bool:
        """Write a held document over ``state`` (conditionally); True if this process won."""
        token = uuid.uuid4().hex
        generation = self._next_generation(state)
        previous = self.token
        self.token = token
        document = self._document(generation)
        if state.version is None:
            won = self.store.put_if_absent(self.path, document)
        else:
            won = self.store.replace_if_match(self.path, document, state.version.etag)
        if won:
            self.generation = generation
        else:
            self.token = previous
        return won

    def try_acquire(self) -> LockState | None:
        """Take the lock if it is free or stale; else return the holder's state."""
        for _ in range(20):  # each round loses only to another process's success
            state = self.state()
            if not state.held and state.problem is None:
                if self._take(state):
                    return None
                continue
            reason = self.stale_reason(state)
            if reason is None:
                return state
            if self._take(state):
                log.warning(
                    "took over the stale lock %s (%s): %s", self.path, reason, state.describe()
                )
                return None
        return self.state()

    def acquire(
        self, wait: float = 0.0, on_wait: Callable[[LockState], None] | None = None
    ) -> None:
        """Take the lock, waiting up to ``wait`` seconds for a live holder.

        Raises ``LockedError`` naming the holder and the command that clears it.
        """
        deadline = time.monotonic() + wait
        pause = 0.05
        told = False
        while True:
            holder = self.try_acquire()
            if holder is None:
                return
            if time.monotonic() >= deadline:
                raise LockedError(
                    f"{self.path} is locked: {holder.describe()}. "
                    + (f"If that process is gone, run `{self.hint}`." if self.hint else "")
                )
            if not told and on_wait is not None:
                on_wait(holder)
                told = True
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 1.0)

    def check(self) -> None:
        """Raise ``LockLostError`` unless this process still holds the lock."""
        state = self.state()
        if self.token is None or not state.held or state.token != self.token:
            raise LockLostError(
                f"{self.path}: this {self.operation} lost its lock (it was paused past the "
                f"TTL or unlocked by hand); nothing more was committed, run it again"
            )

    def fence(self) -> Fence:
        """The fence table commits of this holder carry (see :func:`lakehouse_assets.tables.delta.commit`)."""
        if self.token is None:
            raise LockLostError(f"{self.path}: not held")
        return Fence(FENCE_APP_ID, self.generation, self)

    def release(self) -> None:
        """Mark the lock free (if it is still ours); the generation stays."""
        if self.token is None:
            return
        for _ in range(20):
            state = self.state()
            if not state.held or state.token != self.token:
                log.warning("%s was taken over before release: %s", self.path, state.describe())
                break
            free = self._free_document(state, state.generation)
            assert state.version is not None
            if self.store.replace_if_match(self.path, free, state.version.etag):
                break
        self.token = None

    def _free_document(self, state: LockState, generation: int) -> bytes:
        d = state.data or {}
        return json.dumps(
            {
                "state": "free",
                "generation": generation,
                "released_at": cv.utcnow().isoformat(),
                "last_holder": {k: d.get(k) for k in ("tenant", "operation", "pid", "host")},
            }
        ).encode()

    def force_release(self) -> str:
        """``lakehouse unlock``: free the lock unless its holder is alive on this host.

        The generation is advanced, so the old holder's commits are fenced off
        should it still be running elsewhere. Returns what was done.
        """
        state = self.state()
        if state.version is None or (not state.held and state.problem is None):
            return f"{self.path} is not locked"
        data = state.data or {}
        here = state.problem is None and data.get("host") == socket.gethostname()
        if here and self.stale_reason(state) is None:
            raise LockedError(
                f"refusing to unlock {self.path}: its holder is alive on this host "
                f"({state.describe()}); stop that process first"
            )
        free = self._free_document(state, self._next_generation(state))
        assert state.version is not None
        if not self.store.replace_if_match(self.path, free, state.version.etag):
            raise LockedError(f"{self.path} changed while unlocking; look again")
        held = state.describe() if state.problem is None else state.problem
        return f"unlocked {self.path} ({held})"

    def __enter__(self) -> Lock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def dataset_lock(
    store: Store, dataset: str, tenant: str, ttl_seconds: int, *, operation: str = "tables"
) -> Lock:
    """The dataset-wide ``.LOCK``: one writer of the dataset's tables, whoever the tenant."""
    return Lock(
        store,
        cv.dataset_path(dataset, cv.LOCK),
        tenant=tenant,
        operation=operation,
        ttl_seconds=ttl_seconds,
        hint=f"lakehouse -d {dataset} unlock",
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
        hint=f"lakehouse -d {dataset} --tenant {tenant} unlock --operation {operation}",
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
