"""Spark SQL expressions for followthemoney's rules, so checks run in the JVM.

Each expression is tested against followthemoney's own Python implementation
(``lakehouse_assets_tests/test_checks.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column


def statement_key() -> Column:
    """``Statement.make_key`` in SQL: SHA-1 of ``dataset.entity_id.prop.value``,
    with ``@lang`` when the statement has a language and ``.ext`` when it is
    external, over the UTF-8 bytes (followthemoney's ``HASH_ENCODING``)."""
    from pyspark.sql import functions as F

    key = F.concat(
        F.col("dataset"),
        F.lit("."),
        F.col("entity_id"),
        F.lit("."),
        F.col("prop"),
        F.lit("."),
        F.col("value"),
        F.when(F.col("lang").isNotNull(), F.concat(F.lit("@"), F.col("lang"))).otherwise(F.lit("")),
        F.when(F.col("external"), F.lit(".ext")).otherwise(F.lit("")),
    )
    return F.sha1(key.cast("binary"))
