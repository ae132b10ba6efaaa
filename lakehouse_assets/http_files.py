"""Serving a stored file: ``ETag``, ``If-None-Match`` → 304, one ``Range`` → 206.

The ETag is the quoted SHA-256 of the content: an archived blob's checksum,
or (for exports) computed once per stored version of the file, keyed by the
store's fingerprint of it. A ``Range`` the file cannot satisfy is 416 with
``Content-Range: bytes */size``; a multi-range request gets the whole file
(RFC 9110 lets a server ignore ``Range``).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from typing import Final

from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from lakehouse_assets.storage import Store

#: bytes read and sent at a time (each chunk one hop to a worker thread)
CHUNK: Final = 4 * 1024 * 1024
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
    etag = f'"{sha256}"'
    headers = {"ETag": etag, "Accept-Ranges": "bytes"}
    if filename:
        safe = filename.replace('"', "").replace("\\", "")
        headers["Content-Disposition"] = f'inline; filename="{safe}"'
    match = request.headers.get("if-none-match")
    if match and (match.strip() == "*" or etag in [m.strip() for m in match.split(",")]):
        return Response(status_code=304, headers=headers)
    size = store.size(path)
    wanted = _byte_range(request.headers.get("range"), size)
    if wanted == "unsatisfiable":
        return Response(status_code=416, headers={**headers, "Content-Range": f"bytes */{size}"})
    status, start, length = 200, 0, size
    if isinstance(wanted, tuple):
        status, start, length = 206, wanted[0], wanted[1] - wanted[0] + 1
        headers["Content-Range"] = f"bytes {start}-{wanted[1]}/{size}"
    headers["Content-Length"] = str(length)
    if request.method == "HEAD":
        # the headers alone: a body generator would read the whole file for nothing
        # (the server drops a HEAD's body), and clients ask HEAD before each open
        return Response(status_code=status, headers=headers, media_type=media_type)
    body = _read(store, path, start, length)
    return StreamingResponse(body, status_code=status, headers=headers, media_type=media_type)
