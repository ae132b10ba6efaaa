"""followthemoney's serialisations as Spark SQL, so exports run in the JVM.

The exports used to build a ``Statement`` per row and a ``StatementEntity``
per entity in Python tasks (about 40k statements/s on 2 cores). Here the same
results are Spark SQL expressions and aggregations over the live statements:

- :func:`csv_line`: a line of followthemoney's statement CSV (``CSV_COLUMNS``,
  every field quoted, ``"`` doubled, booleans ``t``/``f``), the bytes its
  ``CSVStatementWriter`` writes;
- :func:`entity_frame` + :func:`entity_json`: ``StatementEntity.from_statements``
  and ``to_dict`` as two aggregations (per property, then per entity): the
  common schema of the statements' schemata, the caption by the schema's
  caption properties, referents, datasets, origins, seen range and
  ``last_change``, the properties' distinct values (sorted, so an export is
  byte-stable from run to run; followthemoney's own order comes from a set);
- :func:`statistics`: ftmq's ``Collector`` as one aggregation collected to the
  driver, turned into its ``DatasetStats`` by the ``Collector`` itself.

One rule is not SQL: an entity with several statements of a name-typed
caption property gets its caption from rigour's ``pick_lang_name``. That runs
in a Python UDF, which receives the names of those entities only (a null
for every other entity), and is left out of the plan when no entity needs it.

The model's rules come in as literals built from ``followthemoney.model``
(caption properties, labels, schema compatibility, Thing/Interval), so the
plan is the same on ``local[*]`` and a Spark Connect server. Tests compare
every output with followthemoney's and ftmq's own code
(``lakehouse_assets_tests/test_exports.py``, ``test_properties_dataset.py``).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from followthemoney.dataset import Dataset as FtmDataset
from followthemoney.statement.util import BASE_ID

if TYPE_CHECKING:
    from ftmq.model.stats import DatasetStats
    from pyspark.sql import Column, DataFrame, Row


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql_map(pairs: dict[str, str]) -> str:
    if not pairs:
        return "map()"
    keys = ", ".join(_sql_string(k) for k in pairs)
    values = ", ".join(_sql_string(v) for v in pairs.values())
    return f"map_from_arrays(array({keys}), array({values}))"


@cache
def _model_literals() -> dict[str, str]:
    """SQL literals of the model's rules the entity and statistics expressions use."""
    import itertools

    from followthemoney import model
    from followthemoney.exc import InvalidData
    from followthemoney.types import registry

    common: dict[str, str] = {}
    for left, right in itertools.permutations(sorted(model.schemata), 2):
        try:
            common[f"{left}|{right}"] = model.common_schema(left, right).name
        except InvalidData:
            continue
    captions = []
    for name, schema in sorted(model.schemata.items()):
        props = ", ".join(
            f"named_struct('prop', {_sql_string(p)}, 'is_name', "
            f"{'true' if schema.properties[p].type == registry.name else 'false'})"
            for p in schema.caption
            if p in schema.properties
        )
        captions.append(f"{_sql_string(name)}, array({props})" if props else None)
    caption_map = ", ".join(c for c in captions if c)
    labels = {name: schema.label for name, schema in model.schemata.items()}
    things = [n for n, s in model.schemata.items() if s.is_a("Thing")]
    intervals = [n for n, s in model.schemata.items() if s.is_a("Interval")]
    return {
        "common": _sql_map(common),
        "captions": f"map({caption_map})",
        "labels": _sql_map(labels),
        "things": "array(" + ", ".join(_sql_string(t) for t in sorted(things)) + ")",
        "intervals": "array(" + ", ".join(_sql_string(t) for t in sorted(intervals)) + ")",
    }


# --- statements.csv -------------------------------------------------------------


def csv_line() -> Column:
    """One statement as followthemoney's ``CSVStatementWriter`` writes it, without
    the line end (the writers add ``\\n``): the SQL DuckDB renders it with too."""
    from pyspark.sql import functions as F

    from lakehouse_assets.spark.sql import csv_line_sql

    return F.expr(csv_line_sql(lambda name: name)).alias("line")


