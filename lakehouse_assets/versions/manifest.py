"""Building a version's manifest: table files and log entries, totals, exports, graph.

A manifest is the immutable, self-describing snapshot a version publishes;
this module only builds and compares manifests (nothing is written here:
:mod:`lakehouse_assets.versions.publishing` writes and links them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, MutableMapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import pyarrow.compute as pc
from deltalake import DeltaTable

from lakehouse_assets import conventions as cv
from lakehouse_assets.conventions import _table_dir
from lakehouse_assets.tables.delta import DeltaLocation, add_actions
from lakehouse_assets.tables.duck import bounded_duckdb
from lakehouse_assets.tables.schemas import TRANSLOG_SCHEMA
from lakehouse_assets.tables.snapshot import DatasetSnapshot, arrow_dataset
from lakehouse_assets.versions.chain import Version
from lakehouse_assets.versions.hashes import canonical_json, known_sha256, multihash, sha256_of
from lakehouse_assets.versions.render import logical_hash

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.settings import Settings


#: The manifest format (Lode: schema name + version).
MANIFEST_SCHEMA: Final = {"name": "ftm-lakehouse/manifest", "version": 1}


def _file_entries(
    ds: DatasetContext, table: str, dt: DeltaTable, known: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The data files of one table version, with Delta's statistics and SHA-256.

    A file the parent manifest already hashed (same path and size: data files
    are immutable) keeps its hash; only new files are read.
    """
    actions = add_actions(dt)
    entries = []
    for action in sorted(actions, key=lambda a: str(a["path"])):
        path = str(action["path"])
        size = int(action["size_bytes"])
        old = known.get(path)
        sha = (
            str(old["sha256"])
            if old is not None and old.get("size") == size
            else sha256_of(ds, cv.dataset_path(ds.name, _table_dir(table), path))
        )
        columns: dict[str, dict[str, Any]] = {}
        for key, value in action.items():
            kind, _, column = key.partition(".")
            if kind in ("min", "max", "null_count") and column:
                columns.setdefault(column, {})[kind] = _jsonable(value)
        partition = {
            k.removeprefix("partition."): v for k, v in action.items() if k.startswith("partition.")
        }
        entry: dict[str, Any] = {"path": path, "size": size, "sha256": sha}
        if partition:
            entry["partition"] = partition
        stats: dict[str, Any] = {}
        if action.get("num_records") is not None:
            stats["rows"] = int(action["num_records"])
        if columns:
            stats["columns"] = columns
        if stats:  # Lode: statistics only when the format reported them
            entry["stats"] = stats
        entries.append(entry)
    return entries


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return value


def _log_entries(
    ds: DatasetContext, table: str, since: int | None, version: int
) -> list[dict[str, Any]]:
    """The Delta log commits ``(since, version]`` of a table, hashed."""
    entries = []
    start = -1 if since is None else since
    for v in range(start + 1, version + 1):
        path = cv.dataset_path(ds.name, _table_dir(table), "_delta_log", f"{v:020d}.json")
        if not ds.store.exists(path):  # cleaned up after a checkpoint: nothing to hash
            continue
        entries.append(
            {"path": f"_delta_log/{v:020d}.json", "version": v, "sha256": sha256_of(ds, path)}
        )
    return entries


def _table_entry(
    ds: DatasetContext,
    table: str,
    location: DeltaLocation,
    version: int | None,
    parent: Version | None,
) -> dict[str, Any] | None:
    if version is None:
        return None
    dt = location.table(version)
    assert dt is not None
    old = (parent.manifest["tables"].get(table) if parent else None) or {}
    known = {f["path"]: f for f in old.get("files", [])}
    since = old.get("version")
    if since is not None and since > version:  # cannot happen on a linear chain
        since = None
    return {
        "version": version,
        "files": _file_entries(ds, table, dt, known),
        "log": _log_entries(ds, table, since, version),
    }


def _totals(
    ds: DatasetContext, snapshot: DatasetSnapshot, live_statements: int | None = None
) -> dict[str, Any]:
    """Live statements (distinct ids) and their first_seen/last_seen range, from the
    translog, with bounded memory.

    The seen range streamed batch by batch; the count as the statements export
    of this very snapshot counted it while writing (``live_statements``: one
    line per live statement id), else counted by DuckDB within a memory limit.
    (Reading the translog's ids into Arrow and counting them there held 3.7 GB
    at 10M statements.) A parent version's figures are no shortcut: publishing
    tags the translog with a commit of its own, so the next snapshot never has
    the parent's table versions.
    """
    log_data = arrow_dataset(
        snapshot.translog.files, TRANSLOG_SCHEMA, ds.statements_table.storage_options
    )
    first = last = None
    live_rows = 0
    for batch in log_data.to_batches(
        columns=["first_seen", "last_seen"],
        filter=pc.field("deleted_at").is_null(),
        batch_size=256 * 1024,
        # pyarrow's default read-ahead (4 files, 16 batches) held 0.9 GB at 10M
        batch_readahead=2,
        fragment_readahead=1,
    ):
        if batch.num_rows == 0:
            continue
        live_rows += batch.num_rows
        low = pc.min(batch.column("first_seen")).as_py()
        high = pc.max(batch.column("last_seen")).as_py()
        first = low if first is None or (low is not None and low < first) else first
        last = high if last is None or (high is not None and high > last) else last
    if live_statements is None:
        live_statements = _count_live_ids(log_data, ds.settings) if live_rows else 0
    return {"live_statements": live_statements, "first_seen": first, "last_seen": last}


