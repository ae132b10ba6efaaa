"""The published files at their lake paths, for yente and browsers.

With ``LAKEHOUSE_PUBLIC_URL`` naming this server, the metadata a ``make``
writes (the catalog ``index.json``, each dataset's ``index.json``, yente's
``entities_url`` and ``delta_url``) points at ``{public_url}/{lake path}``;
this module answers those paths beside the export routes of :mod:`.exports`:

- ``/index.json``: the catalog, **filtered** to the datasets the caller may
  read (anonymous: ``LAKEHOUSE_PUBLIC_DATASETS``), so it never names a
  private dataset; its ETag is the SHA-256 of the answer;
- ``/{dataset}/diffs/entities.ftm.json/index.json`` and
  ``/{dataset}/diffs/entities.ftm.json/{version}.delta.json``: yente's delta
  feed (the index and one file per published version);
- ``/{dataset}/index.json``, ``/{dataset}/entities.ftm.json`` and
  ``/{dataset}/exports/...`` stay in :mod:`.exports`, with
  :func:`published_dataset` as their dependency.

Each with ``ETag``, ``If-None-Match`` → 304 and ``Range`` → 206 (:mod:`..http_files`).
A dataset matching ``LAKEHOUSE_PUBLIC_DATASETS`` is read without a token;
any other needs one with ``read`` (401/403 as every route). A request that
carries a token is always judged by it.
"""

from __future__ import annotations

import hashlib
import json
from fnmatch import fnmatchcase
from typing import Annotated, Final

from fastapi import APIRouter, Depends, Request, Response
from starlette.concurrency import run_in_threadpool

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import SourceNotFoundError
from lakehouse_assets.http_files import content_sha256, file_response
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.server.auth import Grant, authorize, bearer, request_grant, unauthorized
from lakehouse_assets.server.deps import lake_of
from lakehouse_assets.settings import Settings

router = APIRouter(tags=["published"])

JSON: Final = "application/json"


def is_public(settings: Settings, dataset: str) -> bool:
    return any(fnmatchcase(dataset, glob) for glob in settings.public_datasets)


def published_dataset(dataset: str, request: Request) -> Dataset:
    """The dataset of a published file: anonymous when it is public, else the token's."""
    settings: Settings = request.app.state.settings
    if "authorization" not in request.headers and is_public(settings, dataset):
        lake: Lakehouse = request.app.state.lakes.get(None)
        return lake.dataset(dataset)
    grant = authorize(request)
    return lake_of(request, grant).dataset(dataset)


PublishedDep = Annotated[Dataset, Depends(published_dataset)]


def _readable(request: Request) -> tuple[Lakehouse, Grant | None]:
    """The caller's lake and grant (None: anonymous); the catalog names no dataset, so
    the token is only checked to be valid here (401), each entry against it below."""
    if "authorization" not in request.headers:
        return request.app.state.lakes.get(None), None
    token = bearer(request.headers.get("authorization"))
    if token is None:
        raise unauthorized("no bearer token")
    grant = request_grant(request, token)
    return lake_of(request, grant), grant


@router.api_route("/index.json", methods=["GET", "HEAD"])
async def catalog_index(request: Request) -> Response:
    """The catalog ``index.json``: only the datasets the caller may read."""
    lake, grant = _readable(request)
    settings: Settings = request.app.state.settings

    def may(name: str) -> bool:
        if grant is None:
            return is_public(settings, name)
        return grant.allows("GET", f"/{name}/index.json")

    def render() -> bytes:
        if not lake.store.exists(cv.CATALOG_INDEX):
            raise SourceNotFoundError("the lake has no catalog index.json yet: run make")
        data = json.loads(lake.store.read_text(cv.CATALOG_INDEX))
        data["datasets"] = [d for d in data.get("datasets", []) if may(str(d.get("name")))]
        return json.dumps(data, indent=2, ensure_ascii=False).encode()

    body = await run_in_threadpool(render)
    etag = f'"{hashlib.sha256(body).hexdigest()}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    match = request.headers.get("if-none-match")
    if match and etag in [m.strip() for m in match.split(",")]:
        return Response(status_code=304, headers=headers)
    return Response(body if request.method == "GET" else b"", media_type=JSON, headers=headers)


@router.api_route("/{dataset}/diffs/entities.ftm.json/{name}", methods=["GET", "HEAD"])
async def delta_feed(ds: PublishedDep, request: Request, name: str) -> Response:
    """yente's delta feed: ``index.json`` or a version's ``{id}.delta.json``."""
    if name == "index.json":
        path = cv.diff_index_path(ds.name)
        media = JSON
    else:
        snapshot = name.removesuffix(".delta.json")
        if snapshot == name:
            raise SourceNotFoundError(f"no delta file {name!r}")
        path = cv.diff_path(ds.name, snapshot)  # validated: no path can escape
        media = "application/x-ndjson"

    def prepare() -> str:
        if not ds.store.exists(path):
            raise SourceNotFoundError(f"dataset {ds.name!r} has no {name} in its delta feed")
        return content_sha256(ds.store, path)

    sha256 = await run_in_threadpool(prepare)
    return file_response(request, ds.store, path, sha256=sha256, media_type=media)
