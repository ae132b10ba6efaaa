"""What a materialization tells an operator: counts, versions, URIs, sizes.

Helpers that turn library results and Delta logs into Dagster metadata, so the
asset functions stay a few lines each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import pyarrow as pa

from lakehouse_assets import conventions as cv
from lakehouse_assets.freshness import EXPORTS, INDEX
from lakehouse_assets.lake import Dataset
from lakehouse_assets.tables.delta import DeltaLocation, add_actions

#: Dagster's tag for a reported event's data version (what staleness compares).
DATA_VERSION_TAG = "dagster/data_version"


@dataclass
class TableSummary:
    """A Delta table's current version, as its log describes it (no data read)."""

    uri: str
    version: int | None = None
    rows: int = 0
    files: int = 0
    bytes: int = 0
    rows_by_origin: Counter[str] = field(default_factory=Counter)


def table_summary(location: DeltaLocation) -> TableSummary:
    summary = TableSummary(uri=location.uri)
    table = location.table()
    if table is None:
        return summary
    summary.version = table.version()
    actions = add_actions(table)
    for action in actions:
        rows = int(action.get("num_records") or 0)
        summary.rows += rows
        summary.files += 1
        summary.bytes += int(action.get("size_bytes") or 0)
        origin = action.get("partition.origin")
        if origin is not None:
            summary.rows_by_origin[str(origin)] += rows
    return summary


def markdown_table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    head = list(header)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def column_schema(schema: pa.Schema) -> dg.TableSchema:
    """A Delta table's columns as Dagster shows them (``dagster/column_schema``)."""
    return dg.TableSchema(
        columns=[dg.TableColumn(name=f.name, type=str(f.type), constraints=None) for f in schema]
    )


def table_metadata(summary: TableSummary, schema: pa.Schema | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "dagster/uri": summary.uri,
        # the dataset's table (one partition of the asset): both names, so the UI's
        # row count column and the partition views show it
        "dagster/row_count": summary.rows,
        "dagster/partition_row_count": summary.rows,
        "delta_version": summary.version if summary.version is not None else -1,
        "files": summary.files,
        "size_bytes": summary.bytes,
    }
    if schema is not None:
        meta["dagster/column_schema"] = column_schema(schema)
    if summary.rows_by_origin:
        meta["rows_by_origin"] = dg.MetadataValue.md(
            markdown_table(["origin", "rows"], sorted(summary.rows_by_origin.items()))
        )
    return meta


def schema_distribution(stats: Mapping[str, Any]) -> str | None:
    """ftmq's ``DatasetStats`` schemata counts as a Markdown table."""
    items = []
    for group in ("things", "intervals"):
        for item in (stats.get(group) or {}).get("schemata") or []:
            items.append((item.get("name"), item.get("count", 0)))
    if not items:
        return None
    items.sort(key=lambda kv: (-int(kv[1] or 0), str(kv[0])))
    return markdown_table(["schema", "entities"], items)


def export_metadata(ds: Dataset, kind: str, written: Mapping[str, Any] | None) -> dict[str, Any]:
    """Metadata of one export file, whether it was rewritten now or was fresh."""
    path, tag, mime = EXPORTS[kind]
    full = cv.dataset_path(ds.name, path)
    meta: dict[str, Any] = {
        "dagster/uri": ds.store.full_uri(full),
        "path": path,
        "mime_type": mime,
        "rewritten": written is not None,
    }
    if ds.store.exists(full):
        meta["size_bytes"] = ds.store.size(full)
    rows = written.get("rows") if written is not None else last_written_rows(ds, kind)
    if isinstance(rows, int):
        meta["dagster/row_count"] = rows
        meta["dagster/partition_row_count"] = rows
    if written is not None:
        if "sha256" in written:
            meta["sha256"] = written["sha256"]
        snapshot = written.get("snapshot")
        if snapshot:  # the (statements, translog) versions the export was built from
            meta["built_from_statements_version"] = int(
                snapshot[0] if snapshot[0] is not None else -1
            )
            meta["built_from_translog_version"] = int(
                snapshot[1] if snapshot[1] is not None else -1
            )
    ts = ds.core_tags.get(tag)
    if ts is not None:
        meta["exported_at"] = dg.MetadataValue.timestamp(ts)
    return meta


