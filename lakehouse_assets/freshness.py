"""Is each derived file of a dataset fresh, and if not, why: the specification's rule.

An export is fresh when it exists, its tag is newer than every tag it depends
on (``statements/last_updated``, ``journal/last_updated``; the index also on
``exports/statistics``) and the journal holds no row waiting for a flush. The
graph index is fresh when it reflects the current table versions; its Cypher
export when it is newer than ``entities.ftm.json``.

Tags are lake files a tamperer can move, so they never make a file fresh on
their own: before keeping an export, ``make`` also holds it byte for byte to
the head version's manifest (:func:`versions.published_intact`) and writes it
again if it differs. ``lakehouse status`` reads the tags only (hashing the
exports on every status would cost seconds at 10M statements).

Reading it costs a few tag reads and one journal count: ``lakehouse status``,
the Dagster freshness check and its sensor use it on every dataset. So the
export kinds and their rule are defined here, and this module imports
neither Spark nor followthemoney (``lakehouse status`` took 1.3 s, about half
of it importing them through the export and graph-export modules).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from lakehouse_assets import conventions as cv

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext

STATEMENTS = "statements"
ENTITIES = "entities"
STATISTICS = "statistics"
INDEX = "index"

#: Export kind → (lake path under the dataset, its tag, mime type).
EXPORTS: dict[str, tuple[str, str, str]] = {
    STATEMENTS: (cv.STATEMENTS_CSV, cv.EXPORTS_STATEMENTS, "text/csv"),
    ENTITIES: (cv.ENTITIES_JSON, cv.EXPORTS_ENTITIES, "application/json+ftm"),
    STATISTICS: (cv.STATISTICS_JSON, cv.EXPORTS_STATISTICS, "application/json"),
    INDEX: (cv.INDEX, cv.EXPORTS_INDEX, "application/json"),
}

#: What every export depends on (the spec's freshness rule).
FRESHNESS_DEPENDENCIES = (cv.STATEMENTS_LAST_UPDATED, cv.JOURNAL_LAST_UPDATED)


def dependencies(kind: str) -> tuple[str, ...]:
    """The tags an export depends on (the spec's freshness rule; index also on statistics)."""
    if kind == INDEX:
        return (*FRESHNESS_DEPENDENCIES, cv.EXPORTS_STATISTICS)
    return FRESHNESS_DEPENDENCIES


def graph_exports_fresh(ds: DatasetContext) -> bool:
    """The graph exports (Cypher, GraphML, Neo4j CSVs) are newer than the entities
    export they are made of."""
    return ds.core_tags.is_latest(cv.EXPORTS_GRAPH, [cv.EXPORTS_ENTITIES])


#: The graph index and its exports, beside the exports of :data:`EXPORTS`.
GRAPH = "graph"
GRAPH_CYPHER = "graph_cypher"


@dataclass(frozen=True)
class Freshness:
    """One derived file's state under the freshness rule."""

    path: str
    fresh: bool
    why: str
    stamp: datetime | None = None
    #: False for an output never made (the graph exports before a first
    #: ``graph export``): not fresh, but not stale either, nothing was made to go stale
    built: bool = True

    @property
    def stale(self) -> bool:
        return self.built and not self.fresh

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["stamp"] = self.stamp.isoformat() if self.stamp else None
        return data


def freshness(ds: DatasetContext, pending: int | None = None) -> dict[str, Freshness]:
    """Each export's (and the graph index's, once built) freshness, by export kind.

    ``pending`` is the journal's row count when the caller has it already.
    """
    from lakehouse_assets import graph

    tags = ds.core_tags
    if pending is None:
        pending = ds.journal.count(ds.name)
    found: dict[str, Freshness] = {}
    for kind, (path, tag, _) in EXPORTS.items():
        stamp = tags.get(tag)
        reasons = []
        if not ds.store.exists(cv.dataset_path(ds.name, path)):
            reasons.append("not written yet")
        for dep in dependencies(kind):
            value = tags.get(dep)
            if value is not None and (stamp is None or value > stamp):
                reasons.append(f"{dep} is newer")
        if pending:
            reasons.append(f"{pending} journal rows wait for a flush")
        found[kind] = Freshness(
            path, not reasons, "; ".join(reasons) or "newer than everything it depends on", stamp
        )
    built = graph.status(ds)
    if built["built"]:
        current = bool(built["current"])
        found[GRAPH] = Freshness(
            cv.GRAPH_STATE,
            current,
            f"{built['edges']:,} edges; "
            + ("reflects the latest tables" if current else "the tables changed since its update"),
        )
        stamp = tags.get(cv.EXPORTS_GRAPH)
        if stamp is None and not ds.store.exists(cv.dataset_path(ds.name, cv.GRAPH_CYPHER)):
            found[GRAPH_CYPHER] = Freshness(
                cv.GRAPH_CYPHER, False, "lakehouse graph export writes it", built=False
            )
            return found
        cypher = graph_exports_fresh(ds)
        found[GRAPH_CYPHER] = Freshness(
            cv.GRAPH_CYPHER,
            cypher,
            "newer than entities.ftm.json" if cypher else "older than entities.ftm.json",
            stamp,
        )
    return found
