"""The queue: UPSERT/DELETE of entities and files, applied in order, exactly once.

Tenants push actions; the lakehouse applies them later (the ``queue_items``
sensor, ``lakehouse queue consume``). Layout (see :mod:`conventions`)::

    {dataset}/queue/{tenant}/{uuid7}.json          pending item
    {dataset}/queue/_done/{tenant}/{uuid7}.json    applied: the item and what it did
    {dataset}/queue/_failed/{tenant}/{uuid7}.json  set aside: the raw item and the error

An item is ``{"id", "tenant", "action", "resource", "payload", "created_at"}``:

======  ========  =================================================================
action  resource  payload
======  ========  =================================================================
UPSERT  entity    ``{"entity": {FtM entity}, "origin"?}`` (a bare entity dict too)
DELETE  entity    ``{"entity_id", "origin"?}`` (tombstones its live statements)
UPSERT  file      ``{"uri", "checksum"?, "file_id"?, "key"?, "name"?, "mimetype"?,
                  "extra"?, "document"?}`` (what :meth:`Archive.put` takes)
DELETE  file      ``{"file_id", "checksum"?}`` (what :meth:`Archive.delete` takes)
======  ========  =================================================================

Ids are UUIDv7 (RFC 9562): their string order is their time order, so the
consumer applies the pending items of all tenants in one sequence sorted by
id. Items are written put-if-absent (:meth:`Store.put_if_absent`), so two
pushers never overwrite each other.

**Exactly once.** Applying an item and recording it as done are two writes to
two systems (journal or archive; the lake's ``_done/``), and a process can die
between them. The consumer makes each step safe to redo instead:

1. One consumer per dataset: it holds the operation lock
   ``locks/lakehouse/queue`` (not the dataset's ``.LOCK``: a long flush must not
   stop the queue, and the queue never writes the Delta tables) and checks it
   is still its own before each item.
2. An item with a ``_done`` record is finished: its pending file is only
   removed (the crash came after the record).
3. The journal effect of an item (an entity's statements, its tombstones, a
   file's Document entity) commits in **one transaction** with a row
   ``(dataset, item id)`` in the journal table ``lakehouse_queue_applied``
   (primary key). Redoing the item finds the row and writes nothing, and
   the row, unlike the statements, survives a flush in between. The rows
   also carry the tenant of the item and a write id derived from the item id
   (``trace`` shows which item wrote a statement), and the item's
   ``created_at`` as their first/last seen, so the rows are the same whoever
   applies them.
4. Archive effects are idempotent by construction: a blob is stored by its
   checksum, its metadata under a file id derived from its key (rewritten
   with the same content); deleting a file that is already gone is done.
5. Only then the ``_done`` record is written (put-if-absent), the pending file
   deleted and the journal row dropped (rows left by a crash are dropped
   by the next consume once their item is no longer pending).

So a SIGKILL anywhere (fault points :data:`QUEUE_POINTS`) leaves an item that
the next consume finishes with the same effect, once.

**Bad items.** An item that is not JSON, not an item, names another tenant or
id than its path, or carries an invalid entity or name is moved to
``_failed/`` with the error and reported; the queue goes on. An error that may
pass (``retryable``: an unreachable source, a lost lock) stops the consume
before that item, which stays pending and first in line.

**Hostile items.** Items come from tenants, so the consumer trusts none of
their content:

* a file UPSERT reads a local path only under ``LAKEHOUSE_SOURCE_ROOTS``
  (none by default: refused), resolved with every symlink followed, and never
  ``/proc``, ``/sys``, ``/dev`` nor the lake's own files and journal
  (:meth:`SourceAccess.for_queue`); the item is set aside with the reason,
  never with the file's bytes;
* an item file that is a symlink (or no regular file) is set aside without
  its target being read: the record says so and the link is removed;
* an item's ``created_at`` becomes its statements' first/last seen, so it
  must match the time in its UUIDv7 id within :data:`MAX_CLOCK_SKEW`, and
  that time must not lie further ahead of the consumer's clock: a planted
  item cannot date statements into the future;
* anything under ``queue/`` that is not a tenant's folder (an invalid name,
  a symlink, a stray file) is never consumed nor followed, and is reported as
  ``invalid`` by :meth:`Queue.consume`, :meth:`Queue.list` and
  :meth:`Queue.invalid`;
* every id and text an item names is checked as at every other entry point
  (:func:`conventions.entity_id`, :func:`conventions.text`), when pushed and
  again when consumed.

Example:
    >>> item = ds.queue.push("UPSERT", "entity", {"id": "p1", "schema": "Person",
    ...                                          "properties": {"name": ["Ann"]}})
    >>> ds.queue.consume().applied
    1
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import secrets
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, cast, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticSerializationError

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults
from lakehouse_assets.access import SourceAccess, read_regular
from lakehouse_assets.catalog import describe_errors
from lakehouse_assets.entities import entity_statements, validate_entity
from lakehouse_assets.errors import (
    ConcurrentWriteError,
    InvalidInputError,
    InvalidNameError,
    LakehouseError,
    SourceNotFoundError,
)
from lakehouse_assets.journal import Row, Write, iso, statement_row
from lakehouse_assets.queue_ledger import applied_items, apply_once, forget_applied, is_applied
from lakehouse_assets.sources import local_path
from lakehouse_assets.storage import LocalStore

if TYPE_CHECKING:
    from lakehouse_assets.lake import Dataset

log = logging.getLogger(__name__)

Action = Literal["UPSERT", "DELETE"]
Resource = Literal["entity", "file"]
State = Literal["pending", "done", "failed", "invalid"]
ACTIONS: Final[tuple[str, ...]] = get_args(Action)
RESOURCES: Final[tuple[str, ...]] = get_args(Resource)
STATES: Final[tuple[str, ...]] = get_args(State)

#: The operation lock of the consumer (``locks/lakehouse/queue``).
LOCK_OPERATION: Final = "queue"
#: Where a consume may die between two durable states (see :mod:`faults`).
QUEUE_POINTS: Final = ("queue.after_apply", "queue.after_mark")
#: How far an item's ``created_at`` may differ from the time in its id, and
#: that time lie ahead of the consumer's clock (pushers on other hosts).
MAX_CLOCK_SKEW: Final = timedelta(minutes=5)
#: The largest queue item read (an item is one entity or file reference; a
#: bigger file is set aside unread, and push refuses to write one).
MAX_ITEM_BYTES: Final = 64 * 1024 * 1024
#: The longest URI, key, name and media type a file UPSERT may carry.
TEXT_LIMITS: Final = {"uri": 4096, "key": 4096, "name": 1024, "mimetype": 255}


# --- UUIDv7 -------------------------------------------------------------------

_uuid_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> str:
    """A UUIDv7 (RFC 9562, method 1): 48-bit Unix milliseconds, a 12-bit counter,
    62 random bits.

    Monotonic within a process: the counter starts at a random value below
    2048 each millisecond and counts up within it; when it runs out, or the
    clock steps back, the next id borrows the following millisecond, so an
    id is always greater than the one before it.
    """
    global _last_ms, _counter
    with _uuid_lock:
        now = time.time_ns() // 1_000_000
        if now > _last_ms:
            _last_ms, _counter = now, secrets.randbits(11)
        else:
            _counter += 1
            if _counter > 0xFFF:
                _last_ms, _counter = _last_ms + 1, 0
        ms, counter = _last_ms, _counter
    value = (
        (ms & 0xFFFF_FFFF_FFFF) << 80
        | 0x7 << 76
        | counter << 64
        | 0b10 << 62
        | secrets.randbits(62)
    )
    return str(uuid.UUID(int=value))


def uuid7_time(item_id: str) -> datetime:
    """The time a UUIDv7 was made (millisecond precision, UTC).

    ``InvalidNameError`` for an id whose time lies beyond what a date can say
    (48 bits of milliseconds reach the year 10889).
    """
    ms = int(cv.queue_item_id(item_id).replace("-", "")[:12], 16)
    try:
        return datetime.fromtimestamp(ms / 1000, UTC)
    except (ValueError, OverflowError, OSError):
        raise InvalidNameError(
            f"Invalid queue item id {item_id!r}: its time lies beyond the year 9999"
        ) from None


def write_id(item_id: str) -> str:
    """The journal write id of an item: its time and id, the same on every apply."""
    stamp = uuid7_time(item_id).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{item_id.replace('-', '')[12:]}"


# --- items ----------------------------------------------------------------------


class _Payload(BaseModel):
    """An action's payload. The names in it that become paths (origin, checksum,
    file id) are checked by the conventions here, whichever payload holds them."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("origin", check_fields=False)
    @classmethod
    def _origin(cls, value: str | None) -> str | None:
        return None if value is None else cv.origin(value)

    @field_validator("checksum", check_fields=False)
    @classmethod
    def _checksum(cls, value: str | None) -> str | None:
        return None if value is None else cv.checksum(value.lower())

    @field_validator("file_id", check_fields=False)
    @classmethod
    def _file_id(cls, value: str | None) -> str | None:
        return None if value is None else cv.file_id(value)

    @field_validator("entity_id", check_fields=False)
    @classmethod
    def _entity_id(cls, value: str) -> str:
        return cv.entity_id(value)

    @field_validator("uri", "key", "name", "mimetype", check_fields=False)
    @classmethod
    def _text(cls, value: str | None, info: ValidationInfo) -> str | None:
        name = info.field_name or "text"
        return None if value is None else cv.text(value, name, TEXT_LIMITS.get(name, 4096))


