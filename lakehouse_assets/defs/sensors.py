"""Sensors: how Dagster learns what tenants did to the lake.

Tenants write outside Dagster (CLI, API). Each write moves a tag of the lake
(``archive/last_updated``, ``journal/last_updated``), so a sensor tick costs
one catalog listing plus one small read per dataset and tag; only a dataset
whose tag moved since the cursor is looked at more closely. Cursors (JSON:
dataset → last tag seen) live in Dagster's storage and survive restarts.

- ``new_datasets`` keeps the ``datasets`` partitions equal to the lake's datasets
  (adds the new ones, deletes those whose dataset is gone).
- ``archive_files`` lists each dataset's ``archive/`` (one listing per tick:
  a writer that bypasses the API moves no tag) and reports an ``archive``
  materialization for each changed dataset; for files written since, it asks
  ``archive_documents`` to write their Document entities into the journal.
- ``journal_writes`` reports a ``journal`` materialization (data version: the
  tag), which makes the statements and exports stale; automation refreshes them.
"""

import hashlib
import json
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import dagster as dg

from lakehouse_assets import conventions as cv
from lakehouse_assets.archive import DOCUMENT_MARK, FileMeta, document_entity
from lakehouse_assets.defs.metadata import DATA_VERSION_TAG
from lakehouse_assets.defs.partitions import DATASETS, datasets, partition_datasets
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets.storage import Entry

RUNNING = dg.DefaultSensorStatus.RUNNING


def _interval() -> int:
    return Settings().sensor_interval_seconds


