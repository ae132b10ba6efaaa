"""The one Dagster ``Definitions`` object of the project (loaded by workspace.yaml).

- assets: the dataset-partitioned chain archive → journal → statements +
  translog → statements_csv / entities_ftm_json / statistics → index, and
  statements + translog → graph (:mod:`lakehouse_assets.defs.assets`), with data
  checks (``defs.checks``);
- automation: the executable assets materialize by ``AutomationCondition.eager()``,
  evaluated by the ``lakehouse_automation`` sensor;
- collections: one asset ``collection/{name}`` per collection of the lake's
  catalog (read when the definitions load), fed by its leaves' ``index``
  partitions and its ``judgements``; built by the ``collection_changes``
  sensor's requests (``defs.collections``);
- sensors: new datasets, archive files, journal writes (``defs.sensors``),
  mapping changes (``defs.ingest``), queued actions (``defs.queue``), the
  per-dataset freshness check (``defs.freshness``), collection changes;
- jobs and schedules: ``refresh_dataset`` (the whole chain; what ``make demo``
  runs; ``daily_refresh``), the ``optimize`` and ``compact`` maintenance assets
  with their schedules (``defs.maintenance``), archive Document entities,
  crawl (``defs.ingest``);
- resources: the lake (with dagster-aws's S3 resource for ``s3://`` lakes,
  credentials as ``dg.EnvVar``) and dagster-pyspark's Spark resource
  (``defs.resources``).

Every job runs in one process (in-process executor), so a run starts one
Spark session and all its steps share it; a run may cover many datasets
(single-run backfills, the schedules: ``defs.batch``). Runs of one dataset
never overlap: ``dagster_home/dagster.yaml`` limits queued runs to one per
partition, and the lake's locks serialize writers of a dataset's tables.
"""

import dagster as dg

from lakehouse_assets.defs.assets import ASSETS
from lakehouse_assets.defs.checks import CHECKS
from lakehouse_assets.defs.collections import (
    collection_assets,
    collection_sensor,
    judgements,
    loaded_collections,
)
from lakehouse_assets.defs.freshness import CHECKS as FRESHNESS_CHECKS
from lakehouse_assets.defs.freshness import JOBS as FRESHNESS_JOBS
from lakehouse_assets.defs.freshness import SENSORS as FRESHNESS_SENSORS
from lakehouse_assets.defs.ingest import JOBS as INGEST_JOBS
from lakehouse_assets.defs.ingest import SENSORS as INGEST_SENSORS
from lakehouse_assets.defs.maintenance import ASSETS as MAINTENANCE
from lakehouse_assets.defs.maintenance import JOBS, SCHEDULES, refresh_requests
from lakehouse_assets.defs.queue import JOBS as QUEUE_JOBS
from lakehouse_assets.defs.queue import SENSORS as QUEUE_SENSORS
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource, s3_from_env
from lakehouse_assets.defs.sensors import SENSORS, archive_documents
from lakehouse_assets.settings import Settings

#: Everything Dagster computes (archive and journal are reported, not computed).
COMPUTED = dg.AssetSelection.assets(
    "statements",
    "translog",
    "statements_csv",
    "entities_ftm_json",
    "statistics",
    "index",
    "graph",
    "graph_cypher",
)

refresh_dataset = dg.define_asset_job(
    "refresh_dataset",
    selection=COMPUTED,
    description="Flush the journal, write the exports, the graph index and the index of the "
    "selected datasets, in one run (fresh exports are kept).",
)

#: the server's flush and export operations as runs of their own (the UI shows them)
flush_job = dg.define_asset_job(
    "flush_job",
    selection=dg.AssetSelection.assets("statements", "translog"),
    description="Flush the journal into the statements and translog tables of the selected "
    "datasets (the server's flush operation).",
)

export_job = dg.define_asset_job(
    "export_job",
    selection=dg.AssetSelection.assets(
        "statements_csv", "entities_ftm_json", "statistics", "index"
    ),
    description="Write the exports and the index of the selected datasets (fresh exports are "
    "kept; the server's export operation, a subset of them by asset selection).",
)


@dg.schedule(
    job=refresh_dataset,
    cron_schedule="0 3 * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every day: the whole chain for the datasets the freshness rule finds "
    "stale (judged where the change marker moved since the last ticks; no run when "
    "nothing changed), neighbours in one run.",
)
def daily_refresh(
    context: dg.ScheduleEvaluationContext, lakehouse: LakehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    return refresh_requests(context, lakehouse.lake(), "refresh_dataset")


#: Run tags of every automation run (Dagster adds dagster/partition: the dataset).
AUTOMATION_TAGS = {"lakehouse/trigger": "automation", "lakehouse/job": "refresh_dataset"}

automation = dg.AutomationConditionSensorDefinition(
    "lakehouse_automation",
    target=COMPUTED,
    run_tags=AUTOMATION_TAGS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=Settings().sensor_interval_seconds,
    description="Materializes the chain when the journal or archive of a dataset changed.",
)

#: Each collection of the lake → its leaves, as the definitions loaded them.
COLLECTIONS = loaded_collections()

defs = dg.Definitions(
    assets=[*ASSETS, *MAINTENANCE, judgements, *collection_assets(COLLECTIONS)],
    asset_checks=[*CHECKS, *FRESHNESS_CHECKS],
    jobs=[
        refresh_dataset,
        flush_job,
        export_job,
        archive_documents,
        *INGEST_JOBS,
        *JOBS,
        *QUEUE_JOBS,
        *FRESHNESS_JOBS,
    ],
    sensors=[
        *SENSORS,
        *INGEST_SENSORS,
        *FRESHNESS_SENSORS,
        *QUEUE_SENSORS,
        collection_sensor(COLLECTIONS),
        automation,
    ],
    schedules=[*SCHEDULES, daily_refresh],
    resources={"lakehouse": LakehouseResource(s3=s3_from_env()), "spark": SparkResource()},
    executor=dg.in_process_executor,
)