class EntityUpsert(_Payload):
    """Add or update an entity: its statements go to the journal."""

    entity: dict[str, Any]
    origin: str = cv.DEFAULT_ORIGIN

    @field_validator("entity")
    @classmethod
    def _entity(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "id" in value:
            cv.entity_id(value["id"])
        return value


class EntityDelete(_Payload):
    """Tombstone the live statements of an entity (of one origin, if given)."""

    entity_id: str = Field(min_length=1)
    origin: str | None = None


class FileUpsert(_Payload):
    """Archive a file from a path or URI (what :meth:`Archive.put` takes)."""

    uri: str = Field(min_length=1)
    checksum: str | None = None
    file_id: str | None = None
    key: str | None = None
    name: str | None = None
    mimetype: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    #: also write the file's Document entity into the journal
    document: bool = False


class FileDelete(_Payload):
    """Remove one file's metadata entry (the blob stays, as for :meth:`Archive.delete`)."""

    file_id: str
    checksum: str | None = None


PAYLOADS: Final[dict[tuple[str, str], type[_Payload]]] = {
    ("UPSERT", "entity"): EntityUpsert,
    ("DELETE", "entity"): EntityDelete,
    ("UPSERT", "file"): FileUpsert,
    ("DELETE", "file"): FileDelete,
}


class QueueItem(BaseModel):
    """One queued action of a tenant."""

    model_config = ConfigDict(extra="forbid")

    id: str
    tenant: str
    action: Action
    resource: Resource
    payload: dict[str, Any]
    created_at: datetime

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        return cv.queue_item_id(value)

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        return cv.tenant_name(value)

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        # a time without a zone is UTC, as every time the lake writes
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)

    def parsed(self) -> _Payload:
        """The payload as its action's model (``ValidationError`` if it does not fit)."""
        return PAYLOADS[(self.action, self.resource)].model_validate(self.payload)

    def summary(self) -> str:
        """What the item is about, in a few words: an entity id, a URI, a file id."""
        p = self.payload
        entity = p.get("entity")
        value = (
            (entity.get("id") if isinstance(entity, dict) else None)
            or p.get("entity_id")
            or p.get("uri")
            or p.get("file_id")
        )
        return str(value) if value is not None else ""


