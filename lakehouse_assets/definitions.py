"""The one Dagster ``Definitions`` object of the project (loaded by workspace.yaml).

- assets: the dataset-partitioned chain archive → journal → statements +
  translog → statements_csv / entities_ftm_json / statistics → index, and
  statements + translog → graph (:mod:`lakehouse_assets.defs.assets`), with data
  checks (``defs.checks``);
- automation: the executable assets materialize by ``AutomationCondition.eager()``,
  evaluated by the ``lakehouse_automation`` sensor;
- sensors: new datasets, archive files, journal writes (``defs.sensors``),
  mapping changes (``defs.ingest``);
- jobs and schedules: ``refresh_dataset`` (the whole chain for one dataset,
  what ``make demo`` runs), nightly optimize, weekly compact
  (``defs.maintenance``), archive Document entities, crawl (``defs.ingest``).

Every job runs in one process (in-process executor), so a run starts one
Spark session and all its steps share it. Runs of one dataset never overlap:
``dagster_home/dagster.yaml`` limits queued runs to one per partition.
"""

import dagster as dg

from lakehouse_assets.defs.assets import ASSETS
from lakehouse_assets.defs.checks import CHECKS
from lakehouse_assets.defs.ingest import JOBS as INGEST_JOBS
from lakehouse_assets.defs.ingest import SENSORS as INGEST_SENSORS
from lakehouse_assets.defs.maintenance import JOBS, SCHEDULES
from lakehouse_assets.defs.resources import LakehouseResource, SparkResource
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
    description="Flush the journal, write the exports and the index of one dataset "
    "(fresh exports are kept).",
)

automation = dg.AutomationConditionSensorDefinition(
    "lakehouse_automation",
    target=COMPUTED,
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=Settings().sensor_interval_seconds,
    description="Materializes the chain when the journal or archive of a dataset changed.",
)

defs = dg.Definitions(
    assets=ASSETS,
    asset_checks=CHECKS,
    jobs=[refresh_dataset, archive_documents, *INGEST_JOBS, *JOBS],
    sensors=[*SENSORS, *INGEST_SENSORS, automation],
    schedules=SCHEDULES,
    resources={"lakehouse": LakehouseResource(), "spark": SparkResource()},
    executor=dg.in_process_executor,
)
