"""The lake's catalog ``index.json``: every dataset with its latest published version.

Rewritten when a dataset is created and after each publish (with a dated copy
then), so it lives with the versions it lists rather than on the facade.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import yaml

from lakehouse_assets import conventions as cv
from lakehouse_assets.catalog import dataset_names, load_dataset_config
from lakehouse_assets.storage import Store
from lakehouse_assets.versions.chain import head

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


def write_catalog(
    store: Store, context_of: Callable[[str], DatasetContext], *, snapshot: bool = False
) -> None:
    """Rewrite the catalog ``index.json`` (and ``config.yml`` if missing).

    Each dataset is listed with its latest published version and logical
    hash; with ``snapshot`` (after a dataset published a version) a copy
    goes under ``versions/YYYY/MM/{timestamp}/index.json``. Every rewrite
    reads every dataset's head, so two datasets publishing at once leave
    a catalog that the next publish completes.
    """
    entries = []
    for name in dataset_names(store):
        cfg = load_dataset_config(store, name)
        entry: dict[str, Any] = {"name": name, "title": cfg.get("title", name)}
        version = head(context_of(name))
        if version is not None:
            entry["version"] = {
                "sequence": version.sequence,
                "hash": version.hash,
                "logical_hash": version.manifest["logical_hash"],
                "published_at": version.manifest["created_at"],
                "manifest": version.path,
            }
        entries.append(entry)
    now = cv.utcnow()
    index = {"datasets": entries, "updated_at": now.isoformat()}
    text = json.dumps(index, indent=2)
    store.write_text(cv.CATALOG_INDEX, text)
    if snapshot:
        store.write_text(cv.catalog_version(cv.CATALOG_INDEX, now), text)
    if not store.exists(cv.CATALOG_CONFIG):
        store.write_text(cv.CATALOG_CONFIG, yaml.safe_dump({"name": "catalog"}))
