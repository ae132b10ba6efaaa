"""Spark SQL expressions for followthemoney's rules, so checks run in the JVM.

Each expression is tested against followthemoney's own Python implementation
(``lakehouse_assets_tests/test_checks.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

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


def csv_line_sql(column: Callable[[str], str]) -> str:
    """A statement as followthemoney's ``CSVStatementWriter`` writes it (every field
    quoted, ``"`` doubled, booleans ``t``/``f``), without the line end, as SQL
    that DuckDB and Spark both run; ``column`` names each column's expression."""
    from followthemoney.statement.serialize import CSV_COLUMNS

    def field(name: str) -> str:
        if name == "external":
            value = f"CASE WHEN {column(name)} THEN 't' ELSE 'f' END"
        else:
            value = f"coalesce({column(name)}, '')"
        return f"""'"' || replace({value}, '"', '""') || '"'"""

    return " || ',' || ".join(field(c) for c in CSV_COLUMNS)
