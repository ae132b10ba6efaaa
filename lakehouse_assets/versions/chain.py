"""The hash-linked chain of published versions: :class:`Version`, the head and history.

Reading the chain needs only the store (chain entries, ``latest.json`` and the
manifests they name); as-of reads of the tables build on it in
:mod:`lakehouse_assets.versions.asof`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from lakehouse_assets import conventions as cv
from lakehouse_assets.conventions import CHAIN, chain_entry_path, latest_path
from lakehouse_assets.errors import LakehouseError

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


#: A version id (:func:`lakehouse_assets.conventions.version_id`).
_VERSION_ID = re.compile(r"\d{14}-\d{6}")


class VersionNotFoundError(LakehouseError, LookupError):
    """No published version matches what was asked for."""


@dataclass(frozen=True, slots=True)
class Version:
    """One published version: its chain entry and its manifest."""

    sequence: int
    path: str
    hash: str
    manifest: dict[str, Any]

    @property
    def snapshot_id(self) -> str:
        return str(self.manifest["snapshot_id"])

    @property
    def created_at(self) -> datetime:
        return datetime.fromisoformat(self.manifest["created_at"])

    @property
    def version_id(self) -> str:
        """The sortable id followthemoney and yente know it by (``index.json``'s ``version``)."""
        return cv.version_id(self.created_at)

    def table_version(self, table: str) -> int | None:
        entry = self.manifest["tables"].get(table)
        return None if entry is None else entry.get("version")

    def summary(self) -> dict[str, Any]:
        """One line of ``lakehouse versions``."""
        m = self.manifest
        return {
            "sequence": self.sequence,
            "snapshot_id": self.snapshot_id,
            "version": self.version_id,
            "created_at": m["created_at"],
            "hash": self.hash,
            "parent_hash": m["parent_hash"],
            "logical_hash": m["logical_hash"],
            **m["totals"],
            "changes": (m.get("diff") or {}).get("counts"),
            "tables": {k: v["version"] for k, v in m["tables"].items()},
        }


def _read_entry(ds: DatasetContext, sequence: int) -> dict[str, Any] | None:
    path = chain_entry_path(ds.name, sequence)
    if not ds.store.exists(path):
        return None
    entry: dict[str, Any] = json.loads(ds.store.read_text(path))
    return entry


def _load(ds: DatasetContext, entry: Mapping[str, Any]) -> Version:
    manifest = json.loads(ds.store.read_text(entry["path"]))
    return Version(int(entry["sequence"]), entry["path"], entry["hash"], manifest)


def head_sequence(ds: DatasetContext) -> int:
    """The sequence number of the head (0: nothing published yet).

    Starts from ``latest.json`` and follows chain entries past it, so a lagging
    pointer (a publisher that died after its entry) costs one extra read.
    """
    seq = 0
    latest = latest_path(ds.name)
    if ds.store.exists(latest):
        seq = int(json.loads(ds.store.read_text(latest))["sequence"])
    while ds.store.exists(chain_entry_path(ds.name, seq + 1)):
        seq += 1
    return seq


def head(ds: DatasetContext) -> Version | None:
    """The latest published version, or ``None``."""
    seq = head_sequence(ds)
    if seq == 0:
        return None
    entry = _read_entry(ds, seq)
    if entry is None:  # latest.json names an entry that is not there (tampered)
        raise VersionNotFoundError(
            f"Dataset {ds.name!r}: versions/latest.json names version {seq}, "
            "whose chain entry is missing; run `lakehouse verify`"
        )
    return _load(ds, entry)


def history(ds: DatasetContext) -> list[Version]:
    """Every published version, oldest first (reads the whole chain)."""
    prefix = cv.dataset_path(ds.name, cv.VERSIONS, CHAIN) + "/"
    entries = sorted(p for p in ds.store.list(prefix) if p.endswith(".json"))
    return [_load(ds, json.loads(ds.store.read_text(p))) for p in entries]


def resolve(ds: DatasetContext, as_of: str | int) -> Version:
    """The version ``as_of`` names: a sequence number, a snapshot id, a version id
    (``20261122101112-123456``, as ``index.json`` has it), or a time (ISO 8601;
    the last version published at or before it)."""
    text = str(as_of).strip()
    if text.isdigit():
        entry = _read_entry(ds, int(text))
        if entry is None:
            raise VersionNotFoundError(
                f"Dataset {ds.name!r} has no version {text} "
                f"(the head is {head_sequence(ds)}; see `lakehouse -d {ds.name} versions`)"
            )
        return _load(ds, entry)
    versions = history(ds)
    for version in versions:
        if text in (version.snapshot_id, version.version_id):
            return version
    if _VERSION_ID.fullmatch(text):
        raise VersionNotFoundError(
            f"Dataset {ds.name!r} has no version {text!r} (see `lakehouse -d {ds.name} versions`)"
        )
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise VersionNotFoundError(
            f"Dataset {ds.name!r}: {text!r} is not a version number, snapshot id, "
            "version id or ISO 8601 time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    before = [v for v in versions if v.created_at <= when]
    if not before:
        first = versions[0].manifest["created_at"] if versions else "never"
        raise VersionNotFoundError(
            f"Dataset {ds.name!r} had no published version at {when.isoformat()} "
            f"(first published: {first})"
        )
    return before[-1]
