"""followthemoney's rules as Spark SQL (what the data checks run) against followthemoney."""

from __future__ import annotations

from typing import Any

from followthemoney.statement import Statement
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse_assets_tests.conftest import examples

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