def dedupe(ranged: DataFrame, *, origins: int) -> DataFrame:
    """Each statement once per entity: of the copies two origins wrote, the first in
    export order (``query.SORT``) (followthemoney's aggregation keeps one per id).

    ``ranged`` is range-partitioned by ``canonical_id``, which the window's
    clustering accepts, so this adds a sort, not a shuffle. With one origin
    (``origins``, from the snapshot's partition values) there are no copies:
    the table holds a statement once per origin, and the sort is saved.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if origins <= 1:
        return ranged.withColumn("_copies_first_seen", F.col("first_seen"))
    key = Window.partitionBy("canonical_id", "id")
    window = key.orderBy("prop", "value", "origin")
    copies = window.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    return (
        ranged.withColumn("_copy", F.row_number().over(window))
        # followthemoney's last_change takes the ``id`` statements of every origin
        .withColumn("_copies_first_seen", F.max("first_seen").over(copies))
        .where(F.col("_copy") == 1)
        .drop("_copy")
    )


# --- entities.ftm.json ---------------------------------------------------------------


def entity_frame(statements: DataFrame, *, csv_bytes: bool = False) -> DataFrame:
    """One row per entity (``canonical_id``) with what ``to_dict`` and the
    statistics need; ``statements`` are deduplicated (:func:`dedupe`) and
    partitioned by ``canonical_id`` (both aggregations then need no shuffle).

    With ``csv_bytes``, also the bytes of the entity's lines in statements.csv
    (what an incremental export needs to find them again)."""
    from pyspark.sql import functions as F

    lit = _model_literals()
    not_base = F.col("prop") != BASE_ID
    sizes = [F.sum(F.octet_length(csv_line()) + 1).alias("csv_bytes")] if csv_bytes else []
    per_prop = statements.groupBy("canonical_id", "prop").agg(
        *sizes,
        F.array_sort(F.collect_set("value")).alias("values"),
        F.count(F.lit(1)).alias("n"),
        # the caption of a single-valued (or non-name) property: sorted(stmts)[0],
        # followthemoney sorts a property's statements by id
        F.min_by("value", "id").alias("first"),
        F.collect_list(F.struct("value", "lang")).alias("names"),
        F.collect_set("schema").alias("schemas"),
        F.collect_set(
            F.when(F.col("entity_id") != F.col("canonical_id"), F.col("entity_id"))
        ).alias("referents"),
        F.collect_set("dataset").alias("datasets"),
        F.collect_set("origin").alias("origins"),
        F.min("first_seen").alias("first_seen"),
        F.max("last_seen").alias("last_seen"),
        F.max("_copies_first_seen").alias("max_first_seen"),
        F.max(F.col("prop_type") == "country").alias("is_country"),
    )

    def flat(column: str) -> Column:
        """The distinct values of an array column over the entity's non-``id`` properties."""
        return F.array_sort(
            F.array_distinct(F.flatten(F.collect_list(F.when(not_base, F.col(column)))))
        )

    entity = per_prop.groupBy("canonical_id").agg(
        F.array_sort(F.array_distinct(F.flatten(F.collect_list("schemas")))).alias("schemas"),
        F.array_sort(
            F.collect_list(F.when(not_base, F.struct("prop", "values", "n", "first", "names")))
        ).alias("props"),
        flat("referents").alias("referents"),
        flat("datasets").alias("datasets"),
        flat("origins").alias("origins"),
        F.min(F.when(not_base, F.col("first_seen"))).alias("first_seen"),
        F.max(F.when(not_base, F.col("last_seen"))).alias("last_seen"),
        F.max(F.when(~not_base, F.col("max_first_seen"))).alias("last_change"),
        F.sum("n").alias("statements"),
        *([F.sum("csv_bytes").alias("csv_bytes")] if csv_bytes else []),
        # ftmq's Collector: countries, and the start and end of the dates
        F.array_distinct(
            F.flatten(F.collect_list(F.when(F.col("is_country"), F.col("values"))))
        ).alias("countries"),
        F.min(F.when(F.col("prop").isin("startDate", "date"), F.element_at("values", 1))).alias(
            "start"
        ),
        F.max(F.when(F.col("prop").isin("endDate", "date"), F.element_at("values", -1))).alias(
            "end"
        ),
    )
    # the common schema: the most specific of a chain; none (an error) otherwise
    merged = F.expr(
        f"aggregate(slice(schemas, 2, size(schemas)), schemas[0], "
        f"(acc, s) -> CASE WHEN acc IS NULL THEN NULL "
        f"ELSE try_element_at({lit['common']}, acc || '|' || s) END)"
    )
    entity = entity.withColumn(
        "schema",
        F.when(merged.isNotNull(), merged).otherwise(
            F.raise_error(
                F.concat(
                    F.lit("entity "),
                    F.col("canonical_id"),
                    F.lit(": no common schema of "),
                    F.array_join("schemas", ", "),
                )
            )
        ),
    )
    # the caption: the first of the schema's caption properties the entity has
    entity = entity.withColumn(
        "_props", F.map_from_entries(F.expr("transform(props, p -> struct(p.prop, p))"))
    )
    entity = entity.withColumn(
        "_caption_prop",
        F.expr(
            f"try_element_at(filter(coalesce(try_element_at({lit['captions']}, schema), array()), "
            "c -> map_contains_key(_props, c.prop)), 1)"
        ),
    )
    entity = entity.withColumn("_cap", F.expr("try_element_at(_props, _caption_prop.prop)"))
    pick = F.col("_caption_prop.is_name") & (F.col("_cap.n") > 1)
    # the caption SQL gives (the first value, or the schema's label), and the
    # names rigour must pick among where it has a say (see :func:`with_caption`)
    plain = F.when(
        F.col("_caption_prop").isNull(), F.expr(f"try_element_at({lit['labels']}, schema)")
    ).otherwise(F.col("_cap.first"))
    return (
        entity.withColumn("_caption", plain)
        .withColumn("_pick_names", F.when(pick, F.col("_cap.names")))
        .drop("_props", "_caption_prop", "_cap")
    )


