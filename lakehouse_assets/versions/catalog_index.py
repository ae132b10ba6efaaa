"""The lake's catalog ``index.json``: every dataset with its latest published version.

Rewritten when a dataset is created and after each publish (with a dated copy
then), so it lives with the versions it lists rather than on the facade.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import yaml

from lakehouse_assets import conventions as cv
from lakehouse_assets.catalog import dataset_names
from lakehouse_assets.storage import Store
from lakehouse_assets.versions.chain import head
from lakehouse_assets.versions.feed import catalog_entry

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


def write_catalog(
    store: Store, context_of: Callable[[str], DatasetContext], *, snapshot: bool = False
) -> None:
    """Rewrite the catalog ``index.json`` (and ``config.yml`` if missing).

    Each dataset is listed as followthemoney's ``DataCatalog`` reads it: the
    ``index.json`` its latest version published, with that version's id and
    the lake's record of it (:func:`~lakehouse_assets.versions.feed.catalog_entry`);
    with ``snapshot`` (after a dataset published a version) a copy
    goes under ``versions/YYYY/MM/{timestamp}/index.json``. Every rewrite
    reads every dataset's head, so two datasets publishing at once leave
    a catalog that the next publish completes.
    """
    entries = [catalog_entry(store, name, head(context_of(name))) for name in dataset_names(store)]
    now = cv.utcnow()
    index = {"datasets": entries, "updated_at": now.isoformat()}
    text = json.dumps(index, indent=2)
    store.write_text(cv.CATALOG_INDEX, text)
    if snapshot:
        store.write_text(cv.catalog_version(cv.CATALOG_INDEX, now), text)
    if not store.exists(cv.CATALOG_CONFIG):
        store.write_text(cv.CATALOG_CONFIG, yaml.safe_dump({"name": "catalog"}))
