"""The one partitioning of the asset graph: one partition per dataset."""

from typing import Final

import dagster as dg

DATASETS: Final = "datasets"

#: Filled by the ``new_datasets`` sensor from the lake's catalog, never by hand.
datasets = dg.DynamicPartitionsDefinition(name=DATASETS)
