"""Entity changes between two snapshots, and the diff files a version publishes.

From the translog and statements rows that differ (only the files one side
has are read) to the entities that were added, modified or deleted, written
as JSON lines. The rows that differ come from
:func:`lakehouse_assets.tables.changes.changed_translog_rows` and
:func:`~lakehouse_assets.tables.changes.changed_statement_rows` (the latter
finds what a writer outside the lakehouse changed: the translog does not).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets import conventions as cv
from lakehouse_assets.tables.changes import changed_statement_rows, changed_translog_rows
from lakehouse_assets.tables.snapshot import DatasetSnapshot

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.incremental import ChangedLines
    from lakehouse_assets.versions.chain import Version


def _canonical_ids(
    ds: DatasetContext, snapshot: DatasetSnapshot | None, rows: pa.Table
) -> set[str]:
    from lakehouse_assets.query import rows_by_id

    if snapshot is None or rows.num_rows == 0:
        return set()
    found = rows_by_id(ds, snapshot, rows, columns=["canonical_id"])
    return set(pc.unique(found.column("canonical_id")).to_pylist())


def _entities(
    ds: DatasetContext, snapshot: DatasetSnapshot | None, ids: list[str]
) -> dict[str, dict[str, Any]]:
    """Entities as ``entities.ftm.json`` writes them (a statement once, first origin)."""
    from lakehouse_assets.query import aggregate, first_origin, live_statements, to_statements

    if snapshot is None or not ids:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), 5000):
        table = live_statements(ds, entity_ids=ids[start : start + 5000], snapshot=snapshot)
        for entity in aggregate(ds.name, first_origin(to_statements(table))):
            out[str(entity.id)] = entity.to_dict()
    return out


def _normal(entity: Mapping[str, Any]) -> dict[str, Any]:
    """An entity dict without list order (followthemoney builds some lists from sets)."""
    out = dict(entity)
    for key in ("referents", "datasets", "origin"):
        if isinstance(out.get(key), list):
            out[key] = sorted(out[key])
    out["properties"] = {k: sorted(v) for k, v in (out.get("properties") or {}).items()}
    return out


def entity_changes(
    ds: DatasetContext, old: DatasetSnapshot | None, new: DatasetSnapshot
) -> Iterator[dict[str, Any]]:
    """``{"op": ADD|MOD|DEL, "entity": ...}`` for every entity that differs, in (flush
    bucket, id) order: a batch of entities then spans few buckets, so building it
    reads only the files of those buckets (in id order every batch read the whole
    table: 34 s of a 10M-statement diff)."""
    from lakehouse_assets.journal import bucket_of

    new_rows, old_rows = changed_translog_rows(ds, old, new)
    found = _canonical_ids(ds, new, new_rows) | _canonical_ids(ds, old, old_rows)
    # and the statements a writer changed without the translog knowing (a
    # delta-rs delete() or append): the diff says every change, by whoever
    # made it, or yente never learns of it
    new_stmts, old_stmts = changed_statement_rows(ds, old, new)
    for rows in (new_stmts, old_stmts):
        found.update(pc.unique(rows.column("canonical_id")).to_pylist())
    found.discard(None)
    ids = sorted(found, key=lambda i: (bucket_of(i), i))
    for start in range(0, len(ids), 5000):
        batch = ids[start : start + 5000]
        before = _entities(ds, old, batch)
        after = _entities(ds, new, batch)
        for eid in batch:
            a, b = before.get(eid), after.get(eid)
            if a is None and b is not None:
                yield {"op": "ADD", "entity": b}
            elif a is not None and b is None:
                yield {"op": "DEL", "entity": a}
            elif a is not None and b is not None and _normal(a) != _normal(b):
                yield {"op": "MOD", "entity": b}


class _Digest:
    """A diff's file being written: its bytes go to ``out``, hashed and counted
    on the way (a first version's diff is as big as entities.ftm.json, 1 GB at
    10M statements: built in memory and copied, it took 1.5 GB)."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.out.write(data)
        self.sha256.update(data)
        self.size += len(data)


def render_diff(
    ds: DatasetContext, old: DatasetSnapshot | None, new: DatasetSnapshot, out: IO[bytes] | _Digest
) -> dict[str, int]:
    """Write the delta file between two snapshots (JSON lines, one per changed
    entity) to ``out``; its counts."""
    counts = {"ADD": 0, "MOD": 0, "DEL": 0}
    for change in entity_changes(ds, old, new):
        counts[change["op"]] += 1
        out.write(orjson.dumps(change) + b"\n")
    return counts


