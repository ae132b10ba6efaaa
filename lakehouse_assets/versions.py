"""Published versions of a dataset: manifests, a hash-linked chain, verify, as-of reads.

Each ``make`` (or Dagster ``index`` materialization) that changed what a
dataset publishes writes one **manifest** (the Lode seed: an immutable,
self-describing snapshot) and links it into the dataset's **chain** (the
Open Data Fabric seed: every block carries the hash of its parent)::

    {dataset}/versions/YYYY/MM/{snapshot_id}/manifest.json   the manifest
    {dataset}/versions/YYYY/MM/{snapshot_id}/index.json      index.json as published
    {dataset}/versions/chain/{sequence:010d}.json            chain entry: path + hash
    {dataset}/versions/latest.json                           head pointer (a hint)
    {dataset}/diffs/entities.ftm.json/{snapshot_id}.delta.json   entity changes
    {dataset}/diffs/entities.ftm.json/index.json             the diffs and their parents

**Linear history.** A chain entry is written put-if-absent; its sequence
number is the serialization point, so of two publishers racing for the same
sequence exactly one wins and the other re-reads the head and retries on it.
``latest.json`` is rewritten after the entry; a reader that finds a newer
entry than it names (a publisher died between the two writes) follows the
entries, so the pointer can lag but never lie.

**Hashes** are self-describing (multihash in multibase base16, as ODF does):
``f1220`` + 64 hex digits is SHA-256. A manifest's hash is SHA-256 over its
canonical JSON (sorted keys, no whitespace, UTF-8). The **logical hash** of a
version is SHA-256 over its live statements rendered in export order as
followthemoney's statement CSV: it is the hash of ``statements.csv`` (the
export is byte-identical to that rendering) and it does not change when
compact or optimize rewrite the table files.

**Tables.** A manifest names the Delta versions of the statements and
translog tables it was built from, each data file with size, SHA-256 and the
statistics the Delta log reports (row count, per-column min/max/null count),
and the Delta log entries added since its parent (so a rewritten log entry
is caught). Data files are immutable, so a file already hashed by the parent
is not read again. After publishing, a commit to the translog carries the
manifest hash in its commit metadata (an app transaction with the sequence
number makes it idempotent), tying the Delta history to the chain.

**Coverage.** Every file a reader trusts is named by the head or reported by
:func:`verify`: ``compact`` and ``optimize`` of a published dataset publish
the files they wrote (:func:`publish_relayout`: the head's statements,
exports and ``index.json`` carried over), ``make`` publishes whenever the
table files changed, and an export that differs from the head's manifest is
never fresh (:func:`published_intact`), whatever its tag says.

**As-of reads** load the tables at the versions a manifest names (delta-rs
time travel): :func:`snapshot_at`. ``vacuum`` removes files older than its
retention; an as-of read of a version whose files are gone says which
retention to set, or, when no vacuum is on record, that they were removed
outside the lakehouse (:class:`VersionDamagedError`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, Final, cast

import duckdb
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults
from lakehouse_assets.errors import ConcurrentWriteError, LakehouseError
from lakehouse_assets.staging import scratch_dir
from lakehouse_assets.tables.delta import DeltaLocation, commit
from lakehouse_assets.tables.lookups import point_lookup
from lakehouse_assets.tables.schemas import (
    PROVENANCE_FIELDS,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)
from lakehouse_assets.tables.snapshot import DataFile, DatasetSnapshot, arrow_dataset

if TYPE_CHECKING:
    from lakehouse_assets.lake import Dataset

log = logging.getLogger(__name__)

#: The manifest format (Lode: schema name + version).
MANIFEST_SCHEMA: Final = {"name": "ftm-lakehouse/manifest", "version": 1}
#: Multihash prefix of SHA-256 (code 0x12, 32 bytes) in multibase base16 (``f``).
SHA256_PREFIX: Final = "f1220"
#: The app transaction of the translog commit that carries a manifest hash.
VERSION_APP_ID: Final = "lakehouse-version"
#: Commit metadata keys of that commit.
META_HASH: Final = "lakehouse.manifest_hash"
META_SEQUENCE: Final = "lakehouse.sequence"
#: How often a publisher that lost the race for a sequence retries on the new head.
PUBLISH_ATTEMPTS: Final = 5

CHAIN: Final = "chain"
LATEST: Final = "latest.json"
MANIFEST: Final = "manifest.json"
DIFFS: Final = "diffs/entities.ftm.json"


class VersionNotFoundError(LakehouseError, LookupError):
    """No published version matches what was asked for."""


class VersionExpiredError(LakehouseError):
    """The files of a published version were removed by vacuum."""


class VersionDamagedError(LakehouseError):
    """Files of a published version are gone although no vacuum removed them."""


# --- hashes -------------------------------------------------------------------


def multihash(digest: bytes) -> str:
    """A SHA-256 digest as a self-describing string (multihash, multibase base16)."""
    return SHA256_PREFIX + digest.hex()


def canonical_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    """The hash a child manifest links to: SHA-256 over the canonical JSON."""
    return multihash(hashlib.sha256(canonical_json(manifest)).digest())


def sha256_of(ds: Dataset, path: str) -> str:
    """Hex SHA-256 of a lake file, streamed."""
    digest = hashlib.sha256()
    with ds.store.open_read(path) as fh:
        while chunk := fh.read(8 * 1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def known_sha256(ds: Dataset, rel: str, size: int, known: MutableMapping[str, Any] | None) -> str:
    """SHA-256 of the dataset's file ``rel`` (now ``size`` bytes): from ``known``
    (by path: what the export pass computed while writing the file) when it
    holds the file at that size, otherwise read and hashed once, and recorded
    in ``known`` for the next caller (index.json, then the version manifest)."""
    entry = (known or {}).get(rel)
    if entry is not None and entry.get("size") == size and entry.get("sha256"):
        return str(entry["sha256"])
    sha = sha256_of(ds, cv.dataset_path(ds.name, rel))
    if known is not None:
        known[rel] = {"path": rel, "size": size, "sha256": sha}
    return sha


def logical_hash(ds: Dataset, snapshot: DatasetSnapshot) -> tuple[str, int]:
    """Recompute a snapshot's logical hash from the tables (and its live statement count).

    The SHA-256 of the snapshot's ``statements.csv``: the live statements in
    export order, a statement written by two origins once, in the bytes of
    followthemoney's CSV writer (rendered in SQL by
    :func:`query.statement_csv_buffers`, which the tests hold to that writer).
    """
    from lakehouse_assets.query import statement_csv_buffers

    digest = hashlib.sha256()
    count = 0
    for buffer, lines in statement_csv_buffers(ds, snapshot):
        digest.update(buffer)
        count += lines
    return multihash(digest.digest()), count


def render_export(ds: Dataset, snapshot: DatasetSnapshot, kind: str, out: IO[bytes]) -> int:
    """Write one export of a snapshot; returns the count of statements or entities
    written. Entities and statistics with followthemoney's and ftmq's own code
    (the reference the Spark exports are tested against); statements.csv in
    SQL (:func:`query.statement_csv_buffers`), byte for byte what
    followthemoney's writer gives (tested), several times faster.

    This is how an export of an earlier version is re-made (``export --as-of``).
    """
    from followthemoney.cli.util import write_entity
    from ftmq.model.stats import Collector

    from lakehouse_assets.query import (
        aggregate,
        first_origin,
        sorted_live_batches,
        statement_csv_buffers,
        to_statements,
    )
    from lakehouse_assets.spark.ftm_sql import stats_json

    if kind == "statements":
        count = 0
        for buffer, lines in statement_csv_buffers(ds, snapshot):
            out.write(buffer)
            count += lines
        return count
    statements = first_origin(
        s for batch in sorted_live_batches(ds, snapshot) for s in to_statements(batch)
    )
    entities = aggregate(ds.name, statements)
    if kind == "entities":
        count = 0
        for entity in entities:
            write_entity(cast(BinaryIO, out), entity)
            count += 1
        return count
    if kind == "statistics":
        stats = Collector().collect_many(e for e in entities)  # type: ignore[no-untyped-call]
        out.write(stats_json(stats).encode())
        return int(stats.entity_count or 0)
    raise ValueError(f"Unknown export {kind!r}; choose from statements, entities, statistics")


# --- paths --------------------------------------------------------------------


def chain_entry_path(dataset: str, sequence: int) -> str:
    return cv.dataset_path(dataset, cv.VERSIONS, CHAIN, f"{sequence:010d}.json")


def latest_path(dataset: str) -> str:
    return cv.dataset_path(dataset, cv.VERSIONS, LATEST)


def diff_path(dataset: str, snapshot_id: str) -> str:
    return cv.dataset_path(dataset, DIFFS, f"{cv.file_id(snapshot_id)}.delta.json")


def diff_index_path(dataset: str) -> str:
    return cv.dataset_path(dataset, DIFFS, "index.json")


# --- the chain ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Version:
    """One published version: its chain entry and its manifest."""

    sequence: int
    path: str
    hash: str
    manifest: dict[str, Any]

    @property
    def snapshot_id(self) -> str:
        return str(self.manifest["snapshot_id"])

    @property
    def created_at(self) -> datetime:
        return datetime.fromisoformat(self.manifest["created_at"])

    def table_version(self, table: str) -> int | None:
        entry = self.manifest["tables"].get(table)
        return None if entry is None else entry.get("version")

    def summary(self) -> dict[str, Any]:
        """One line of ``lakehouse versions``."""
        m = self.manifest
        return {
            "sequence": self.sequence,
            "snapshot_id": self.snapshot_id,
            "created_at": m["created_at"],
            "hash": self.hash,
            "parent_hash": m["parent_hash"],
            "logical_hash": m["logical_hash"],
            **m["totals"],
            "changes": (m.get("diff") or {}).get("counts"),
            "tables": {k: v["version"] for k, v in m["tables"].items()},
        }


def _read_entry(ds: Dataset, sequence: int) -> dict[str, Any] | None:
    path = chain_entry_path(ds.name, sequence)
    if not ds.store.exists(path):
        return None
    entry: dict[str, Any] = json.loads(ds.store.read_text(path))
    return entry


def _load(ds: Dataset, entry: Mapping[str, Any]) -> Version:
    manifest = json.loads(ds.store.read_text(entry["path"]))
    return Version(int(entry["sequence"]), entry["path"], entry["hash"], manifest)


def head_sequence(ds: Dataset) -> int:
    """The sequence number of the head (0: nothing published yet).

    Starts from ``latest.json`` and follows chain entries past it, so a lagging
    pointer (a publisher that died after its entry) costs one extra read.
    """
    seq = 0
    latest = latest_path(ds.name)
    if ds.store.exists(latest):
        seq = int(json.loads(ds.store.read_text(latest))["sequence"])
    while ds.store.exists(chain_entry_path(ds.name, seq + 1)):
        seq += 1
    return seq


def head(ds: Dataset) -> Version | None:
    """The latest published version, or ``None``."""
    seq = head_sequence(ds)
    if seq == 0:
        return None
    entry = _read_entry(ds, seq)
    if entry is None:  # latest.json names an entry that is not there (tampered)
        raise VersionNotFoundError(
            f"Dataset {ds.name!r}: versions/latest.json names version {seq}, "
            "whose chain entry is missing; run `lakehouse verify`"
        )
    return _load(ds, entry)


def history(ds: Dataset) -> list[Version]:
    """Every published version, oldest first (reads the whole chain)."""
    prefix = cv.dataset_path(ds.name, cv.VERSIONS, CHAIN) + "/"
    entries = sorted(p for p in ds.store.list(prefix) if p.endswith(".json"))
    return [_load(ds, json.loads(ds.store.read_text(p))) for p in entries]


def resolve(ds: Dataset, as_of: str | int) -> Version:
    """The version ``as_of`` names: a sequence number, a snapshot id, or a time
    (ISO 8601; the last version published at or before it)."""
    text = str(as_of).strip()
    if text.isdigit():
        entry = _read_entry(ds, int(text))
        if entry is None:
            raise VersionNotFoundError(
                f"Dataset {ds.name!r} has no version {text} "
                f"(the head is {head_sequence(ds)}; see `lakehouse -d {ds.name} versions`)"
            )
        return _load(ds, entry)
    versions = history(ds)
    for version in versions:
        if version.snapshot_id == text:
            return version
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise VersionNotFoundError(
            f"--as-of {text!r}: not a version number, snapshot id or ISO 8601 time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    before = [v for v in versions if v.created_at <= when]
    if not before:
        first = versions[0].manifest["created_at"] if versions else "never"
        raise VersionNotFoundError(
            f"Dataset {ds.name!r} had no published version at {when.isoformat()} "
            f"(first published: {first})"
        )
    return before[-1]


def snapshot_at(ds: Dataset, version: Version) -> DatasetSnapshot:
    """The snapshot a version was built from (Delta time travel), if its files remain."""
    translog_version = version.table_version("translog")
    if translog_version is None:
        return DatasetSnapshot.load(ds.statements_table, ds.translog_table, None)
    try:
        snapshot = DatasetSnapshot.load(ds.statements_table, ds.translog_table, translog_version)
    except Exception as exc:  # the log entries themselves were cleaned up
        raise _expired(ds, version, f"its Delta log is gone ({exc})") from exc
    tables = (
        ("statements", ds.statements_table, snapshot.statements),
        ("translog", ds.translog_table, snapshot.translog),
    )
    gone = {
        name: [
            f.path
            for f in snap.files
            if not ds.store.exists(cv.dataset_path(ds.name, _table_dir(name), f.path))
        ]
        for name, _, snap in tables
    }
    missing = [path for paths in gone.values() for path in paths]
    if missing:
        from lakehouse_assets.verify_coverage import vacuumable

        if not all(
            all(map(vacuumable(ds, _table_dir(name), location), gone[name]))
            for name, location, _ in tables
            if gone[name]
        ):
            # nothing that keeps a record removed them: lost or tampered
            raise VersionDamagedError(
                f"Dataset {ds.name!r} version {version.sequence} cannot be read: "
                f"{len(missing)} of its files are missing ({missing[0]}, …) and no vacuum "
                "removed them (none ran, or they were inside its retention window): they "
                "were removed outside the lakehouse (run `lakehouse verify`)"
            )
        raise _expired(ds, version, f"{len(missing)} of its files were vacuumed ({missing[0]}, …)")
    return snapshot


def vacuum_ran(location: DeltaLocation) -> bool:
    """Whether a vacuum is on record in a table's Delta history (a vacuum writes a
    ``VACUUM END`` commit): only then may a file a version names be gone."""
    try:
        table = location.table()
        history = [] if table is None else table.history()
    except Exception:  # noqa: BLE001 - an unreadable log proves no vacuum
        return False
    return any(str(info.get("operation", "")).startswith("VACUUM") for info in history)


def _expired(ds: Dataset, version: Version, why: str) -> VersionExpiredError:
    age = cv.utcnow() - version.created_at
    hours = int(age.total_seconds() // 3600) + 1
    return VersionExpiredError(
        f"Dataset {ds.name!r} version {version.sequence} ({version.manifest['created_at']}) "
        f"can no longer be read: {why}. Vacuum keeps "
        f"{ds.settings.vacuum_retention_hours} h; set LAKEHOUSE_VACUUM_RETENTION_HOURS "
        f"to at least {hours} to keep versions this old"
    )


def _table_dir(table: str) -> str:
    return cv.STATEMENTS_TABLE if table == "statements" else cv.TRANSLOG_TABLE


# --- building a manifest ------------------------------------------------------


def _file_entries(
    ds: Dataset, table: str, dt: DeltaTable, known: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The data files of one table version, with Delta's statistics and SHA-256.

    A file the parent manifest already hashed (same path and size: data files
    are immutable) keeps its hash; only new files are read.
    """
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
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


