"""Load a lake's dataset as yente does: run in yente's own virtual environment.

``python yente_driver.py CATALOG_URL DATASET STATE OUT [--by-resource NAME] [--scope NAME]``

yente's manifest loader reads the catalog ``index.json`` at ``CATALOG_URL``
(``Catalog.load``: followthemoney's ``DataCatalog`` with yente's ``Dataset``);
its ``DatasetUpdater`` decides, from the version in ``STATE`` (the last one
loaded, none at first), between the full load and the deltas, and yields the
entity operations; each goes through yente's ``build_entity_action`` (what
its indexer sends to the search index: an entity yente refuses is counted)
and is applied to the entities of ``STATE`` the way the index applies it
(``DEL`` deletes the id, ``ADD``/``MOD`` index the entity under its id; a full
load starts from an empty index). ``OUT`` gets the new state and what yente
decided. ``--by-resource`` drops ``entities_url`` so yente takes the
resource of that name, with its checksum checked (``YENTE_VERIFY_CHECKSUM``).
``--scope`` is the manifest's ``scope`` (how yente is told to load a collection).

This file imports yente: it is never imported by the test suite.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from pathlib import Path
from typing import Any


async def main(argv: list[str]) -> None:
    from yente.data.dataset import Dataset
    from yente.data.manifest import Catalog, CatalogManifest, Manifest
    from yente.data.updater import DatasetUpdater
    from yente.search.indexer import build_entity_action

    catalog_url, name, state_path, out_path = argv[:4]
    extra = dict(zip(argv[4::2], argv[5::2], strict=False))
    by_resource = extra.get("--by-resource")
    # a collection is loaded only in scope (yente's Dataset: load = not is_collection)
    scope = extra.get("--scope")
    manifest = Manifest(catalogs=[CatalogManifest(url=catalog_url, scope=scope)])
    specs = await manifest.fetch_datasets()
    if by_resource is not None:
        for spec in specs:
            spec.pop("entities_url", None)
            spec["resource_name"] = by_resource
    catalog = Catalog(Dataset, {})  # as Catalog.load builds it, from the specs
    for spec in specs:
        catalog.make_dataset(spec)
    dataset = catalog.require(name)
    state_file = Path(state_path)
    state: dict[str, Any] = (
        json.loads(state_file.read_text())
        if state_file.exists()
        else {"version": None, "entities": {}}
    )
    updater = await DatasetUpdater.build(dataset, state["version"])
    out: dict[str, Any] = {
        "dataset_version": dataset.model.version,
        "entities_url": dataset.model.entities_url,
        "delta_url": dataset.model.delta_url,
        "needs_update": updater.needs_update(),
        "incremental": updater.is_incremental,
        "delta_versions": [v for v, _ in updater.delta_urls or []],
        "ops": {"ADD": 0, "MOD": 0, "DEL": 0},
        "refused": 0,
    }
    entities: dict[str, Any] = dict(state["entities"]) if updater.is_incremental else {}
    if out["needs_update"]:
        names = set(dataset.dataset_names)
        async for op in updater.load():
            out["ops"][op["op"]] += 1
            entity = copy.deepcopy(op["entity"])  # yente's Entity.from_dict pops keys
            if build_entity_action("index", op["op"], entity, names, dataset) is None:
                out["refused"] += 1
            if op["op"] == "DEL":
                entities.pop(op["entity"]["id"], None)
            else:
                entities[op["entity"]["id"]] = op["entity"]
        version = updater.target_version
    else:
        entities = dict(state["entities"])
        version = state["version"]
    state_file.write_text(json.dumps({"version": version, "entities": entities}))
    out["version"] = version
    out["entities"] = entities
    Path(out_path).write_text(json.dumps(out))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
