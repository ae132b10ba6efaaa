"""Serving a stored file: ``ETag``, ``If-None-Match`` → 304, one ``Range`` → 206.

Two answers that speak the same HTTP: :func:`file_response` for any store
(read through ``Store.open_read``), and :func:`local_file_response` for a
file of a local lake, which Delta Sharing recipients fetch many times per
read (``os.pread`` spans, stopping when the client leaves). A ``HEAD`` gets
the headers alone.

The ETag is the quoted SHA-256 of the content: an archived blob's checksum,
or (for exports) computed once per stored version of the file, keyed by the
store's fingerprint of it. A ``Range`` the file cannot satisfy is 416 with
``Content-Range: bytes */size``; a multi-range request gets the whole file
(RFC 9110 lets a server ignore ``Range``).
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
import anyio.to_thread
from fastapi import Request, Response
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from lakehouse_assets.storage import Store

#: bytes read and sent at a time (each chunk one hop to a worker thread)
CHUNK: Final = 4 * 1024 * 1024
#: bytes of a local file read at a time (:class:`LocalFileResponse`): small enough
#: that a client gone mid-file costs little, large enough that a thread hop a chunk
#: is nothing beside the copy
LOCAL_CHUNK: Final = 1024 * 1024
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
#: (lake uri, path, fingerprint) → SHA-256; the few export files of a server's datasets
_digests: dict[tuple[str, str, str], str] = {}
_digests_lock = threading.Lock()
MAX_DIGESTS: Final = 4096


def content_sha256(store: Store, path: str) -> str:
    """The SHA-256 of a stored file, computed once per version of it."""
    key = (store.uri, path, store.fingerprint(path))
    with _digests_lock:
        known = _digests.get(key)
    if known is not None:
        return known
    digest = hashlib.sha256()
    with store.open_read(path) as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    value = digest.hexdigest()
    with _digests_lock:
        if len(_digests) >= MAX_DIGESTS:
            _digests.clear()
        _digests[key] = value
    return value


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None | str:
    """(first, last) of a single range, None for the whole file, "unsatisfiable"."""
    if not header:
        return None
    match = _RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(size - n, 0), size - 1
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or (last and int(last) < start):
        return "unsatisfiable"
    return start, end


def _read(store: Store, path: str, start: int, length: int) -> Iterator[bytes]:
    with store.open_read(path) as fh:
        if start:
            try:
                fh.seek(start)
            except (OSError, AttributeError, ValueError):  # a stream: skip to the start
                skip = start
                while skip:
                    got = fh.read(min(CHUNK, skip))
                    if not got:
                        return
                    skip -= len(got)
        left = length
        while left > 0:
            chunk = fh.read(min(CHUNK, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk


@dataclass(frozen=True, slots=True)
class _Answer:
    """What a request for a file of ``size`` bytes gets: a status, headers, a span."""

    status: int
    headers: dict[str, str]
    start: int = 0
    length: int = 0


def _answer(
    request: Request, size: int, *, sha256: str, filename: str | None
) -> _Answer | Response:
    """The status, headers and byte span of the answer, or the 304/416 itself (shared
    by the stored and the local file answers, so both speak the same HTTP)."""
    etag = f'"{sha256}"'
    headers = {"ETag": etag, "Accept-Ranges": "bytes"}
    if filename:
        safe = filename.replace('"', "").replace("\\", "")
        headers["Content-Disposition"] = f'inline; filename="{safe}"'
    match = request.headers.get("if-none-match")
    if match and (match.strip() == "*" or etag in [m.strip() for m in match.split(",")]):
        return Response(status_code=304, headers=headers)
    wanted = _byte_range(request.headers.get("range"), size)
    if wanted == "unsatisfiable":
        return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"})
    answer = _Answer(200, headers, 0, size)
    if isinstance(wanted, tuple):
        answer = _Answer(206, headers, wanted[0], wanted[1] - wanted[0] + 1)
        headers["Content-Range"] = f"bytes {wanted[0]}-{wanted[1]}/{size}"
    headers["Content-Length"] = str(answer.length)
    return answer


def file_response(
    request: Request,
    store: Store,
    path: str,
    *,
    sha256: str,
    media_type: str,
    filename: str | None = None,
) -> Response:
    """The stored file at ``path`` as the request asks for it (whole, a range, or 304)."""
    answer = _answer(request, store.size(path), sha256=sha256, filename=filename)
    if isinstance(answer, Response):
        return answer
    if request.method == "HEAD":
        # the headers alone: a body generator would read the whole file for nothing
        # (the server drops a HEAD's body), and clients ask HEAD before each open
        return Response(status_code=answer.status, headers=answer.headers, media_type=media_type)
    body = _read(store, path, answer.start, answer.length)
    return StreamingResponse(
        body, status_code=answer.status, headers=answer.headers, media_type=media_type
    )


class LocalFileResponse(Response):
    """A span of a local file, read with ``os.pread`` in the worker threads.

    ``StreamingResponse`` over a sync generator costs a thread hop per chunk and
    reads its first chunk before it learns that the client left; this answer
    opens the file once, reads :data:`LOCAL_CHUNK` at a time and stops at the
    client's disconnect (uvicorn drops what is sent after it without a word: a
    client that reads only the status of a whole-file GET, as fsspec's
    ``exists`` does, would cost the whole file otherwise). uvicorn offers no
    ``sendfile`` to an ASGI app (no ``pathsend`` or ``zerocopy`` extension), so
    the bytes pass through Python once.
    """

    def __init__(self, file: Path, answer: _Answer, *, media_type: str, head_only: bool) -> None:
        self.file = file
        self.start = answer.start
        self.length = 0 if head_only else answer.length
        self.status_code = answer.status
        self.media_type = media_type
        self.background = None
        self.init_headers(answer.headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        if not self.length:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        fd = await anyio.to_thread.run_sync(os.open, self.file, os.O_RDONLY)
        try:
            async with anyio.create_task_group() as group:

                async def body() -> None:
                    await self._send_span(fd, send)
                    group.cancel_scope.cancel()

                group.start_soon(body)
                while (await receive())["type"] != "http.disconnect":
                    pass
                group.cancel_scope.cancel()
        finally:
            os.close(fd)

    async def _send_span(self, fd: int, send: Send) -> None:
        offset, left = self.start, self.length
        while left > 0:
            chunk = await anyio.to_thread.run_sync(os.pread, fd, min(LOCAL_CHUNK, left), offset)
            if not chunk:  # the file shrank under us: end short, the client sees it
                raise OSError(f"{self.file} ended {left} bytes early")
            offset += len(chunk)
            left -= len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": left > 0})


def local_file_response(
    request: Request,
    file: Path,
    info: os.stat_result,
    *,
    sha256: str,
    media_type: str,
    filename: str | None = None,
) -> Response:
    """A local file (already ``stat``-ed) as the request asks for it: what
    :func:`file_response` answers, without its per-chunk costs (see
    :class:`LocalFileResponse`)."""
    answer = _answer(request, info.st_size, sha256=sha256, filename=filename)
    if isinstance(answer, Response):
        return answer
    return LocalFileResponse(
        file, answer, media_type=media_type, head_only=request.method == "HEAD"
    )
