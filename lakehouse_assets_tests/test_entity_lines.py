"""The driver's export lines (:mod:`lakehouse_assets.entity_lines`) equal Spark's
(:mod:`lakehouse_assets.spark.ftm_sql`, what the full pass writes) and DuckDB's
(:mod:`lakehouse_assets.export_duckdb`, the other engine of that pass) on arbitrary
statements: any text in values and languages (control characters, quotes,
backslashes, non-ASCII), two origins holding copies of a statement, schemata
that merge, several names (rigour picks the caption), countries and dates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lakehouse_assets import export_duckdb, staging
from lakehouse_assets.entity_lines import NoCommonSchema, entity_rows, json_string
from lakehouse_assets.export_state import SPARK_INDEX_COLUMNS
from lakehouse_assets.incremental import _changed_rows_spark
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.query import LIVE_SCHEMA
from lakehouse_assets_tests.conftest import SPARK_MODE, examples

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark_modes

#: (prop, its type) of the properties drawn, ``id`` being the entity's own statement
PROPS = (
    ("id", "id"),
    ("name", "name"),
    ("alias", "name"),
    ("country", "country"),
    ("jurisdiction", "country"),
    ("startDate", "date"),
    ("endDate", "date"),
    ("notes", "text"),
)
#: each entity's schema, its statements' being it or LegalEntity (they merge), or
#: now and then one that does not merge with it
SCHEMATA = {"e1": "Person", "e2": "Company", "e3": "Organization"}
OTHER = {"e3": "Vessel"}  # (e1 and e2 always merge: "other" is LegalEntity for them)
SEEN = ("2024-01-01T00:00:00", "2024-06-01T12:00:00", "2025-03-01T00:00:00", None)
#: any text, with what JSON and CSV must escape made likely
TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(list('"\\\n\t\r\b\f\x00\x01\x1f\x7f,é€😀\u2028 ab')),
        st.characters(codec="utf-8"),
    ),
    min_size=1,
    max_size=8,
)

statement = st.fixed_dictionaries(
    {
        "entity": st.sampled_from(["e1", "e2", "e3"]),
        "referent": st.sampled_from([None, "r1", "r2"]),
        "prop": st.sampled_from([*PROPS, *[PROPS[1]] * 4]),  # names: captions to pick
        "schema": st.sampled_from(["own"] * 5 + ["LegalEntity"] * 4 + ["other"]),
        "value": st.one_of(TEXT, st.sampled_from(["de", "fr", "2020-01-02", "2021"])),
        "lang": st.sampled_from([None, "eng", "deu", "rus", "mul"]),
        "origin": st.sampled_from(["a", "b"]),
        "dataset": st.sampled_from(["same", "default"]),
        "external": st.booleans(),
        "first_seen": st.sampled_from(SEEN),
        "last_seen": st.sampled_from(SEEN),
        "original": st.one_of(st.none(), TEXT),
    }
)


_lakes = iter(range(10**9))


def _table(drawn: list[dict[str, Any]], copies: list[int]) -> pa.Table:
    rows = []
    for number, s in enumerate(drawn):
        prop, prop_type = s["prop"]
        row = {
            "id": f"s{number}",
            "entity_id": s["referent"] or s["entity"],
            "canonical_id": s["entity"],
            "prop": prop,
            "prop_type": prop_type,
            "schema": {
                "own": SCHEMATA[s["entity"]],
                "other": OTHER.get(s["entity"], "LegalEntity"),
            }.get(s["schema"], "LegalEntity"),
            "value": s["entity"] if prop == "id" else s["value"],
            "dataset": s["dataset"],
            "lang": s["lang"],
            "original_value": s["original"],
            "external": s["external"],
            "first_seen": s["first_seen"],
            "last_seen": s["last_seen"],
            "origin": s["origin"],
        }
        rows.append(row)
        if number in copies:  # the same statement written by the other origin
            other = "b" if s["origin"] == "a" else "a"
            rows.append({**row, "origin": other, "first_seen": SEEN[number % 3]})
    return pa.Table.from_pylist(rows, schema=LIVE_SCHEMA)


def _comparable(rows: pa.Table) -> list[dict[str, Any]]:
    out = rows.select([*SPARK_INDEX_COLUMNS, "csv", "json"]).to_pylist()
    for row in out:
        row["countries"] = sorted(row["countries"] or [])  # a set: Spark's order is its own
    return out


def test_json_strings_are_escaped_as_spark_writes_them(spark: SparkSession) -> None:
    from pyspark.sql import functions as F

    text = "".join(chr(c) for c in range(0x80)) + "\u2028\u2029é😀\ufeff\uffff"
    frame = spark.createDataFrame([(text,)], "v string")
    spark_line = frame.select(F.to_json(F.struct("v")).alias("j")).collect()[0]["j"]
    assert spark_line == '{"v":' + json_string(text) + "}"
    assert json.loads(spark_line)["v"] == text


#: each example is a few Spark jobs: on the cluster (executors a round trip away,
#: the same SQL as in process) fewer of them, 15 in the main pass
LINE_EXAMPLES = examples(5 if SPARK_MODE == "cluster" else 15, 150)


@pytest.mark.on_cluster
@settings(max_examples=LINE_EXAMPLES, deadline=None)
@given(
    drawn=st.lists(statement, min_size=1, max_size=16),
    copies=st.lists(st.integers(0, 13), max_size=4),
)
def test_the_driver_makes_the_lines_spark_makes(
    spark: SparkSession, tmp_path: Path, drawn: list[dict[str, Any]], copies: list[int]
) -> None:
    live = _table(drawn, copies)
    origins = len(set(live.column("origin").to_pylist()))
    n = next(_lakes)
    lake = Lakehouse(tmp_path / f"lake-{n}", journal_url=f"sqlite:///{tmp_path / f'{n}.sqlite'}")
    ds = lake.create_dataset("same")
    staging_uri = ds.store.full_uri(staging.new_area(ds, "export"))
    try:
        driver = entity_rows(live, origins=origins, columns=SPARK_INDEX_COLUMNS)
    except NoCommonSchema:
        event("no common schema: all refuse")
        with pytest.raises(Exception, match="no common schema"):
            _changed_rows_spark(ds, live, origins, staging_uri)
        with pytest.raises(NoCommonSchema, match="dataset same: entity e.: no common schema"):
            export_duckdb.entity_rows(live, origins=origins, settings=lake.settings, dataset="same")
        return
    event(f"compared; {sum(driver.column('pick').to_pylist())} caption pick(s)")
    made = _changed_rows_spark(ds, live, origins, staging_uri)
    assert _comparable(driver) == _comparable(made.sort_by("canonical_id"))
    duck = export_duckdb.entity_rows(live, origins=origins, settings=lake.settings, dataset="same")
    assert _comparable(duck) == _comparable(driver)
