"""Operations (flush, make, export, compact, optimize) on the server's background worker.

When a Dagster instance is configured (``LAKEHOUSE_API_DAGSTER_URL``, the
webserver whose daemon starts queued runs, or ``DAGSTER_HOME``, runs in this
process) and ``LAKEHOUSE_API_DAGSTER_RUNS`` is not off, every operation is a
Dagster run of its job (``flush_job``, ``refresh_dataset``, ``export_job``,
``compact_job``, ``optimize_job``) for the dataset's partition
(:mod:`.dagster_runs`): the job carries the run's id from the start, the state
route adds the run's status, and the Dagster UI shows the run.

A request never runs an operation: it submits a job and gets its id (202,
``Location`` the job's route); the worker runs the jobs, one at a time per
dataset (the facade's dataset locks also keep other processes out), and
records each job's state as JSON under ``LAKEHOUSE_API_STATE_DIR/jobs``, so
every worker process of the host can report it. On shutdown the running
jobs finish and the queued ones are cancelled.

The peer's ``POST /{dataset}/_api/entities/flush`` and ``.../merge`` answer
when their job is done (the count, or ``ok``), as the peer does, unless it
takes longer than ``LAKEHOUSE_API_OPERATION_WAIT_SECONDS``: then 202 with the job.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import SourceNotFoundError
from lakehouse_assets.lake import Dataset
from lakehouse_assets.server.dagster_runs import (
    DagsterRunError,
    close_dagster,
    dagster_job,
    dagster_mode,
    dagster_status,
    run_in_dagster,
    submit_queued,
    wait_queued,
)
from lakehouse_assets.server.deps import DatasetDep, staging_dir
from lakehouse_assets.settings import Settings

log = logging.getLogger(__name__)

Kind = Literal["flush", "make", "export", "compact", "optimize"]
#: the peer's job names (``DatasetJobModel`` class names) and ours
NAMES: Final[dict[str, Kind]] = {
    "flush": "flush",
    "FlushJob": "flush",
    "make": "make",
    "MakeJob": "make",
    "export": "export",
    "ExportJob": "export",
    "compact": "compact",
    "MergeJob": "compact",
    "optimize": "optimize",
    "OptimizeJob": "optimize",
}
EXPORT_KINDS: Final = ("statements", "entities", "statistics", "index")
JOB_ID: Final = re.compile(r"^[0-9a-f]{32}$")
#: how many operations the worker runs at once (on different datasets)
THREADS: Final = 2


@dataclass
class Job:
    """One submitted operation and what became of it."""

    id: str
    dataset: str
    tenant: str
    operation: Kind
    params: dict[str, Any]
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"] = "queued"
    submitted_at: str = field(default_factory=lambda: cv.utcnow().isoformat())
    started_at: str | None = None
    finished_at: str | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    #: the Dagster run that carries it out (when an instance is configured), its job,
    #: and how: ``queued`` (the webserver's queue, the daemon) or ``in_process``
    dagster_run_id: str | None = None
    dagster_job: str | None = None
    dagster_mode: str | None = None


class Worker:
    """Runs submitted jobs on a few threads, one job per dataset at a time."""

    def __init__(self, settings: Settings) -> None:
        self.folder = staging_dir(settings).parent / "jobs"
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._pool: ThreadPoolExecutor | None = None
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        #: the jobs not finished yet (a finished one leaves: a long-lived server keeps none)
        self.futures: dict[str, Future[Job]] = {}

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="lakehouse-operation")

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        close_dagster()
        with self._guard:
            left = list(self.futures.items())
        for job_id, future in left:
            if future.cancelled():
                job = self.load(job_id)
                if job is not None and job.state == "queued":
                    job.state = "cancelled"
                    self.save(job)

    def save(self, job: Job) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".job-")
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(job), out)
        os.replace(tmp, self.folder / f"{job.id}.json")

    def load(self, job_id: str) -> Job | None:
        if not JOB_ID.match(job_id):
            raise ValueError(f"job id {job_id[:40]!r}: 32 hex characters")
        path = self.folder / f"{job_id}.json"
        if not path.exists():
            return None
        return Job(**json.loads(path.read_text()))

    def jobs_of(self, dataset: str) -> list[dict[str, Any]]:
        """This server's jobs of a dataset, newest first (at most 20)."""
        found = []
        for path in self.folder.glob("*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if data.get("dataset") == dataset:
                found.append(data)
        found.sort(key=lambda d: str(d.get("submitted_at")), reverse=True)
        return found[:20]

    def submit(
        self, ds: Dataset, operation: Kind, params: dict[str, Any]
    ) -> tuple[Job, Future[Job]]:
        """Queue a job; the job and its future (whose result is the finished job, or
        whose exception the operation's error)."""
        if self._pool is None:
            raise HTTPException(503, detail="the server is not running its worker")
        job = Job(uuid.uuid4().hex, ds.name, ds.tenant, operation, params)
        job.dagster_job = dagster_job(ds.settings, operation)
        if job.dagster_job is not None:
            job.dagster_mode = dagster_mode(ds.settings)
            if job.dagster_mode == "queued":
                try:  # a quick request to the webserver: the run is queued, not run, here
                    job.dagster_run_id = submit_queued(ds, job.dagster_job, operation, params)
                except DagsterRunError as exc:
                    raise HTTPException(503, detail=str(exc)) from None
            else:
                job.dagster_run_id = str(uuid.uuid4())
        self.save(job)
        future = self._pool.submit(self._run, job, ds)
        with self._guard:
            self.futures[job.id] = future
        future.add_done_callback(lambda _: self._forget(job.id))
        return job, future

    def _forget(self, job_id: str) -> None:
        with self._guard:
            self.futures.pop(job_id, None)

    def _lock(self, dataset: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(dataset, threading.Lock())

    def _run(self, job: Job, ds: Dataset) -> Job:
        with self._lock(job.dataset):
            job.state = "running"
            job.started_at = cv.utcnow().isoformat()
            self.save(job)
            try:
                if job.dagster_job is None or job.dagster_run_id is None:
                    job.result = run_operation(ds, job.operation, job.params)
                elif job.dagster_mode == "queued":
                    job.result = wait_queued(ds, job.dagster_job, job.dagster_run_id)
                else:
                    job.result = run_in_dagster(
                        ds, job.dagster_job, job.dagster_run_id, job.operation, job.params
                    )
                job.state = "succeeded"
            except BaseException as exc:  # recorded, and raised to whoever waits
                log.exception("operation %s of %s failed", job.operation, job.dataset)
                job.state = "failed"
                job.error = f"{type(exc).__name__}: {exc}"
                job.finished_at = cv.utcnow().isoformat()
                self.save(job)
                raise
            job.finished_at = cv.utcnow().isoformat()
            self.save(job)
            return job


def run_operation(ds: Dataset, operation: Kind, params: dict[str, Any]) -> dict[str, Any]:
    """Run one operation through the facade; its result as a dict."""
    force = bool(params.get("force", False))
    runs: dict[Kind, Callable[[], Any]] = {
        "flush": ds.flush,
        "make": lambda: ds.make(force=force),
        "export": lambda: ds.export(params.get("kinds") or list(EXPORT_KINDS), force=force),
        "compact": ds.compact,
        "optimize": lambda: ds.optimize(vacuum=bool(params.get("vacuum", False))),
    }
    result = runs[operation]()
    data: dict[str, Any] = json.loads(json.dumps(result.as_dict(), default=str))
    return data


class OperationBody(BaseModel):
    """A job to run: ``name`` (ours: flush, make, export, compact, optimize; or the
    peer's ``MakeJob``, ``ExportJob``, ``OptimizeJob``...), and its options."""

    model_config = ConfigDict(extra="forbid")

    name: str
    dataset: str | None = Field(default=None, description="Ignored: the path names it.")
    kind: str | None = Field(default=None, description="ExportJob: one export kind.")
    kinds: list[str] | None = Field(default=None, description="export: the kinds to run.")
    force: bool = False
    vacuum: bool = False


router = APIRouter(tags=["operations"])


def _job_response(job: Job, status: int = 202) -> JSONResponse:
    location = f"/{job.dataset}/_api/operations/{job.id}"
    return JSONResponse(asdict(job), status_code=status, headers={"Location": location})


@router.post("/{dataset}/_api/operations", status_code=202)
def submit(ds: DatasetDep, request: Request, body: OperationBody, force: bool = False) -> Response:
    """Submit an operation: 202 with the job (its ``id``, ``state``); the peer's
    ``?force=true`` is taken too. An unknown operation is 400, as the peer."""
    operation = NAMES.get(body.name)
    if operation is None:
        raise HTTPException(400, detail=f"Unknown operation: `{body.name}`")
    kinds = body.kinds or ([body.kind] if body.kind else None)
    for kind in kinds or ():
        if kind not in EXPORT_KINDS:
            raise ValueError(f"export kind {kind!r}: one of {', '.join(EXPORT_KINDS)}")
    params = {"force": body.force or force, "vacuum": body.vacuum, "kinds": kinds}
    worker: Worker = request.app.state.worker
    job, _ = worker.submit(ds, operation, params)
    return _job_response(job)


@router.get("/{dataset}/_api/operations")
def list_jobs(ds: DatasetDep, request: Request) -> list[dict[str, Any]]:
    """This server's jobs of the dataset, newest first."""
    worker: Worker = request.app.state.worker
    return worker.jobs_of(ds.name)


@router.get("/{dataset}/_api/operations/{job_id}")
def job_state(ds: DatasetDep, request: Request, job_id: str) -> dict[str, Any]:
    """A job's state: queued, running, succeeded (with its result), failed (with the error)."""
    worker: Worker = request.app.state.worker
    job = worker.load(job_id)
    if job is None or job.dataset != ds.name:
        raise SourceNotFoundError(f"no job {job_id} of dataset {ds.name!r} on this server")
    data = asdict(job)
    if job.dagster_run_id is not None:
        data["dagster_status"] = dagster_status(ds.settings, job.dagster_run_id)
    return data


async def _submit_and_wait(request: Request, ds: Dataset, operation: Kind) -> Job | Response:
    worker: Worker = request.app.state.worker
    job, future = worker.submit(ds, operation, {"force": False})
    wait = ds.settings.api_operation_wait_seconds

    def result() -> Job | None:
        try:
            return future.result(timeout=wait)  # the operation's error, if it failed
        except TimeoutError:
            return None

    done = await run_in_threadpool(result)
    return _job_response(job) if done is None else done


@router.post("/{dataset}/_api/entities/flush")
async def flush(ds: DatasetDep, request: Request) -> Response:
    """The peer's flush: the new statements' count as text, once the job is done."""
    done = await _submit_and_wait(request, ds, "flush")
    if isinstance(done, Response):
        return done
    return PlainTextResponse(str(new_statements(done.result or {})))


def new_statements(result: dict[str, Any]) -> int:
    """The flush's new statements: the worker's result, or the statements asset's
    metadata of the Dagster run that flushed."""
    if "new" in result:
        return int(result["new"])
    meta = (result.get("materializations") or {}).get("statements") or {}
    return int(meta.get("new_statements") or 0)


@router.post("/{dataset}/_api/entities/merge")
async def merge(ds: DatasetDep, request: Request) -> Response:
    """The peer's merge (collapse duplicates, reap tombstones): our compact; ``ok``."""
    done = await _submit_and_wait(request, ds, "compact")
    if isinstance(done, Response):
        return done
    return PlainTextResponse("ok")
