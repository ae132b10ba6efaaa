"""The dataset's export files, streamed with ``ETag`` (their SHA-256), 304 and 206.

At the peer's paths (its blob store serves the lake's keys as they are:
``/{dataset}/entities.ftm.json``, ``/{dataset}/index.json``,
``/{dataset}/exports/statements.csv``, ``/{dataset}/exports/statistics.json``)
and under ``/{dataset}/_api/exports/{name}``. Only these names: no other key
of the lake is reachable this way. At the peer's paths a dataset of
``LAKEHOUSE_PUBLIC_DATASETS`` is read without a token (:mod:`.published`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated, Final, Literal

from fastapi import APIRouter, Query, Request, Response
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import SourceNotFoundError
from lakehouse_assets.http_files import content_sha256, file_response
from lakehouse_assets.lake import Dataset
from lakehouse_assets.server.deps import DatasetDep, staging_dir
from lakehouse_assets.server.published import PublishedDep
from lakehouse_assets.storage import LocalStore

router = APIRouter(tags=["exports"])

ExportName = Literal["statements.csv", "entities.ftm.json", "statistics.json", "index.json"]
#: export name → (lake path in the dataset, media type)
EXPORTS: Final[dict[str, tuple[str, str]]] = {
    "statements.csv": (cv.STATEMENTS_CSV, "text/csv; charset=utf-8"),
    "entities.ftm.json": (cv.ENTITIES_JSON, "application/x-ndjson"),
    "statistics.json": (cv.STATISTICS_JSON, "application/json"),
    "index.json": (cv.INDEX, "application/json"),
}


def _prepare(ds: Dataset, name: str) -> tuple[str, str, str]:
    part, media_type = EXPORTS[name]
    path = cv.dataset_path(ds.name, part)
    if not ds.store.exists(path):
        raise SourceNotFoundError(
            f"dataset {ds.name!r} has no {name} yet: run the export (make) first"
        )
    return path, media_type, content_sha256(ds.store, path)


async def _export(ds: Dataset, request: Request, name: str) -> Response:
    path, media_type, sha256 = await run_in_threadpool(_prepare, ds, name)
    return file_response(request, ds.store, path, sha256=sha256, media_type=media_type)


#: export name → the kind ``Dataset.export_as_of`` re-makes of a published version
AS_OF_KINDS: Final[dict[str, str]] = {
    "statements.csv": "statements",
    "entities.ftm.json": "entities",
    "statistics.json": "statistics",
}


def _render(ds: Dataset, name: str, as_of: str) -> tuple[Path, str]:
    """The export ``name`` of version ``as_of``, re-made into a staging file; its SHA-256."""
    if name not in AS_OF_KINDS:
        raise ValueError(f"{name} is not re-made for a version: one of {', '.join(AS_OF_KINDS)}")
    fd, tmp = tempfile.mkstemp(prefix="export-", dir=staging_dir(ds.settings))
    path = Path(tmp)
    try:
        with os.fdopen(fd, "wb") as out:
            ds.export_as_of(as_of, AS_OF_KINDS[name], out)
        return path, content_sha256(LocalStore(path.parent), path.name)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


@router.api_route("/{dataset}/_api/exports/{name}", methods=["GET", "HEAD"])
async def export_file(
    ds: DatasetDep,
    request: Request,
    name: ExportName,
    as_of: Annotated[
        str | None,
        Query(description="A published version: the export re-made as it was then."),
    ] = None,
) -> Response:
    """An export file (``statements.csv``, ``entities.ftm.json``, ``statistics.json``,
    ``index.json``): 404 before its first export. With ``as_of`` the export of that
    published version, re-made (``lakehouse export KIND --as-of``; not ``index.json``)."""
    if as_of is None:
        return await _export(ds, request, name)
    path, sha256 = await run_in_threadpool(_render, ds, name, as_of)
    response = file_response(
        request, LocalStore(path.parent), path.name, sha256=sha256, media_type=EXPORTS[name][1]
    )
    response.background = BackgroundTask(path.unlink, missing_ok=True)
    return response


@router.api_route("/{dataset}/entities.ftm.json", methods=["GET", "HEAD"])
async def peer_entities(ds: PublishedDep, request: Request) -> Response:
    """``entities.ftm.json`` at the peer's path."""
    return await _export(ds, request, "entities.ftm.json")


@router.api_route("/{dataset}/index.json", methods=["GET", "HEAD"])
async def peer_index(ds: PublishedDep, request: Request) -> Response:
    """``index.json`` at the peer's path."""
    return await _export(ds, request, "index.json")


@router.api_route("/{dataset}/exports/{name}", methods=["GET", "HEAD"])
async def peer_exports(
    ds: PublishedDep, request: Request, name: Literal["statements.csv", "statistics.json"]
) -> Response:
    """``exports/statements.csv`` and ``exports/statistics.json`` at the peer's paths."""
    return await _export(ds, request, name)
