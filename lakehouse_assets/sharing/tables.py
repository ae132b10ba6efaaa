"""The shared tables of a dataset, read with delta-rs: versions, metadata, files, changes.

A schema of the share is a dataset; its tables are the dataset's Delta tables
that exist (``statements``, ``translog`` and ``changes``, the flush's change
feed). Everything here reads the Delta log and nothing else: the rows stay
in their Parquet files, which the recipient fetches through signed URLs.

**The change data feed, honestly.** Our tables are written without Delta's
``delta.enableChangeDataFeed`` (no ``_change_data`` files), so a change can
only be told from the log's ``add`` and ``remove`` actions. An ``add`` with
``dataChange`` is exactly the rows inserted; a compaction's rewrite
(``dataChange: false``) changes no row; but a ``remove`` with ``dataChange``
would make every row of the removed file a "delete", although most of them
live on in the file that replaced it. So :func:`changes` serves a version
range only when no commit in it removes data (a table with the feed enabled:
its ``cdc`` files too), and refuses with a message naming the first version
that does. The ``changes`` table, the flush's own change feed, is always
shareable as a table.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final
from urllib.parse import unquote

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from lakehouse_assets import conventions as cv
from lakehouse_assets.context import DatasetContext
from lakehouse_assets.sharing.recipients import SharingError
from lakehouse_assets.tables.delta import DeltaLocation, add_actions_table

#: shared table name → the dataset's table folder
TABLES: Final[dict[str, str]] = {
    "statements": cv.STATEMENTS_TABLE,
    "translog": cv.TRANSLOG_TABLE,
    "changes": cv.CHANGES_TABLE,
}
#: The protocol's only reader version (PROTOCOL.md, "Protocol").
PROTOCOL_LINE: Final = {"protocol": {"minReaderVersion": 1}}


def location(ds: DatasetContext, table: str) -> DeltaLocation:
    if table == "statements":
        return ds.statements_table
    if table == "translog":
        return ds.translog_table
    return ds.changes_table


def existing_tables(ds: DatasetContext) -> list[str]:
    """The dataset's tables that have a first commit, in a stable order."""
    return [name for name in TABLES if location(ds, name).exists()]


def open_table(
    ds: DatasetContext, table: str, *, version: int | None = None, timestamp: str | None = None
) -> DeltaTable:
    """The table at the head, at ``version`` or at the last version committed at or
    before ``timestamp`` (ISO 8601); a 404/400 :class:`SharingError` otherwise."""
    if table not in TABLES:
        raise SharingError(404, "RESOURCE_DOES_NOT_EXIST", f"no table {table!r} in this schema")
    where = location(ds, table)
    try:
        dt = DeltaTable(where.uri, storage_options=dict(where.storage_options))
    except TableNotFoundError:
        raise SharingError(
            404, "RESOURCE_DOES_NOT_EXIST", f"table {table!r} has no data yet"
        ) from None
    if version is not None and timestamp is not None:
        raise SharingError(400, "INVALID_PARAMETER_VALUE", "give version or timestamp, not both")
    try:
        if version is not None:
            if version < 0 or version > dt.version():
                raise SharingError(
                    400, "INVALID_PARAMETER_VALUE", f"version {version} of 0..{dt.version()}"
                )
            dt.load_as_version(version)
        elif timestamp is not None:
            dt.load_as_version(parse_timestamp(timestamp))
    except DeltaError as exc:
        # an old version vacuumed away, a time before the first commit
        raise SharingError(
            400, "INVALID_PARAMETER_VALUE", f"cannot read that version: {exc}"
        ) from None
    return dt


def parse_timestamp(text: str) -> datetime:
    """The protocol's timestamps (``2022-01-01T00:00:00Z``, offsets allowed)."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise SharingError(
            400, "INVALID_PARAMETER_VALUE", f"timestamp {text!r} is not ISO 8601"
        ) from None
    if when.tzinfo is None:
        raise SharingError(400, "INVALID_PARAMETER_VALUE", "a timestamp needs its zone (Z)")
    return when


def metadata_line(dt: DeltaTable, *, with_version: bool = False) -> dict[str, Any]:
    """The table's ``metaData`` line (parquet response format)."""
    meta = dt.metadata()
    out: dict[str, Any] = {
        "id": meta.id,
        "format": {"provider": "parquet"},
        "schemaString": dt.schema().to_json(),
        "partitionColumns": list(meta.partition_columns),
        "configuration": dict(meta.configuration),
    }
    if meta.name:
        out["name"] = meta.name
    if meta.description:
        out["description"] = meta.description
    if with_version:
        out["version"] = dt.version()
    return {"metaData": out}