def _count_live_ids(log_data: Any, settings: Settings) -> int:
    """Distinct statement ids among live translog rows (one statement may be live
    in several origins): DuckDB's aggregation spills beyond its memory limit
    (:mod:`lakehouse_assets.tables.duck`; at 10M statements on S3 the whole
    process peaked at 0.61 GB in 2.3 s with 128 MB, 0.74 GB in 2.0 s with 256 MB)."""
    ids = log_data.scanner(
        columns=["id"],
        filter=pc.field("deleted_at").is_null(),
        batch_size=64 * 1024,
        batch_readahead=2,
        fragment_readahead=1,
    ).to_reader()
    with bounded_duckdb(settings) as con:
        con.register("ids", ids)
        row = con.execute("SELECT count(*) FROM (SELECT DISTINCT id FROM ids)").fetchone()
    return int(row[0]) if row else 0


def _export_entries(
    ds: DatasetContext, known: MutableMapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The exports with size and SHA-256; ``known`` holds what the export pass that
    just wrote a file computed while writing it (by path), so it is not read again."""
    from lakehouse_assets.freshness import ENTITIES, EXPORTS, STATEMENTS, STATISTICS

    entries = []
    for kind in (STATEMENTS, ENTITIES, STATISTICS):
        rel = EXPORTS[kind][0]
        full = cv.dataset_path(ds.name, rel)
        if ds.store.exists(full):
            stamp = ds.core_tags.get(EXPORTS[kind][1])
            size = ds.store.size(full)
            sha = known_sha256(ds, rel, size, known)
            entries.append(
                {
                    "kind": kind,
                    "path": rel,
                    "size": size,
                    "sha256": sha,
                    # the export's tag: verify tells a later rewrite from tampering
                    "stamp": stamp.isoformat() if stamp else None,
                }
            )
    return entries


def build_manifest(
    ds: DatasetContext,
    snapshot: DatasetSnapshot,
    parent: Version | None,
    *,
    index_text: str,
    statements_fresh: bool,
    metadata: Mapping[str, Any] | None = None,
    created_at: datetime | None = None,
    known_exports: MutableMapping[str, Any] | None = None,
    logical: str | None = None,
) -> dict[str, Any]:
    """The manifest of ``snapshot`` as the next version after ``parent`` (``logical``:
    its logical hash when the caller knows it, a rewrite that kept every statement)."""
    created = created_at or cv.utcnow()
    if parent is not None and created <= parent.created_at:  # monotonic, even with clock skew
        created = parent.created_at + timedelta(microseconds=1)
    tables: dict[str, Any] = {}
    # the change feed as it is now: the next incremental export trusts its rows,
    # so the version covers its files and log like the tables' (verify holds them)
    feed = ds.changes_table.table()
    for name, location, version in (
        ("statements", ds.statements_table, snapshot.statements.version),
        ("translog", ds.translog_table, snapshot.translog.version),
        ("changes", ds.changes_table, None if feed is None else feed.version()),
    ):
        entry = _table_entry(ds, name, location, version, parent)
        if entry is not None:
            tables[name] = entry
    exports = _export_entries(ds, known_exports)
    by_kind = {e["kind"]: e for e in exports}
    from lakehouse_assets.freshness import EXPORTS, STATEMENTS

    counted = (known_exports or {}).get(EXPORTS[STATEMENTS][0], {})
    totals = _totals(
        ds,
        snapshot,
        live_statements=counted.get("rows")
        if counted.get("snapshot") == list(snapshot.versions)
        else None,
    )
    totals["statements"] = sum(
        int(f.get("stats", {}).get("rows", 0))
        for f in tables.get("statements", {}).get("files", [])
    )
    if logical is not None:
        pass
    elif statements_fresh and "statements" in by_kind:
        logical = multihash(bytes.fromhex(by_kind["statements"]["sha256"]))
    else:
        logical, _ = logical_hash(ds, snapshot)
    stats_path = cv.dataset_path(ds.name, cv.STATISTICS_JSON)
    if ds.store.exists(stats_path):
        totals["entities"] = json.loads(ds.store.read_text(stats_path)).get("entity_count")
    index_bytes = index_text.encode()
    exports.append(
        {
            "kind": "index",
            "path": cv.INDEX,
            "size": len(index_bytes),
            "sha256": hashlib.sha256(index_bytes).hexdigest(),
        }
    )
    manifest: dict[str, Any] = {
        "schema": dict(MANIFEST_SCHEMA),
        "dataset": ds.name,
        "snapshot_id": cv.path_timestamp(created),
        "sequence": (parent.sequence if parent else 0) + 1,
        "parent_snapshot_id": parent.snapshot_id if parent else None,
        "parent_hash": parent.hash if parent else None,
        "created_at": created.isoformat(),
        "metadata": dict(metadata or {}),
        "tables": tables,
        "exports": exports,
        "totals": totals,
        "logical_hash": logical,
    }
    graph = _graph_entry(ds, snapshot, parent)
    if graph is not None:
        manifest["graph"] = graph
    manifest["caches"] = caches_entry(ds)
    return manifest


def caches_entry(ds: DatasetContext) -> dict[str, Any]:
    """What the version covers of the caches the next operations trust: the
    incremental export's state (:func:`~lakehouse_assets.export_state.state_digests`;
    the next incremental export uses it only if it matches, ``verify`` holds it
    to the head). The change feed is a table of the manifest's own, the graph
    index has its entry (:func:`_graph_entry`)."""
    from lakehouse_assets.export_state import state_digests

    state = state_digests(ds)
    return {} if state is None else {"export_state": state}


def _graph_entry(
    ds: DatasetContext, snapshot: DatasetSnapshot, parent: Version | None = None
) -> dict[str, Any] | None:
    """The graph index as it was when the version was published (when the dataset has
    one): the Delta versions of its tables, the table versions it reflects (and so
    whether it was current), its edge counts, and the SHA-256 of ``graph/state.json``
    (the index's own snapshot manifest, which lists its files)."""
    from lakehouse_assets import graph

    state_path = cv.dataset_path(ds.name, graph.STATE)
    if not ds.store.exists(state_path):
        return None
    state_bytes = ds.store.read_bytes(state_path)
    state = graph.GraphState.load(ds)
    if state is None:
        return None
    tables = {}
    for name, table in (
        ("by_source", graph.BY_SOURCE),
        ("by_target", graph.BY_TARGET),
        ("tombstones", graph.TOMBSTONES),
    ):
        dt = graph.table_location(ds, table).table()
        tables[name] = None if dt is None else dt.version()
    reflects = {"statements": state.statements_version, "translog": state.translog_version}
    old = ((parent.manifest.get("graph") or {}) if parent is not None else {}).get("files") or []
    known = {(f["table"], f["path"]): f for f in old}
    files = []
    for table, listed in sorted(state.files.items()):
        for item in sorted(listed, key=lambda f: str(f["path"])):
            path = cv.dataset_path(ds.name, table, str(item["path"]))
            size = ds.store.size(path)
            seen = known.get((table, str(item["path"])))
            sha = (
                str(seen["sha256"])
                if seen is not None and seen.get("size") == size
                else sha256_of(ds, path)
            )
            files.append({"table": table, "path": str(item["path"]), "size": size, "sha256": sha})
    return {
        "tables": tables,
        "reflects": reflects,
        "current": (state.statements_version, state.translog_version) == snapshot.versions,
        "edges": state.edges,
        "by_prop": dict(state.by_prop),
        "tombstones": state.tombstones,
        "dangling": state.dangling,
        "state_sha256": hashlib.sha256(state_bytes).hexdigest(),
        # what lookups trust: state.json without the fields every update rewrites,
        # and every file it lists, hashed (verify holds both to the head)
        "state_core_sha256": graph_state_core(state_bytes),
        "files": files,
    }


#: Fields of ``graph/state.json`` that an update rewrites even when no edge changed.
GRAPH_VOLATILE: Final = ("updated_at", "translog_version", "statements_version")


def graph_state_core(state_bytes: bytes) -> str:
    """Hex SHA-256 of ``graph/state.json`` without :data:`GRAPH_VOLATILE`: what
    ``refs`` relies on (generations, file list, counts)."""
    data = json.loads(state_bytes)
    core = (
        {k: v for k, v in data.items() if k not in GRAPH_VOLATILE}
        if isinstance(data, dict)
        else data
    )
    return hashlib.sha256(canonical_json(core)).hexdigest()


def unchanged(manifest: Mapping[str, Any], parent: Version | None) -> bool:
    """Nothing a consumer sees changed since the parent: same content, same exports."""
    if parent is None:
        return False
    old = parent.manifest

    def files(m: Mapping[str, Any]) -> dict[str, str]:
        return {e["path"]: e["sha256"] for e in m["exports"] if e["kind"] != "index"}

    return (
        manifest["logical_hash"] == old["logical_hash"]
        and files(manifest) == files(old)
        and table_files(manifest) == table_files(old)
        and (manifest.get("graph") or {}).get("state_core_sha256")
        == (old.get("graph") or {}).get("state_core_sha256")
        and (manifest.get("caches") or {}) == (old.get("caches") or {})
    )


def table_files(manifest: Mapping[str, Any]) -> dict[str, set[str]]:
    """The data files a manifest covers, by table: a version whose files differ
    from its parent's (a flush that rewrote the same statements, compact,
    optimize) is published even when no statement changed, so every file a
    reader reads is covered by the head."""
    return {
        name: {f["path"] for f in table.get("files", [])}
        for name, table in (manifest.get("tables") or {}).items()
    }
