"""The server's operations as Dagster runs of the existing jobs, on the instance of
``DAGSTER_HOME`` (see :mod:`lakehouse_assets.server.operations`)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Final

from lakehouse_assets import conventions as cv
from lakehouse_assets.lake import Dataset
from lakehouse_assets.settings import Settings

log = logging.getLogger(__name__)

#: the operations that run as Dagster runs of these jobs when an instance is configured
DAGSTER_JOBS: Final[dict[str, str]] = {
    "make": "refresh_dataset",
    "compact": "compact_job",
    "optimize": "optimize_job",
}


def dagster_job(settings: Settings, operation: str) -> str | None:
    """The Dagster job an operation runs as, or None (no instance, or not such an operation)."""
    if not settings.api_dagster_runs or not os.environ.get("DAGSTER_HOME"):
        return None
    return DAGSTER_JOBS.get(operation)


_dagster: dict[str, Any] = {}
_dagster_lock = threading.Lock()


def dagster_instance() -> Any:
    """This process's one ``DagsterInstance`` of ``DAGSTER_HOME``: opening a second one
    while a run stamps a fresh instance's storage races its schema migration
    ("more than one head"), so the runs and the status reads share it."""
    import dagster as dg

    with _dagster_lock:
        if "instance" not in _dagster:
            _dagster["instance"] = dg.DagsterInstance.get()
        return _dagster["instance"]


def close_dagster() -> None:
    with _dagster_lock:
        instance = _dagster.pop("instance", None)
    if instance is not None:
        instance.dispose()


def run_in_dagster(ds: Dataset, job_name: str, run_id: str) -> dict[str, Any]:
    """Run ``job_name`` for the dataset's partition as Dagster run ``run_id``, in this
    process on the instance of ``DAGSTER_HOME`` (as ``make demo`` runs its refresh):
    the run, its events and materializations are in the instance, and the UI shows
    them. The job's resources are the Definitions' (the lake of the environment, as
    the server's own tenant)."""
    from lakehouse_assets.definitions import defs

    instance = dagster_instance()
    if not instance.has_dynamic_partition(cv.DAGSTER_PARTITIONS, ds.name):
        instance.add_dynamic_partitions(cv.DAGSTER_PARTITIONS, [ds.name])
    result = defs.resolve_job_def(job_name).execute_in_process(
        partition_key=ds.name,
        instance=instance,
        run_id=run_id,
        raise_on_error=False,
        tags={"lakehouse/trigger": "api", "lakehouse/tenant": ds.tenant},
    )
    if not result.success:
        raise RuntimeError(f"Dagster run {run_id} of {job_name} failed (see the run in the UI)")
    return {"dagster_run_id": run_id, "job": job_name, "success": True}


def dagster_status(run_id: str) -> str | None:
    """The Dagster run's status in the instance of ``DAGSTER_HOME`` (None: not there yet,
    or the instance could not be read just now: the job's own state still answers)."""
    try:
        run = dagster_instance().get_run_by_id(run_id)
    except Exception:  # noqa: BLE001 - a busy instance must not fail the job's route
        log.warning("the Dagster run %s could not be read", run_id, exc_info=True)
        return None
    return None if run is None else run.status.value
