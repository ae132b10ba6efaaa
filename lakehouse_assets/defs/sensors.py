"""Sensors: how Dagster learns what tenants did to the lake.

Tenants write outside Dagster (CLI, API). Each write moves a tag of the lake
(``archive/last_updated``, ``journal/last_updated``) and then the dataset's
change marker ``.changes/{dataset}``. A sensor tick lists the markers once and
looks only at the datasets whose marker moved since its cursor (and at those
without a marker, written before markers existed), so its work follows what
changed, not the number of datasets. Cursors (JSON) live in Dagster's storage
and survive restarts.

- ``new_datasets`` keeps the ``datasets`` partitions equal to the lake's datasets
  (adds the new ones, deletes those whose dataset is gone).
- ``archive_files`` lists the ``archive/`` of each changed dataset, and of
  :data:`~lakehouse_assets.defs.partitions.SWEEP` others per tick in turn (a
  writer that bypasses the API moves no marker), and reports an ``archive``
  materialization for each changed dataset; for files written since, it asks
  ``archive_documents`` to write their Document entities into the journal.
- ``journal_writes`` reports a ``journal`` materialization (data version: the
  tag), which makes the statements and exports stale; automation refreshes them.
"""

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import dagster as dg

from lakehouse_assets import conventions as cv
from lakehouse_assets.archive import DOCUMENT_MARK, FileMeta, document_entity
from lakehouse_assets.defs.metadata import DATA_VERSION_TAG
from lakehouse_assets.defs.partitions import (
    DATASETS,
    SWEEP,
    Watch,
    changed_partitions,
    datasets,
)
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


def _load_cursor(raw: str | None) -> tuple[dict[str, str], Watch]:
    """A tag sensor's cursor: dataset → last tag seen, and its :class:`Watch`.

    An older cursor (the flat dataset → tag mapping) keeps its tags and looks at
    every dataset once.
    """
    data = _load_json(raw)
    tags = data.get("tags") if "watch" in data else data
    seen = {str(k): str(v) for k, v in tags.items()} if isinstance(tags, dict) else {}
    return seen, Watch.load(data.get("watch"))


def changed_datasets(
    context: dg.SensorEvaluationContext, lake: Lakehouse, tag: str, watch: Watch
) -> Iterable[tuple[Dataset, datetime, datetime | None]]:
    """(dataset, tag now, tag at the cursor) for partitions whose ``tag`` moved.

    Only datasets whose change marker moved are read (tags move their marker).
    """
    seen, _ = _load_cursor(context.cursor)
    for ds in changed_partitions(context.instance, lake, watch):
        ts = ds.core_tags.get(tag)
        if ts is None:
            continue
        prev_raw = seen.get(ds.name)
        prev = datetime.fromisoformat(prev_raw) if prev_raw else None
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
    """The body of every tag sensor: observe each dataset whose tag moved, advance the cursor.

    The cursor advances also when nothing is reported (the markers seen), so a
    quiet tick costs one listing of the markers.
    """
    seen, watch = _load_cursor(context.cursor)
    before = json.dumps({"tags": seen, "watch": watch.dump()}, sort_keys=True)
    events: list[dg.AssetMaterialization] = []
    runs: list[dg.RunRequest] = []
    for ds, ts, prev in list(changed_datasets(context, lake, tag, watch)):
        event, run = observe(ds, ts, prev)
        events.append(event)
        if run is not None:
            runs.append(run)
        seen[ds.name] = ts.isoformat()
    cursor = json.dumps({"tags": seen, "watch": watch.dump()}, sort_keys=True)
    return _result(f"{tag} unchanged", before, cursor, events, runs)


def _result(
    reason: str,
    before: str,
    cursor: str,
    events: Sequence[dg.AssetMaterialization],
    runs: Sequence[dg.RunRequest] = (),
) -> dg.SensorResult | dg.SkipReason:
    """The tick's result; a quiet tick that saw markers move still saves them."""
    if events or runs:
        return dg.SensorResult(run_requests=runs, asset_events=events, cursor=cursor)
    if cursor == before:
        return dg.SkipReason(reason)
    return dg.SensorResult(skip_reason=reason, cursor=cursor)


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

    Only a folder that is not a partition yet is read (is its ``config.yml``
    there?); a partition whose folder left the lake is deleted. A deleted
    partition keeps its history in Dagster's event log (a dataset created again
    under that name finds it). Nothing is deleted when the lake has no catalog
    ``index.json``: a lake URI that points at the wrong place must not empty the
    partitions.
    """
    lake = lakehouse.lake()
    folders = {n for n in lake.store.list_dirs("") if cv.is_dataset_folder(n)}
    known = set(context.instance.get_dynamic_partitions(DATASETS))
    new = sorted(n for n in folders - known if lake.store.exists(cv.dataset_path(n, cv.CONFIG)))
    gone = sorted(known - folders)
    if gone and not lake.store.exists(cv.CATALOG_INDEX):
        context.log.warning(
            "the lake %s has no %s: its %d partitions are kept",
            lake.store.uri,
            cv.CATALOG_INDEX,
            len(known),
        )
        gone = []
    if not new and not gone:
        return dg.SkipReason(f"partitions match the lake ({len(known)} datasets)")
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
    description="Lists the `archive/` of each dataset whose change marker moved, and of a "
    "few others in turn: reports changes, including files another writer put there "
    "without the API, and requests the Document entities of new files.",
)
def archive_files(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """Report the archives that changed since the cursor, by listing, not only by tag.

    Listed: the datasets whose change marker moved (a write through the API),
    and :data:`SWEEP` others in turn, so a copy made behind the API's back is
    seen within (datasets / SWEEP) ticks without listing every archive each tick.

    The cursor keeps, per dataset, a digest of the archive's listing (path and
    fingerprint of each file) and the latest write time seen. A listing that
    differs is a change, whoever made it; the files written after that time
    are the new ones (their Document entities are requested). A writer that
    keeps old modification times (``cp -p``) still changes the digest, so the
    change is reported; only its Documents wait for a write through the API.
    """
    lake = lakehouse.lake()
    cursor, watch = _load_listing_cursor(context.cursor)
    before = _listing_cursor(cursor, watch)
    events: list[dg.AssetMaterialization] = []
    runs: list[dg.RunRequest] = []
    for ds in list(changed_partitions(context.instance, lake, watch, sweep=SWEEP)):
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
    return _result("no archive changed", before, _listing_cursor(cursor, watch), events, runs)


def _listing_cursor(archives: dict[str, dict[str, Any]], watch: Watch) -> str:
    return json.dumps({"archives": archives, "watch": watch.dump()}, sort_keys=True)


def _load_listing_cursor(raw: str | None) -> tuple[dict[str, dict[str, Any]], Watch]:
    """The archive sensor's cursor: per dataset its listing's digest, and its :class:`Watch`.

    An older one (dataset → listing, or dataset → tag) keeps what it saw and looks
    at every dataset once.
    """
    data = _load_json(raw)
    archives = data.get("archives") if "watch" in data else data
    out: dict[str, dict[str, Any]] = {}
    for name, value in (archives if isinstance(archives, dict) else {}).items():
        if isinstance(value, dict):
            out[name] = value
        elif isinstance(value, str):
            try:
                out[name] = {"until": datetime.fromisoformat(value).timestamp()}
            except ValueError:
                continue
    return out, Watch.load(data.get("watch"))


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
