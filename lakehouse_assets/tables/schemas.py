"""The two Delta tables of a dataset: their schemas and column types.

``entities/statements`` holds followthemoney statements, partitioned by
``origin``, plus ``bucket`` (the journal's flush bucket) so that a flush
batch touches few files. ``entities/translog`` holds one row per statement
(``origin``, ``id``) with ``first_seen``, ``last_seen`` and ``deleted_at``,
and who wrote it (:data:`PROVENANCE_FIELDS`): the main table is append-only
between compactions, the translog says what is live. Files written before a
column existed read it as NULL (every reader passes the full schema).

Only pyarrow here: every layer that names a column (the reducer, the
Dagster definitions, the Spark jobs) imports this without delta-rs.
"""

from __future__ import annotations

import re

import pyarrow as pa

#: followthemoney's statement fields (its ``Statement`` model).
STATEMENT_FIELDS: tuple[str, ...] = (
    "id",
    "entity_id",
    "canonical_id",
    "prop",
    "prop_type",
    "schema",
    "value",
    "dataset",
    "lang",
    "original_value",
    "external",
    "first_seen",
    "last_seen",
)


def column_type(name: str) -> pa.DataType:
    """Arrow type of a statement column: all strings but these two."""
    return {"external": pa.bool_(), "bucket": pa.int32()}.get(name, pa.string())


#: The statements table: followthemoney's fields, the flush bucket, the origin.
STATEMENTS_SCHEMA = pa.schema(
    [(name, column_type(name)) for name in (*STATEMENT_FIELDS, "bucket", "origin")]
)

#: Who wrote a statement: the tenant and journal write (:class:`journal.Write`) of
#: its first event and of its last one (the write that deleted it, for a
#: tombstone). NULL in rows flushed before provenance was recorded.
PROVENANCE_FIELDS: tuple[str, ...] = ("first_tenant", "first_write", "last_tenant", "last_write")

TRANSLOG_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("bucket", pa.int32()),
        ("first_seen", pa.string()),
        ("last_seen", pa.string()),
        ("deleted_at", pa.string()),
        ("origin", pa.string()),
        *((name, pa.string()) for name in PROVENANCE_FIELDS),
    ]
)

#: The change feed (:mod:`.feed`): per translog version a flush committed, one
#: ``version`` row (the version is covered, even if it changed nothing) and one
#: row per statement it made ``live`` (new or written again) or ``dead``.
CHANGES_SCHEMA = pa.schema(
    [
        ("translog_version", pa.int64()),
        ("statements_version", pa.int64()),
        ("flush_id", pa.string()),
        ("change", pa.string()),
        ("origin", pa.string()),
        ("id", pa.string()),
        ("canonical_id", pa.string()),
    ]
)

#: The statements table is partitioned by origin; the translog is not.
STATEMENTS_PARTITION = "origin"

#: The order of a statements file's rows (every writer's: the flush, optimize,
#: a collection's build), so a file's row groups each hold a narrow range of
#: buckets and canonical ids.
STATEMENTS_ORDER: tuple[str, ...] = ("bucket", "canonical_id", "prop", "value", "origin")


def physical_schema(schema: pa.Schema, partition: str | None) -> pa.Schema:
    """The schema stored in the Parquet files (Delta keeps partitions in the log)."""
    if partition is None:
        return schema
    return schema.remove(schema.get_field_index(partition))


def partition_dir(value: str) -> str:
    """A readable, path-safe folder name for a partition value.

    The folder name is cosmetic: readers take partition values from the log.
    """
    return re.sub(r"[^A-Za-z0-9_.-]", "_", value)[:100] or "_"
