"""What the routes share: the tenant's lake, the dataset a route names, bounded bodies.

A token's tenant opens the lake as that tenant (its tags, locks and queue are
the tenant's); a peer token without a tenant name acts as the server's
``LAKEHOUSE_TENANT``. The lakes are kept per tenant for the process's life.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from starlette.requests import ClientDisconnect

from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.server.auth import Authorized, Grant
from lakehouse_assets.settings import Settings

NDJSON: str = "application/x-ndjson"
#: bytes read from a request body at a time
CHUNK = 1024 * 1024


class Lakes:
    """One :class:`Lakehouse` per tenant, opened on first use."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lakes: dict[str, Lakehouse] = {}
        self._lock = threading.Lock()

    def get(self, tenant: str | None) -> Lakehouse:
        key = tenant or self.settings.tenant
        with self._lock:
            lake = self._lakes.get(key)
            if lake is None:
                lake = self._lakes[key] = Lakehouse(settings=self.settings, tenant=key)
            return lake


def lake_of(request: Request, grant: Grant) -> Lakehouse:
    lakes: Lakes = request.app.state.lakes
    return lakes.get(grant.tenant)


def get_dataset(dataset: str, request: Request, grant: Authorized) -> Dataset:
    """The dataset the path names: 422 for a bad name, 404 when it was never created
    (after the token is checked, so a stranger learns nothing of which exist)."""
    return lake_of(request, grant).dataset(dataset)


DatasetDep = Annotated[Dataset, Depends(get_dataset)]


def staging_dir(settings: Settings) -> Path:
    """The server's local folder for request bodies being received (not under the
    cache folder: the archive never reads a source there; no caller but the
    server's own upload may name a file in it)."""
    base = settings.api_state_path
    base.mkdir(parents=True, exist_ok=True, mode=0o700)  # owner only, as what it holds
    folder = base / "staging"
    folder.mkdir(exist_ok=True, mode=0o700)
    return folder


async def _chunks(request: Request, timeout: float) -> AsyncIterator[bytes]:
    stream = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(stream.__anext__(), timeout)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise HTTPException(408, detail=f"no body data for {timeout:g} s") from None
        except ClientDisconnect:  # nobody reads the answer; no traceback in the log
            raise HTTPException(400, detail="the client went away before the body ended") from None
        yield chunk


async def receive_body(request: Request, limit: int, what: str) -> Path:
    """The request body in a staging file of its own (the caller removes it).

    413 as soon as it passes ``limit`` (or when Content-Length says it will),
    408 when the client stalls; in both cases, and when the client goes away,
    the staged part is removed before the error leaves.
    """
    settings: Settings = request.app.state.settings
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, detail=f"{what} of {declared} bytes: the limit is {limit}")
    fd, name = tempfile.mkstemp(prefix="body-", dir=staging_dir(settings))
    path = Path(name)
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in _chunks(request, settings.api_upload_timeout_seconds):
                size += len(chunk)
                if size > limit:
                    raise HTTPException(413, detail=f"{what} over {limit} bytes: the limit")
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path