def _log_entries(ds: Dataset, table: str, since: int | None, version: int) -> list[dict[str, Any]]:
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
    ds: Dataset,
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
    ds: Dataset, snapshot: DatasetSnapshot, live_statements: int | None = None
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
        live_statements = _count_live_ids(log_data) if live_rows else 0
    return {"live_statements": live_statements, "first_seen": first, "last_seen": last}


def _count_live_ids(log_data: Any) -> int:
    """Distinct statement ids among live translog rows (one statement may be live
    in several origins): DuckDB's aggregation spills beyond its memory limit
    (0.74 GB for the whole process at 10M statements, 1.9 s)."""
    ids = log_data.scanner(
        columns=["id"],
        filter=pc.field("deleted_at").is_null(),
        batch_size=64 * 1024,
        batch_readahead=2,
        fragment_readahead=1,
    ).to_reader()
    with tempfile.TemporaryDirectory(prefix="lakehouse-count-") as spill:
        con = duckdb.connect(
            config={"memory_limit": "256MB", "threads": 2, "temp_directory": spill}
        )
        try:
            con.register("ids", ids)
            row = con.execute("SELECT count(*) FROM (SELECT DISTINCT id FROM ids)").fetchone()
        finally:
            con.close()
    return int(row[0]) if row else 0


