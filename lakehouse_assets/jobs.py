"""Job run records: one JSON file per run under ``jobs/runs/{job_type}/``.

A record is written when a job starts (status ``running``) and rewritten when
it ends, so a crashed run is visible as a record that never finished.
"""

from __future__ import annotations

import json
import os
import socket
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from lakehouse_assets import conventions as cv
from lakehouse_assets.storage import Store


class JobRun(BaseModel):
    """What one run of a job did."""

    job_type: str
    dataset: str
    tenant: str
    started_at: datetime
    finished_at: datetime | None = None
    status: str = "running"
    host: str = Field(default_factory=socket.gethostname)
    pid: int = Field(default_factory=os.getpid)
    stats: dict[str, Any] = Field(default_factory=dict)
    errors: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None


class JobRecorder:
    """Writes the record of one running job."""

    def __init__(self, store: Store, run: JobRun) -> None:
        self.store = store
        self.run = run
        self.path = cv.job_run_path(run.dataset, run.job_type, run.started_at)

    def save(self) -> None:
        self.store.write_text(self.path, self.run.model_dump_json(indent=2))


@contextmanager
def record_job(store: Store, dataset: str, job_type: str, tenant: str) -> Iterator[JobRecorder]:
    """Record a job run; the record ends as ``succeeded`` or ``failed``."""
    run = JobRun(
        job_type=cv.job_type(job_type), dataset=dataset, tenant=tenant, started_at=cv.utcnow()
    )
    recorder = JobRecorder(store, run)
    recorder.save()
    try:
        yield recorder
    except BaseException as exc:
        run.status = "failed"
        run.error = "".join(traceback.format_exception_only(exc)).strip()
        run.finished_at = cv.utcnow()
        recorder.save()
        raise
    run.status = "succeeded"
    run.finished_at = cv.utcnow()
    recorder.save()


def list_runs(store: Store, dataset: str, job_type: str) -> list[JobRun]:
    """All recorded runs of a job type, oldest first."""
    prefix = cv.dataset_path(dataset, cv.JOB_RUNS, cv.job_type(job_type)) + "/"
    return [JobRun.model_validate(json.loads(store.read_bytes(p))) for p in store.list(prefix)]
