"""Entity changes between two snapshots, and the diff files a version publishes.

From the translog rows that differ (only the files one side has are read) to
the entities that were added, modified or deleted, written as JSON lines.
The translog rows that differ come from
:func:`lakehouse_assets.tables.changes.changed_translog_rows`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets import conventions as cv
from lakehouse_assets.tables.changes import changed_translog_rows
from lakehouse_assets.tables.snapshot import DatasetSnapshot

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


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
