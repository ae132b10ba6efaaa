"""The one partitioning of the asset graph: one partition per dataset."""

import dagster as dg

#: Filled by the ``new_datasets`` sensor from the lake's catalog, never by hand.
datasets = dg.DynamicPartitionsDefinition(name="datasets")