def last_written_rows(ds: Dataset, kind: str, runs: int = 20) -> int | None:
    """The row count of a kept export: what the latest export job that wrote it
    recorded (the newest ``runs`` job records are looked at, not the file)."""
    from lakehouse_assets.jobs import list_runs

    for run in sorted(list_runs(ds.store, ds.name, "export"), key=lambda r: r.started_at)[-runs:][
        ::-1
    ]:
        done = (run.stats.get("written") or {}).get(kind) or {}
        if isinstance(done.get("rows"), int) and run.status == "succeeded":
            return int(done["rows"])
    return None


#: The flush's counts as the statements and translog assets report them.
FLUSH_COUNTS = {
    "new": "new_statements",
    "duplicates": "duplicate_statements",
    "tombstones": "tombstoned_statements",
    "superseded": "superseded_events",
    "ignored_tombstones": "ignored_tombstones",
    "journal_rows": "journal_rows_flushed",
}


def flush_counts(ds: Dataset, done: Mapping[str, Any], runs: int = 50) -> dict[str, Any]:
    """What a flush did, as asset metadata. A flush with nothing to do says so and
    carries the last real flush's counts as ``last_flush_*`` (from the newest
    ``runs`` job records), so the partition's page never hides them behind zeros."""
    meta: dict[str, Any] = {"duration_seconds": round(float(done.get("seconds") or 0), 3)}
    if done.get("journal_rows"):
        meta.update({name: int(done.get(key) or 0) for key, name in FLUSH_COUNTS.items()})
        return meta
    meta["outcome"] = "nothing new: the journal held no rows for this dataset"
    from lakehouse_assets.jobs import JobRun

    prefix = cv.dataset_path(ds.name, cv.JOB_RUNS, "flush") + "/"
    for path in sorted(ds.store.list(prefix))[-runs:][::-1]:  # names sort by start time
        run = JobRun.model_validate_json(ds.store.read_bytes(path))
        if run.status == "succeeded" and run.stats.get("journal_rows"):
            meta["last_flush_at"] = dg.MetadataValue.timestamp(run.started_at)
            for key, name in FLUSH_COUNTS.items():
                meta[f"last_flush_{name}"] = int(run.stats.get(key) or 0)
            break
    return meta


def index_metadata(ds: Dataset, written: Mapping[str, Any] | None) -> dict[str, Any]:
    """The index asset's metadata from what is published, not from what the step
    returned: the head version (number, hash), the resources ``index.json`` lists,
    and whether this step published a new version or kept the index as it was."""
    import json

    version = (written or {}).get("version") or {}
    published = version.get("sequence") is not None
    meta = export_metadata(ds, INDEX, written if published else None)
    path = cv.dataset_path(ds.name, cv.INDEX)
    if ds.store.exists(path):
        meta["resources"] = len(json.loads(ds.store.read_text(path)).get("resources") or [])
    head = ds.version()
    if head is not None:
        meta["version"] = head.sequence
        meta["version_hash"] = head.hash
    if published:
        meta["outcome"] = f"published version {version['sequence']}"
        for op, count in ((version.get("diff") or {}).get("counts") or {}).items():
            meta[f"entities_{op.lower()}"] = int(count)
    else:
        why = version.get("skipped") or "index.json is fresh"
        meta["outcome"] = f"unchanged: {why}"
    return meta


def tag_version(ds: Dataset, tag: str) -> dg.DataVersion | None:
    """A data version from a lake tag: it changes exactly when the tag moves."""
    ts = ds.core_tags.get(tag)
    return dg.DataVersion(ts.isoformat()) if ts is not None else None
