"""The Delta Sharing REST routes (delta-io/delta-sharing PROTOCOL.md), parquet format.

One share, ``lake``: its schemas are the datasets the recipient's token names
(and that exist), its tables each dataset's ``statements``, ``translog`` and
``changes`` (:mod:`.tables`). What the Python connector (``delta-sharing``
1.4) calls is answered: list shares / schemas / tables / all-tables with
``maxResults`` and ``nextPageToken``, the table version (``GET .../version``
and the older ``HEAD`` of the table, ``delta-table-version`` header), the
metadata, ``POST .../query`` (``version`` or ``timestamp``; ``limitHint`` is
applied best effort from the files' row counts, ``predicateHints`` and
``jsonPredicateHints`` are accepted and ignored, as the protocol lets a
server do) and ``GET .../changes`` where :func:`.tables.changes` can tell the
changes honestly.

**Response formats.** A snapshot (``metadata``, ``query``) is answered in the
``delta`` format when the client's ``delta-sharing-capabilities`` offers it,
else in ``parquet``; the answer's header names the one chosen. The Python
connector offers both when left to choose, and with ``delta`` reads the files
through delta-kernel (a fake log of the answer's ``add`` actions, one Arrow
table converted once) instead of file by file: a fifth less CPU, no less
time on a quiet machine (docs/benchmarks.md). The change feed
is served in ``parquet`` only: a client that offers nothing else is told so.

The recipient is checked on every route before any name is looked up: a
schema outside the token's datasets is 403 whether it exists or not; inside
them, an unknown one is 404. Errors are the protocol's
``{"errorCode", "message"}``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterable
from typing import Annotated, Any, Final

from deltalake import DeltaTable
from fastapi import APIRouter, Depends, FastAPI, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import DatasetNotFoundError, InvalidNameError
from lakehouse_assets.http_files import file_response, local_file_response
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets.sharing import tables
from lakehouse_assets.sharing.recipients import (
    Recipient,
    SharingError,
    decode,
    unauthenticated,
)
from lakehouse_assets.sharing.urls import FileGrant, file_url, url_key, verify
from lakehouse_assets.storage import LocalStore, Store
from lakehouse_assets.tokens import Revocations

#: Where the server mounts the protocol; a profile's endpoint is the server's URL plus this.
PREFIX: Final = "/delta-sharing"
#: The one share: the lake (schemas are its datasets).
SHARE: Final = "lake"
NDJSON: Final = "application/x-ndjson; charset=utf-8"
PARQUET: Final = "application/vnd.apache.parquet"
VERSION_HEADER: Final = "Delta-Table-Version"
CAPABILITIES_HEADER: Final = "delta-sharing-capabilities"
#: The protocol's two response formats (``responseformat=`` of the capabilities header).
DELTA: Final = "delta"
PARQUET_FORMAT: Final = "parquet"
#: The page size when the client names none, and the largest one it may ask for.
PAGE: Final = 500
MAX_PAGE: Final = 1000


class Sharing:
    """What the routes share: the settings, the secret's keys, the lake, revocations."""

    def __init__(self, settings: Settings, secret: str) -> None:
        self.settings = settings
        self.secret = secret
        self.url_key = url_key(secret)
        self.revoked = Revocations(settings)
        self._lake: Lakehouse | None = None

    @property
    def lake(self) -> Lakehouse:
        if self._lake is None:  # opened on first use: no storage access at start-up
            self._lake = Lakehouse(settings=self.settings)
        return self._lake

    @property
    def lake_opened(self) -> Lakehouse | None:
        """The lake if a request opened it already (an async route opens it off the loop)."""
        return self._lake


def _sharing(request: Request) -> Sharing:
    state: Sharing = request.app.state.sharing
    return state


def recipient(request: Request) -> Recipient:
    """The request's recipient from its bearer token, or 401."""
    auth = request.headers.get("authorization") or ""
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthenticated()
    sharing = _sharing(request)
    return decode(token.strip(), sharing.secret, sharing.revoked)


Who = Annotated[Recipient, Depends(recipient)]


class SharingErrorBody(BaseModel):
    """The protocol's error answer."""

    errorCode: str  # noqa: N815 - the protocol's names
    message: str