def with_caption(entities: DataFrame, *, picks: int) -> DataFrame:
    """The ``caption`` column of :func:`entity_frame`'s rows.

    ``picks`` is how many of them need rigour's pick among several names
    (:func:`statistics` counts them). With none, the plan has no Python UDF:
    an Arrow UDF sends every row through a Python worker even when its input
    is null: on the kek set, where no entity needs a pick, that was about a
    quarter of the statistics step (0.35 of 1.3 s on a warm server, measured
    alone).
    """
    from pyspark.sql import functions as F

    if not picks:
        caption = F.col("_caption")
    else:
        picked = _pick_name_udf()(F.col("_pick_names"))
        caption = F.when(
            F.col("_pick_names").isNotNull(), F.coalesce(picked, F.col("_caption"))
        ).otherwise(F.col("_caption"))
    return entities.withColumn("caption", caption).drop("_caption", "_pick_names")


def entity_json(dataset_undefined: str = FtmDataset.UNDEFINED) -> Column:
    """An entity as followthemoney's ``write_entity`` writes ``to_dict()`` (``id``
    first, then its keys in the same order; absent keys as it leaves them out)."""
    from pyspark.sql import functions as F

    properties = F.map_from_entries(F.expr("transform(props, p -> struct(p.prop, p.values))"))
    datasets = F.filter("datasets", lambda d: d != F.lit(dataset_undefined))
    return F.to_json(
        F.struct(
            F.col("canonical_id").alias("id"),
            F.col("caption"),
            F.col("schema"),
            F.col("referents"),
            datasets.alias("datasets"),
            F.when(F.size("origins") > 0, F.col("origins")).alias("origin"),
            F.col("first_seen"),
            F.col("last_seen"),
            F.col("last_change"),
            properties.alias("properties"),
        )
    ).alias("line")


def _pick_name_udf() -> Any:
    """rigour's ``pick_lang_name`` over an entity's (value, lang) names: an Arrow UDF
    (null in, null out, so entities that need no pick cost a null)."""
    from pyspark.sql.pandas.functions import arrow_udf

    def pick(names: pa.Array) -> pa.Array:
        from rigour.langs import LangStr
        from rigour.names.pick import pick_lang_name

        out: list[str | None] = []
        for item in names.to_pylist():
            if item is None:
                out.append(None)
            else:
                out.append(pick_lang_name([LangStr(n["value"], lang=n["lang"]) for n in item]))
        return pa.array(out, pa.string())

    return arrow_udf(pick, "string")  # type: ignore[call-overload]


