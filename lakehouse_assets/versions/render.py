"""Re-rendering a snapshot: its logical hash and its exports, from the tables.

Kept apart from publishing because verify (``--deep``) and ``export --as-of``
use it too; it reads through :mod:`lakehouse_assets.query` and imports
followthemoney only inside the functions (kept out of start-up).
"""

from __future__ import annotations

import hashlib
from typing import IO, TYPE_CHECKING, BinaryIO, cast

from lakehouse_assets.versions.hashes import multihash

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.tables.snapshot import DatasetSnapshot


def logical_hash(ds: DatasetContext, snapshot: DatasetSnapshot) -> tuple[str, int]:
    """Recompute a snapshot's logical hash from the tables (and its live statement count).

    The SHA-256 of the snapshot's ``statements.csv``: the live statements in
    export order, a statement written by two origins once, in the bytes of
    followthemoney's CSV writer (rendered in SQL by
    :func:`query.statement_csv_buffers`, which the tests hold to that writer).
    """
    from lakehouse_assets.query import statement_csv_buffers

    digest = hashlib.sha256()
    count = 0
    for buffer, lines in statement_csv_buffers(ds, snapshot):
        digest.update(buffer)
        count += lines
    return multihash(digest.digest()), count


def render_export(ds: DatasetContext, snapshot: DatasetSnapshot, kind: str, out: IO[bytes]) -> int:
    """Write one export of a snapshot; returns the count of statements or entities
    written. Entities and statistics with followthemoney's and ftmq's own code
    (the reference the Spark exports are tested against); statements.csv in
    SQL (:func:`query.statement_csv_buffers`), byte for byte what
    followthemoney's writer gives (tested), several times faster.

    This is how an export of an earlier version is re-made (``export --as-of``).
    """
    from followthemoney.cli.util import write_entity
    from ftmq.model.stats import Collector

    from lakehouse_assets.query import (
        aggregate,
        first_origin,
        sorted_live_batches,
        statement_csv_buffers,
        to_statements,
    )
    from lakehouse_assets.spark.ftm_sql import stats_json

    if kind == "statements":
        count = 0
        for buffer, lines in statement_csv_buffers(ds, snapshot):
            out.write(buffer)
            count += lines
        return count
    statements = first_origin(
        s for batch in sorted_live_batches(ds, snapshot) for s in to_statements(batch)
    )
    entities = aggregate(ds.name, statements)
    if kind == "entities":
        count = 0
        for entity in entities:
            write_entity(cast(BinaryIO, out), entity)
            count += 1
        return count
    if kind == "statistics":
        stats = Collector().collect_many(e for e in entities)  # type: ignore[no-untyped-call]
        out.write(stats_json(stats).encode())
        return int(stats.entity_count or 0)
    raise ValueError(f"Unknown export {kind!r}; choose from statements, entities, statistics")