#: the protocol's error answers, documented on every route (they replace the tenant
#: API's ``{"detail", "error"}`` for these codes in the OpenAPI schema)
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": SharingErrorBody, "description": text}
    for code, text in (
        (400, "INVALID_PARAMETER_VALUE: a bad parameter, or changes not served"),
        (401, "UNAUTHENTICATED: no token, or an expired, forged or revoked one"),
        (403, "PERMISSION_DENIED: not shared with this token; a bad file URL"),
        (404, "RESOURCE_DOES_NOT_EXIST: no such share, schema or table"),
    )
}
router = APIRouter(prefix=PREFIX, tags=["delta-sharing"], responses=ERRORS)


# --- names and paging --------------------------------------------------------------


def _share(share: str) -> str:
    if share.lower() != SHARE:
        raise SharingError(404, "RESOURCE_DOES_NOT_EXIST", f"no share {share!r}")
    return SHARE


def _schemas(sharing: Sharing, who: Recipient) -> list[str]:
    return sorted(name for name in sharing.lake.datasets() if who.may_read(name))


def _dataset(sharing: Sharing, who: Recipient, share: str, schema: str) -> Dataset:
    """The dataset a schema names: 403 outside the token's datasets, then 404."""
    _share(share)
    name = schema.lower()
    try:
        cv.dataset_name(name)
    except InvalidNameError:
        raise SharingError(404, "RESOURCE_DOES_NOT_EXIST", f"no schema {schema!r}") from None
    if not who.may_read(name):
        raise SharingError(403, "PERMISSION_DENIED", f"schema {schema!r} is not shared with you")
    try:
        return sharing.lake.dataset(name)
    except DatasetNotFoundError:
        raise SharingError(404, "RESOURCE_DOES_NOT_EXIST", f"no schema {schema!r}") from None


def _page(items: list[dict[str, Any]], max_results: int | None, token: str | None) -> Response:
    """One page of ``items`` with a ``nextPageToken`` while more follow."""
    if max_results is not None and not 0 <= max_results <= MAX_PAGE:
        raise SharingError(400, "INVALID_PARAMETER_VALUE", f"maxResults in 0..{MAX_PAGE}")
    start = 0
    if token:
        try:
            start = int(base64.urlsafe_b64decode(token.encode()).decode())
        except (ValueError, binascii.Error):
            start = -1
        if start < 0:
            raise SharingError(400, "INVALID_PARAMETER_VALUE", "bad pageToken")
    size = PAGE if max_results is None else max_results
    page = items[start : start + size]
    body: dict[str, Any] = {"items": page}
    if start + size < len(items) and size:
        body["nextPageToken"] = base64.urlsafe_b64encode(str(start + size).encode()).decode()
    return JSONResponse(body)


MaxResults = Annotated[int | None, Query(alias="maxResults")]
PageToken = Annotated[str | None, Query(alias="pageToken")]


def _table_item(schema: str, table: str) -> dict[str, Any]:
    return {"name": table, "schema": schema, "share": SHARE}


@router.get("/shares")
def list_shares(who: Who, max_results: MaxResults = None, page_token: PageToken = None) -> Response:
    """The shares: the lake."""
    return _page([{"name": SHARE}], max_results, page_token)


@router.get("/shares/{share}")
def get_share(who: Who, share: str) -> dict[str, Any]:
    return {"share": {"name": _share(share)}}


@router.get("/shares/{share}/schemas")
def list_schemas(
    who: Who,
    request: Request,
    share: str,
    max_results: MaxResults = None,
    page_token: PageToken = None,
) -> Response:
    """The datasets of the lake the token may read."""
    _share(share)
    items = [{"name": s, "share": SHARE} for s in _schemas(_sharing(request), who)]
    return _page(items, max_results, page_token)


@router.get("/shares/{share}/schemas/{schema}/tables")
def list_tables(
    who: Who,
    request: Request,
    share: str,
    schema: str,
    max_results: MaxResults = None,
    page_token: PageToken = None,
) -> Response:
    """The dataset's tables that have data."""
    ds = _dataset(_sharing(request), who, share, schema)
    items = [_table_item(ds.name, t) for t in tables.existing_tables(ds)]
    return _page(items, max_results, page_token)


@router.get("/shares/{share}/all-tables")
def list_all_tables(
    who: Who,
    request: Request,
    share: str,
    max_results: MaxResults = None,
    page_token: PageToken = None,
) -> Response:
    """Every table of every dataset the token may read."""
    sharing = _sharing(request)
    _share(share)
    items = [
        _table_item(name, t)
        for name in _schemas(sharing, who)
        for t in tables.existing_tables(sharing.lake.dataset(name))
    ]
    return _page(items, max_results, page_token)


