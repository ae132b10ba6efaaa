"""The four exports: statements.csv, entities.ftm.json, statistics.json, index.json.

statements.csv, entities.ftm.json and statistics.json come from one Spark
pass over the live statements (:mod:`lakehouse_assets.export_pass`).

**Freshness** comes from what an export read, never from the clock at its
end. An export pins one :class:`DatasetSnapshot` after its flush-first and
stamps its tag with the dependency tags it read *before* pinning (plus one
microsecond): a write or flush that lands during the pass moves a dependency
past the stamp, so the export is stale and the next ``make`` redoes it. An
export is also never fresh while the journal holds rows (a write that
committed after the flush's claim). Dagster's data versions are the same
stamps.

Statements are identified by their id: a statement written by two origins
is exported once (the first origin in sort order), as followthemoney's
aggregation does.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from followthemoney.dataset.resource import DataResource

from lakehouse_assets import conventions as cv
from lakehouse_assets import incremental, progress, staging
from lakehouse_assets.errors import LockedError
from lakehouse_assets.export_pass import full_pass
from lakehouse_assets.flush import flush_for_reading
from lakehouse_assets.freshness import (  # the export kinds and their rule live there
    ENTITIES,
    EXPORTS,
    INDEX,
    STATEMENTS,
    STATISTICS,
    dependencies,
)
from lakehouse_assets.tables.snapshot import DatasetSnapshot
from lakehouse_assets.tables.writers import adopt_foreign

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.flush import FlushResult


@dataclass
class ExportResult:
    """What an export run did, per kind: skipped (fresh) or written.

    ``snapshot`` is the (statements, translog) version pair the written
    exports were built from; ``pending`` the journal rows that were not
    flushed because another writer held the dataset's lock.
    """

    written: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    flushed: dict[str, Any] | None = None
    pending: int = 0
    snapshot: tuple[int | None, int | None] = (None, None)
    graph: dict[str, Any] | None = None
    seconds: float = 0.0
    #: leftovers of killed exports removed by this one
    cleaned: dict[str, int] = field(default_factory=dict)
    #: where the time went, by part (``spark start``, ``flush``, ``graph``,
    #: ``exports``, ``index``; the CLI adds ``startup`` and ``other``): each
    #: part's own seconds, so they add up to at most ``seconds``
    parts: dict[str, float] = field(default_factory=dict)
    #: how the written exports were made: ``incremental`` (from the last ones and
    #: the change feed) or ``full``, and why not incremental (None if it was)
    mode: str | None = None
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "skipped": self.skipped,
            "flushed": self.flushed,
            "pending": self.pending,
            "snapshot": list(self.snapshot),
            "seconds": round(self.seconds, 3),
            **({"parts": self.parts} if self.parts else {}),
            "cleaned": self.cleaned,
            "mode": self.mode,
            "reason": self.reason,
            **({"graph": self.graph} if self.graph is not None else {}),
        }


log = logging.getLogger(__name__)


def is_fresh(ds: DatasetContext, kind: str) -> bool:
    """True if the export exists, its tag is newer than every dependency, and the
    journal holds nothing that the export could be missing."""
    path, tag, _ = EXPORTS[kind]
    return (
        ds.store.exists(cv.dataset_path(ds.name, path))
        and ds.core_tags.is_latest(tag, dependencies(kind))
        and not ds.journal.has_pending(ds.name)
    )


def stamp(read: dict[str, datetime | None]) -> datetime:
    """An export's tag: just after the newest dependency value it read before pinning.

    A dependency that moves after that read (a flush, a write during the pass)
    is newer than the stamp, so the export is stale, as it should be.
    """
    values = [v for v in read.values() if v is not None]
    return (max(values) if values else datetime(1970, 1, 1, tzinfo=UTC)) + timedelta(microseconds=1)


# --- operations ---------------------------------------------------------------


def export(
    ds: DatasetContext,
    kinds: Sequence[str] = (STATEMENTS, ENTITIES, STATISTICS),
    force: bool = False,
) -> ExportResult:
    """Run the given exports that are not fresh (all of them with ``force``).

    Flushes first when the journal holds anything newer than the last flush
    (waiting up to ``LAKEHOUSE_LOCK_WAIT_SECONDS`` for another writer, then
    exporting the current snapshot and reporting the pending rows); the
    exports that need Spark share one pass over one pinned snapshot.
    """
    from lakehouse_assets import versions

    clock = time.monotonic()
    result = ExportResult()
    unknown = set(kinds) - set(EXPORTS)
    if unknown:
        raise ValueError(f"Unknown export(s) {sorted(unknown)}; choose from {sorted(EXPORTS)}")
    tags = ds.core_tags
    journal_read = tags.get(cv.JOURNAL_LAST_UPDATED)  # before the flush claims the journal
    flushed = flush_for_reading(ds, wait=ds.settings.lock_wait_seconds)
    adopt_foreign(ds, wait=ds.settings.lock_wait_seconds)  # what make publishes is what is there
    result.flushed = flushed.result.as_dict() if flushed.result is not None else None
    result.pending = flushed.pending
    with ds.operation_lock("export", tenant=cv.LAKEHOUSE_TENANT), ds.job("export") as job:
        # no other export runs: staging areas left are those of killed exports
        result.cleaned = staging.clean_stale(ds, "export").as_dict()
        # what every export of this run is stamped with: the dependencies as
        # they are before the snapshot is pinned (and before freshness is judged)
        read = {
            cv.JOURNAL_LAST_UPDATED: journal_read,
            cv.STATEMENTS_LAST_UPDATED: tags.get(cv.STATEMENTS_LAST_UPDATED),
        }
        # another writer's commits since the head: the tags know nothing of them
        foreign = versions.foreign_since_head(ds)
        if foreign:
            progress.stage(
                "export %s: the tables were changed by another writer (%s): every export "
                "is written again",
                ds.name,
                ", ".join(foreign[:5]),
            )
        # fresh by the tags, and byte for byte what the head published (a tag never
        # excuses an export that differs from its manifest: it is written again)
        spark_kinds = frozenset(
            k
            for k in kinds
            if k != INDEX
            and (
                force
                or bool(foreign)
                or not is_fresh(ds, k)
                or not versions.published_intact(ds, k)
            )
        )
        result.skipped = [k for k in kinds if k != INDEX and k not in spark_kinds]
        changed_lines = None  # an incremental pass's lines of the entities it changed
        if result.skipped:
            progress.stage("export %s: fresh, kept: %s", ds.name, ", ".join(result.skipped))
        if spark_kinds:
            snapshot = ds.snapshot()  # pinned after the dependencies were read
            result.snapshot = snapshot.versions
            progress.stage(
                "export %s: writing %s (statements v%s, translog v%s), one Spark pass",
                ds.name,
                ", ".join(sorted(spark_kinds)),
                *snapshot.versions,
            )
            refreshed, result.reason = incremental.attempt(
                ds, spark_kinds, snapshot, force=force, trusted=versions.trusted_export_state(ds)
            )
            result.mode = "full" if refreshed is None else "incremental"
            if refreshed is not None:
                result.written.update(refreshed.written)
                changed_lines = refreshed.lines
            else:
                result.written.update(full_pass(ds, spark_kinds, snapshot))
                for done in result.written.values():
                    done.update(mode="full", reason=result.reason)
            for kind in sorted(spark_kinds):
                done = result.written[kind]
                progress.stage(
                    "export %s: %s written (%s %s, %s bytes)",
                    ds.name,
                    done.get("path", kind),
                    f"{done.get('rows') or 0:,}",
                    "statements" if kind == STATEMENTS else "entities",
                    f"{done.get('size', 0):,}",
                )
            built = stamp(read)
            for kind in spark_kinds:
                tags.set(EXPORTS[kind][1], built)
                result.written[kind]["stamp"] = built.isoformat()
                result.written[kind]["snapshot"] = list(snapshot.versions)
        if INDEX in kinds:
            if (
                force
                or not is_fresh(ds, INDEX)
                or spark_kinds
                or not versions.published_intact(ds, INDEX)
                or versions.graph_unpublished(ds)
            ):
                progress.stage("export %s: index.json and the version manifest", ds.name)
                step = progress.Steps(log, f"export {ds.name}")
                statistics = tags.get(cv.EXPORTS_STATISTICS)
                # the version describes what this pass exported (or, when every
                # export was fresh, the latest snapshot, which they render)
                pinned = snapshot if spark_kinds else ds.snapshot()
                result.written[INDEX] = export_index(
                    ds,
                    stamp({**read, cv.EXPORTS_STATISTICS: statistics}),
                    snapshot=pinned,
                    statements_fresh=STATEMENTS in spark_kinds or is_fresh(ds, STATEMENTS),
                    entities_fresh=ENTITIES in spark_kinds or is_fresh(ds, ENTITIES),
                    written=result.written,
                    changed_lines=changed_lines,
                )
                step("index.json and the version manifest written")
            else:
                result.skipped.append(INDEX)
        result.seconds = time.monotonic() - clock
        job.run.stats = {k: v for k, v in result.as_dict().items() if k != "written"}
        job.run.stats["written"] = {k: _summary(v) for k, v in result.written.items()}
    return result


def _summary(written: dict[str, Any]) -> dict[str, Any]:
    """What a job record keeps of a written export (not the whole statistics)."""
    return {k: v for k, v in written.items() if k != "stats"}


def export_statements(ds: DatasetContext, force: bool = False) -> ExportResult:
    return export(ds, [STATEMENTS], force)


def export_entities(ds: DatasetContext, force: bool = False) -> ExportResult:
    return export(ds, [ENTITIES], force)


def export_statistics(ds: DatasetContext, force: bool = False) -> ExportResult:
    return export(ds, [STATISTICS], force)


def make(ds: DatasetContext, force: bool = False) -> ExportResult:
    """Flush if needed; the graph index built or brought up to date
    (:func:`make_graph`); then every export that is not fresh, then index.json
    (publishing a version that records the graph index, current)."""
    clock = time.monotonic()
    with progress.collect() as parts:
        flushed, updated = make_graph(ds)
        result = export(ds, [STATEMENTS, ENTITIES, STATISTICS, INDEX], force)
    result.graph = updated
    if result.flushed is None and flushed is not None:
        result.flushed = flushed.as_dict()
    return made(ds, result, clock, parts)


def made(
    ds: DatasetContext, result: ExportResult, clock: float, parts: progress.Parts
) -> ExportResult:
    """``make``'s result over the whole of it since ``clock`` (the graph index and,
    for a collection, its build included, not the export pass alone), with where
    the time went (``parts``) on its closing progress line."""
    result.seconds = time.monotonic() - clock
    result.parts = parts.rounded()
    version = (result.written.get(INDEX) or {}).get("version") or {}
    progress.stage(
        "make %s: done in %.1f s (%s)%s",
        ds.name,
        result.seconds,
        progress.parts_line(result.parts) or "nothing to do",
        f"; published version {version['sequence']}" if version.get("sequence") else "",
    )
    return result


def make_graph(ds: DatasetContext) -> tuple[FlushResult | None, dict[str, Any] | None]:
    """``make``'s graph step: flush, then build the graph index (the first time) or
    bring it up to date; returns the flush's result and the index's (None and
    None while the dataset has no tables: nothing to index).

    Before this, ``make`` only updated an index someone had built: after a
    first ``make``, ``refs`` and ``neighbours`` still said "run graph update".
    The index comes first, so the version published after it records it current.

    While another writer holds the dataset's lock, the step is skipped (its
    ``skipped`` says why) and the exports go on with the current snapshot, as
    a reader's flush does: ``make`` never fails because a writer is busy.
    """
    from lakehouse_assets import graph

    reader = flush_for_reading(ds, wait=ds.settings.lock_wait_seconds)
    adopt_foreign(ds, wait=ds.settings.lock_wait_seconds)  # the index reflects what is there
    if reader.locked_by is not None:
        return None, {"skipped": f"the dataset's lock is held: {reader.locked_by}"}
    if ds.snapshot().statements.version is None:
        return reader.result, None
    built = graph.GraphState.load(ds) is not None
    progress.stage("make %s: %s the graph index", ds.name, "updating" if built else "building")
    try:
        with progress.part("graph"):
            return reader.result, graph.update(ds).as_dict()
    except LockedError as exc:  # taken since the flush (a compact, say)
        return reader.result, {"skipped": f"the dataset's lock is held: {exc}"}


#: Graph exports (see :mod:`lakehouse_assets.graph.exports`): listed in index.json
#: when they exist, stamped by the tag of their export.
GRAPH_RESOURCES: dict[str, tuple[str, str, str]] = {
    "graph_cypher": (cv.GRAPH_CYPHER, cv.EXPORTS_GRAPH, "application/x-cypher-query"),
    "graph_graphml": (cv.GRAPH_GRAPHML, cv.EXPORTS_GRAPH, "application/graphml+xml"),
}


#: What is known of files of a dataset (by path under it): ``size`` and
#: ``sha256``, from the export pass that wrote them or from hashing them once.
Checksums = dict[str, dict[str, Any]]


def _neo4j_resources(ds: DatasetContext, known: Checksums) -> list[dict[str, Any]]:
    """Each Neo4j bulk-import file present (one per schema, so listed from the
    lake), named ``neo4j/{file}``."""
    prefix = cv.dataset_path(ds.name, cv.GRAPH_NEO4J) + "/"
    found = []
    for full in sorted(ds.store.list(prefix)):
        name = full[len(prefix) :]
        mime = "text/csv" if name.endswith(".csv") else "text/x-shellscript"
        path = f"{cv.GRAPH_NEO4J}/{name}"
        if resource := _resource_of(ds, path, cv.EXPORTS_GRAPH, mime, known, f"neo4j/{name}"):
            found.append(resource)
    return found


def _resource(ds: DatasetContext, kind: str, known: Checksums) -> dict[str, Any] | None:
    path, tag, mime = EXPORTS[kind] if kind in EXPORTS else GRAPH_RESOURCES[kind]
    return _resource_of(ds, path, tag, mime, known)


def _resource_of(
    ds: DatasetContext, path: str, tag: str, mime: str, known: Checksums, name: str | None = None
) -> dict[str, Any] | None:
    """A file of the dataset as an index.json resource (``None`` if absent),
    named by its file name unless ``name`` says otherwise.

    ``checksum`` is its SHA-1 (followthemoney's field, what yente compares a
    download with), ``sha256`` the hash the version manifests use; both come
    from ``known`` (:func:`~lakehouse_assets.versions.known_sha256`): at 10M
    statements, hashing the exports again took 6 s. ``url`` is absolute
    (``public_url``) or absent: followthemoney takes only http(s) URLs;
    ``path`` is relative to the dataset's folder either way."""
    full = cv.dataset_path(ds.name, path)
    if not ds.store.exists(full):
        return None
    from lakehouse_assets.versions import known_sha1, known_sha256, public_url

    size = ds.store.size(full)
    resource = DataResource(
        name=name or path.rsplit("/", 1)[-1],
        url=public_url(ds.settings, full),
        checksum=known_sha1(ds, path, size, known),
        timestamp=ds.core_tags.get(tag),
        mime_type=mime,
        size=size,
    )
    return {
        **resource.model_dump(mode="json", exclude_none=True),
        "sha256": known_sha256(ds, path, size, known),
        "path": path,
    }