# --- statistics.json -----------------------------------------------------------------


@dataclass(frozen=True)
class Statistics:
    """The one aggregation over :func:`entity_frame`'s rows, by (schema, country).

    Counts come straight from it; ftmq's ``DatasetStats`` is made on demand
    (:meth:`dataset_stats`), so an export can start writing its lines while
    ftmq is still being imported.
    """

    #: Spark's rows, or mappings with the same keys (an incremental export's)
    rows: tuple[Row | Mapping[str, Any], ...]

    @property
    def entities(self) -> int:
        return sum(r["n"] for r in self.rows if r["country"] is None)

    @property
    def statements(self) -> int:
        """Statements of the entities (the rows of statements.csv)."""
        return sum(r["statements"] or 0 for r in self.rows if r["country"] is None)

    @property
    def picks(self) -> int:
        """Entities whose caption rigour picks among several names (:func:`with_caption`)."""
        return sum(r["picks"] or 0 for r in self.rows if r["country"] is None)

    def dataset_stats(self) -> DatasetStats:
        """ftmq's ``DatasetStats``: the sums made by ftmq's ``Collector``."""
        from ftmq.model.stats import Collector

        collector = Collector()  # type: ignore[no-untyped-call]
        things: Counter[str] = Counter()
        intervals: Counter[str] = Counter()
        things_countries: Counter[str] = Counter()
        intervals_countries: Counter[str] = Counter()
        # in a fixed order (ftmq lists them in the order it meets them)
        for row in sorted(self.rows, key=lambda r: (r["schema"], r["country"] or "")):
            if row["country"] is None:
                collector.entity_count += row["n"]
                if row["thing"]:
                    things[row["schema"]] += row["n"]
                if row["interval"]:
                    intervals[row["schema"]] += row["n"]
                if row["start"] is not None:
                    collector.start.add(row["start"])
                if row["end"] is not None:
                    collector.end.add(row["end"])
            else:
                if row["thing"]:
                    things_countries[row["country"]] += row["n"]
                if row["interval"]:
                    intervals_countries[row["country"]] += row["n"]
        collector.things, collector.intervals = things, intervals
        collector.things_countries, collector.intervals_countries = (
            things_countries,
            intervals_countries,
        )
        return collector.export()


def statistics(entities: DataFrame) -> Statistics:
    """The aggregation behind ftmq's ``DatasetStats`` of the entities, their
    statement count and how many need a caption pick, collected to the driver.

    ftmq's import (about 0.5 s, pyrql building its grammar) starts here on a
    background thread: it runs while this aggregation and the writes after it
    run in Spark, and :meth:`Statistics.dataset_stats` needs it only then.
    """
    from pyspark.sql import functions as F

    from lakehouse_assets.preload import preload

    if "ftmq.model.stats" not in sys.modules:
        preload("ftmq.model.stats")
    lit = _model_literals()
    # each entity once with no country (schema counts), then once per country
    rows = (
        entities.select(
            "schema",
            "start",
            "end",
            "statements",
            F.col("_pick_names").isNotNull().cast("long").alias("pick"),
            F.explode(
                F.concat(F.array(F.lit(None).cast("string")), F.coalesce("countries", F.array()))
            ).alias("country"),
        )
        .groupBy("schema", "country")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.min("start").alias("start"),
            F.max("end").alias("end"),
            F.sum("statements").alias("statements"),
            F.sum("pick").alias("picks"),
            F.expr(f"array_contains({lit['things']}, schema)").alias("thing"),
            F.expr(f"array_contains({lit['intervals']}, schema)").alias("interval"),
        )
        .collect()
    )
    return Statistics(tuple(rows))


def stats_json(stats: DatasetStats) -> str:
    """statistics.json as ftmq writes a ``DatasetStats``, its ``countries`` sorted.

    ftmq keeps the countries as a set, which pydantic writes in the set's
    order: that depends on the process's string hash seed, so the same
    snapshot gave a different file (and checksum) in every process."""
    import json

    data = stats.model_dump(mode="json")
    data["countries"] = sorted(data["countries"])
    # pydantic's JSON with indent=2 and UTF-8 text, as model_dump_json writes it
    return json.dumps(data, indent=2, ensure_ascii=False)