def normalize_payload(
    action: str, resource: str, payload: Any
) -> tuple[Action, Resource, dict[str, Any]]:
    """Check an action and its payload; the payload in its stored form.

    Accepts a bare FtM entity dict for UPSERT entity (``origin`` may sit beside
    its keys) and ``id`` for ``entity_id``. Raises ``InvalidInputError``.
    """
    act, res = action.upper(), resource.lower()
    if act not in ACTIONS or res not in RESOURCES:
        raise InvalidInputError(
            f"unknown queue action {action!r} {resource!r}: use UPSERT or DELETE, "
            "and entity or file"
        )
    if not isinstance(payload, dict):
        raise InvalidInputError(
            f"{act} {res} payload must be a JSON object, got {type(payload).__name__}"
        )
    data = dict(payload)
    if (act, res) == ("UPSERT", "entity") and "entity" not in data and "schema" in data:
        origin = data.pop("origin", None)
        data = {"entity": data} | ({"origin": origin} if origin is not None else {})
    if (act, res) == ("DELETE", "entity") and "entity_id" not in data and "id" in data:
        data["entity_id"] = data.pop("id")
    try:
        model = PAYLOADS[(act, res)].model_validate(data)
    except ValidationError as exc:
        raise InvalidInputError(f"{act} {res} payload: {describe_errors(exc)}") from None
    return (
        cast(Action, act),
        cast(Resource, res),
        model.model_dump(mode="json", exclude_defaults=True),
    )


