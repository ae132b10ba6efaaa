"""followthemoney's rules as Spark SQL (what the data checks run) against followthemoney."""

from __future__ import annotations

from typing import Any

import pytest
from followthemoney.statement import Statement
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse_assets_tests.conftest import examples

pytestmark = pytest.mark.spark_modes

text = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=20)
statement = st.fixed_dictionaries(
    {
        "dataset": st.sampled_from(["ds", "kek_2026", "ünïcode"]),
        "entity_id": text,
        "prop": st.sampled_from(["name", "alias", "notes", "ownershipAsset"]),
        "value": text,
        "lang": st.none() | st.sampled_from(["eng", "deu", "rus", "zho"]),
        "external": st.booleans(),
    }
)


@pytest.mark.on_cluster
@settings(max_examples=examples(5, 50), deadline=None)
@given(st.lists(statement, min_size=1, max_size=200))
def test_statement_key_in_sql_is_followthemoneys(spark: Any, rows: list[dict[str, Any]]) -> None:
    from lakehouse_assets.spark.sql import statement_key

    frame = spark.createDataFrame(
        rows,
        "dataset string, entity_id string, prop string, value string, lang string, external boolean",
    )
    got = [r["key"] for r in frame.select(statement_key().alias("key")).collect()]
    want = [
        Statement.make_key(
            r["dataset"], r["entity_id"], r["prop"], r["value"], r["external"], r["lang"]
        )
        for r in rows
    ]
    assert got == want


def test_statement_checks_name_what_is_wrong(spark: Any, local_lake: Any) -> None:
    """The checks on a dataset with a dangling reference: only that check fails,
    and it says how many statements, which entities are missing and where."""
    from lakehouse_assets.defs.checks import (
        IDS_VALID,
        REFERENCES,
        SCHEMA_VALID,
        statement_outcomes,
    )
    from lakehouse_assets.defs.resources import SparkResource

    ds = local_lake.create_dataset("checked")
    ds.add_entity({"id": "acme", "schema": "Company", "properties": {"name": ["ACME"]}})
    ds.add_entity(
        {
            "id": "stake",
            "schema": "Ownership",
            "properties": {"owner": ["nobody-here"], "asset": ["acme"]},
        }
    )
    ds.flush()
    outcomes, cached, _snapshot = statement_outcomes(ds, SparkResource())
    by_name = {o.check_name: o for o in outcomes}
    assert not cached
    assert by_name[SCHEMA_VALID].passed and by_name[IDS_VALID].passed
    assert by_name[IDS_VALID].metadata == {"wrong_ids": 0}
    refs = by_name[REFERENCES]
    assert not refs.passed and refs.warn
    assert refs.metadata == {"dangling_references": 1, "missing_entities": 1}
    assert refs.examples == [{"ref": "nobody-here", "source": "stake", "prop": "owner"}]
    again, cached, _snapshot = statement_outcomes(ds, SparkResource())
    assert cached and again == outcomes  # judged once per snapshot
