"""The Delta tables of a dataset: one owner of how they are laid out, written and read.

A dataset keeps its entities in two Delta tables (statements and translog,
see :mod:`.schemas`). The modules, by concern, from the bottom up:

- :mod:`.schemas`: the tables' schemas, partition column and column types
  (pyarrow only);
- :mod:`.delta`: the delta-rs layer: :class:`~.delta.DeltaLocation`, the
  fenced :func:`~.delta.commit`, add/remove actions and their file stats;
- :mod:`.snapshot`: what a reader sees (:class:`~.snapshot.DatasetSnapshot`),
  the files of a version, pyarrow filesystems, datasets and cached footers;
- :mod:`.lookups`: point lookups of a few rows by their keys;
- :mod:`.changes`: the translog rows that differ between two snapshots;
- :mod:`.spark_io`: Spark's reads of snapshots and writes of table files
  (imported by its full path only: it imports pyspark).

Only the schemas are re-exported here, so that ``import lakehouse_assets.tables``
costs no more than pyarrow: the other modules load delta-rs, and the CLI's
start-up (``lakehouse status``) must stay free of Spark's client.
"""

from __future__ import annotations

from lakehouse_assets.tables.schemas import (
    PROVENANCE_FIELDS,
    STATEMENT_FIELDS,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)

__all__ = [
    "PROVENANCE_FIELDS",
    "STATEMENTS_PARTITION",
    "STATEMENTS_SCHEMA",
    "STATEMENT_FIELDS",
    "TRANSLOG_SCHEMA",
]
