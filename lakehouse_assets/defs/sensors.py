"""Sensors: how Dagster learns what tenants did to the lake.

Tenants write outside Dagster (CLI, API). Each write moves a tag of the lake
(``archive/last_updated``, ``journal/last_updated``), so a sensor tick costs
one catalog listing plus one small read per dataset and tag; only a dataset
whose tag moved since the cursor is looked at more closely. Cursors (JSON:
dataset → last tag seen) live in Dagster's storage and survive restarts.

- ``new_datasets`` adds a ``datasets`` partition for every dataset of the lake.
- ``archive_files`` reports an ``archive`` materialization for each changed
  dataset and, for files archived since, asks ``archive_documents`` to write
  their Document entities into the journal.
- ``journal_writes`` reports a ``journal`` materialization (data version: the
  tag), which makes the statements and exports stale; automation refreshes them.
"""

import json
from collections.abc import Callable, Iterable
from datetime import datetime

import dagster as dg

from lakehouse_assets import conventions as cv
from lakehouse_assets.archive import FileMeta
from lakehouse_assets.defs.metadata import DATA_VERSION_TAG
from lakehouse_assets.defs.partitions import DATASETS, datasets
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.errors import DatasetNotFoundError
from lakehouse_assets.lake import DOCUMENT_MARK, Dataset, Lakehouse
from lakehouse_assets.settings import Settings

RUNNING = dg.DefaultSensorStatus.RUNNING


def _interval() -> int:
    return Settings().sensor_interval_seconds


def _load_cursor(raw: str | None) -> dict[str, str]:
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def changed_datasets(
    context: dg.SensorEvaluationContext, lake: Lakehouse, tag: str
) -> Iterable[tuple[Dataset, datetime, datetime | None]]:
    """(dataset, tag now, tag at the cursor) for partitions whose ``tag`` moved."""
    cursor = _load_cursor(context.cursor)
    known = set(context.instance.get_dynamic_partitions(DATASETS))
    for name in sorted(known):
        try:
            ds = lake.dataset(name)
        except DatasetNotFoundError:  # a partition whose dataset left the lake
            continue
        ts = ds.core_tags.get(tag)
        if ts is None:
            continue
        seen = cursor.get(name)
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
    ds: Dataset, ts: datetime, files: list[FileMeta], new: int
) -> dg.AssetMaterialization:
    """The reported materialization of a dataset's ``archive`` (tenants wrote files)."""
    return dg.AssetMaterialization(
        asset_key="archive",
        partition=ds.name,
        tags={DATA_VERSION_TAG: ts.isoformat()},
        metadata={
            "dagster/uri": ds.store.full_uri(cv.dataset_path(ds.name, cv.ARCHIVE)),
            "files": len(files),
            "new_files": new,
            "size_bytes": sum(m.size for m in files),
            "last_updated": dg.MetadataValue.timestamp(ts),
        },
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
    description="Adds a `datasets` partition for each dataset found in the lake's catalog.",
)
def new_datasets(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    found = lakehouse.lake().datasets()
    known = set(context.instance.get_dynamic_partitions(DATASETS))
    new = [name for name in found if name not in known]
    if not new:
        return dg.SkipReason(f"no new datasets ({len(found)} in the lake)")
    context.log.info("new datasets: %s", ", ".join(new))
    return dg.SensorResult(dynamic_partitions_requests=[datasets.build_add_request(new)])


class DocumentsConfig(dg.Config):
    checksums: list[str]


@dg.op(
    description="Write the Document entity of each given archived file into the journal "
    "(origin `archive`); the journal sensor then sees the write."
)
def write_documents(
    context: dg.OpExecutionContext, config: DocumentsConfig, lakehouse: LakehouseResource
) -> dg.Output[int]:
    from lakehouse_assets.lake import document_entity

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
    description="Reports new archive files (tag `archive/last_updated`) and requests "
    "their Document entities.",
)
def archive_files(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    lake = lakehouse.lake()

    def observe(
        ds: Dataset, ts: datetime, prev: datetime | None
    ) -> tuple[dg.AssetMaterialization, dg.RunRequest | None]:
        files = list(ds.archive.list())
        new = [m for m in files if prev is None or m.updated_at > prev]
        # files whose writer made the Document already (crawl, --document) are left alone
        checksums = sorted({m.checksum for m in new if not m.extra.get(DOCUMENT_MARK)})
        run = None
        if checksums and lake.settings.archive_documents:
            run = dg.RunRequest(
                run_key=f"{ds.name}:{ts.isoformat()}",
                partition_key=ds.name,
                run_config=dg.RunConfig(
                    ops={"write_documents": DocumentsConfig(checksums=checksums)}
                ),
            )
        return archive_event(ds, ts, files, len(new)), run

    return watch_tag(context, lake, cv.ARCHIVE_LAST_UPDATED, observe)


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