def diff_from_export(ds: DatasetContext, out: IO[bytes] | _Digest) -> dict[str, int]:
    """Write the first version's diff to ``out``: every entity of
    ``entities.ftm.json`` added; its counts.

    Only valid when that export renders the snapshot being published (it is
    fresh); building 200k entities again in Python would cost a minute at 1M
    statements, wrapping the export's lines costs a second.
    """
    count = 0
    with ds.store.open_read(cv.dataset_path(ds.name, cv.ENTITIES_JSON)) as fh:
        for line in fh:
            line = line.rstrip(b"\n")
            if line:
                out.write(b'{"op":"ADD","entity":' + line + b"}\n")
                count += 1
    return {"ADD": count, "MOD": 0, "DEL": 0}


def diff_from_lines(lines: ChangedLines, out: IO[bytes] | _Digest) -> dict[str, int]:
    """Write the diff of an incremental export's change to ``out``: its entities'
    entities.ftm.json lines before and after (:class:`.incremental.ChangedLines`),
    in the order :func:`entity_changes` yields them; its counts.

    The same changes the tables give (the change feed that picked the entities
    is the translog's), with the export's lines as the entities, as the first
    version's diff has them (:func:`diff_from_export`): nothing is built again
    (1.8 s of a 1% change's export at 1M statements when built from the tables).
    """
    from lakehouse_assets.journal import bucket_of

    counts = {"ADD": 0, "MOD": 0, "DEL": 0}
    for eid in sorted(set(lines.entities), key=lambda i: (bucket_of(i), i)):
        before, after = lines.before.get(eid), lines.after.get(eid)
        if before is None and after is not None:
            op, line = "ADD", after
        elif before is not None and after is None:
            op, line = "DEL", before
        elif before is not None and after is not None and before != after:
            op, line = "MOD", after
        else:
            continue
        counts[op] += 1
        out.write(b'{"op":"' + op.encode() + b'","entity":' + line + b"}\n")
    return counts


#: One entity's change from an older version: the op (``None``: as the older
#: version had it), the entity to print, and the entity as the older version had
#: it when a line told (a ``DEL`` carries it; ``None``: unknown or absent).
Composed = tuple[str | None, dict[str, Any], dict[str, Any] | None]


def _compose(earlier: Composed | None, op: str, entity: dict[str, Any]) -> Composed:
    """One entity's change from an older version after one more diff line.

    A ``MOD`` line carries only the new entity, so a change that a later
    version undid is still a ``MOD`` unless a ``DEL`` told the older entity."""
    if earlier is None:
        return (op, entity, entity if op == "DEL" else None)
    first, before, original = earlier
    if op == "DEL":
        if first == "ADD":
            return (None, entity, None)  # absent in the older version too
        return ("DEL", original if original is not None else entity, original)
    if first in ("ADD", None) and op == "ADD" and original is None:
        return ("ADD", entity, None)
    if first == "ADD":
        return ("ADD", entity, None)
    if original is not None and _normal(original) == _normal(entity):
        return (None, entity, original)  # deleted or changed, then back as it was
    return ("MOD", entity, original)


def changes_between(ds: DatasetContext, old: Version, new: Version) -> list[dict[str, Any]]:
    """The ``{"op", "entity"}`` lines from ``old`` to ``new`` (``lakehouse diff``).

    Composed from the diffs the versions after ``old`` published (each checked
    against its manifest's SHA-256 before use; no table is read, so it works
    after vacuum); when one of them has none (skipped, its parent's files
    were gone), computed from the two versions' tables instead. In the order
    entities first changed.
    """
    from lakehouse_assets.errors import LakehouseError
    from lakehouse_assets.versions.asof import snapshot_at
    from lakehouse_assets.versions.chain import history

    if new.sequence <= old.sequence:
        raise LakehouseError(
            f"Dataset {ds.name!r}: diff from version {old.sequence} to {new.sequence}: "
            "the second version must be the newer one"
        )
    between = [v for v in history(ds) if old.sequence < v.sequence <= new.sequence]
    if any("path" not in (v.manifest.get("diff") or {}) for v in between):
        return list(entity_changes(ds, snapshot_at(ds, old), snapshot_at(ds, new)))
    changed: dict[str, Composed] = {}
    for version in between:
        diff = version.manifest["diff"]
        path = cv.dataset_path(ds.name, diff["path"])
        digest = hashlib.sha256()
        with ds.store.open_read(path) as fh:
            for line in fh:
                digest.update(line)
                if line.strip():
                    change = orjson.loads(line)
                    eid = str(change["entity"]["id"])
                    changed[eid] = _compose(changed.get(eid), change["op"], change["entity"])
        if digest.hexdigest() != diff["sha256"]:  # checked before anything is returned
            raise LakehouseError(
                f"Dataset {ds.name!r}: {path} differs from version {version.sequence}'s "
                "manifest; run `lakehouse verify`"
            )
    return [{"op": c[0], "entity": c[1]} for c in changed.values() if c[0] is not None]
