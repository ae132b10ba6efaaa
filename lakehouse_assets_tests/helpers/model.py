"""A model of what a dataset acknowledged (live statements by origin and id) and
what its exports say, compared by the property tests of a dataset's guarantees."""

from __future__ import annotations

import io
from collections import defaultdict
from typing import Any

import orjson
from followthemoney import model as ftm
from followthemoney.statement import Statement
from followthemoney.statement.entity import StatementEntity
from followthemoney.statement.serialize import read_csv_statements

from lakehouse_assets import conventions as cv
from lakehouse_assets.lake import Dataset
from lakehouse_assets.query import SORT, ftm_dataset

DROP = ("first_seen", "last_seen", "last_change")


class Model:
    """What was acknowledged: live statements by (origin, statement id)."""

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self.live: dict[tuple[str, str], Statement] = {}

    def write(self, entity: dict[str, Any], origin: str) -> None:
        proxy = ftm.get_proxy(entity, cleaned=False)
        for stmt in Statement.from_entity(proxy, self.dataset, origin=origin):
            assert stmt.id is not None
            self.live[(origin, stmt.id)] = stmt

    def delete_entity(self, entity_id: str) -> None:
        for key in [k for k, s in self.live.items() if s.canonical_id == entity_id]:
            del self.live[key]

    def delete_statement(self, key: tuple[str, str]) -> None:
        self.live.pop(key, None)

    def entities(self) -> dict[str, dict[str, Any]]:
        by_entity: dict[str, list[Statement]] = defaultdict(list)
        for stmt in sorted(self.live.values(), key=sort_key):
            by_entity[stmt.canonical_id].append(stmt)
        meta = ftm_dataset(self.dataset)
        return {
            k: normal(StatementEntity.from_statements(meta, v).to_dict())
            for k, v in by_entity.items()
        }

    def csv_rows(self) -> set[tuple[str | None, ...]]:
        """statements.csv: each statement id once (the first origin in sort order)."""
        first: dict[str, Statement] = {}
        for stmt in sorted(self.live.values(), key=sort_key):
            assert stmt.id is not None
            first.setdefault(stmt.id, stmt)
        return {(s.id, s.canonical_id, s.prop, s.value, s.origin) for s in first.values()}


def sort_key(stmt: Statement) -> tuple[str, ...]:
    return tuple(str(getattr(stmt, k) or "") for k in SORT)


def normal(entity: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in entity.items() if k not in DROP}
    for key in ("referents", "datasets", "origin"):
        if key in out:
            out[key] = sorted(out[key])
    out["properties"] = {k: sorted(v) for k, v in out["properties"].items()}
    return out


def seen_in_exports(ds: Dataset) -> tuple[dict[str, dict[str, Any]], set[tuple[str | None, ...]]]:
    raw = ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON))
    entities = {}
    for line in raw.splitlines():
        data = orjson.loads(line)
        entities[data["id"]] = normal(data)
    csv_data = ds.store.read_bytes(cv.dataset_path(ds.name, cv.STATEMENTS_CSV))
    rows = {
        (s.id, s.canonical_id, s.prop, s.value, s.origin)
        for s in read_csv_statements(io.BytesIO(csv_data))
    }
    return entities, rows
