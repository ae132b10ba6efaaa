"""The published versions as the FtM world reads them: followthemoney's dataset
metadata and yente's delta feed.

followthemoney's ``Dataset`` (and yente's, which extends it) wants ``version``
to be one sortable string, resource ``url`` and yente's ``delta_url`` to be
http(s) URLs, and ``checksum`` to be what the consumer hashes a download with
(yente: SHA-1). The lake's own record of a version (sequence, hashes,
manifest) goes under ``lakehouse_version``, a field followthemoney ignores.

yente's ``DatasetUpdater`` reads ``delta_url``: a JSON ``{"versions":
{version id: URL of a delta file}}``; it applies, in version order, every
delta after the version it loaded up to the dataset's ``version``, each a
JSON line ``{"op": "ADD"|"MOD"|"DEL", "entity": {...}}``, and reloads
everything when its version is older than the oldest one listed. The delta
files are the diffs each version publishes (:mod:`.diffs`); their index
(``diffs/entities.ftm.json/index.json``) carries ``versions`` beside the
lake's own ``diffs`` list, limited to the last ``delta_retention`` versions
of the dataset's ``config.yml`` and to the run of versions whose diffs all
exist (a version whose diff was skipped ends the window: a delta across it
would miss its changes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Final

from lakehouse_assets import conventions as cv
from lakehouse_assets.catalog import load_dataset_config
from lakehouse_assets.errors import InvalidConfigError
from lakehouse_assets.settings import Settings
from lakehouse_assets.storage import Store

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.versions.chain import Version

#: How many versions the delta index lists unless the dataset's config.yml says.
DELTA_RETENTION: Final = 30
#: The config.yml key of that window (a number of versions, >= 1).
DELTA_RETENTION_KEY: Final = "delta_retention"
#: The field of index.json (and of each catalog entry) with the lake's record
#: of the version; followthemoney's model ignores it.
LAKEHOUSE_VERSION: Final = "lakehouse_version"


def public_url(settings: Settings, path: str) -> str | None:
    """The http(s) URL of a lake file when the lake is published (``public_url``),
    else ``None``: followthemoney's ``Url`` accepts only absolute http(s) URLs, so
    without a public base the metadata carries lake-relative ``path`` fields only."""
    if not settings.public_url:
        return None
    return f"{settings.public_url.rstrip('/')}/{path}"


def delta_retention(store: Store, dataset: str) -> int:
    """The number of versions the delta index lists (``delta_retention`` in the
    dataset's ``config.yml``, default :data:`DELTA_RETENTION`)."""
    value = load_dataset_config(store, dataset).get(DELTA_RETENTION_KEY, DELTA_RETENTION)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidConfigError(
            f"{store.full_uri(cv.dataset_path(dataset, cv.CONFIG))}: {DELTA_RETENTION_KEY} "
            f"must be a whole number of versions >= 1, got {value!r}"
        )
    return value


def stamp_index(
    ds: DatasetContext, index_text: str, created: datetime, sequence: int, parent: Version | None
) -> str:
    """``index.json`` as the version published at ``created`` has it: followthemoney's
    ``version`` (:func:`~lakehouse_assets.conventions.version_id`), yente's
    ``entities_url`` and ``delta_url`` (with a public URL), and the lake's record."""
    data = json.loads(index_text)
    data["version"] = cv.version_id(created)
    for key, path in (
        ("entities_url", cv.dataset_path(ds.name, cv.ENTITIES_JSON)),
        ("delta_url", cv.diff_index_path(ds.name)),
    ):
        url = public_url(ds.settings, path)
        if url is None:
            data.pop(key, None)
        else:
            data[key] = url
    data[LAKEHOUSE_VERSION] = {
        "sequence": sequence,
        "snapshot_id": cv.path_timestamp(created),
        "parent_hash": parent.hash if parent is not None else None,
        "manifest": cv.dataset_version(ds.name, cv.MANIFEST, created),
    }
    return json.dumps(data, indent=2, ensure_ascii=False)


def delta_versions(
    ds: DatasetContext, diffs: Sequence[Mapping[str, Any]], retention: int
) -> dict[str, str]:
    """yente's ``versions`` of the delta index: version id → URL of its delta file
    (relative to the index without a public URL: the files sit beside it), for
    the last ``retention`` versions back to the first one without a diff."""
    window: list[Mapping[str, Any]] = []
    for entry in sorted(diffs, key=lambda d: int(d["sequence"]), reverse=True):
        if len(window) >= retention or "path" not in entry or "version" not in entry:
            break
        window.append(entry)
    out: dict[str, str] = {}
    for entry in reversed(window):
        full = cv.dataset_path(ds.name, str(entry["path"]))
        out[str(entry["version"])] = public_url(ds.settings, full) or full.rsplit("/", 1)[-1]
    return out


#: The diffs' index's ``format``: what a reader of the file is told it holds.
DIFF_INDEX_FORMAT: Final = "entities.ftm.json delta"


def diff_index_entry(version: Version) -> dict[str, Any]:
    """A version's entry in the diffs' index: its place in the chain and its diff
    as the manifest records it (written by publishing, held to it by verify)."""
    return {
        "sequence": version.sequence,
        "snapshot_id": version.snapshot_id,
        "version": version.version_id,
        "version_hash": version.hash,
        "parent_sequence": version.sequence - 1 if version.sequence > 1 else None,
        "parent_hash": version.manifest["parent_hash"],
        **version.manifest.get("diff", {}),
    }


def catalog_entry(store: Store, name: str, version: Version | None) -> dict[str, Any]:
    """A dataset as the catalog ``index.json`` lists it: the ``index.json`` its head
    published (without the statistics), its ``version`` and the lake's record
    (sequence, hash, logical hash, time, manifest: what ``verify`` checks)."""
    cfg = load_dataset_config(store, name)
    entry: dict[str, Any] = {"name": name, "title": cfg.get("title", name)}
    if version is None:
        return entry
    copy = cv.dataset_version(name, cv.INDEX, version.created_at)
    try:
        published = json.loads(store.read_text(copy)) if store.exists(copy) else {}
    except ValueError:
        published = {}  # verify reports the altered copy
    if isinstance(published, dict) and published.get("name") == name:
        entry.update({k: v for k, v in published.items() if k != "statistics"})
    entry["version"] = version.version_id
    entry[LAKEHOUSE_VERSION] = catalog_record(version)
    return entry


def catalog_record(version: Version) -> dict[str, Any]:
    """The lake's record of ``version`` in a catalog entry."""
    return {
        "sequence": version.sequence,
        "hash": version.hash,
        "logical_hash": version.manifest.get("logical_hash"),
        "published_at": version.manifest["created_at"],
        "manifest": version.path,
    }
