"""The server's operations as Dagster runs of the existing jobs.

Two ways, by what the operator configured:

* ``LAKEHOUSE_API_DAGSTER_URL`` names the Dagster webserver: the run is
  **submitted** through its GraphQL API (``DagsterGraphQLClient``), queued by
  the instance's run coordinator and started by the daemon in a run worker of
  the code location, exactly as a run launched from the UI (the queue's tag
  limit keeps one run per dataset). The server's job waits for the run's end;
* only ``DAGSTER_HOME``: the run executes in the server's process on that
  instance (``execute_in_process``, as ``make demo`` runs its refresh).

Either way the run carries ``lakehouse/trigger=api`` and ``lakehouse/tenant``,
its asset selection and config follow the operation's options (export kinds,
``force``, ``vacuum``), and the job's result holds the run's materializations'
metadata (the flush's counts among them).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Final, Literal
from urllib.parse import urlsplit

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.lake import Dataset
from lakehouse_assets.settings import Settings

log = logging.getLogger(__name__)

#: the Dagster job of each operation
DAGSTER_JOBS: Final[dict[str, str]] = {
    "flush": "flush_job",
    "make": "refresh_dataset",
    "export": "export_job",
    "compact": "compact_job",
    "optimize": "optimize_job",
}
#: export kind → its asset (``export_job`` runs the selected ones)
EXPORT_ASSETS: Final[dict[str, str]] = {
    "statements": "statements_csv",
    "entities": "entities_ftm_json",
    "statistics": "statistics",
    "index": "index",
}
#: how a run ended, as Dagster names its statuses
FINISHED: Final = frozenset({"SUCCESS", "FAILURE", "CANCELED"})

Mode = Literal["queued", "in_process"]


class DagsterRunError(LakehouseError):
    """A Dagster run of an operation could not be submitted, or did not succeed."""


def dagster_mode(settings: Settings) -> Mode | None:
    """How operations become Dagster runs here (None: the server's own worker)."""
    if not settings.api_dagster_runs:
        return None
    if settings.api_dagster_url:
        return "queued"
    return "in_process" if os.environ.get("DAGSTER_HOME") else None


def dagster_job(settings: Settings, operation: str) -> str | None:
    """The Dagster job an operation runs as, or None (no instance configured)."""
    if dagster_mode(settings) is None:
        return None
    return DAGSTER_JOBS.get(operation)


def launch_options(
    operation: str, params: dict[str, Any]
) -> tuple[list[str] | None, dict[str, Any]]:
    """The run's asset selection (None: the whole job) and run config for an
    operation's options."""
    force = bool(params.get("force", False))
    if operation == "optimize":
        return None, {"ops": {"optimize": {"config": {"vacuum": bool(params.get("vacuum"))}}}}
    if operation == "export":
        kinds = params.get("kinds") or list(EXPORT_ASSETS)
        selection = [EXPORT_ASSETS[kind] for kind in kinds]
        writes_exports = any(kind != "index" for kind in kinds)
        config = (
            {"ops": {"exports": {"config": {"force": True}}}} if force and writes_exports else {}
        )
        return selection, config
    if operation == "make" and force:
        return None, {"ops": {"exports": {"config": {"force": True}}}}
    return None, {}


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


def _tags(ds: Dataset) -> dict[str, str]:
    return {"lakehouse/trigger": "api", "lakehouse/tenant": ds.tenant}


def _ensure_partition(ds: Dataset) -> None:
    """The dataset's partition in the instance (the partitions sensor adds it too,
    but a run submitted before its tick must find it)."""
    instance = dagster_instance()
    if not instance.has_dynamic_partition(cv.DAGSTER_PARTITIONS, ds.name):
        instance.add_dynamic_partitions(cv.DAGSTER_PARTITIONS, [ds.name])


def run_in_dagster(
    ds: Dataset, job_name: str, run_id: str, operation: str, params: dict[str, Any]
) -> dict[str, Any]:
    """Run ``job_name`` for the dataset's partition as Dagster run ``run_id``, in this
    process on the instance of ``DAGSTER_HOME`` (as ``make demo`` runs its refresh):
    the run, its events and materializations are in the instance, and the UI shows
    them. The job's resources are the Definitions' (the lake of the environment, as
    the server's own tenant)."""
    from lakehouse_assets.definitions import defs

    _ensure_partition(ds)
    selection, config = launch_options(operation, params)
    job = defs.resolve_job_def(job_name)
    result = job.execute_in_process(
        partition_key=ds.name,
        instance=dagster_instance(),
        run_id=run_id,
        raise_on_error=False,
        tags=_tags(ds),
        run_config=config or None,
        asset_selection=None if selection is None else _keys(selection),
    )
    if not result.success:
        raise DagsterRunError(f"Dagster run {run_id} of {job_name} failed (see the run in the UI)")
    return _result(run_id, job_name, "SUCCESS")


def _keys(selection: list[str]) -> list[Any]:
    import dagster as dg

    return [dg.AssetKey(key) for key in selection]


def _graphql(settings: Settings) -> Any:
    from dagster_graphql import DagsterGraphQLClient

    url = urlsplit(str(settings.api_dagster_url))
    if url.scheme not in ("http", "https") or not url.hostname:
        raise DagsterRunError(
            f"LAKEHOUSE_API_DAGSTER_URL {settings.api_dagster_url!r}: expected http(s)://host:port"
        )
    return DagsterGraphQLClient(
        url.hostname,
        port_number=url.port,
        use_https=url.scheme == "https",
        path_prefix=url.path.rstrip("/"),
        timeout=60,
    )


def submit_queued(ds: Dataset, job_name: str, operation: str, params: dict[str, Any]) -> str:
    """Submit the run to the webserver of ``LAKEHOUSE_API_DAGSTER_URL`` (queued; the
    daemon starts it); its run id. ``DagsterRunError`` naming the URL if it refused."""
    if os.environ.get("DAGSTER_HOME"):
        _ensure_partition(ds)
    selection, config = launch_options(operation, params)
    try:
        run_id: str = _graphql(ds.settings).submit_job_execution(
            job_name,
            run_config=config,
            tags={**_tags(ds), "dagster/partition": ds.name},
            asset_selection=selection,
        )
    except Exception as exc:  # noqa: BLE001 - the client's errors, requests' and GraphQL's
        raise DagsterRunError(
            f"the Dagster webserver at {ds.settings.api_dagster_url} did not take the run of "
            f"{job_name} for {ds.name!r}: {type(exc).__name__}: {str(exc)[:300]}"
        ) from None
    return run_id


def wait_queued(ds: Dataset, job_name: str, run_id: str, poll: float = 1.0) -> dict[str, Any]:
    """Wait for a queued run's end (the daemon starts it when the queue lets it);
    its result, or ``DagsterRunError`` if it failed or was cancelled."""
    client = _graphql(ds.settings)
    while True:
        try:
            status = client.get_run_status(run_id).value
        except Exception:  # noqa: BLE001 - a webserver restart: ask again
            log.warning("the status of Dagster run %s could not be read", run_id, exc_info=True)
            status = None
        if status in FINISHED:
            break
        time.sleep(poll)
    if status != "SUCCESS":
        raise DagsterRunError(
            f"Dagster run {run_id} of {job_name}: {status} (see the run in the UI)"
        )
    return _result(run_id, job_name, status)


def _result(run_id: str, job_name: str, status: str) -> dict[str, Any]:
    """The job's result: the run, and each materialization's metadata (where the
    instance is readable here) as JSON values, by asset key."""
    result: dict[str, Any] = {"dagster_run_id": run_id, "job": job_name, "status": status}
    if os.environ.get("DAGSTER_HOME"):
        result["materializations"] = materializations(run_id)
    return result


def materializations(run_id: str) -> dict[str, dict[str, Any]]:
    """The run's materializations' metadata by asset key (the last of each)."""
    import dagster as dg

    found: dict[str, dict[str, Any]] = {}
    try:
        entries = dagster_instance().all_logs(
            run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
        )
    except Exception:  # noqa: BLE001 - the result without them, not a failed job
        log.warning("the materializations of run %s could not be read", run_id, exc_info=True)
        return found
    for entry in entries:
        materialization = entry.asset_materialization
        if materialization is None:
            continue
        found[materialization.asset_key.to_user_string()] = {
            name: _plain(value.value) for name, value in materialization.metadata.items()
        }
    return found


def _plain(value: Any) -> Any:
    """A metadata value as JSON (numbers, text, lists and dicts as they are; the rest
    as text)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if type(value) in (list, tuple):  # not Dagster's records, which are named tuples
        return [_plain(v) for v in value]
    if type(value) is dict:
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def dagster_status(settings: Settings, run_id: str) -> str | None:
    """The Dagster run's status (``QUEUED``, ``STARTED``, ``SUCCESS``...): from the
    instance of ``DAGSTER_HOME`` where the server has it, else from the webserver.
    None: not there yet, or not readable just now (the job's own state still answers)."""
    try:
        if os.environ.get("DAGSTER_HOME"):
            run = dagster_instance().get_run_by_id(run_id)
            return None if run is None else str(run.status.value)
        if settings.api_dagster_url:
            return str(_graphql(settings).get_run_status(run_id).value)
    except Exception:  # noqa: BLE001 - a busy instance must not fail the job's route
        log.warning("the Dagster run %s could not be read", run_id, exc_info=True)
    return None