# --- what the queue reports -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """An item as listed: pending, done or failed."""

    id: str
    tenant: str
    state: State
    item: QueueItem | None
    #: why a pending item cannot be read, or why a failed one was set aside
    error: str | None = None
    #: what applying it did (done items)
    result: dict[str, Any] | None = None
    #: when it was done or set aside
    at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        item = self.item
        return {
            "id": self.id,
            "tenant": self.tenant,
            "state": self.state,
            "action": item.action if item else None,
            "resource": item.resource if item else None,
            "subject": item.summary() if item else None,
            "created_at": item.created_at.isoformat() if item else None,
            "payload": item.payload if item else None,
            "error": self.error,
            "result": self.result,
            "at": self.at.isoformat() if self.at else None,
        }


@dataclass
class ConsumeResult:
    """What one consume did."""

    dataset: str
    #: items applied now
    applied: int = 0
    #: items a crashed consume had applied (or recorded), finished now without
    #: applying them again
    recovered: int = 0
    #: items set aside as failed: id, tenant, error
    failed: list[dict[str, str]] = field(default_factory=list)
    #: entries of queue/ that are no tenant's folder, never consumed: folder, error
    invalid: list[dict[str, str]] = field(default_factory=list)
    #: pending items left (not reached, or after a stop)
    remaining: int = 0
    #: why the consume stopped early (a retryable error), None if it did not
    stopped: str | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "applied": self.applied,
            "recovered": self.recovered,
            "failed": self.failed,
            "invalid": self.invalid,
            "remaining": self.remaining,
            "stopped": self.stopped,
            "items": self.items,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True, slots=True)
class _Slot:
    """A file in a tenant's queue folder: an item, or something that has no item's name."""

    tenant: str
    name: str
    path: str
    id: str | None  # None: the file name is not ``{uuid7}.json``


def _item_id(name: str) -> str | None:
    stem = name.removesuffix(".json")
    if stem == name or "/" in stem or not cv.QUEUE_ITEM_ID.fullmatch(stem):
        return None
    return stem


def _consumer() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


# --- the queue ----------------------------------------------------------------------


