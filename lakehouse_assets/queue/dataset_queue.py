"""The queue of one dataset: push, list and consume its items (:class:`Queue`).

Pushing writes an item file put-if-absent; listing reads the pending files
and the ``_done``/``_failed`` records; consuming applies the pending items in
id order under the queue's operation lock, each exactly once, and sets bad
ones aside (the design is in :mod:`lakehouse_assets.queue`).
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults
from lakehouse_assets.access import SourceAccess, read_regular
from lakehouse_assets.archive import DOCUMENT_MARK, document_entity
from lakehouse_assets.catalog import describe_errors
from lakehouse_assets.crawl import archive_file
from lakehouse_assets.errors import (
    ConcurrentWriteError,
    InvalidInputError,
    InvalidNameError,
    LakehouseError,
    SourceNotFoundError,
)
from lakehouse_assets.journal import Row, Write, iso, statement_row
from lakehouse_assets.queue.ids import uuid7, uuid7_time, write_id
from lakehouse_assets.queue.items import (
    EntityDelete,
    EntityUpsert,
    FileDelete,
    FileUpsert,
    QueueItem,
    State,
    normalize_payload,
)
from lakehouse_assets.queue_ledger import applied_items, apply_once, forget_applied, is_applied
from lakehouse_assets.sources import local_path
from lakehouse_assets.storage import LocalStore

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext

log = logging.getLogger(__name__)

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

    def __init__(self, dataset: DatasetContext) -> None:
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
        who = cv.tenant_name(tenant or self.dataset.tenant)
        act, res, data = normalize_payload(action, resource, payload)
        if (act, res) == ("UPSERT", "entity"):
            from lakehouse_assets.entities import validate_entity

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
                # after the item: a sensor that sees the marker move finds it
                self.store.write_text(cv.queue_marker(self.name), item.id)
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
        # followthemoney (about 0.5 s, more on a loaded machine) is imported where an
        # entity is made or read, not by `status` or `queue ls`, which count items
        from lakehouse_assets.entities import entity_statements, validate_entity
        from lakehouse_assets.query import stored_statements

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
                for s in stored_statements(ds, payload.entity_id)
                if payload.origin is None or s.origin == payload.origin
            ]
            now = iso(cv.utcnow())
            rows = [
                statement_row(s, self.name, s.origin or cv.DEFAULT_ORIGIN, deleted_at=now)
                for s in stmts
            ]
            effect = {"entity_id": payload.entity_id, "tombstones": len(rows)}
        elif isinstance(payload, FileUpsert):
            extra = dict(payload.extra)
            if payload.document:
                extra[DOCUMENT_MARK] = True
            access = SourceAccess.for_queue(ds.settings, ds.store, dataset=self.name)
            source = local_path(payload.uri)
            if source is not None:  # the policy first: no word on a link's target outside it
                access.check_path(source, payload.uri)
            meta = archive_file(
                ds,
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