@progress.part("index")
def export_index(
    ds: DatasetContext,
    built: datetime | None = None,
    *,
    snapshot: DatasetSnapshot | None = None,
    statements_fresh: bool | None = None,
    entities_fresh: bool | None = None,
    metadata: dict[str, Any] | None = None,
    written: dict[str, Any] | None = None,
    changed_lines: incremental.ChangedLines | None = None,
) -> dict[str, Any]:
    """Write ``index.json`` (dataset metadata, stats, resource links) and publish a version.

    ``built`` is the freshness stamp for ``exports/index`` (see :func:`stamp`).
    ``snapshot`` is what the exports were built from (default: the latest, with
    ``statements.csv`` taken as its rendering only if it is fresh): the
    version's manifest describes it (see :mod:`lakehouse_assets.versions`);
    nothing is published when nothing changed since the last version.
    ``changed_lines``: an incremental pass's lines of the entities it changed
    (the version's diff is made from them when they span its parent's snapshot).
    """
    from lakehouse_assets import versions

    if snapshot is None:
        snapshot = ds.snapshot()
        statements_fresh = is_fresh(ds, STATEMENTS)
        entities_fresh = is_fresh(ds, ENTITIES)
    config = ds.config()
    stats_path = cv.dataset_path(ds.name, cv.STATISTICS_JSON)
    stats = json.loads(ds.store.read_text(stats_path)) if ds.store.exists(stats_path) else None
    kinds = (STATEMENTS, ENTITIES, STATISTICS, *GRAPH_RESOURCES)
    # what the pass just wrote, hashed as it was written; the rest is hashed once
    known: Checksums = {
        str(w["path"]): dict(w) for w in (written or {}).values() if "path" in w and "sha256" in w
    }
    resources = [r for k in kinds if (r := _resource(ds, k, known))]
    resources += _neo4j_resources(ds, known)
    now = cv.utcnow()
    data = config.model_dump(mode="json", exclude_none=True, exclude={"resources"})
    data.update(
        {
            "updated_at": now.isoformat(),
            "last_export": now.isoformat(),
            "resources": resources,
        }
    )
    if stats is not None:
        data["entity_count"] = stats.get("entity_count")
        data["thing_count"] = (stats.get("things") or {}).get("total")
        data["statistics"] = stats
    text = json.dumps(data, indent=2, sort_keys=False)
    # written by publish with the version it belongs to; kept as it is when
    # nothing changed (so a run with nothing new writes no new index.json)
    published = versions.publish(
        ds,
        snapshot,
        index_text=text,
        statements_fresh=bool(statements_fresh),
        entities_fresh=bool(entities_fresh),
        metadata=metadata,
        known_exports=known,
        changed_lines=changed_lines,
    )
    if built is None:
        ds.core_tags.touch(cv.EXPORTS_INDEX)
    else:
        ds.core_tags.set(cv.EXPORTS_INDEX, built)
    return {
        "path": cv.INDEX,
        "size": len(text.encode()),
        "resources": len(resources),
        "version": published.as_dict(),
    }
