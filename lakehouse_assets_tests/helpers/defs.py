"""The Dagster layer's shared test pieces: the asset keys of the definitions and the
resources of a lake (for sensors and jobs built in tests)."""

from __future__ import annotations

from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.lake import Lakehouse

KEYS = {
    "archive",
    "mappings",
    "journal",
    "statements",
    "translog",
    "statements_csv",
    "entities_ftm_json",
    "statistics",
    "index",
    "graph",
    "graph_cypher",
    "optimize",
    "compact",
}


def resources(lake: Lakehouse) -> dict[str, object]:
    return {
        "lakehouse": LakehouseResource(
            lake_uri=lake.settings.lake_uri, journal_url=lake.settings.journal_url
        )
    }
