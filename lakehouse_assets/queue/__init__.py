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

from lakehouse_assets.queue.dataset_queue import (
    MAX_CLOCK_SKEW,
    MAX_ITEM_BYTES,
    QUEUE_POINTS,
    ConsumeResult,
    Entry,
    Queue,
)
from lakehouse_assets.queue.ids import uuid7, uuid7_time, write_id
from lakehouse_assets.queue.items import QueueItem, normalize_payload

__all__ = [
    "MAX_CLOCK_SKEW",
    "MAX_ITEM_BYTES",
    "QUEUE_POINTS",
    "ConsumeResult",
    "Entry",
    "Queue",
    "QueueItem",
    "normalize_payload",
    "uuid7",
    "uuid7_time",
    "write_id",
]
