"""The full export pass in DuckDB writes Spark's bytes (issue 49).

``export_engine`` picks DuckDB on the driver or Spark's plan for a full pass
(``auto``: DuckDB up to ``export_duckdb_max_statements``). The contract is the
files: statements.csv, entities.ftm.json and statistics.json, and the
incremental state beside them, must be the same bytes whichever engine made
them, on data where followthemoney's rules branch (two origins holding copies,
schemata that merge, captions rigour picks, merged entities, deleted and
re-written statements whose seen range the translog widens). The per-entity
rows are compared on arbitrary statements in ``test_entity_lines.py``; JSON
escapes here, on any text.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse_assets import conventions as cv
from lakehouse_assets.entity_lines import json_string
from lakehouse_assets.export_state import ExportState
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets_tests.conftest import examples
from lakehouse_assets_tests.helpers.data import input_entities
from lakehouse_assets_tests.test_exports import EXPORT_FILES, add_awkward_entities

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def duckdb_json(texts: list[str]) -> list[str]:
    import duckdb

    con = duckdb.connect()
    try:
        rows = con.execute(
            "SELECT to_json(t)::VARCHAR FROM unnest(?::VARCHAR[]) AS u(t)", [texts]
        ).fetchall()
    finally:
        con.close()
    return [r[0] for r in rows]


@pytest.mark.spark_free
def test_duckdb_escapes_every_character_as_jackson_does() -> None:
    """Every code point (the surrogates aside: UTF-8 has none), one string per
    block of 4,096: DuckDB's ``to_json`` of a string is Jackson's (Spark's)."""
    blocks = []
    for start in range(0, 0x110000, 4096):
        chars = [chr(c) for c in range(start, start + 4096) if not 0xD800 <= c < 0xE000]
        if chars:
            blocks.append("".join(chars))
    assert duckdb_json(blocks) == [json_string(b) for b in blocks]


@pytest.mark.spark_free
@settings(max_examples=examples(200, 2000), deadline=None)
@given(st.lists(st.text(st.characters(codec="utf-8")), min_size=1, max_size=20))
def test_duckdb_json_strings_are_jacksons(texts: list[str]) -> None:
    escaped = duckdb_json(texts)
    assert escaped == [json_string(t) for t in texts]
    assert [json.loads(e) for e in escaped] == texts


def files(ds: Dataset) -> dict[str, bytes]:
    return {p: ds.store.read_bytes(cv.dataset_path(ds.name, p)) for p in EXPORT_FILES}


def full_pass(ds: Dataset, engine: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A forced full pass by ``engine``: its files, the state's index and aggregates."""
    monkeypatch.setattr(ds.settings, "export_engine", engine)
    result = ds.export(["statements", "entities", "statistics"], force=True)
    assert result.mode == "full"
    state = ExportState.load(ds)
    assert state is not None
    return {
        "files": files(ds),
        "index": state.index(ds).to_pylist(),
        "aggregates": state.aggregates,
        "rows": {k: v["rows"] for k, v in result.written.items()},
    }


@pytest.mark.spark_modes
@pytest.mark.on_cluster
def test_both_engines_write_the_same_bytes(
    spark: SparkSession, local_lake: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First build (the translog changes no stored row), then after deletes, a
    statement written again (its seen range widened) and new writes (the join
    with the translog): each time DuckDB's pass and Spark's write the same files,
    index and aggregates, and ``auto`` takes DuckDB at this size."""
    ds = local_lake.create_dataset("engines")
    add_awkward_entities(ds)
    for origin in ("crawl", "registry"):
        with ds.bulk(origin=origin) as bulk:
            for e in input_entities()[:80]:
                bulk.add_entity(e)
    ds.flush()
    first = full_pass(ds, "spark", monkeypatch)
    assert full_pass(ds, "duckdb", monkeypatch) == first
    entities = input_entities()
    ds.delete_entity(str(entities[3]["id"]))
    ds.delete_entity("ann", origin="registry")
    ds.add_entity(entities[5], origin="crawl")  # written again: a later last_seen
    ds.add_entity({"id": "late", "schema": "Person", "properties": {"name": ['Zoë "Q" \\ Late']}})
    ds.flush()
    later = full_pass(ds, "spark", monkeypatch)
    assert later["files"] != first["files"]
    assert full_pass(ds, "duckdb", monkeypatch) == later
    monkeypatch.setattr(ds.settings, "export_engine", "auto")
    from lakehouse_assets import export_duckdb

    assert export_duckdb.takes_pass(ds, ds.snapshot())
    monkeypatch.setattr(ds.settings, "export_duckdb_max_statements", 10)
    assert not export_duckdb.takes_pass(ds, ds.snapshot())


def test_a_clash_of_schemata_names_the_dataset_and_the_entity(
    local_lake: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB refuses an entity with no common schema as Spark does, naming the
    dataset, the entity and the schemata; the files before stay."""
    ds = local_lake.create_dataset("clash_duck")
    monkeypatch.setattr(ds.settings, "export_engine", "duckdb")
    ds.add_entity({"id": "x", "schema": "Person", "properties": {"name": ["X"]}})
    ds.export(["statements", "entities", "statistics"])
    before = files(ds)
    ds.add_entity({"id": "x", "schema": "Vessel", "properties": {"name": ["X II"]}}, "other")
    with pytest.raises(
        ValueError, match=r"dataset clash_duck: entity x: no common schema of Person, Vessel"
    ):
        ds.export(["statements", "entities", "statistics"], force=True)
    assert files(ds) == before


@pytest.mark.spark_modes
def test_entities_made_a_range_of_ids_at_a_time_are_the_same_bytes(
    spark: SparkSession, local_lake: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot larger than the memory limit's share is aggregated a range of
    canonical ids at a time: the same files as one range and as Spark's; the incremental rows of a large
    change are cut the same way. The ranges' boundaries are quantiles of sampled
    canonical ids (the footers' minima all fall at the start of the id space:
    the files are sorted by bucket first)."""
    from lakehouse_assets.export_duckdb import lines
    from lakehouse_assets.tables.schemas import STATEMENTS_SCHEMA
    from lakehouse_assets.tables.snapshot import arrow_dataset

    ds = local_lake.create_dataset("ranges")
    add_awkward_entities(ds)
    for origin in ("crawl", "registry"):
        with ds.bulk(origin=origin) as bulk:
            for e in input_entities()[:120]:
                bulk.add_entity(e)
    ds.flush()
    spark_made = full_pass(ds, "spark", monkeypatch)
    one = full_pass(ds, "duckdb", monkeypatch)
    snapshot = ds.snapshot()
    total = sum(f.num_records or 0 for f in snapshot.statements.files)
    ids = arrow_dataset(
        snapshot.statements.files, STATEMENTS_SCHEMA, ds.statements_table.storage_options
    ).to_table(columns=["canonical_id"])
    with lines.connect(ds.settings) as con:
        con.register("ids", ids)
        assert lines.id_ranges(con, "ids", total, "1GB") == [(None, None)]
        monkeypatch.setattr(lines, "STATEMENTS_PER_GIB", 100)
        ranges = lines.id_ranges(con, "ids", total, "1GB")
    per_range = int(100 * lines.memory_gib("1GB"))  # 1GB is 0.93 GiB
    assert len(ranges) == -(-total // per_range) and ranges[0][0] is None and ranges[-1][1] is None
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    bounds = [high for _, high in ranges[:-1]]
    assert bounds == sorted(set(bounds))  # increasing, each a canonical id
    assert set(bounds) <= set(ids.column("canonical_id").to_pylist())
    assert full_pass(ds, "duckdb", monkeypatch) == one == spark_made


def test_duckdb_out_of_memory_goes_on_with_spark_or_says_which_setting(
    spark: SparkSession, local_lake: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB's pass past its memory limit replaces nothing: with ``auto`` the
    export goes on with Spark's pass (the same bytes), with ``duckdb`` it fails
    naming the limit and the other engine."""
    from lakehouse_assets.errors import ExportMemoryError

    ds = local_lake.create_dataset("tight")
    with ds.bulk(origin="crawl") as bulk:
        for e in input_entities()[:150]:
            bulk.add_entity(e)
    ds.flush()
    want = full_pass(ds, "spark", monkeypatch)["files"]
    monkeypatch.setattr(ds.settings, "export_duckdb_memory_limit", "1MB")
    with pytest.raises(ExportMemoryError, match="LAKEHOUSE_EXPORT_DUCKDB_MEMORY_LIMIT=1MB"):
        full_pass(ds, "duckdb", monkeypatch)
    assert files(ds) == want
    assert full_pass(ds, "auto", monkeypatch)["files"] == want
