"""Archived files over HTTP: upload, list, metadata, download, delete.

A tenant uploads bytes; it never names a path of the server. The body is
received into the server's own staging folder (``LAKEHOUSE_API_STATE_DIR``,
bounded by ``LAKEHOUSE_API_MAX_UPLOAD_BYTES``: 413), then archived through the
facade, which computes the SHA-256 and, when the client gave one, verifies it
(a mismatch is 422 and stores nothing). The staged file is removed whatever
happens, a stalled or vanished client included. The archive reads it with a
source policy whose only root is that staging folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from lakehouse_assets import conventions as cv
from lakehouse_assets.access import SourceAccess
from lakehouse_assets.archive import FileMeta
from lakehouse_assets.errors import InvalidInputError
from lakehouse_assets.http_files import file_response
from lakehouse_assets.lake import Dataset
from lakehouse_assets.server.deps import NDJSON, DatasetDep, receive_body, staging_dir

router = APIRouter(tags=["archive"])

#: an uploaded file's name is metadata, but it still may not look like a path
MAX_NAME = 255


def file_name(value: str) -> str:
    """A file name without folders, ``..``, or control characters (else 422)."""
    if (
        not value
        or len(value) > MAX_NAME
        or value in (".", "..")
        or "/" in value
        or "\\" in value
        or any(ord(c) < 32 or ord(c) == 127 for c in value)
    ):
        raise InvalidInputError(
            f"file name {value[:80]!r}: a plain name (no folders, '..' or control characters, "
            f"at most {MAX_NAME} characters)"
        )
    return value


def _archive(
    ds: Dataset,
    staged: Path,
    *,
    name: str,
    key: str,
    checksum: str | None,
    file_id: str | None,
    mimetype: str | None,
    document: bool,
) -> FileMeta:
    folder = Path(os.path.realpath(staging_dir(ds.settings)))
    access = SourceAccess.for_staged(ds.settings, ds.store, folder, dataset=ds.name)
    return ds.add_file(
        str(staged),
        checksum=checksum,
        create_document=document,
        follow_symlinks=False,
        key=key,
        name=name,
        file_id=file_id,
        mimetype=mimetype,
        access=access,
    )


@router.post("/{dataset}/_api/archive", status_code=201)
async def upload(
    ds: DatasetDep,
    request: Request,
    name: Annotated[str, Query(description="The file's name (metadata; no folders).")],
    checksum: Annotated[
        str | None, Query(description="Expected SHA-256: a mismatch stores nothing (422).")
    ] = None,
    key: Annotated[
        str | None, Query(description="The path the tenant knows the file by (default: name).")
    ] = None,
    file_id: str | None = None,
    document: Annotated[
        bool, Query(description="Also write the file's Document entity to the journal.")
    ] = False,
) -> FileMeta:
    """Archive the request body as a file of the dataset; answers its metadata."""
    file_name(name)
    if checksum is not None:
        checksum = cv.checksum(checksum.lower())
    if file_id is not None:
        cv.file_id(file_id)
    if key is not None:
        cv.text(key, "file key", 4096)
    mimetype = request.headers.get("content-type")
    if mimetype in (None, "application/octet-stream", "application/x-www-form-urlencoded"):
        mimetype = None
    staged = await receive_body(request, ds.settings.api_max_upload_bytes, "upload")
    try:
        return await run_in_threadpool(
            lambda: _archive(
                ds,
                staged,
                name=name,
                key=key or name,
                checksum=checksum,
                file_id=file_id,
                mimetype=mimetype,
                document=document,
            )
        )
    finally:
        staged.unlink(missing_ok=True)


@router.get("/{dataset}/_api/archive")
def list_files(ds: DatasetDep) -> StreamingResponse:
    """Every file's metadata, NDJSON."""

    def lines() -> Iterator[bytes]:
        for meta in ds.archive.list():
            yield meta.model_dump_json().encode() + b"\n"

    return StreamingResponse(lines(), media_type=NDJSON)


@router.get("/{dataset}/_api/archive/{checksum}")
def file_meta(ds: DatasetDep, checksum: str) -> FileMeta:
    """A file's metadata (the most recently updated of its entries), 404 if unknown."""
    return ds.archive.get(cv.checksum(checksum))


@router.get("/{dataset}/_api/archive/{checksum}/files")
def file_entries(ds: DatasetDep, checksum: str) -> list[FileMeta]:
    """Every metadata entry of a blob (one per key it was archived under)."""
    return ds.archive.files(cv.checksum(checksum))


@router.api_route("/{dataset}/_api/archive/{checksum}/data", methods=["GET", "HEAD"])
def download(ds: DatasetDep, request: Request, checksum: str) -> Response:
    """A file's content, with its checksum as ``ETag``, ``If-None-Match`` and ``Range``."""
    meta = ds.archive.get(cv.checksum(checksum))
    return file_response(
        request,
        ds.store,
        cv.archive_blob(ds.name, meta.checksum),
        sha256=meta.checksum,
        media_type=meta.mimetype,
        filename=meta.name,
    )


@router.delete("/{dataset}/_api/archive/{checksum}/{file_id}")
def delete(ds: DatasetDep, checksum: str, file_id: str) -> dict[str, Any]:
    """Remove one metadata entry (the blob stays, as the spec says); answers it."""
    meta = ds.archive.delete(cv.file_id(file_id), checksum=cv.checksum(checksum))
    return meta.model_dump(mode="json")
