"""Open a source URI for streaming: local path, ``file://``, ``s3://``, ``http(s)://``.

Errors distinguish a source that does not exist (fix the input) from one that
cannot be reached right now (retry may help). Which sources may be read at
all is the caller's :class:`~lakehouse_assets.access.SourceAccess`: every
source goes through it here, the one place a source is opened.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, cast
from urllib.parse import unquote, urlparse

from lakehouse_assets.access import SourceAccess, local_path
from lakehouse_assets.errors import SourceNotFoundError, SourceUnreachableError
from lakehouse_assets.settings import Settings
from lakehouse_assets.storage import s3_client, split_s3_uri

CHUNK = 1024 * 1024


def source_name(uri: str) -> str:
    """The file name part of a source URI or path."""
    parsed = urlparse(uri)
    path = parsed.path if parsed.scheme else uri
    return Path(unquote(path)).name or parsed.netloc or uri


@contextmanager
def open_source(uri: str, settings: Settings, access: SourceAccess) -> Iterator[IO[bytes]]:
    """A binary stream of a source's content, if ``access`` allows reading it."""
    path = local_path(uri)
    if path is not None:
        with access.open(path, uri) as fh:
            yield fh
        return
    access.check_remote(uri)
    scheme = urlparse(uri).scheme
    if scheme == "s3":
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = split_s3_uri(uri)
        try:
            obj = s3_client(settings).get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NoSuchBucket"):
                raise SourceNotFoundError(f"Source not found: {uri}") from exc
            raise SourceUnreachableError(f"Cannot read {uri}: {exc}") from exc
        except BotoCoreError as exc:
            raise SourceUnreachableError(f"Cannot reach {uri}: {exc}") from exc
        body = obj["Body"]
        try:
            yield body
        finally:
            body.close()
        return
    if scheme in ("http", "https"):
        import requests

        try:
            resp = requests.get(uri, stream=True, timeout=settings.http_timeout_seconds)
        except requests.RequestException as exc:
            raise SourceUnreachableError(f"Cannot reach {uri}: {exc}") from exc
        with resp:
            if resp.status_code == 404:
                raise SourceNotFoundError(f"Source not found (HTTP 404): {uri}")
            if resp.status_code >= 400:
                raise SourceUnreachableError(f"HTTP {resp.status_code} for {uri}")
            resp.raw.decode_content = True
            yield cast(IO[bytes], resp.raw)
        return
    raise SourceNotFoundError(f"Unsupported source URI scheme {scheme!r}: {uri}")


__all__ = ["CHUNK", "local_path", "open_source", "source_name"]
