"""The one partitioning of the asset graph: one partition per dataset, and which
partitions a sensor tick looks at (those whose change marker moved)."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import dagster as dg

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import DatasetNotFoundError
from lakehouse_assets.lake import Dataset, Lakehouse

DATASETS: Final = cv.DAGSTER_PARTITIONS

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


#: How many datasets with no announced change the archive sensor lists anyway,
#: in turn: files copied into ``archive/`` behind the API's back move no marker
#: and are seen within (partitions / SWEEP) ticks (2,000 datasets, 30 s ticks:
#: 50 min), at the cost of SWEEP listings a tick.
SWEEP: Final = 20


@dataclass
class Watch:
    """What a sensor keeps in its cursor to look only at what changed.

    ``marks``: dataset → fingerprint of its change marker (``.changes/{dataset}``)
    when the sensor last looked at it; ``swept``: the last dataset of the sweep.
    """

    marks: dict[str, str] = field(default_factory=dict)
    swept: str = ""

    @classmethod
    def load(cls, raw: Any) -> Watch:
        if not isinstance(raw, dict):
            return cls()
        marks = raw.get("marks")
        return cls(
            {str(k): str(v) for k, v in marks.items()} if isinstance(marks, dict) else {},
            str(raw.get("swept", "")),
        )

    def dump(self) -> dict[str, Any]:
        return {"marks": self.marks, "swept": self.swept}


def change_marks(lake: Lakehouse, folder: str = cv.CHANGES) -> dict[str, str]:
    """Dataset → fingerprint of its change marker: one listing of ``.changes/``
    (or of ``folder``: ``.queue-changes/``)."""
    prefix = folder + "/"
    return {e.path[len(prefix) :]: e.fingerprint for e in lake.store.entries(prefix)}


def changed_partitions(
    instance: dg.DagsterInstance,
    lake: Lakehouse,
    watch: Watch,
    *,
    sweep: int = 0,
    folder: str = cv.CHANGES,
    also: Iterable[str] = (),
) -> Iterator[Dataset]:
    """The partitions to look at this tick; ``watch`` advances to what they show.

    Those never looked at, those whose change marker (in ``folder``) moved since
    ``watch`` (a marker appears with a dataset's first tag), those in ``also``
    (still to do from an earlier tick), plus the next ``sweep`` others in turn.
    Cost: one listing of the markers, one query for the partitions, then work
    in proportion to what changed.
    """
    names = sorted(instance.get_dynamic_partitions(DATASETS))
    marks = change_marks(lake, folder)
    picked = {n for n in names if marks.get(n, "") != watch.marks.get(n)}
    picked.update(set(also) & set(names))
    rest = [n for n in names if n not in picked]
    if rest and sweep > 0:
        start = bisect.bisect_right(rest, watch.swept)
        swept = (rest[start:] + rest[:start])[:sweep]
        watch.swept = swept[-1]
        picked.update(swept)
    known = set(names)
    watch.marks = {n: m for n, m in watch.marks.items() if n in known}
    watch.marks.update({n: marks.get(n, "") for n in picked})
    yield from existing_datasets(lake, sorted(picked))