# --- a table ----------------------------------------------------------------------


def _offered_formats(request: Request) -> set[str]:
    """The response formats the client's capabilities header offers (parquet when silent)."""
    for part in request.headers.get(CAPABILITIES_HEADER, "").split(";"):
        key, _, value = part.partition("=")
        if key.strip().lower() == "responseformat":
            offered = {v.strip().lower() for v in value.split(",") if v.strip()}
            return offered or {PARQUET_FORMAT}
    return {PARQUET_FORMAT}


def response_format(request: Request) -> str:
    """``delta`` when the client offers it, else ``parquet`` (see the module's docstring)."""
    offered = _offered_formats(request)
    if DELTA in offered:
        return DELTA
    if PARQUET_FORMAT in offered:
        return PARQUET_FORMAT
    raise SharingError(
        400,
        "INVALID_PARAMETER_VALUE",
        f"responseformat {','.join(sorted(offered))} is not served: ask for delta or parquet",
    )


def _ndjson(
    lines: Iterable[dict[str, Any]], version: int, response: str = PARQUET_FORMAT
) -> Response:
    body = b"".join(json.dumps(line, separators=(",", ":")).encode() + b"\n" for line in lines)
    headers = {VERSION_HEADER: str(version), CAPABILITIES_HEADER: f"responseformat={response}"}
    return Response(body, media_type=NDJSON, headers=headers)


def _head_lines(dt: DeltaTable, response: str, *, with_version: bool) -> list[dict[str, Any]]:
    """The protocol and metadata lines of an answer in ``response`` format."""
    if response == DELTA:
        return [tables.delta_protocol_line(dt), tables.delta_metadata_line(dt)]
    return [tables.PROTOCOL_LINE, tables.metadata_line(dt, with_version=with_version)]


@router.api_route("/shares/{share}/schemas/{schema}/tables/{table}/version", methods=["GET"])
def table_version(
    who: Who,
    request: Request,
    share: str,
    schema: str,
    table: str,
    starting_timestamp: Annotated[str | None, Query(alias="startingTimestamp")] = None,
) -> Response:
    """The table's version (at ``startingTimestamp``: the first at or after it)."""
    ds = _dataset(_sharing(request), who, share, schema)
    dt = tables.open_table(ds, table.lower())
    version = dt.version()
    if starting_timestamp is not None:
        version = tables.version_at(dt, starting_timestamp)
    return Response(status_code=200, headers={VERSION_HEADER: str(version)})


@router.head("/shares/{share}/schemas/{schema}/tables/{table}")
def table_version_head(who: Who, request: Request, share: str, schema: str, table: str) -> Response:
    """The older protocol's ``HEAD`` of a table: its version in the header."""
    ds = _dataset(_sharing(request), who, share, schema)
    version = tables.open_table(ds, table.lower()).version()
    return Response(status_code=200, headers={VERSION_HEADER: str(version)})


@router.get("/shares/{share}/schemas/{schema}/tables/{table}/metadata")
def table_metadata(who: Who, request: Request, share: str, schema: str, table: str) -> Response:
    """The protocol and metadata lines of the table's head."""
    ds = _dataset(_sharing(request), who, share, schema)
    response = response_format(request)
    dt = tables.open_table(ds, table.lower())
    return _ndjson(_head_lines(dt, response, with_version=False), dt.version(), response)


class QueryBody(BaseModel):
    """The query's body: time travel and hints (unknown fields are ignored)."""

    model_config = ConfigDict(extra="ignore")

    predicateHints: list[str] | None = None  # noqa: N815 - the protocol's names
    jsonPredicateHints: str | None = None  # noqa: N815
    limitHint: int | None = None  # noqa: N815
    version: int | None = None
    timestamp: str | None = None
    startingVersion: int | None = None  # noqa: N815
    endingVersion: int | None = None  # noqa: N815


def _base(sharing: Sharing, request: Request) -> str:
    """This server's URL as the recipient reaches it (``LAKEHOUSE_PUBLIC_URL`` when set)."""
    root = sharing.settings.public_url or str(request.base_url)
    return root.rstrip("/") + PREFIX