def _load_json(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


def _load_cursor(raw: str | None) -> dict[str, str]:
    return {k: str(v) for k, v in _load_json(raw).items()}


def changed_datasets(
    context: dg.SensorEvaluationContext, lake: Lakehouse, tag: str
) -> Iterable[tuple[Dataset, datetime, datetime | None]]:
    """(dataset, tag now, tag at the cursor) for partitions whose ``tag`` moved."""
    cursor = _load_cursor(context.cursor)
    for ds in partition_datasets(context.instance, lake):
        ts = ds.core_tags.get(tag)
        if ts is None:
            continue
        seen = cursor.get(ds.name)
        prev = datetime.fromisoformat(seen) if seen else None
        if prev is None or ts > prev:
            yield ds, ts, prev


#: What a tag sensor makes of one changed dataset: its reported event and,
#: optionally, a run to request.
Observe = Callable[
    [Dataset, datetime, datetime | None], tuple[dg.AssetMaterialization, dg.RunRequest | None]
]


def watch_tag(
    context: dg.SensorEvaluationContext, lake: Lakehouse, tag: str, observe: Observe
) -> dg.SensorResult | dg.SkipReason:
    """The body of every tag sensor: observe each dataset whose tag moved, advance the cursor."""
    events: list[dg.AssetMaterialization] = []
    runs: list[dg.RunRequest] = []
    updates: dict[str, str] = {}
    for ds, ts, prev in changed_datasets(context, lake, tag):
        event, run = observe(ds, ts, prev)
        events.append(event)
        if run is not None:
            runs.append(run)
        updates[ds.name] = ts.isoformat()
    if not events:
        return dg.SkipReason(f"{tag} unchanged")
    return dg.SensorResult(
        run_requests=runs, asset_events=events, cursor=cursor_with(context.cursor, updates)
    )


def archive_event(
    ds: Dataset, ts: datetime, files: list[FileMeta], new: int, blobs: int = 0
) -> dg.AssetMaterialization:
    """The reported materialization of a dataset's ``archive`` (tenants wrote files)."""
    metadata: dict[str, Any] = {
        "dagster/uri": ds.store.full_uri(cv.dataset_path(ds.name, cv.ARCHIVE)),
        "files": len(files),
        "dagster/row_count": len(files),
        "new_files": new,
        "size_bytes": sum(m.size for m in files),
        "last_updated": dg.MetadataValue.timestamp(ts),
    }
    if blobs:
        metadata["blobs_without_metadata"] = blobs
    # the data version follows the archive's content, whoever wrote it
    version = hashlib.sha256(
        "\n".join(sorted(f"{m.checksum} {m.key}" for m in files)).encode()
    ).hexdigest()[:24]
    return dg.AssetMaterialization(
        asset_key="archive",
        partition=ds.name,
        tags={DATA_VERSION_TAG: version},
        metadata=metadata,
    )


def journal_event(lake: Lakehouse, ds: Dataset, ts: datetime) -> dg.AssetMaterialization:
    """The reported materialization of a dataset's ``journal`` (tenants wrote statements)."""
    return dg.AssetMaterialization(
        asset_key="journal",
        partition=ds.name,
        tags={DATA_VERSION_TAG: ts.isoformat()},
        metadata={
            "pending_statements": lake.journal.count(ds.name),
            "last_updated": dg.MetadataValue.timestamp(ts),
        },
    )


def cursor_with(raw: str | None, updates: dict[str, str]) -> str:
    cursor = _load_cursor(raw)
    cursor.update(updates)
    return json.dumps(cursor, sort_keys=True)


@dg.sensor(
    name="new_datasets",
    minimum_interval_seconds=_interval(),
    default_status=RUNNING,
    description="Keeps the `datasets` partitions equal to the lake's catalog: adds a "
    "partition for each new dataset, deletes the partition of a dataset that left the lake.",
)
def new_datasets(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """One listing of the lake's top level against the partitions, both ways.

    A deleted partition keeps its history in Dagster's event log (a dataset
    created again under that name finds it). Nothing is deleted when the lake
    has no catalog ``index.json``: a lake URI that points at the wrong place
    must not empty the partitions.
    """
    lake = lakehouse.lake()
    found = lake.datasets()
    known = set(context.instance.get_dynamic_partitions(DATASETS))
    new = [name for name in found if name not in known]
    gone = sorted(known.difference(found))
    if gone and not lake.store.exists(cv.CATALOG_INDEX):
        context.log.warning(
            "the lake %s has no %s: its %d partitions are kept",
            lake.store.uri,
            cv.CATALOG_INDEX,
            len(known),
        )
        gone = []
    if not new and not gone:
        return dg.SkipReason(f"partitions match the lake ({len(found)} datasets)")
    requests: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    if new:
        context.log.info("new datasets: %s", ", ".join(new))
        requests.append(datasets.build_add_request(new))
    if gone:
        context.log.info("datasets gone from the lake: %s", ", ".join(gone))
        requests.append(datasets.build_delete_request(gone))
    return dg.SensorResult(dynamic_partitions_requests=requests)


class DocumentsConfig(dg.Config):
    checksums: list[str]


@dg.op(
    description="Write the Document entity of each given archived file into the journal "
    "(origin `archive`); the journal sensor then sees the write."
)
def write_documents(
    context: dg.OpExecutionContext, config: DocumentsConfig, lakehouse: LakehouseResource
) -> dg.Output[int]:
    ds = lakehouse.dataset(context.partition_key)
    written = 0
    with ds.bulk(origin="archive") as bulk:
        for checksum in config.checksums:
            for meta in ds.archive.files(cv.checksum(checksum))[:1]:
                written += bulk.add_entity(document_entity(meta))
    return dg.Output(written, metadata={"documents": len(config.checksums), "statements": written})


@dg.job(
    partitions_def=datasets,
    description="Document entities for newly archived files (requested by `archive_files`).",
)
def archive_documents() -> None:
    write_documents()


@dg.sensor(
    name="archive_files",
    job=archive_documents,
    minimum_interval_seconds=_interval(),
    default_status=RUNNING,
    description="Lists each dataset's `archive/` every tick: reports changes, including "
    "files another writer put there without the API, and requests the Document entities "
    "of new files.",
)
def archive_files(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """Report the archives that changed since the cursor, by listing, not only by tag.

    The cursor keeps, per dataset, a digest of the archive's listing (path and
    fingerprint of each file) and the latest write time seen. A listing that
    differs is a change, whoever made it; the files written after that time
    are the new ones (their Document entities are requested). A writer that
    keeps old modification times (``cp -p``) still changes the digest, so the
    change is reported; only its Documents wait for a write through the API.
    """
    lake = lakehouse.lake()
    cursor = _load_listing_cursor(context.cursor)
    events: list[dg.AssetMaterialization] = []
    runs: list[dg.RunRequest] = []
    for ds in partition_datasets(context.instance, lake):
        name = ds.name
        listing = list(ds.store.entries(cv.dataset_path(name, cv.ARCHIVE) + "/"))
        digest = hashlib.sha256(
            "\n".join(f"{e.path} {e.fingerprint}" for e in listing).encode()
        ).hexdigest()
        seen = cursor.get(name, {})
        if seen.get("digest") == digest or (not seen and not listing):
            continue  # unchanged, or empty from the start
        until = float(seen.get("until", 0.0))
        # S3 times have whole seconds: files of the cursor's last second are told apart
        # by path
        known_at_until = set(seen.get("at_until", []))
        fresh = {
            e.path
            for e in listing
            if e.path.endswith(".json")
            and (e.modified > until or (e.modified == until and e.path not in known_at_until))
        }
        files, new = [], []
        for entry in listing:
            if not entry.path.endswith(".json"):
                continue
            meta = FileMeta.model_validate_json(ds.store.read_bytes(entry.path))
            files.append(meta)
            if entry.path in fresh:
                new.append(meta)
        ts = ds.core_tags.get(cv.ARCHIVE_LAST_UPDATED) or cv.utcnow()
        events.append(archive_event(ds, ts, files, len(new), blobs=_orphans(listing)))
        # files whose writer made the Document already (crawl, --document) are left alone
        checksums = sorted({m.checksum for m in new if not m.extra.get(DOCUMENT_MARK)})
        if checksums and lake.settings.archive_documents:
            runs.append(
                dg.RunRequest(
                    run_key=f"{name}:{digest[:16]}",
                    partition_key=name,
                    run_config=dg.RunConfig(
                        ops={"write_documents": DocumentsConfig(checksums=checksums)}
                    ),
                )
            )
        latest = max([until, *(e.modified for e in listing)])
        cursor[name] = {
            "digest": digest,
            "until": latest,
            "at_until": sorted(e.path for e in listing if e.modified == latest),
        }
    if not events:
        return dg.SkipReason("no archive changed")
    return dg.SensorResult(
        run_requests=runs, asset_events=events, cursor=json.dumps(cursor, sort_keys=True)
    )


def _load_listing_cursor(raw: str | None) -> dict[str, dict[str, Any]]:
    """The archive sensor's cursor; an older one (dataset → tag) counts its tag as seen."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in _load_json(raw).items():
        if isinstance(value, dict):
            out[name] = value
        elif isinstance(value, str):
            try:
                out[name] = {"until": datetime.fromisoformat(value).timestamp()}
            except ValueError:
                continue
    return out


def _orphans(listing: list[Entry]) -> int:
    """Blobs with no metadata entry beside them (written without the API, or half-way)."""
    folders = {e.path.rsplit("/", 1)[0] for e in listing if e.path.endswith(".json")}
    return sum(
        1
        for e in listing
        if e.path.endswith("/" + cv.BLOB) and e.path.rsplit("/", 1)[0] not in folders
    )


@dg.sensor(
    name="journal_writes",
    minimum_interval_seconds=_interval(),
    default_status=RUNNING,
    description="Reports journal writes (tag `journal/last_updated`): the statements and "
    "exports become stale and automation refreshes them.",
)
def journal_writes(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    lake = lakehouse.lake()
    return watch_tag(
        context,
        lake,
        cv.JOURNAL_LAST_UPDATED,
        lambda ds, ts, _: (journal_event(lake, ds, ts), None),
    )


SENSORS = [new_datasets, archive_files, journal_writes]
