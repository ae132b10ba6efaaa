"""An FtM data lakehouse as a Dagster asset graph, with Spark for the heavy work.

The public surface for tenants is :class:`Lakehouse` and :class:`Dataset`.
"""

from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.lake import BulkWriter, Dataset, Lakehouse
from lakehouse_assets.settings import Settings

__all__ = ["BulkWriter", "Dataset", "Lakehouse", "LakehouseError", "Settings"]
