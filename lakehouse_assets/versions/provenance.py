"""Provenance (``lakehouse trace``): where each statement of an entity came from.

Its stored rows and translog entry, the journal writes that wrote it, its
source (archived file, mapping, crawl) and the published versions that first
carried it and that removed it, probed from the manifests' file lists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.tables.lookups import point_lookup
from lakehouse_assets.tables.schemas import (
    PROVENANCE_FIELDS,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)
from lakehouse_assets.tables.snapshot import DataFile, DatasetSnapshot
from lakehouse_assets.versions.chain import Version, history

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


def _statement_rows(ds: DatasetContext, key: str, snapshot: DatasetSnapshot) -> pa.Table:
    """Every stored statement (live or deleted) of entity ``key``, or with statement id
    ``key``, with its translog row.

    An entity id prunes to one bucket (an entity's statements share it); a
    statement id, a hash no file's range narrows, is found by the files'
    bloom filters (:func:`lakehouse_assets.tables.lookups.point_lookup`).
    """
    from lakehouse_assets.journal import bucket_of

    options = ds.statements_table.storage_options
    bucket = bucket_of(key)
    rows = point_lookup(
        snapshot.statements.select((bucket, bucket)),
        STATEMENTS_SCHEMA,
        options,
        {"bucket": [bucket], "canonical_id": [key]},
        partition=STATEMENTS_PARTITION,
    )
    if rows.num_rows == 0:
        rows = point_lookup(
            snapshot.statements.files,
            STATEMENTS_SCHEMA,
            options,
            {"id": [key]},
            partition=STATEMENTS_PARTITION,
        )
    if rows.num_rows == 0:
        return rows
    buckets = pc.unique(rows.column("bucket")).to_pylist()
    log = point_lookup(
        [f for b in buckets for f in snapshot.translog.select((b, b))],
        TRANSLOG_SCHEMA,
        options,
        {"bucket": buckets, "id": pc.unique(rows.column("id")).to_pylist()},
        columns=["origin", "id", "first_seen", "last_seen", "deleted_at", *PROVENANCE_FIELDS],
    )
    log = log.rename_columns(
        ["origin", "id", "t_first", "t_last", "deleted_at", *PROVENANCE_FIELDS]
    )
    return rows.join(log, keys=["origin", "id"], join_type="left outer").sort_by(
        [("prop", "ascending"), ("value", "ascending"), ("origin", "ascending")]
    )


def _writer(tenant: str | None, write_id: str | None) -> dict[str, Any] | None:
    """A journal write as trace shows it (None: flushed before writes were recorded)."""
    from lakehouse_assets.journal import write_time

    if tenant is None and write_id is None:
        return None
    return {"tenant": tenant, "write_id": write_id, "started_at": write_time(write_id)}


class _LiveProbe:
    """Which of some statements were live in a published version: their rows in the
    translog files the version's manifest lists (a row with no ``deleted_at`` is
    live: the translog has rows only for statements in the main table). No Delta
    log is loaded and nothing but those rows is read; answers are cached per
    version, so tracing an entity's statements costs a probe per version visited.
    """

    def __init__(self, ds: DatasetContext, keys: pa.Table) -> None:
        self.ds = ds
        self.buckets = pc.unique(keys.column("bucket")).to_pylist()
        self.ids = pc.unique(keys.column("id")).to_pylist()
        self.root = ds.translog_table.uri.rstrip("/")
        self.cache: dict[int, set[tuple[str, str]] | None] = {}

    def live(self, version: Version) -> set[tuple[str, str]] | None:
        """(origin, id) of the statements live in ``version``; None if its files are gone."""
        if version.sequence not in self.cache:
            self.cache[version.sequence] = self._probe(version)
        return self.cache[version.sequence]

    def _probe(self, version: Version) -> set[tuple[str, str]] | None:
        entries = (version.manifest["tables"].get("translog") or {}).get("files") or []
        files = []
        for entry in entries:
            bounds = (entry.get("stats") or {}).get("columns", {}).get("bucket") or {}
            low, high = bounds.get("min"), bounds.get("max")
            if (
                low is not None
                and high is not None
                and all(not (low <= b <= high) for b in self.buckets)
            ):
                continue
            files.append(
                DataFile(
                    f"{self.root}/{entry['path']}",
                    entry["path"],
                    int(entry["size"]),
                    entry.get("partition") or {},
                    low,
                    high,
                )
            )
        try:
            rows = point_lookup(
                files,
                TRANSLOG_SCHEMA,
                self.ds.translog_table.storage_options,
                {"bucket": self.buckets, "id": self.ids},
                columns=["origin", "id", "deleted_at"],
            )
        except (OSError, ValueError):  # vacuumed: this version can no longer tell
            return None
        live = rows.filter(pc.is_null(rows.column("deleted_at")))
        return set(
            zip(live.column("origin").to_pylist(), live.column("id").to_pylist(), strict=True)
        )


def _appeared(
    probe: _LiveProbe, history: list[Version], origin: str, sid: str
) -> tuple[Version | None, Version | None]:
    """The version since which a statement is (or was last) published, and the one
    that removed it: binary searches over the versions (a statement deleted and
    written again counts from its latest return; a vacuumed version counts as
    not having it)."""
    if not history:
        return None, None

    def live(i: int) -> bool:
        found = probe.live(history[i])
        return found is not None and (origin, sid) in found

    def search(lo: int, hi: int, want_last: bool) -> int:
        found = -1
        while lo <= hi:
            mid = (lo + hi) // 2
            if live(mid):
                found = mid
                lo, hi = (mid + 1, hi) if want_last else (lo, mid - 1)
            elif want_last:
                hi = mid - 1
            else:
                lo = mid + 1
        return found

    last = len(history) - 1 if live(len(history) - 1) else search(0, len(history) - 1, True)
    if last < 0:
        return None, None
    removed = history[last + 1] if last + 1 < len(history) else None
    first = search(0, last, False)
    return history[first if first >= 0 else last], removed


def _source(ds: DatasetContext, origin: str, canonical_id: str) -> dict[str, Any]:
    """Where statements of ``origin`` came from: the archived file, the mapping, the crawl."""
    from lakehouse_assets.crawl import CRAWL_JOB
    from lakehouse_assets.jobs import list_runs
    from lakehouse_assets.mappings import list_mappings, mapping_origin

    source: dict[str, Any] = {"origin": origin}
    if cv.CHECKSUM.match(canonical_id):
        try:
            files = ds.archive.files(canonical_id)
        except LakehouseError:
            files = []
        if files:
            source["archive"] = [
                {"checksum": f.checksum, "name": f.name, "source": f.key, "size": f.size}
                for f in files
            ]
    for mapping in list_mappings(ds):
        checksum = str(mapping.get("content_hash") or mapping.get("checksum") or "")
        if checksum and mapping_origin(checksum) == origin:
            source["mapping"] = {
                "csv_checksum": checksum,
                "config": cv.mapping_config(ds.name, checksum),
                **{
                    k: v
                    for k, v in mapping.items()
                    if k in ("versions", "last_processed", "queries")
                },
            }
    if origin == CRAWL_JOB:
        runs = list_runs(ds.store, ds.name, CRAWL_JOB)
        if runs:
            last = max(runs, key=lambda r: r.started_at)
            source["crawl"] = {
                "runs": len(runs),
                "last_started": last.started_at.isoformat(),
                "last_status": last.status,
                "last_stats": last.stats,
            }
    return source


def trace(ds: DatasetContext, key: str) -> list[dict[str, Any]]:
    """Where each statement of an entity (or one statement, by its id) came from.

    For each: its values, origin and what the origin names (archived file,
    mapping, crawl runs), first_seen/last_seen/deleted_at from the translog,
    the tenant and journal write that first wrote it and that last wrote (or
    deleted) it, and the versions that first published it and that removed
    it. Statements flushed before writes were recorded have ``None`` writers.
    """
    snapshot = ds.snapshot()
    rows = _statement_rows(ds, key, snapshot)
    versions = history(ds)
    probe = _LiveProbe(ds, rows.select(["bucket", "id"]))
    out = []
    sources: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows.to_pylist():
        origin, canonical = str(row["origin"]), str(row["canonical_id"])
        if (origin, canonical) not in sources:
            sources[(origin, canonical)] = _source(ds, origin, canonical)
        first, removed = _appeared(probe, versions, origin, str(row["id"]))
        out.append(
            {
                "id": row["id"],
                "canonical_id": canonical,
                "entity_id": row["entity_id"],
                "schema": row["schema"],
                "prop": row["prop"],
                "value": row["value"],
                "first_seen": row["t_first"] or row["first_seen"],
                "last_seen": row["t_last"] or row["last_seen"],
                "deleted_at": row["deleted_at"],
                "written_by": _writer(row["first_tenant"], row["first_write"]),
                "last_written_by": _writer(row["last_tenant"], row["last_write"]),
                "source": sources[(origin, canonical)],
                "published_in": first.sequence if first else None,
                "removed_in": removed.sequence if removed else None,
            }
        )
    return out
