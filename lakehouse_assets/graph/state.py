"""What the graph index reflects: ``graph/state.json`` (table versions, completed
generations, counts and the tables' file lists) and the status report made of it.

The state is written last by every rebuild and update, so it is the one file
that says which rows of the index are readable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lakehouse_assets import conventions as cv
from lakehouse_assets.graph.tables import BY_SOURCE, BY_TARGET, STATE, TOMBSTONES, _table_files
from lakehouse_assets.tables.snapshot import DatasetSnapshot

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


@dataclass(slots=True)
class GraphState:
    """What the index reflects (``graph/state.json``)."""

    translog_version: int | None = None
    statements_version: int | None = None
    generations: list[int] = field(default_factory=list)
    edges: int = 0
    by_prop: dict[str, int] = field(default_factory=dict)
    dangling: int | None = None
    tombstones: int = 0
    rebuilding: bool = False
    updated_at: str | None = None
    #: the files of each table when the state was written, with the min/max of the
    #: lookup column (GraphLake's snapshot manifest): a lookup reads this one small
    #: file instead of two Delta logs
    files: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def record_files(self, ds: DatasetContext) -> None:
        self.files = {
            table: _table_files(ds, table, column)
            for table, column in (
                (BY_SOURCE, "source"),
                (BY_TARGET, "target"),
                (TOMBSTONES, "edge_id"),
            )
        }

    @classmethod
    def load(cls, ds: DatasetContext) -> GraphState | None:
        path = cv.dataset_path(ds.name, STATE)
        if not ds.store.exists(path):
            return None
        data = json.loads(ds.store.read_text(path))
        return cls(**{k: v for k, v in data.items() if k in cls.__slots__})

    def save(self, ds: DatasetContext) -> None:
        self.updated_at = cv.utcnow().isoformat()
        data = {k: getattr(self, k) for k in self.__slots__}
        ds.store.write_text(cv.dataset_path(ds.name, STATE), json.dumps(data, indent=1))
        # no tag moves with the index: the freshness sensor learns of it by the marker
        ds.core_tags.mark_changed(f"{STATE} {self.updated_at}")


def status(ds: DatasetContext) -> dict[str, Any]:
    """What the index reflects, and whether that is the current snapshot."""
    state = GraphState.load(ds)
    if state is None:
        return {"built": False}
    current = ds.snapshot()
    try:
        old = DatasetSnapshot.load(ds.statements_table, ds.translog_table, state.translog_version)
        current_ok = old.content_key == current.content_key
    except Exception:
        current_ok = False
    return {
        "built": True,
        "current": current_ok and not state.rebuilding,
        "reflects": {"statements": state.statements_version, "translog": state.translog_version},
        "latest": {"statements": current.statements.version, "translog": current.translog.version},
        "edges": state.edges,
        "by_prop": state.by_prop,
        "dangling": state.dangling,
        "tombstones": state.tombstones,
        "generations": len(state.generations),
        "updated_at": state.updated_at,
    }
