"""File URLs a recipient may fetch: presigned on S3, signed by the server on a local lake.

A Delta Sharing recipient never holds storage credentials: each file of a
query's answer comes with a URL valid for ``LAKEHOUSE_SHARING_URL_SECONDS``.

- **S3**: a presigned ``GET`` of that object (boto3, the lake's own client);
  the storage server checks the signature and the expiry.
- **A local lake**: ``{base}/delta-sharing/files/{name}?sp=r&g={grant}&s={signature}``
  on this server, where ``grant`` is the base64url JSON of (dataset, table,
  path in the table, expiry, token id) and ``signature`` its HMAC-SHA256
  under a key derived from the server secret (never the secret itself, which
  signs tokens). The route checks the signature in constant time, the expiry,
  that the token id was not revoked since, and that the path stays inside
  that dataset's table folder. Nothing of a URL can be changed to reach
  another dataset's file: the dataset is inside what is signed. ``sp=r``
  ("signed permission: read", as in an Azure SAS) is what delta-kernel looks
  for to tell a presigned URL from a path under the table root (its
  ``is_presigned``: ``X-Amz-Signature``, ``sp``, ``X-Goog-Credential``…); the
  route ignores it, as every URL of this route grants reading one file only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import posixpath
import time
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from lakehouse_assets import conventions as cv
from lakehouse_assets.sharing.recipients import SharingError
from lakehouse_assets.sharing.tables import TABLES
from lakehouse_assets.storage import S3Store, Store
from lakehouse_assets.tokens import Revocations

#: The path of the download route under the sharing prefix.
FILES_ROUTE: Final = "/files"
#: Separates the purpose of the URL key from a token key derived from the same secret.
_KEY_LABEL: Final = b"lakehouse-sharing-file-url-v1"


def url_key(secret: str) -> bytes:
    return hmac.new(secret.encode(), _KEY_LABEL, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class FileGrant:
    """What a signed URL lets its holder read, until ``expires`` (unix seconds)."""

    dataset: str
    table: str
    path: str
    expires: int
    jti: str | None

    def lake_path(self) -> str:
        """The file's path in the lake: refused unless it stays in the table folder."""
        clean = posixpath.normpath(self.path)
        if clean.startswith(("/", "..")) or clean != self.path or "\x00" in clean:
            raise SharingError(403, "PERMISSION_DENIED", "the file URL names no table file")
        return cv.dataset_path(cv.dataset_name(self.dataset), TABLES[self.table], clean)


def sign(key: bytes, grant: FileGrant) -> str:
    """``{name}?sp=r&g={grant}&s={signature}``: the route's tail for a local file (the
    capability in the query string, which the server's access log never writes)."""
    fields = [grant.dataset, grant.table, grant.path, grant.expires, grant.jti]
    payload = _b64(json.dumps(fields, separators=(",", ":")).encode())
    signature = _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())
    name = quote(posixpath.basename(grant.path) or "data.parquet")
    return f"{name}?sp=r&g={payload}&s={signature}"


def verify(key: bytes, payload: str, signature: str, revoked: Revocations) -> FileGrant:
    """The grant of a signed URL; 403 when it is tampered with, expired or revoked."""
    expected = _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())
    # as bytes: compare_digest refuses str with non-ASCII characters (a 500, not a 403)
    if not hmac.compare_digest(expected.encode(), signature.encode("utf-8", "replace")):
        raise SharingError(403, "PERMISSION_DENIED", "the file URL's signature does not match")
    try:
        fields: Any = json.loads(_unb64(payload))
        dataset, table, path, expires, jti = fields
    except (ValueError, binascii.Error, TypeError):
        raise SharingError(403, "PERMISSION_DENIED", "the file URL is malformed") from None
    if table not in TABLES or not isinstance(expires, int):
        raise SharingError(403, "PERMISSION_DENIED", "the file URL is malformed")
    if expires < time.time():
        raise SharingError(403, "PERMISSION_DENIED", "the file URL has expired")
    if jti is not None and revoked.is_revoked(jti):
        raise SharingError(403, "PERMISSION_DENIED", "the token of this file URL was revoked")
    return FileGrant(dataset, table, path, expires, jti)


def presign(store: S3Store, lake_path: str, seconds: int) -> str:
    """A presigned ``GET`` of a lake file on S3 (the store's own endpoint and keys)."""
    key = f"{store.prefix}/{lake_path}" if store.prefix else lake_path
    url: str = store.client.generate_presigned_url(
        "get_object", Params={"Bucket": store.bucket, "Key": key}, ExpiresIn=seconds
    )
    return url


def file_url(store: Store, base: str, key: bytes, grant: FileGrant, seconds: int) -> str:
    """The URL of one table file: presigned on S3, the signed route otherwise."""
    if isinstance(store, S3Store):
        return presign(store, grant.lake_path(), seconds)
    return f"{base}{FILES_ROUTE}/{sign(key, grant)}"
