"""Staging areas inside the lake: where operations keep intermediate files.

An operation stages under ``{dataset}/_staging/{operation}-{run id}/``, in the
lake's own storage (a folder of a local lake, keys under an ``s3://`` lake),
never in the driver's temp folder: a Spark Connect server or a cluster's
executors reach the lake, not the driver's disk. The run removes its area when
it is done; a run that was killed leaves it, and the next run of the same
operation (holding the same lock, so no live run can own an area) removes
every area of that operation and counts what it removed in its job record.

Local scratch space of a process (Spark's and the JVM's temp folders, a file
assembled before its upload to S3) lives in :func:`scratch_dir`, named after
the process; :func:`clean_stale_scratch` removes those of dead processes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lakehouse_assets import conventions as cv
from lakehouse_assets.locks import pid_alive, process_start
from lakehouse_assets.settings import Settings
from lakehouse_assets.storage import LocalStore

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext

#: Staging folder of an earlier version of the exports (cleaned the same way).
LEGACY = {"export": ".staging"}


@dataclass
class Cleaned:
    """What removing stale staging areas freed."""

    areas: int = 0
    files: int = 0
    bytes: int = 0

    def add(self, other: Cleaned) -> None:
        self.areas += other.areas
        self.files += other.files
        self.bytes += other.bytes

    def as_dict(self) -> dict[str, int]:
        return {"areas": self.areas, "files": self.files, "bytes": self.bytes}


def new_area(ds: DatasetContext, operation: str, run_id: str | None = None) -> str:
    """The lake path of a fresh staging area for one run of ``operation``."""
    name = f"{cv.job_type(operation)}-{run_id or uuid.uuid4().hex}"
    return cv.dataset_path(ds.name, cv.STAGING, name)


@contextmanager
def area(ds: DatasetContext, operation: str, run_id: str | None = None) -> Iterator[str]:
    """A fresh staging area for one run (its full URI), removed when the block ends."""
    rel = new_area(ds, operation, run_id)
    try:
        yield ds.store.full_uri(rel)
    finally:
        remove(ds, rel)


def _is_local_folder(ds: DatasetContext, rel: str) -> bool:
    """Whether ``rel`` is a folder of a local lake (an empty one included)."""
    return isinstance(ds.store, LocalStore) and ds.store.local_path(rel).is_dir()


def remove(ds: DatasetContext, rel: str) -> Cleaned:
    """Delete a staging area (or any lake folder) and say what it held."""
    store = ds.store
    cleaned = Cleaned()
    if isinstance(store, LocalStore):
        root = store.local_path(rel)
        return _remove_folder(root) if root.exists() else cleaned
    for path in list(store.list(rel.rstrip("/") + "/")):
        cleaned.files += 1
        with contextlib.suppress(OSError):
            cleaned.bytes += store.size(path)
        store.delete(path)
    cleaned.areas = 1 if cleaned.files else 0
    return cleaned


def clean_stale(ds: DatasetContext, operation: str) -> Cleaned:
    """Remove every staging area of ``operation`` (call while holding its lock)."""
    cleaned = Cleaned()
    prefix = f"{cv.job_type(operation)}-"
    base = cv.dataset_path(ds.name, cv.STAGING)
    # empty areas too: a run killed before it wrote anything leaves an empty
    # folder in a local lake, which a listing of what holds files never shows
    for name in ds.store.list_dirs(base, empty=True):
        if name.startswith(prefix):
            cleaned.add(remove(ds, f"{base}/{name}"))
    legacy = LEGACY.get(operation)
    if legacy is not None:
        old = cv.dataset_path(ds.name, legacy)
        if ds.store.list_dirs(old, empty=True) or _is_local_folder(ds, old):
            cleaned.add(remove(ds, old))
    return cleaned


# --- this process's scratch folder (local) ---------------------------------------------


def scratch_dir(settings: Settings) -> Path:
    """This process's local scratch folder: Spark's ``spark.local.dir`` and the JVM's
    temp folder (block manager files, extracted native libraries), uploads to S3.

    Named after the process (pid and start time), so a later process can tell
    a folder of a killed one from a live one's.
    """
    pid = os.getpid()
    folder = settings.cache_path / "scratch" / f"{pid}-{process_start(pid) or 0}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def clean_stale_scratch(settings: Settings) -> Cleaned:
    """Remove the scratch folders of processes that are gone (or whose pid was re-used)."""
    cleaned = Cleaned()
    base = settings.cache_path / "scratch"
    if not base.is_dir():
        return cleaned
    for entry in os.scandir(base):
        pid_text, _, start_text = entry.name.partition("-")
        if not (pid_text.isdigit() and start_text.isdigit()):
            continue
        pid, start = int(pid_text), int(start_text)
        if pid_alive(pid) and (start == 0 or process_start(pid) == start):
            continue  # a live process's folder
        cleaned.add(_remove_folder(Path(entry.path)))
    return cleaned


def _remove_folder(root: Path) -> Cleaned:
    """Delete a local folder, counting its files and bytes."""
    cleaned = Cleaned(areas=1)
    for folder, _dirs, files in os.walk(root):
        for name in files:
            cleaned.files += 1
            with contextlib.suppress(OSError):
                cleaned.bytes += os.path.getsize(os.path.join(folder, name))
    shutil.rmtree(root, ignore_errors=True)
    return cleaned