class Queue:
    """The action queue of one dataset."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self.store = dataset.store
        self.name = dataset.name

    def __repr__(self) -> str:
        return f"<Queue of {self.name}>"

    # --- writing ---------------------------------------------------------

    def push(
        self,
        action: str,
        resource: str,
        payload: dict[str, Any],
        *,
        tenant: str | None = None,
    ) -> QueueItem:
        """Queue an action as ``tenant`` (default: the lake's tenant); returns the item.

        The payload is checked now (an invalid entity or name raises
        ``InvalidInputError`` and nothing is queued). A relative local path of
        a file UPSERT is made absolute: the consumer runs elsewhere.
        """
        who = cv.tenant_name(tenant or self.dataset.lake.tenant)
        act, res, data = normalize_payload(action, resource, payload)
        if (act, res) == ("UPSERT", "entity"):
            validate_entity(data["entity"], dataset=self.name)
        if (act, res) == ("UPSERT", "file"):
            path = local_path(data["uri"])
            if path is not None and not path.is_absolute():
                data["uri"] = str(Path(path).absolute())
        for _ in range(5):
            item = QueueItem(
                id=uuid7(),
                tenant=who,
                action=act,
                resource=res,
                payload=data,
                created_at=cv.utcnow(),
            )
            try:
                body = item.model_dump_json(indent=2).encode("utf-8")
            except (PydanticSerializationError, UnicodeError) as exc:
                # a lone surrogate deep in an entity: JSON cannot carry it
                raise InvalidInputError(
                    f"{act} {res} payload is not valid Unicode text: {exc}", dataset=self.name
                ) from None
            if len(body) > MAX_ITEM_BYTES:
                raise InvalidInputError(
                    f"{act} {res} payload: the item would be {len(body):,} bytes, more than "
                    f"the queue reads ({MAX_ITEM_BYTES // 2**20} MiB)",
                    dataset=self.name,
                )
            if self.store.put_if_absent(cv.queue_item(self.name, who, item.id), body):
                return item
        raise ConcurrentWriteError(  # pragma: no cover - five UUIDv7 collisions in a row
            f"could not queue an item in dataset {self.name!r}: its ids kept colliding"
        )

    # --- reading ---------------------------------------------------------

    def _folders(self) -> tuple[builtins.list[str], builtins.list[dict[str, str]]]:
        """The tenant folders of ``queue/``, and what else is there (never consumed)."""
        base = cv.queue_prefix(self.name)
        tenants: list[str] = []
        invalid: list[dict[str, str]] = []
        for name in self.store.list_dirs(base):
            if name in (cv.QUEUE_DONE, cv.QUEUE_FAILED):
                continue
            where = f"{base}{name}"
            kind = self._kind(where)
            if kind == "link":
                why = "a symlink: never followed, its target never read; remove it"
            elif kind == "file":
                why = "a file outside any tenant folder: never consumed; push it as a tenant"
            elif not cv.TENANT_NAME.fullmatch(name):
                count = sum(1 for _ in self.store.list(where + "/"))
                why = (
                    f"{count} file(s) under a folder that is not a tenant name "
                    "(lowercase letters, digits, '_' and '-', max 64 chars): never consumed; "
                    "move them into a tenant's folder or remove them"
                )
            else:
                tenants.append(name)
                continue
            invalid.append({"folder": where, "error": why})
        return tenants, invalid

    def _kind(self, path: str) -> str:
        """``link``, ``dir`` or ``file``: what a path of the queue is (never following a link)."""
        if isinstance(self.store, LocalStore):
            local = self.store.local_path(path)
            if local.is_symlink():
                return "link"
            return "dir" if local.is_dir() else "file"
        return "file" if self.store.exists(path) else "dir"

    def tenants(self) -> builtins.list[str]:
        """Tenants with a queue folder (pending items or none left)."""
        return self._folders()[0]

    def invalid(self) -> builtins.list[dict[str, str]]:
        """What lies under ``queue/`` that is no tenant's folder: never consumed, reported."""
        return self._folders()[1]

    def _read(self, path: str) -> bytes | None:
        """A pending file's bytes (at most ``MAX_ITEM_BYTES + 1``); None if it is a
        symlink or no regular file (a local lake): its target is never read.
        ``SourceNotFoundError`` if gone."""
        if not isinstance(self.store, LocalStore):
            body = self.store.open_read(path)
            try:
                return body.read(MAX_ITEM_BYTES + 1)
            finally:
                body.close()
        try:
            return read_regular(self.store.local_path(path), MAX_ITEM_BYTES + 1)
        except FileNotFoundError:
            raise SourceNotFoundError(f"Not found in lake {self.store.uri}: {path}") from None

    def _slots(self, tenant: str | None = None) -> builtins.list[_Slot]:
        """The files of the pending queue: bad names first, then items by id."""
        slots = []
        for who in [cv.tenant_name(tenant)] if tenant else self.tenants():
            prefix = cv.queue_prefix(self.name, who)
            for path in self.store.list(prefix):
                name = path[len(prefix) :]
                slots.append(_Slot(who, name, path, _item_id(name)))
        return sorted(slots, key=lambda s: (s.id is not None, s.id or "", s.tenant, s.name))

    def pending_count(self, tenant: str | None = None) -> int:
        """How many files wait in the queue (bad ones included: consume sets them aside)."""
        return len(self._slots(tenant))

    def has_pending(self) -> bool:
        """Whether a tenant's folder holds anything (what is invalid is not pending)."""
        return any(self.store.list(cv.queue_prefix(self.name, t)) for t in self.tenants())

    def list(
        self, tenant: str | None = None, *, state: State | Literal["all"] = "pending"
    ) -> builtins.list[Entry]:
        """Items by id (UUIDv7: time order), of one tenant or all; pending by default.

        What lies under ``queue/`` outside any tenant's folder is listed with
        the pending items (all tenants), one entry per folder, as ``invalid``.
        """
        entries: list[Entry] = []
        if state in ("pending", "all", "invalid") and tenant is None:
            for bad in self.invalid():
                folder = bad["folder"].rsplit("/", 1)[-1]
                entries.append(Entry(folder, "", "invalid", None, error=bad["error"]))
        if state in ("pending", "all"):
            for slot in self._slots(tenant):
                try:
                    item: QueueItem | None = self._parse(self._read(slot.path), slot)
                    error = None
                except SourceNotFoundError:
                    continue  # consumed meanwhile
                except InvalidInputError as exc:
                    item, error = None, exc.reason
                entries.append(
                    Entry(slot.id or slot.name, slot.tenant, "pending", item, error=error)
                )
        for kind, folder in (("done", cv.QUEUE_DONE), ("failed", cv.QUEUE_FAILED)):
            if state not in (kind, "all"):
                continue
            base = cv.dataset_path(self.name, cv.QUEUE, folder) + "/"
            prefix = base + cv.tenant_name(tenant) + "/" if tenant else base
            for path in self.store.list(prefix):
                entries.append(self._record(kind, path[len(base) :].split("/")[0], path))
        return sorted(entries, key=lambda e: (e.id, e.tenant, e.state))

    def _record(self, kind: str, tenant: str, path: str) -> Entry:
        """A ``_done`` or ``_failed`` record as an entry."""
        stem = path.rsplit("/", 1)[-1].removesuffix(".json")
        try:
            raw = self._read(path)
            if raw is None:
                raise ValueError("a symlink or not a regular file (not read)")
            record = json.loads(raw)
            item = None
            if isinstance(record.get("item"), dict):
                try:
                    item = QueueItem.model_validate(record["item"])
                except ValidationError:
                    item = None
            at = record.get("done_at") or record.get("failed_at")
            return Entry(
                stem,
                tenant,
                "done" if kind == "done" else "failed",
                item,
                error=record.get("error"),
                result=record.get("result"),
                at=datetime.fromisoformat(at) if isinstance(at, str) else None,
            )
        except (ValueError, AttributeError, RecursionError) as exc:
            return Entry(stem, tenant, "failed", None, error=f"unreadable record {path}: {exc}")

    def _parse(self, raw: bytes | None, slot: _Slot) -> QueueItem:
        """The item in a pending file, or ``InvalidInputError`` saying what is wrong."""
        where = slot.path

        def bad(message: str) -> InvalidInputError:
            return InvalidInputError(message, dataset=self.name, source=where)

        if raw is None:
            raise bad("not a queue item: a symlink or not a regular file (its target was not read)")
        if slot.id is None:
            raise bad("not a queue item: its name is not {uuid7}.json")
        if len(raw) > MAX_ITEM_BYTES:
            raise bad(f"not a queue item: larger than {MAX_ITEM_BYTES // 2**20} MiB (not read)")
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise bad(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
        except json.JSONDecodeError as exc:
            raise bad(f"not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}") from None
        except RecursionError:
            raise bad("not a queue item: its JSON is nested too deeply") from None
        try:
            item = QueueItem.model_validate(data)
        except ValidationError as exc:
            raise bad(f"not a queue item: {describe_errors(exc)}") from None
        if item.id != slot.id or item.tenant != slot.tenant:
            raise bad(
                f"the item says id {item.id} of tenant {item.tenant!r}, its path "
                f"{slot.id} of tenant {slot.tenant!r}"
            )
        try:
            made = uuid7_time(item.id)
        except InvalidNameError as exc:
            raise bad(str(exc)) from None
        if made > cv.utcnow() + MAX_CLOCK_SKEW:
            raise bad(f"its id says it was made at {made.isoformat()}, in the future")
        if abs(item.created_at - made) > MAX_CLOCK_SKEW:
            raise bad(
                f"created_at {item.created_at.isoformat()} is not the time of its id "
                f"({made.isoformat()}, within {MAX_CLOCK_SKEW.total_seconds():.0f} s)"
            )
        try:
            item.parsed()
        except ValidationError as exc:
            raise bad(f"{item.action} {item.resource} payload: {describe_errors(exc)}") from None
        return item

    # --- consuming -------------------------------------------------------

    def consume(self, *, limit: int | None = None, wait: float = 0.0) -> ConsumeResult:
        """Apply the pending items of every tenant in id order, each exactly once.

        Holds ``locks/lakehouse/queue`` (``LockedError`` if another consumer
        holds it longer than ``wait`` seconds). Stops early, leaving the item
        pending, on a retryable error; sets bad items aside (see module doc).
        """
        started = time.monotonic()
        result = ConsumeResult(self.name)
        lock = self.dataset.operation_lock(LOCK_OPERATION, tenant=cv.LAKEHOUSE_TENANT)
        lock.acquire(wait=wait)
        try:
            slots = self._slots()
            result.invalid = self.invalid()
            for bad in result.invalid:
                log.warning("queue of %s: %s is %s", self.name, bad["folder"], bad["error"])
            self._forget_finished({s.id for s in slots if s.id})
            done = 0
            for slot in slots:
                if limit is not None and done >= limit:
                    break
                lock.check()
                try:
                    self._process(slot, result)
                except LakehouseError as exc:
                    if not exc.retryable:
                        raise
                    result.stopped = f"{slot.tenant}/{slot.name}: {exc}"
                    log.warning("queue of %s stopped: %s", self.name, result.stopped)
                    break
                done += 1
            result.remaining = len(slots) - done
        finally:
            lock.release()
        result.seconds = time.monotonic() - started
        return result

    def _forget_finished(self, pending: set[str]) -> None:
        """Drop the journal marks of items no longer pending (left by a crash after _done)."""
        journal = self.dataset.journal
        stale = [i for i in applied_items(journal, self.name) if i not in pending]
        forget_applied(journal, self.name, stale)

    def _process(self, slot: _Slot, result: ConsumeResult) -> None:
        if slot.id is not None and self.store.exists(
            cv.queue_done(self.name, slot.tenant, slot.id)
        ):
            # recorded done before a crash: only the pending file was left
            self.store.delete(slot.path)
            forget_applied(self.dataset.journal, self.name, [slot.id])
            result.recovered += 1
            result.items.append({"id": slot.id, "tenant": slot.tenant, "outcome": "recovered"})
            return
        try:
            raw = self._read(slot.path)
        except SourceNotFoundError:
            return
        try:
            item = self._parse(raw, slot)
            effect = self._apply(item)
        except LakehouseError as exc:
            if exc.retryable:
                raise
            self._fail(slot, raw, exc)
            message = exc.reason if isinstance(exc, InvalidInputError) else str(exc)
            result.failed.append(
                {"id": slot.id or slot.name, "tenant": slot.tenant, "error": message}
            )
            result.items.append(
                {
                    "id": slot.id or slot.name,
                    "tenant": slot.tenant,
                    "outcome": "failed",
                    "error": message,
                }
            )
            return
        faults.point("queue.after_apply")
        record = {
            "id": item.id,
            "tenant": item.tenant,
            "item": item.model_dump(mode="json"),
            "result": effect,
            "done_at": cv.utcnow().isoformat(),
            "consumer": _consumer(),
        }
        self.store.put_if_absent(
            cv.queue_done(self.name, item.tenant, item.id),
            json.dumps(record, indent=2).encode("utf-8"),
        )
        faults.point("queue.after_mark")
        self.store.delete(slot.path)
        forget_applied(self.dataset.journal, self.name, [item.id])
        if effect.get("already_applied"):
            result.recovered += 1
            outcome = "recovered"
        else:
            result.applied += 1
            outcome = "applied"
        result.items.append(
            {
                "id": item.id,
                "tenant": item.tenant,
                "action": item.action,
                "resource": item.resource,
                "outcome": outcome,
                **effect,
            }
        )

    def _fail(self, slot: _Slot, raw: bytes | None, error: LakehouseError) -> None:
        """Move a bad item to ``_failed/`` with its error (its content kept as text;
        a symlink's target is never read, so never copied: ``raw`` is None)."""
        record_id = slot.id or uuid7()
        if raw is not None and len(raw) > MAX_ITEM_BYTES:
            raw = None  # not copied: the record says why
        try:
            item: Any = None if raw is None else json.loads(raw)
        except (ValueError, RecursionError):
            item = None
        record = {
            "id": record_id,
            "tenant": slot.tenant,
            "name": slot.name,
            "item": item if isinstance(item, dict) else None,
            "raw": None if raw is None else raw.decode("utf-8", errors="replace"),
            "error": error.reason if isinstance(error, InvalidInputError) else str(error),
            "failed_at": cv.utcnow().isoformat(),
            "consumer": _consumer(),
        }
        self.store.put_if_absent(
            cv.queue_failed(self.name, slot.tenant, record_id),
            json.dumps(record, indent=2).encode("utf-8"),
        )
        self.store.delete(slot.path)
        log.warning("queue of %s: set aside %s/%s: %s", self.name, slot.tenant, slot.name, error)

    def _apply(self, item: QueueItem) -> dict[str, Any]:
        """Apply an item (see the module doc for why each branch is safe to redo)."""
        ds, journal = self.dataset, self.dataset.journal
        write = Write(item.tenant, write_id(item.id))
        writes_journal = item.resource == "entity" or bool(item.payload.get("document"))
        if is_applied(journal, self.name, item.id):
            if writes_journal:
                ds.core_tags.touch(cv.JOURNAL_LAST_UPDATED)
            return {"already_applied": True}
        payload = item.parsed()
        rows: list[Row] = []
        effect: dict[str, Any]
        if isinstance(payload, EntityUpsert):
            proxy = validate_entity(
                payload.entity,
                dataset=self.name,
                source=cv.queue_item(self.name, item.tenant, item.id),
            )
            seen = iso(item.created_at)
            stmts = entity_statements(proxy, dataset=self.name, origin=payload.origin, seen=seen)
            rows = [statement_row(s, self.name, payload.origin) for s in stmts]
            effect = {"entity_id": proxy.id, "origin": payload.origin, "statements": len(rows)}
        elif isinstance(payload, EntityDelete):
            stmts = [
                s
                for s in ds.stored_statements(payload.entity_id)
                if payload.origin is None or s.origin == payload.origin
            ]
            now = iso(cv.utcnow())
            rows = [
                statement_row(s, self.name, s.origin or cv.DEFAULT_ORIGIN, deleted_at=now)
                for s in stmts
            ]
            effect = {"entity_id": payload.entity_id, "tombstones": len(rows)}
        elif isinstance(payload, FileUpsert):
            from lakehouse_assets.lake import DOCUMENT_MARK, document_entity

            extra = dict(payload.extra)
            if payload.document:
                extra[DOCUMENT_MARK] = True
            access = SourceAccess.for_queue(ds.settings, ds.store, dataset=self.name)
            source = local_path(payload.uri)
            if source is not None:  # the policy first: no word on a link's target outside it
                access.check_path(source, payload.uri)
            meta = ds.add_file(
                payload.uri,
                checksum=payload.checksum,
                file_id=payload.file_id,
                key=payload.key,
                name=payload.name,
                mimetype=payload.mimetype,
                extra=extra,
                follow_symlinks=False,
                access=access,
            )
            if payload.document:
                doc = document_entity(meta)
                stmts = entity_statements(
                    doc, dataset=self.name, origin="archive", seen=iso(item.created_at)
                )
                rows = [statement_row(s, self.name, "archive") for s in stmts]
            effect = {
                "file_id": meta.file_id,
                "checksum": meta.checksum,
                "key": meta.key,
                "size": meta.size,
                "document": payload.document,
            }
        else:
            assert isinstance(payload, FileDelete)
            try:
                gone = ds.archive.delete(payload.file_id, checksum=payload.checksum)
                effect = {"file_id": gone.file_id, "checksum": gone.checksum, "deleted": True}
            except SourceNotFoundError:  # already gone: what the tenant asked for
                effect = {"file_id": payload.file_id, "deleted": False}
        written = apply_once(journal, self.name, item.id, rows, write)
        if rows or writes_journal:
            ds.core_tags.touch(cv.JOURNAL_LAST_UPDATED)
        if not written:
            effect["already_applied"] = True
        return effect


__all__ = [
    "ConsumeResult",
    "Entry",
    "Queue",
    "QueueItem",
    "normalize_payload",
    "uuid7",
]
