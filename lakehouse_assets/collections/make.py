"""``make`` for a collection: rebuild its tables when a leaf or a judgement
changed, then the dataset exports and a published version.

A build is due when what the collection's tables were built from
(``resolver/built.json``: each leaf's statements and translog versions and
the canonical-id table's version) differs from what is there now: a leaf
flushed, compacted or optimized, a child added or removed, a judgement
loaded or decided. Table versions, not clocks: a leaf written during a build
is seen by the next ``make``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakehouse_assets import conventions as cv
from lakehouse_assets import progress
from lakehouse_assets.collections.build import BuildResult, build
from lakehouse_assets.collections.judgements import canonical_table
from lakehouse_assets.collections.leaves import leaves
from lakehouse_assets.exports import export, made, make_graph
from lakehouse_assets.freshness import ENTITIES, INDEX, STATEMENTS, STATISTICS

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.exports import ExportResult


@dataclass
class CollectionResult:
    """A collection's ``make``: its build (None: its tables were current) and exports."""

    built: BuildResult | None
    reason: str | None
    exported: ExportResult

    def as_dict(self) -> dict[str, Any]:
        return {
            "built": None if self.built is None else self.built.as_dict(),
            "reason": self.reason,
            "exported": self.exported.as_dict(),
        }


def sources(ds: DatasetContext) -> dict[str, Any]:
    """What the collection's tables would be built from now."""
    table = canonical_table(ds).table()
    return {
        "leaves": {
            name: list(ds.sibling(name).snapshot().versions) for name in leaves(ds.store, ds.name)
        },
        "canonical": None if table is None else table.version(),
    }


def built_from(ds: DatasetContext) -> dict[str, Any] | None:
    path = cv.dataset_path(ds.name, cv.COLLECTION_BUILT_FROM)
    if not ds.store.exists(path):
        return None
    data = json.loads(ds.store.read_text(path))
    return data if isinstance(data, dict) else None


def stale_reason(ds: DatasetContext) -> str | None:
    """Why the collection's tables must be built again (None: they are current)."""
    before = built_from(ds)
    if before is None or ds.snapshot().statements.version is None:
        return "never built"
    now = sources(ds)
    if before.get("canonical") != now["canonical"]:
        return "the judgements changed"
    old, new = before.get("leaves") or {}, now["leaves"]
    if set(old) != set(new):
        return f"the leaves changed ({', '.join(sorted(set(old) ^ set(new)))})"
    changed = sorted(name for name in new if old[name] != new[name])
    if changed:
        return f"leaves changed: {', '.join(changed)}"
    return None


def make(ds: DatasetContext, *, force: bool = False) -> CollectionResult:
    """Build the collection's tables if due (always with ``force``), bring its
    graph index up to date (as a dataset's ``make`` does: ``refs`` and
    ``neighbours`` answer for the merged entities, and the version records the
    index current), then every export that is stale and ``index.json`` with its
    published version."""
    clock = time.monotonic()
    with progress.collect() as parts:
        reason = "forced" if force else stale_reason(ds)
        built = None
        if reason is not None:
            now = sources(ds)
            built = build(ds)
            ds.store.write_text(
                cv.dataset_path(ds.name, cv.COLLECTION_BUILT_FROM), json.dumps(now, sort_keys=True)
            )
        # the collection's journal takes no writes: the step's flush finds nothing
        _, graph = make_graph(ds)
        exported = export(ds, [STATEMENTS, ENTITIES, STATISTICS, INDEX], force=force)
    exported.graph = graph
    made(ds, exported, clock, parts)
    return CollectionResult(built, reason, exported)
