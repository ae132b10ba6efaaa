"""One line per dataset of a lake: what ``datasets list`` and ``status`` without
``-d`` show, so an operator sees the whole catalog at once.

Each line reads only what ``status`` reads (no flush, no Spark): the dataset's
config (title), its published head, the journal's pending rows (one grouped
count for the whole lake, not one query per dataset) and each export's
freshness from the lake's tags.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse_assets.catalog import dataset_names, load_dataset_config
from lakehouse_assets.freshness import freshness
from lakehouse_assets.storage import Store
from lakehouse_assets.versions import head

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


@dataclass
class DatasetLine:
    """A dataset at a glance."""

    name: str
    title: str
    #: The published head's sequence and hash (None: nothing published yet).
    version: int | None
    version_hash: str | None
    published_at: str | None
    #: Journal rows waiting for a flush.
    pending: int
    #: The derived files (exports, the graph index once built) that are stale.
    stale: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def dataset_lines(
    store: Store, context_of: Callable[[str], DatasetContext], pending: dict[str, int]
) -> Iterator[DatasetLine]:
    """Every dataset of the lake at ``store``, by name; ``pending`` maps a dataset
    to its journal rows (``Journal.counts``)."""
    for name in dataset_names(store):
        ds = context_of(name)
        config = load_dataset_config(store, name)
        version = head(ds)
        waiting = pending.get(name, 0)
        stale = sorted(kind for kind, state in freshness(ds, waiting).items() if state.stale)
        yield DatasetLine(
            name=name,
            title=str(config.get("title") or name),
            version=None if version is None else version.sequence,
            version_hash=None if version is None else version.hash,
            published_at=None if version is None else str(version.manifest["created_at"]),
            pending=waiting,
            stale=stale,
        )
