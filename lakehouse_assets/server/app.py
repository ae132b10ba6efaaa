"""The app factory: routers, the request-id middleware, the error mapping, health.

Errors the lakehouse raises on purpose become one JSON ``{"detail": ...}``
with the status that says what to do: a bad name or input 422 (naming the
line of an NDJSON body), an unknown dataset, file or version 404, a held lock or a
flaky network 503 with ``Retry-After``, a dataset with work in flight 409.
Anything else is a 500 whose detail is only the request id (the traceback
goes to the log, under that id).

Example:
    >>> app = create_app(Settings(lake_uri="./lake", api_secret="0" * 32))
"""

from __future__ import annotations

import contextvars
import importlib.metadata
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from lakehouse_assets.errors import (
    DatasetBusyError,
    DatasetNotFoundError,
    InvalidInputError,
    InvalidNameError,
    LakehouseError,
    SourceNotFoundError,
)
from lakehouse_assets.server import (
    archive,
    auth,
    exports,
    operations,
    published,
    queue,
    reads,
    writes,
)
from lakehouse_assets.server.deps import Lakes
from lakehouse_assets.settings import Settings
from lakehouse_assets.sharing import mount as mount_sharing
from lakehouse_assets.tokens import Revocations, server_secret

log = logging.getLogger("lakehouse_assets.server")
access_log = logging.getLogger("lakehouse_assets.server.access")

#: the request id of the request being served, added to every log record
request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
#: a client's own X-Request-ID is kept when it is this tame (else a new one)
REQUEST_ID = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")

try:
    VERSION = importlib.metadata.version("lakehouse-assets")
except importlib.metadata.PackageNotFoundError:  # a checkout that was never installed
    VERSION = "0+unknown"


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to records (``%(request_id)s`` in a log format)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class RequestIdMiddleware:
    """Gives each request an id (``X-Request-ID``, the client's if tame), answers
    with it (and ``X-Lakehouse-Version``, as the peer), and logs one line per request: id, method, path, status, seconds.
    Never the query string or a header (a token travels in one)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if REQUEST_ID.match(given) else uuid.uuid4().hex
        token = request_id.set(rid)
        # the handler of unexpected errors runs outside this middleware: it finds it here
        scope.setdefault("state", {})["request_id"] = rid
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", rid.encode()),
                    (b"x-lakehouse-version", VERSION.encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            access_log.info(
                "%s %s %s %.3fs",
                scope["method"],
                scope["path"],
                status,
                time.perf_counter() - started,
            )
            request_id.reset(token)


class ErrorBody(BaseModel):
    """Every error answer: ``detail`` a message (or, for a request FastAPI could not
    parse, its list of problems) and ``error`` the lakehouse error's class."""

    detail: str | list[dict[str, Any]]
    error: str | None = None


#: the error answers documented on every route (the OpenAPI schema says what they hold)
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in (
        (401, "No token, or a malformed, expired or forged one"),
        (403, "The token does not allow this request"),
        (404, "Unknown dataset, entity, file or job"),
        (408, "The body stalled"),
        (409, "The dataset has work in flight"),
        (413, "The body is over its limit"),
        (422, "A bad name, id, body or line"),
        (503, "A lock is held or a source unreachable: retry"),
    )
}


def _error(
    status: int, exc: Exception, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """``{"detail": ..., "error": <the lakehouse error's class>}`` (the peer's ``detail``;
    ``error`` lets the remote client raise the same class)."""
    content = {"detail": detail, "error": type(exc).__name__}
    return JSONResponse(status_code=status, content=content, headers=headers)


async def _lakehouse_error(request: Request, exc: Exception) -> JSONResponse:
    # LookupError: an unknown version too (versions' VersionNotFoundError)
    if isinstance(
        exc, DatasetNotFoundError | SourceNotFoundError | FileNotFoundError | LookupError
    ):
        return _error(404, exc, str(exc))
    if isinstance(exc, InvalidNameError | InvalidInputError | ValueError):
        return _error(422, exc, str(exc))
    if isinstance(exc, DatasetBusyError):
        return _error(409, exc, str(exc))
    if isinstance(exc, LakehouseError) and exc.retryable:
        return _error(503, exc, str(exc), {"Retry-After": "5"})
    if isinstance(exc, LakehouseError):
        return _error(400, exc, str(exc))
    rid = getattr(request.state, "request_id", None) or request_id.get()
    token = request_id.set(rid)
    try:
        log.exception("unexpected error")
    finally:
        request_id.reset(token)
    return _error(500, exc, f"internal error (request {rid})")


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [{k: v for k, v in e.items() if k in ("loc", "msg", "type")} for e in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": errors})


def create_app(settings: Settings | None = None) -> FastAPI:
    """The app over the lake ``settings`` name (``LAKEHOUSE_*`` by default).

    Raises :class:`~lakehouse_assets.errors.ConfigurationError` (one line naming
    ``LAKEHOUSE_API_SECRET``) without a secret of sufficient length.
    """
    settings = settings or Settings()
    secret = server_secret(settings)
    worker = operations.Worker(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        worker.start()
        try:
            yield
        finally:
            # graceful: the running operation finishes, queued ones are cancelled
            worker.stop()

    app = FastAPI(
        title="lakehouse_assets",
        version=VERSION,
        description="An FtM data lakehouse over HTTP: tenants write, read and operate on "
        "datasets with scoped bearer tokens (see docs/server.md).",
        lifespan=lifespan,
        responses=ERRORS,
    )
    app.state.settings = settings
    app.state.secret = secret
    app.state.revoked = Revocations(settings)
    app.state.lakes = Lakes(settings)
    app.state.worker = worker

    @app.get("/health", tags=["health"])
    def health() -> dict[str, Any]:
        """Liveness: the process answers (no token, no lake access)."""
        return {"status": "ok", "version": VERSION}

    app.include_router(auth.router)
    mount_sharing(app, settings, secret)  # the Delta Sharing protocol, /delta-sharing
    for module in (writes, reads, archive, exports, published, operations, queue):
        app.include_router(module.router)
    app.add_middleware(RequestIdMiddleware)
    app.add_exception_handler(Exception, _lakehouse_error)
    app.add_exception_handler(LakehouseError, _lakehouse_error)
    app.add_exception_handler(ValueError, _lakehouse_error)
    app.add_exception_handler(FileNotFoundError, _lakehouse_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    return app
