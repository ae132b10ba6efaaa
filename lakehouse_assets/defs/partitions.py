"""The one partitioning of the asset graph: one partition per dataset."""

from collections.abc import Iterable, Iterator
from typing import Final

import dagster as dg

from lakehouse_assets.errors import DatasetNotFoundError
from lakehouse_assets.lake import Dataset, Lakehouse

DATASETS: Final = "datasets"

#: Filled by the ``new_datasets`` sensor from the lake's catalog, never by hand.
datasets = dg.DynamicPartitionsDefinition(name=DATASETS)


def partition_datasets(instance: dg.DagsterInstance, lake: Lakehouse) -> Iterator[Dataset]:
    """The datasets that are partitions, by name (what every sensor tick walks).

    A partition whose dataset left the lake is skipped: Dagster keeps partitions
    until they are deleted, and a sensor must not fail on one.
    """
    yield from existing_datasets(lake, sorted(instance.get_dynamic_partitions(DATASETS)))


def existing_datasets(lake: Lakehouse, names: Iterable[str]) -> Iterator[Dataset]:
    """The named datasets that are still in the lake (a gone one is skipped, not an error)."""
    for name in names:
        try:
            yield lake.dataset(name)
        except DatasetNotFoundError:
            continue
