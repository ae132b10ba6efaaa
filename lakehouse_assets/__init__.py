"""An FtM data lakehouse as a Dagster asset graph, with Spark for the heavy work.

The public surface for tenants is :class:`Lakehouse` and :class:`Dataset`.

The names are imported on first use (PEP 562): Spark's Python workers import
this package to unpickle a task's function, and the public surface pulls in
followthemoney, SQLAlchemy and delta-rs, 0.2 GB and a second per worker that
its task may never touch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_assets.bulk import BulkWriter
    from lakehouse_assets.errors import LakehouseError
    from lakehouse_assets.lake import Dataset, Lakehouse
    from lakehouse_assets.settings import Settings

__all__ = ["BulkWriter", "Dataset", "Lakehouse", "LakehouseError", "Settings"]

_HOMES = {
    "BulkWriter": "lakehouse_assets.bulk",
    "Dataset": "lakehouse_assets.lake",
    "Lakehouse": "lakehouse_assets.lake",
    "LakehouseError": "lakehouse_assets.errors",
    "Settings": "lakehouse_assets.settings",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