def _export_entries(
    ds: Dataset, known: MutableMapping[str, Any] | None = None
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


@dataclass(slots=True)
class PublishResult:
    """What :func:`publish` did."""

    version: Version | None = None
    skipped: str | None = None
    diff: dict[str, Any] | None = None
    attempts: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sequence": self.version.sequence if self.version else None,
            "hash": self.version.hash if self.version else None,
            "skipped": self.skipped,
            "diff": self.diff,
        }


def build_manifest(
    ds: Dataset,
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
    for name, location, version in (
        ("statements", ds.statements_table, snapshot.statements.version),
        ("translog", ds.translog_table, snapshot.translog.version),
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
    return manifest


def _graph_entry(
    ds: Dataset, snapshot: DatasetSnapshot, parent: Version | None = None
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


def publish(
    ds: Dataset,
    snapshot: DatasetSnapshot,
    *,
    index_text: str,
    statements_fresh: bool,
    entities_fresh: bool = False,
    metadata: Mapping[str, Any] | None = None,
    known_exports: MutableMapping[str, Any] | None = None,
    logical: str | None = None,
    parent_hash: str | None = None,
) -> PublishResult:
    """Write the manifest of a new version, link it, tag the Delta history, write its diff.

    ``parent_hash``: publish only on that head (a rewrite that kept the head's
    statements, :func:`publish_relayout`; skipped if another version came first).

    Called by ``export_index`` after ``index.json`` was written. Skips (returns
    without a version) when nothing changed since the head. The diff is
    computed first and its hash goes into the manifest; the files are
    written in an order a crash cannot make inconsistent: diff and manifest
    (paths unique to this publisher), then the chain entry (put-if-absent:
    the serialization point), then the Delta tag and the pointers. A
    publisher that loses the race for a sequence number removes its files
    and rebuilds on the new head; after :data:`PUBLISH_ATTEMPTS` it fails
    with :class:`ConcurrentWriteError`.
    """
    result = PublishResult()
    for attempt in range(1, PUBLISH_ATTEMPTS + 1):
        result.attempts = attempt
        parent = head(ds)
        if parent is not None:
            _finish(ds, parent)  # a publisher that died after its chain entry
        if parent_hash is not None and (parent is None or parent.hash != parent_hash):
            result.skipped = "another version was published meanwhile"
            return result
        manifest = build_manifest(
            ds,
            snapshot,
            parent,
            index_text=index_text,
            statements_fresh=statements_fresh,
            metadata=metadata,
            known_exports=known_exports,
            logical=logical,
        )
        if unchanged(manifest, parent):
            result.skipped = f"nothing changed since version {parent.sequence if parent else 0}"
            return result
        created = datetime.fromisoformat(manifest["created_at"])
        with tempfile.TemporaryDirectory(dir=scratch_dir(ds.settings), prefix="diff-") as tmp:
            diff_file = Path(tmp) / "diff.json"
            try:
                old = snapshot_at(ds, parent) if parent is not None else None
            except (VersionExpiredError, VersionDamagedError) as exc:
                manifest["diff"] = {"skipped": str(exc)}
            else:
                with diff_file.open("wb") as fh:
                    sink = _Digest(fh)
                    if old is None and entities_fresh:  # every entity is new: the export
                        counts = diff_from_export(ds, sink)
                    else:
                        counts = render_diff(ds, old, snapshot, sink)
                manifest["diff"] = {
                    "path": diff_path(ds.name, manifest["snapshot_id"]).split("/", 1)[1],
                    "size": sink.size,
                    "sha256": sink.sha256.hexdigest(),
                    "counts": counts,
                }
            path = cv.dataset_version(ds.name, MANIFEST, created)
            digest = manifest_hash(manifest)
            written = [path, cv.dataset_version(ds.name, cv.INDEX, created)]
            if "path" in manifest["diff"]:
                written.append(cv.dataset_path(ds.name, manifest["diff"]["path"]))
                ds.store.put_file(written[-1], diff_file)
        ds.store.write_text(written[1], index_text)
        ds.store.put_if_absent(path, json.dumps(manifest, indent=1, ensure_ascii=False).encode())
        faults.point("publish.after_files")
        entry = {"sequence": manifest["sequence"], "path": path, "hash": digest}
        if not ds.store.put_if_absent(
            chain_entry_path(ds.name, manifest["sequence"]), canonical_json(entry)
        ):
            log.info(
                "%s: version %d was published by another writer; retrying on it",
                ds.name,
                manifest["sequence"],
            )
            for stale in written:
                ds.store.delete(stale)
            continue
        faults.point("publish.after_entry")
        version = Version(manifest["sequence"], path, digest, manifest)
        _finish(ds, version)
        result.version = version
        result.diff = manifest["diff"]
        ds.lake.write_catalog(snapshot=True)
        return result
    raise ConcurrentWriteError(
        f"Dataset {ds.name!r}: lost the race to publish a version {PUBLISH_ATTEMPTS} times; "
        "run `make` again"
    )


def publish_relayout(
    ds: Dataset, snapshot: DatasetSnapshot, parent: Version, operation: str
) -> PublishResult:
    """Publish ``snapshot``, a rewrite of ``parent``'s tables that kept every live
    statement (compact, optimize), so that the files readers now read are
    covered by the head: the parent's logical hash, exports and ``index.json``
    carried over (the exports render the same statements), the new files
    hashed. Skipped when another version was published meanwhile, or when the
    parent's published ``index.json`` is not what it recorded (verify says so).
    """
    published = next((e for e in parent.manifest["exports"] if e["kind"] == "index"), None)
    copy = cv.dataset_version(ds.name, cv.INDEX, parent.created_at)
    if published is None or not ds.store.exists(copy) or sha256_of(ds, copy) != published["sha256"]:
        return PublishResult(
            skipped=f"version {parent.sequence}'s index.json is missing or altered: "
            "run `lakehouse verify`"
        )
    # the hashes the parent recorded (a file altered since keeps failing verify)
    known: dict[str, Any] = {
        e["path"]: {"path": e["path"], "size": e["size"], "sha256": e["sha256"]}
        for e in parent.manifest["exports"]
        if e["kind"] != "index"
    }
    return publish(
        ds,
        snapshot,
        index_text=ds.store.read_text(copy),
        statements_fresh=False,
        metadata={"operation": operation},
        known_exports=known,
        logical=str(parent.manifest["logical_hash"]),
        parent_hash=parent.hash,
    )


def published_intact(ds: Dataset, kind: str) -> bool:
    """Whether the export ``kind`` (or the live ``index.json``) is byte for byte
    what the head's manifest recorded: the condition, beside the tags, for an
    export to count as fresh. Tags are lake files like any other, so they
    never excuse a difference; an export the head does not list (written
    after it) is not fresh either. With nothing published, nothing to hold
    the file to: the tags decide, and the first version records it.
    """
    from lakehouse_assets.freshness import EXPORTS, INDEX

    try:
        version = head(ds)
    except (LakehouseError, ValueError, KeyError):
        return False
    if version is None:
        return True
    rel = EXPORTS[kind][0]
    entry = next((e for e in version.manifest.get("exports", []) if e["path"] == rel), None)
    full = cv.dataset_path(ds.name, rel)
    if entry is None or not ds.store.exists(full) or ds.store.size(full) != entry["size"]:
        return False
    if kind == INDEX:  # and the pointer names the head (make writes it again)
        latest = latest_path(ds.name)
        if not ds.store.exists(latest):
            return False
        try:
            if json.loads(ds.store.read_text(latest)).get("hash") != version.hash:
                return False
        except (ValueError, AttributeError):
            return False
    return sha256_of(ds, full) == str(entry["sha256"])


def covers(version: Version, snapshot: DatasetSnapshot) -> bool:
    """Whether ``version``'s manifest names exactly the data files of ``snapshot``."""
    files = table_files(version.manifest)
    return files.get("statements", set()) == {
        f.path for f in snapshot.statements.files
    } and files.get("translog", set()) == {f.path for f in snapshot.translog.files}


def _finish(ds: Dataset, version: Version) -> None:
    """What follows a chain entry, idempotent: the Delta tag, the diffs' index, latest."""
    _tag_delta(ds, version)
    faults.point("publish.after_tag")
    index_path = diff_index_path(ds.name)
    index: dict[str, Any] = (
        json.loads(ds.store.read_text(index_path))
        if ds.store.exists(index_path)
        else {"dataset": ds.name, "format": "entities.ftm.json delta", "diffs": []}
    )
    if not any(d["sequence"] == version.sequence for d in index["diffs"]):
        index["diffs"].append(
            {
                "sequence": version.sequence,
                "snapshot_id": version.snapshot_id,
                "version_hash": version.hash,
                "parent_sequence": version.sequence - 1 if version.sequence > 1 else None,
                "parent_hash": version.manifest["parent_hash"],
                **version.manifest.get("diff", {}),
            }
        )
        index["diffs"].sort(key=lambda d: d["sequence"])
        ds.store.write_text(index_path, json.dumps(index, indent=1))
    # the live index.json is the head's, written only here (after the chain entry)
    published = next((e for e in version.manifest["exports"] if e["kind"] == "index"), None)
    live = cv.dataset_path(ds.name, cv.INDEX)
    if published is not None and (
        not ds.store.exists(live) or sha256_of(ds, live) != published["sha256"]
    ):
        copy = cv.dataset_version(ds.name, cv.INDEX, version.created_at)
        if ds.store.exists(copy):
            ds.store.write_bytes(live, ds.store.read_bytes(copy))
    latest = latest_path(ds.name)
    current = json.loads(ds.store.read_text(latest)) if ds.store.exists(latest) else None
    if current is None or int(current["sequence"]) < version.sequence:
        entry = {"sequence": version.sequence, "path": version.path, "hash": version.hash}
        ds.store.write_text(latest, json.dumps(entry))


def _tag_delta(ds: Dataset, version: Version) -> None:
    """The translog commit that carries ``version``'s manifest hash (idempotent)."""
    location = ds.translog_table
    table = location.table()
    if table is None:
        return
    done = table.transaction_version(VERSION_APP_ID)
    if done is not None and done >= version.sequence:
        return
    with ds.table_lock("publish"):
        commit(
            location,
            [],
            schema=TRANSLOG_SCHEMA,
            app_id=VERSION_APP_ID,
            app_version=version.sequence,
            metadata={META_HASH: version.hash, META_SEQUENCE: version.sequence},
            publishes=_published(location),
        )


def _published(location: DeltaLocation) -> int | None:
    from lakehouse_assets.tables.delta import PUBLISHED_APP_ID

    table = location.table()
    return None if table is None else table.transaction_version(PUBLISHED_APP_ID)


def delta_tags(ds: Dataset) -> dict[int, str]:
    """sequence → manifest hash, as the translog's commit metadata records them."""
    table = ds.translog_table.table()
    if table is None:
        return {}
    found: dict[int, str] = {}
    for info in table.history():
        if META_HASH in info and META_SEQUENCE in info:
            found[int(info[META_SEQUENCE])] = str(info[META_HASH])
    return found


# --- diffs --------------------------------------------------------------------


def changed_translog_rows(
    ds: Dataset, old: DatasetSnapshot | None, new: DatasetSnapshot
) -> tuple[pa.Table, pa.Table]:
    """Translog rows (origin, id, bucket) that differ between two snapshots.

    Only the files one snapshot has and the other has not are read (the
    translog is rewritten a bucket range at a time), and rows equal on both
    sides are dropped, so compact and optimize produce no changes.
    Returns (rows of the new side, rows of the old side).
    """
    options = ds.statements_table.storage_options
    old_files = {f.path: f for f in (old.translog.files if old else ())}
    new_files = {f.path: f for f in new.translog.files}
    added = [f for p, f in new_files.items() if p not in old_files]
    removed = [f for p, f in old_files.items() if p not in new_files]
    new_side = arrow_dataset(added, TRANSLOG_SCHEMA, options)  # noqa: F841 (DuckDB reads it)
    old_side = arrow_dataset(removed, TRANSLOG_SCHEMA, options)  # noqa: F841
    # timestamps compared with NULL as '' (a live row, deleted_at NULL, equals itself);
    # DuckDB's parallel hash join: pyarrow's took 21 s of a 10M-row diff, this ~3 s
    cols = ["origin", "id", "bucket", "deleted_at", "first_seen", "last_seen"]
    times = ("deleted_at", "first_seen", "last_seen")

    def side(name: str, alias: str) -> str:
        fields = ", ".join(f"coalesce({c}, '') AS {c}" if c in times else c for c in cols)
        return f"{alias} AS (SELECT {fields} FROM {name})"

    differs = " OR ".join(f"n.{c} <> o.{c}" for c in cols if c not in ("origin", "id"))
    picked = ", ".join([*(f"n.{c} AS n_{c}" for c in cols), *(f"o.{c} AS o_{c}" for c in cols)])
    con = duckdb.connect(config={"threads": 2})
    try:
        changed = con.execute(
            f"WITH {side('new_side', 'n')}, {side('old_side', 'o')} "
            f"SELECT {picked} FROM n FULL OUTER JOIN o ON n.origin = o.origin AND n.id = o.id "
            f"WHERE n.id IS NULL OR o.id IS NULL OR {differs}"
        ).to_arrow_table()
    finally:
        con.close()
    schema = pa.schema([pa.field(c, TRANSLOG_SCHEMA.field(c).type) for c in cols])

    def rows(prefix: str) -> pa.Table:
        present = changed.filter(pc.is_valid(changed.column(f"{prefix}_id")))
        return pa.table([present.column(f"{prefix}_{c}") for c in cols], names=cols).cast(schema)

    return rows("n"), rows("o")


def _canonical_ids(ds: Dataset, snapshot: DatasetSnapshot | None, rows: pa.Table) -> set[str]:
    from lakehouse_assets.query import rows_by_id

    if snapshot is None or rows.num_rows == 0:
        return set()
    found = rows_by_id(ds, snapshot, rows, columns=["canonical_id"])
    return set(pc.unique(found.column("canonical_id")).to_pylist())


def _entities(
    ds: Dataset, snapshot: DatasetSnapshot | None, ids: list[str]
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
    ds: Dataset, old: DatasetSnapshot | None, new: DatasetSnapshot
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
    ds: Dataset, old: DatasetSnapshot | None, new: DatasetSnapshot, out: IO[bytes] | _Digest
) -> dict[str, int]:
    """Write the delta file between two snapshots (JSON lines, one per changed
    entity) to ``out``; its counts."""
    counts = {"ADD": 0, "MOD": 0, "DEL": 0}
    for change in entity_changes(ds, old, new):
        counts[change["op"]] += 1
        out.write(orjson.dumps(change) + b"\n")
    return counts


def diff_from_export(ds: Dataset, out: IO[bytes] | _Digest) -> dict[str, int]:
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


# --- verify -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing verify found wrong: which version, which file, what."""

    version: int | None
    file: str
    message: str

    def __str__(self) -> str:
        where = f"version {self.version}" if self.version is not None else "chain"
        return f"{where}: {self.file}: {self.message}"


@dataclass(slots=True)
class VerifyReport:
    """What ``lakehouse verify`` checked and found."""

    dataset: str
    versions: int = 0
    head: str | None = None
    files_hashed: int = 0
    bytes_hashed: int = 0
    deep: bool = False
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "dataset": self.dataset,
            "ok": self.ok,
            "versions": self.versions,
            "head": self.head,
            "files_hashed": self.files_hashed,
            "bytes_hashed": self.bytes_hashed,
            "deep": self.deep,
            "problems": [str(p) for p in self.problems],
            "notes": self.notes,
        }


class _Hasher:
    """Hashes each lake file once per verify (versions share their data files)."""

    def __init__(self, ds: Dataset, report: VerifyReport) -> None:
        self.ds = ds
        self.report = report
        self.cache: dict[str, str | None] = {}

    def sha256(self, path: str) -> str | None:
        if path not in self.cache:
            if not self.ds.store.exists(path):
                self.cache[path] = None
            else:
                self.cache[path] = sha256_of(self.ds, path)
                self.report.files_hashed += 1
                self.report.bytes_hashed += self.ds.store.size(path)
        return self.cache[path]


def _chain_entries(ds: Dataset, report: VerifyReport) -> list[tuple[int, dict[str, Any]]]:
    prefix = cv.dataset_path(ds.name, cv.VERSIONS, CHAIN) + "/"
    entries = []
    for path in sorted(ds.store.list(prefix)):
        name = path.rsplit("/", 1)[-1]
        stem = name.removesuffix(".json")
        if not stem.isdigit():
            report.problems.append(Problem(None, path, "unexpected file in the chain"))
            continue
        try:
            entry = json.loads(ds.store.read_text(path))
            assert isinstance(entry, dict) and {"sequence", "path", "hash"} <= set(entry)
        except (ValueError, AssertionError):
            report.problems.append(Problem(int(stem), path, "chain entry is not valid"))
            continue
        if int(entry["sequence"]) != int(stem):
            report.problems.append(
                Problem(int(stem), path, f"chain entry says sequence {entry['sequence']}")
            )
        entries.append((int(stem), entry))
    return entries


def verify(ds: Dataset, *, deep: bool = False, trusted_head: str | None = None) -> VerifyReport:
    """Replay the chain and re-hash what it references (see the module docstring).

    - the chain: sequence numbers 1..N without gaps, each manifest's hash as its
      entry records it, parent hashes and snapshot ids linking each version to
      the one before, creation times strictly increasing, ``latest.json`` and
      (if given) a hash the caller trusts naming the head;
    - the Delta history: each version's hash in the translog's commit metadata,
      the log entries each manifest hashed;
    - the anchor: the newest version a translog commit carries is the chain's
      head (a version removed from the chain, with its files, pointer and
      catalog entry, is still anchored in the Delta history);
    - the files: every data file a version references (one a later version
      replaced may be gone only if a vacuum is on record), the head's exports
      and live ``index.json`` byte for byte (no tag excuses a difference),
      every version's published ``index.json`` and diff;
    - what readers read now (:mod:`lakehouse_assets.verify_coverage`): every
      commit after the head made by a lakehouse operation, every file of the
      current snapshot named by the head or added by such a commit, the graph
      index's state and files, the diffs' index, the catalog and its snapshots;
    - with ``deep``, the head's logical hash recomputed from the tables.
    """
    report = VerifyReport(ds.name, deep=deep)
    hasher = _Hasher(ds, report)
    entries = _chain_entries(ds, report)
    report.versions = len(entries)
    if not entries:
        if trusted_head:
            report.problems.append(Problem(None, "versions/", "no versions, but a head was given"))
        return report
    versions: list[Version] = []
    previous: Version | None = None
    expected = 1
    for seq, entry in entries:
        if seq != expected:
            report.problems.append(
                Problem(seq, chain_entry_path(ds.name, seq), f"sequence gap: expected {expected}")
            )
        expected = seq + 1
        path = str(entry["path"])
        if not ds.store.exists(path):
            report.problems.append(Problem(seq, path, "manifest is missing"))
            previous = None
            continue
        try:
            manifest = json.loads(ds.store.read_text(path))
        except ValueError:
            report.problems.append(Problem(seq, path, "manifest is not valid JSON"))
            previous = None
            continue
        version = Version(seq, path, str(entry["hash"]), manifest)
        if manifest_hash(manifest) != entry["hash"]:
            report.problems.append(
                Problem(seq, path, "manifest was altered: its hash differs from the chain's")
            )
        _check_links(ds, version, previous, report)
        versions.append(version)
        previous = version
    head_version = versions[-1] if versions else None
    report.head = entries[-1][1]["hash"]
    _check_pointer(ds, entries, trusted_head, report)
    try:
        tags = delta_tags(ds)
    except Exception as exc:  # a broken Delta log
        report.problems.append(Problem(None, cv.TRANSLOG_TABLE, f"Delta log unreadable: {exc}"))
        tags = {}
    newest = max(tags, default=0)
    if newest > entries[-1][0]:
        # the translog still anchors a version the chain no longer has: rolled back
        report.problems.append(
            Problem(
                newest,
                cv.TRANSLOG_TABLE,
                f"a Delta commit anchors version {newest} ({tags[newest][:17]}…) but the "
                f"chain ends at version {entries[-1][0]}: versions were removed",
            )
        )
    for version in versions:
        tagged = tags.get(version.sequence)
        if tagged is None:
            report.problems.append(
                Problem(version.sequence, cv.TRANSLOG_TABLE, "no Delta commit carries this version")
            )
        elif tagged != version.hash:
            report.problems.append(
                Problem(
                    version.sequence,
                    cv.TRANSLOG_TABLE,
                    f"the Delta commit metadata names another manifest ({tagged[:17]}…)",
                )
            )
    try:
        latest = ds.snapshot()
        current = {
            "statements": {f.path for f in latest.statements.files},
            "translog": {f.path for f in latest.translog.files},
        }
    except Exception as exc:  # a broken Delta log
        report.problems.append(Problem(None, "tables", f"Delta log unreadable: {exc}"))
        current = {}
    from lakehouse_assets.verify_coverage import vacuumable

    vacuumed = {
        name: vacuumable(
            ds,
            _table_dir(name),
            location,
            head_version.table_version(name) if head_version is not None else None,
        )
        for name, location in (("statements", ds.statements_table), ("translog", ds.translog_table))
    }
    for version in versions:
        _check_files(ds, version, current, vacuumed, hasher, report)
    if head_version is not None:
        from lakehouse_assets import verify_coverage

        _check_head_tables(ds, head_version, report)
        _check_exports(ds, head_version, hasher, report)
        verify_coverage.check_after_head(ds, head_version, report)
        verify_coverage.check_graph(ds, head_version, hasher.sha256, report)
        verify_coverage.check_diff_index(ds, versions, report)
        verify_coverage.check_catalog(ds, versions, report)
        if deep:
            try:
                snapshot = snapshot_at(ds, head_version)
                logical, _ = logical_hash(ds, snapshot)
            except LakehouseError as exc:
                report.problems.append(Problem(head_version.sequence, "tables", str(exc)))
            except Exception as exc:  # unreadable Parquet, say
                report.problems.append(
                    Problem(head_version.sequence, "tables", f"cannot be read: {exc}")
                )
            else:
                if logical != head_version.manifest.get("logical_hash"):
                    report.problems.append(
                        Problem(
                            head_version.sequence,
                            cv.STATEMENTS_TABLE,
                            "the live statements do not hash to the manifest's logical hash",
                        )
                    )
    return report


def _check_links(
    ds: Dataset, version: Version, previous: Version | None, report: VerifyReport
) -> None:
    m, seq, path = version.manifest, version.sequence, version.path
    if m.get("schema") != MANIFEST_SCHEMA:
        report.problems.append(Problem(seq, path, f"unknown manifest schema {m.get('schema')}"))
    if m.get("dataset") != ds.name:
        report.problems.append(Problem(seq, path, f"manifest of dataset {m.get('dataset')!r}"))
    if m.get("sequence") != seq:
        report.problems.append(Problem(seq, path, f"manifest says sequence {m.get('sequence')}"))
    if not isinstance(m.get("metadata"), dict):
        report.problems.append(Problem(seq, path, "metadata object is missing"))
    try:
        created = datetime.fromisoformat(str(m.get("created_at")))
    except ValueError:
        report.problems.append(Problem(seq, path, "creation time is not a time"))
        return
    if cv.path_timestamp(created) != m.get("snapshot_id") or str(m.get("snapshot_id")) not in path:
        report.problems.append(Problem(seq, path, "snapshot id does not match its time and path"))
    if seq == 1:
        if m.get("parent_hash") is not None:
            report.problems.append(Problem(seq, path, "first version names a parent"))
        return
    if previous is None or previous.sequence != seq - 1:
        return  # the gap or broken parent was reported
    if m.get("parent_hash") != previous.hash:
        report.problems.append(
            Problem(seq, path, "parent hash does not match the previous version's manifest")
        )
    if m.get("parent_snapshot_id") != previous.snapshot_id:
        report.problems.append(Problem(seq, path, "parent snapshot id does not match"))
    if created <= previous.created_at:
        report.problems.append(
            Problem(seq, path, "created before its parent: time must increase along the chain")
        )


def _check_pointer(
    ds: Dataset,
    entries: list[tuple[int, dict[str, Any]]],
    trusted_head: str | None,
    report: VerifyReport,
) -> None:
    by_seq = dict(entries)
    latest = latest_path(ds.name)
    if not ds.store.exists(latest):
        # the pointer may lag but never lie; a missing one names no head at all
        # (a publish interrupted before it, or removed): make writes it again
        report.problems.append(Problem(None, latest, "head pointer is missing (run make)"))
    else:
        try:
            pointer = json.loads(ds.store.read_text(latest))
            seq = int(pointer["sequence"])
        except (ValueError, KeyError, TypeError):
            report.problems.append(Problem(None, latest, "not a valid pointer"))
        else:
            entry = by_seq.get(seq)
            if entry is None or entry["hash"] != pointer.get("hash"):
                report.problems.append(
                    Problem(seq, latest, "points at a manifest the chain does not have")
                )
            elif seq < entries[-1][0]:
                report.notes.append(
                    f"latest.json lags: it names {seq}, the head is {entries[-1][0]}"
                )
    if trusted_head and entries[-1][1]["hash"] != trusted_head:
        report.problems.append(
            Problem(
                entries[-1][0], "versions/", f"the head is not the trusted {trusted_head[:17]}…"
            )
        )


def _check_files(
    ds: Dataset,
    version: Version,
    current: Mapping[str, set[str]],
    vacuumed: Mapping[str, Callable[[str], bool]],
    hasher: _Hasher,
    report: VerifyReport,
) -> None:
    seq = version.sequence
    for name, table in version.manifest.get("tables", {}).items():
        root = _table_dir(name)
        for entry in table.get("log", []):
            path = cv.dataset_path(ds.name, root, entry["path"])
            sha = hasher.sha256(path)
            if sha is None:
                report.problems.append(Problem(seq, path, "Delta log entry is missing"))
            elif sha != entry["sha256"]:
                report.problems.append(Problem(seq, path, "Delta log entry was rewritten"))
        for entry in table.get("files", []):
            path = cv.dataset_path(ds.name, root, entry["path"])
            sha = hasher.sha256(path)
            if sha is None:
                if entry["path"] in current.get(name, set()):
                    report.problems.append(Problem(seq, path, "data file is missing"))
                elif not vacuumed[name](entry["path"]):
                    report.problems.append(
                        Problem(seq, path, "data file is missing and no vacuum removed it")
                    )
                continue  # replaced by a later version and vacuumed: expected
            if sha != entry["sha256"]:
                report.problems.append(Problem(seq, path, "data file content differs"))
    index = cv.dataset_version(ds.name, cv.INDEX, version.created_at)
    published = next((e for e in version.manifest.get("exports", []) if e["kind"] == "index"), None)
    if published is not None:
        sha = hasher.sha256(index)
        if sha is None:
            report.problems.append(Problem(seq, index, "published index.json is missing"))
        elif sha != published["sha256"]:
            report.problems.append(Problem(seq, index, "published index.json differs"))
    diff = version.manifest.get("diff") or {}
    if "path" in diff:
        path = cv.dataset_path(ds.name, diff["path"])
        sha = hasher.sha256(path)
        if sha is None:
            report.problems.append(Problem(seq, path, "diff is missing"))
        elif sha != diff["sha256"]:
            report.problems.append(Problem(seq, path, "diff differs"))


def _check_head_tables(ds: Dataset, version: Version, report: VerifyReport) -> None:
    """The Delta log at the head's versions lists exactly the files the manifest names."""
    for name, location in (("statements", ds.statements_table), ("translog", ds.translog_table)):
        entry = version.manifest.get("tables", {}).get(name)
        if entry is None:
            continue
        try:
            dt = location.table(int(entry["version"]))
        except Exception as exc:
            report.problems.append(
                Problem(version.sequence, _table_dir(name), f"Delta log cannot be read: {exc}")
            )
            continue
        if dt is None:
            report.problems.append(Problem(version.sequence, _table_dir(name), "table is gone"))
            continue
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
        listed = {(str(a["path"]), int(a["size_bytes"])) for a in actions}
        named = {(f["path"], int(f["size"])) for f in entry.get("files", [])}
        for path, _ in sorted(listed - named):
            report.problems.append(
                Problem(
                    version.sequence, f"{_table_dir(name)}/{path}", "data file not in the manifest"
                )
            )
        for path, _ in sorted(named - listed):
            report.problems.append(
                Problem(
                    version.sequence, f"{_table_dir(name)}/{path}", "data file not in the Delta log"
                )
            )


def _check_exports(ds: Dataset, version: Version, hasher: _Hasher, report: VerifyReport) -> None:
    """The head's exports and live ``index.json``, byte for byte as it recorded them.

    No tag excuses a difference: tags are files of the lake like any other, so
    an export rewritten after the head (by a run that has not published yet)
    is reported too; ``make`` rewrites such a file and publishes.
    """
    for entry in version.manifest.get("exports", []):
        path = cv.dataset_path(ds.name, entry["path"])
        sha = hasher.sha256(path)
        if sha == entry["sha256"]:
            continue
        report.problems.append(
            Problem(
                version.sequence,
                path,
                "export is missing"
                if sha is None
                else "export differs from the head's manifest (tampered, or written after "
                "it and not published: run make)",
            )
        )


# --- provenance ---------------------------------------------------------------


def _statement_rows(ds: Dataset, key: str, snapshot: DatasetSnapshot) -> pa.Table:
    """Every stored statement (live or deleted) of entity ``key``, or with statement id
    ``key``, with its translog row.

    An entity id prunes to one bucket (an entity's statements share it); a
    statement id, a hash no file's range narrows, is found by the files'
    bloom filters (:func:`tables.point_lookup`).
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

    def __init__(self, ds: Dataset, keys: pa.Table) -> None:
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


def _source(ds: Dataset, origin: str, canonical_id: str) -> dict[str, Any]:
    """Where statements of ``origin`` came from: the archived file, the mapping, the crawl."""
    from lakehouse_assets.crawl import CRAWL_JOB
    from lakehouse_assets.jobs import list_runs
    from lakehouse_assets.mappings import mapping_origin

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
    for mapping in ds.mappings():
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


def trace(ds: Dataset, key: str) -> list[dict[str, Any]]:
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
