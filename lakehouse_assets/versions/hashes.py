"""Self-describing hashes of versions: multihash, canonical JSON, SHA-256 and SHA-1 of files.

Every other module of the package hashes through these, so a manifest, a chain
entry and verify agree on one spelling of a hash (``f1220`` + 64 hex digits).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Final

from lakehouse_assets import conventions as cv

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


#: Multihash prefix of SHA-256 (code 0x12, 32 bytes) in multibase base16 (``f``).
SHA256_PREFIX: Final = "f1220"


def multihash(digest: bytes) -> str:
    """A SHA-256 digest as a self-describing string (multihash, multibase base16)."""
    return SHA256_PREFIX + digest.hex()


def canonical_json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    """The hash a child manifest links to: SHA-256 over the canonical JSON."""
    return multihash(hashlib.sha256(canonical_json(manifest)).digest())


def sha256_of(ds: DatasetContext, path: str) -> str:
    """Hex SHA-256 of a lake file, streamed."""
    digest = hashlib.sha256()
    with ds.store.open_read(path) as fh:
        while chunk := fh.read(8 * 1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _digests(ds: DatasetContext, path: str) -> tuple[str, str]:
    """Hex SHA-256 and SHA-1 of a lake file, in one read."""
    sha256, sha1 = hashlib.sha256(), hashlib.sha1(usedforsecurity=False)
    with ds.store.open_read(path) as fh:
        while chunk := fh.read(8 * 1024 * 1024):
            sha256.update(chunk)
            sha1.update(chunk)
    return sha256.hexdigest(), sha1.hexdigest()


def _known(known: MutableMapping[str, Any] | None, rel: str, size: int, key: str) -> str | None:
    entry = (known or {}).get(rel)
    if entry is not None and entry.get("size") == size and entry.get(key):
        return str(entry[key])
    return None


def _hash_once(
    ds: DatasetContext, rel: str, size: int, known: MutableMapping[str, Any] | None
) -> tuple[str, str]:
    sha, sha1 = _digests(ds, cv.dataset_path(ds.name, rel))
    if known is not None:
        known[rel] = {"path": rel, "size": size, "sha256": sha, "sha1": sha1}
    return sha, sha1


def known_sha256(
    ds: DatasetContext, rel: str, size: int, known: MutableMapping[str, Any] | None
) -> str:
    """SHA-256 of the dataset's file ``rel`` (now ``size`` bytes): from ``known``
    (by path: what the export pass computed while writing the file) when it
    holds the file at that size, otherwise read and hashed once, and recorded
    in ``known`` for the next caller (index.json, then the version manifest)."""
    return _known(known, rel, size, "sha256") or _hash_once(ds, rel, size, known)[0]


def known_sha1(
    ds: DatasetContext, rel: str, size: int, known: MutableMapping[str, Any] | None
) -> str:
    """SHA-1 of the dataset's file ``rel``, as :func:`known_sha256` finds it: the
    checksum yente compares a downloaded resource with (followthemoney's
    ``DataResource.checksum``), so a consumer can check a download without
    another hash of ours."""
    return _known(known, rel, size, "sha1") or _hash_once(ds, rel, size, known)[1]
