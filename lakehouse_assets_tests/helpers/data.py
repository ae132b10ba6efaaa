"""Test data shared by the data-plane tests: the input entities (a slice of real data
where ../shared is present), entity dicts without list order, and a Delta table's rows."""

from __future__ import annotations

from typing import Any

import orjson

from lakehouse_assets.lake import Dataset
from lakehouse_assets.tables.schemas import STATEMENTS_SCHEMA, TRANSLOG_SCHEMA
from lakehouse_assets.tables.snapshot import Snapshot, read_files
from lakehouse_assets_tests.conftest import SHARED_DATA, sample_entities


def input_entities() -> list[dict[str, Any]]:
    """Real data where ../shared is present (a slice of kek), else the sample."""
    kek = SHARED_DATA / "kek.ftm.json"
    if kek.exists():
        lines = kek.read_bytes().splitlines()[:400]
        return [orjson.loads(line) for line in lines if line.strip()]
    return sample_entities()


def normal(entity: dict[str, Any]) -> dict[str, Any]:
    """Entity dicts with list order removed (followthemoney builds some lists from sets)."""
    out = dict(entity)
    for key in ("referents", "datasets", "origin"):
        if key in out:
            out[key] = sorted(out[key])
    out["properties"] = {k: sorted(v) for k, v in out["properties"].items()}
    return out


def entities_of(data: bytes) -> dict[str, dict[str, Any]]:
    """An entities.ftm.json (or as-of stream) by id, list order removed."""
    out = {}
    for line in data.splitlines():
        if line.strip():
            entity = orjson.loads(line)
            out[entity["id"]] = normal(entity)
    return out


def table_rows(ds: Dataset, which: str = "statements") -> list[dict[str, object]]:
    location = ds.statements_table if which == "statements" else ds.translog_table
    schema = STATEMENTS_SCHEMA if which == "statements" else TRANSLOG_SCHEMA
    partition = "origin" if which == "statements" else None
    snap = Snapshot.load(location)
    table = read_files(snap.files, schema, location.storage_options, partition=partition)
    return sorted(table.to_pylist(), key=lambda r: (r["origin"], r["id"]))