def _file_line(
    sharing: Sharing,
    request: Request,
    who: Recipient,
    ds: Dataset,
    table: str,
    file: tables.TableFile,
    *,
    key: str = "file",
) -> dict[str, Any]:
    seconds = sharing.settings.sharing_url_seconds
    expires = int(time.time()) + seconds
    grant = FileGrant(ds.name, table, file.path, expires, who.jti)
    out: dict[str, Any] = {
        "url": file_url(ds.store, _base(sharing, request), sharing.url_key, grant, seconds),
        "id": hashlib.sha256(f"{ds.name}/{table}/{file.path}".encode()).hexdigest()[:32],
        "partitionValues": file.partition_values,
        "size": file.size,
        "expirationTimestamp": expires * 1000,
    }
    if file.stats is not None and key == "file":
        out["stats"] = file.stats
    if file.version is not None:
        out["version"] = file.version
        out["timestamp"] = file.timestamp
    return {key: out}


def _delta_file_line(line: dict[str, Any], file: tables.TableFile) -> dict[str, Any]:
    """A parquet-format ``file`` line as the delta format's: the table's own ``add``
    action, its path the signed URL."""
    parquet = line["file"]
    add: dict[str, Any] = {
        "path": parquet["url"],
        "partitionValues": file.partition_values,
        "size": file.size,
        "modificationTime": file.modified,
        "dataChange": True,
    }
    if file.stats is not None:
        add["stats"] = file.stats
    out = {"id": parquet["id"], "expirationTimestamp": parquet["expirationTimestamp"]}
    return {"file": {**out, "deltaSingleAction": {"add": add}}}


def _limited(files: list[tables.TableFile], limit: int | None) -> list[tables.TableFile]:
    """The first files that hold ``limit`` rows (by their stats; all when unknown)."""
    if limit is None or limit < 0:
        return files
    out, rows = [], 0
    for file in files:
        if rows >= limit:
            break
        out.append(file)
        count = json.loads(file.stats).get("numRecords") if file.stats else None
        if count is None:
            return files
        rows += int(count)
    return out


def _query_body(raw: bytes) -> QueryBody:
    """The body, parsed here so a bad one gets the protocol's 400, not FastAPI's."""
    if not raw.strip():
        return QueryBody()
    try:
        return QueryBody.model_validate_json(raw)
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"] if exc.errors() else "not JSON"
        raise SharingError(400, "INVALID_PARAMETER_VALUE", f"bad query body: {problem}") from None


QUERY_BODY: Final = {
    "requestBody": {
        "required": False,
        "content": {"application/json": {"schema": QueryBody.model_json_schema()}},
    }
}


@router.post("/shares/{share}/schemas/{schema}/tables/{table}/query", openapi_extra=QUERY_BODY)
async def query_table(who: Who, request: Request, share: str, schema: str, table: str) -> Response:
    """The table's files at the head, a ``version`` or a ``timestamp`` (body: ``QueryBody``)."""
    body = _query_body(await request.body())
    return await run_in_threadpool(_query, who, request, share, schema, table, body)


def _query(
    who: Recipient, request: Request, share: str, schema: str, table: str, body: QueryBody
) -> Response:
    sharing = _sharing(request)
    ds = _dataset(sharing, who, share, schema)
    name = table.lower()
    if body.startingVersion is not None:
        raise SharingError(
            400,
            "INVALID_PARAMETER_VALUE",
            "startingVersion (streaming) is not served: read the changes route",
        )
    response = response_format(request)
    travel = body.version is not None or body.timestamp is not None
    dt = tables.open_table(ds, name, version=body.version, timestamp=body.timestamp)
    files = _limited(tables.snapshot_files(dt), body.limitHint)
    when = _commit_ms(dt) if travel and response == PARQUET_FORMAT else None
    lines = _head_lines(dt, response, with_version=travel)
    for file in files:
        line = _file_line(sharing, request, who, ds, name, file)
        if response == DELTA:
            line = _delta_file_line(line, file)
        elif travel:
            line["file"]["version"] = dt.version()
            line["file"]["timestamp"] = when
        lines.append(line)
    return _ndjson(lines, dt.version(), response)


def _commit_ms(dt: DeltaTable) -> int | None:
    history = dt.history(1)
    return int(history[0]["timestamp"]) if history else None