@dataclass(frozen=True, slots=True)
class TableFile:
    """A data file of a snapshot or of a change: its path in the table folder."""

    path: str
    size: int
    partition_values: dict[str, str | None]
    stats: str | None = None
    #: for changes: the commit's version and time (ms), and the action kind
    version: int | None = None
    timestamp: int | None = None
    kind: str = "file"
    extra: dict[str, Any] = field(default_factory=dict)
    #: the add action's ``modificationTime`` (ms), which the delta response format carries
    modified: int = 0


def snapshot_files(dt: DeltaTable) -> list[TableFile]:
    """The add actions of the table's loaded version, with their row counts."""
    actions = add_actions_table(dt).to_pylist()
    partitions = list(dt.metadata().partition_columns)
    files = []
    for row in actions:
        values = {c: _partition_text(row.get(f"partition.{c}")) for c in partitions}
        stats = None
        if row.get("num_records") is not None:
            stats = json.dumps({"numRecords": int(row["num_records"])})
        modified = int(row.get("modification_time") or 0)
        files.append(
            TableFile(
                unquote(row["path"]), int(row["size_bytes"]), values, stats, modified=modified
            )
        )
    return files


def delta_protocol_line(dt: DeltaTable) -> dict[str, Any]:
    """The table's ``protocol`` line in the delta response format: its own Delta protocol."""
    protocol = dt.protocol()
    out: dict[str, Any] = {
        "minReaderVersion": protocol.min_reader_version,
        "minWriterVersion": protocol.min_writer_version,
    }
    if protocol.reader_features:
        out["readerFeatures"] = list(protocol.reader_features)
    if protocol.writer_features:
        out["writerFeatures"] = list(protocol.writer_features)
    return {"protocol": {"deltaProtocol": out}}


def delta_metadata_line(dt: DeltaTable) -> dict[str, Any]:
    """The table's ``metaData`` line in the delta response format: its Delta metadata
    action, with the version it describes."""
    meta = dt.metadata()
    delta: dict[str, Any] = {
        "id": meta.id,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": dt.schema().to_json(),
        "partitionColumns": list(meta.partition_columns),
        "configuration": dict(meta.configuration),
        "createdTime": meta.created_time,
    }
    if meta.name:
        delta["name"] = meta.name
    if meta.description:
        delta["description"] = meta.description
    return {"metaData": {"version": dt.version(), "deltaMetadata": delta}}


def _partition_text(value: Any) -> str | None:
    return None if value is None else str(value)


def _commit(ds: DatasetContext, table: str, version: int) -> list[dict[str, Any]]:
    path = cv.dataset_path(ds.name, TABLES[table], "_delta_log", f"{version:020d}.json")
    try:
        text = ds.store.read_bytes(path)
    except (FileNotFoundError, KeyError, OSError):
        raise SharingError(
            400,
            "INVALID_PARAMETER_VALUE",
            f"version {version}'s commit is no longer in the log (cleaned up): "
            "start the changes later",
        ) from None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def changes(
    ds: DatasetContext, table: str, dt: DeltaTable, start: int, end: int
) -> Iterator[TableFile]:
    """The data changes of versions ``start..end`` (inclusive) as ``add`` and ``cdf``
    files; a 400 :class:`SharingError` for a range that removes data (see above)."""
    cdf_enabled = dt.metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    for version in range(start, end + 1):
        actions = _commit(ds, table, version)
        when = next((int(a["commitInfo"]["timestamp"]) for a in actions if "commitInfo" in a), None)
        has_cdc = any("cdc" in a for a in actions)
        for action in actions:
            if "remove" in action and action["remove"].get("dataChange", True) and not has_cdc:
                raise SharingError(
                    400,
                    "INVALID_PARAMETER_VALUE",
                    f"table {table!r} has no change data feed (delta.enableChangeDataFeed) "
                    f"and version {version} removes data: its changes cannot be told row by "
                    "row. Read the versions as snapshots, or the 'changes' table "
                    f"(cdf enabled: {cdf_enabled})",
                )
        for action in actions:
            kind = "cdf" if "cdc" in action else "add" if "add" in action else None
            if kind is None:
                continue
            body = action["cdc" if kind == "cdf" else "add"]
            if kind == "add" and (has_cdc or not body.get("dataChange", True)):
                continue  # the cdc files say it, or a rewrite that changes no row
            stamp = when if when is not None else int(body.get("modificationTime", 0))
            yield TableFile(
                unquote(body["path"]),
                int(body["size"]),
                dict(body.get("partitionValues") or {}),
                body.get("stats"),
                version=version,
                timestamp=stamp,
                kind=kind,
            )


def version_at(dt: DeltaTable, timestamp: str) -> int:
    """The first version committed at or after ``timestamp`` (a changes range's start)."""
    when = parse_timestamp(timestamp)
    ms = int(when.timestamp() * 1000)
    for entry in sorted(dt.history(), key=lambda e: int(e["version"])):
        if int(entry["timestamp"]) >= ms:
            return int(entry["version"])
    raise SharingError(400, "INVALID_PARAMETER_VALUE", f"no version after {timestamp}")