@router.get("/shares/{share}/schemas/{schema}/tables/{table}/changes")
def table_changes(
    who: Who,
    request: Request,
    share: str,
    schema: str,
    table: str,
    starting_version: Annotated[int | None, Query(alias="startingVersion")] = None,
    ending_version: Annotated[int | None, Query(alias="endingVersion")] = None,
    starting_timestamp: Annotated[str | None, Query(alias="startingTimestamp")] = None,
    ending_timestamp: Annotated[str | None, Query(alias="endingTimestamp")] = None,
) -> Response:
    """The inserted rows' files of a version range, where that is the whole change."""
    sharing = _sharing(request)
    ds = _dataset(sharing, who, share, schema)
    if PARQUET_FORMAT not in _offered_formats(request):
        raise SharingError(
            400,
            "INVALID_PARAMETER_VALUE",
            "the changes are served in the parquet response format only: "
            "read them without use_delta_format",
        )
    name = table.lower()
    dt = tables.open_table(ds, name)
    head = dt.version()
    if starting_version is None and starting_timestamp is not None:
        starting_version = tables.version_at(dt, starting_timestamp)
    if starting_version is None:
        raise SharingError(400, "INVALID_PARAMETER_VALUE", "startingVersion or startingTimestamp")
    end = head if ending_version is None else ending_version
    if ending_timestamp is not None:
        end = min(end, tables.open_table(ds, name, timestamp=ending_timestamp).version())
    if not 0 <= starting_version <= end <= head:
        raise SharingError(
            400,
            "INVALID_PARAMETER_VALUE",
            f"versions {starting_version}..{end} are not within 0..{head}",
        )
    lines: list[dict[str, Any]] = [tables.PROTOCOL_LINE, tables.metadata_line(dt)]
    for change in tables.changes(ds, name, dt, starting_version, end):
        lines.append(_file_line(sharing, request, who, ds, name, change, key=change.kind))
    return _ndjson(lines, starting_version)


# --- the signed download route of a local lake ----------------------------------


@router.api_route("/files/{name}", methods=["GET", "HEAD"])
async def download(
    request: Request,
    name: str,
    g: Annotated[str, Query(description="the signed grant")],
    s: Annotated[str, Query(description="its signature")],
) -> Response:
    """A table file a query handed out (``HEAD``, ``Range`` → 206, ``ETag``).

    The grant and its signature travel in the query string, which the server's
    access log never writes. The connector sends about ten requests per file
    (four ``HEAD``, three whole-file ``GET`` it drops after the status, the
    footer twice over, then the data): on a local lake each is answered here
    on the event loop (an HMAC, a ``stat``, no worker thread but for the
    bytes), the body by :func:`~lakehouse_assets.http_files.local_file_response`."""
    sharing = _sharing(request)
    grant = verify(sharing.url_key, g, s, sharing.revoked)
    path = grant.lake_path()
    if sharing.lake_opened is None:  # the first request opens the lake (storage access)
        await run_in_threadpool(lambda: sharing.lake)
    store = sharing.lake.store
    if not isinstance(store, LocalStore):  # S3 lakes hand out presigned URLs, not these
        return await run_in_threadpool(_stored_file, request, store, path)
    file = store.local_path(path)
    try:
        info = os.stat(file)
    except (FileNotFoundError, NotADirectoryError):
        info = None
    if info is None or not stat.S_ISREG(info.st_mode):
        raise SharingError(404, "RESOURCE_DOES_NOT_EXIST", "the file is gone (vacuumed)")
    return local_file_response(
        request,
        file,
        info,
        sha256=_file_tag(path, store.stat_fingerprint(info)),
        media_type=PARQUET,
    )


def _file_tag(path: str, fingerprint: str) -> str:
    """The ETag of a table file: a Delta data file is written once and never changed in
    place, so its path and the store's fingerprint name its content (no full read
    to hash it, as exports need)."""
    return hashlib.sha256(f"{path}\0{fingerprint}".encode()).hexdigest()


def _stored_file(request: Request, store: Store, path: str) -> Response:
    if not store.exists(path):
        raise SharingError(404, "RESOURCE_DOES_NOT_EXIST", "the file is gone (vacuumed)")
    tag = _file_tag(path, store.fingerprint(path))
    return file_response(request, store, path, sha256=tag, media_type=PARQUET)


# --- mounting -------------------------------------------------------------------


async def _sharing_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SharingError)
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(
        status_code=exc.status,
        content={"errorCode": exc.code, "message": str(exc)},
        headers=headers,
    )


def mount(app: FastAPI, settings: Settings, secret: str) -> None:
    """Serve the protocol under :data:`PREFIX` of ``app`` (the server's app)."""
    app.state.sharing = Sharing(settings, secret)
    app.include_router(router)
    app.add_exception_handler(SharingError, _sharing_error)
