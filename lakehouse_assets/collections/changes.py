"""A collection build's change feed: which statements the rebuild made live or dead.

A collection has no journal and no flush, so nothing records what a build
changed, and without a record every export after a rebuild took its full
pass (every canonical entity re-aggregated and re-serialised, whatever the
change). The build therefore compares its new rows with the collection's
live rows before it (every column; Spark's ``exceptAll`` both ways, or in
DuckDB a full join on (origin, id), which both sides hold once: a row
whose canonical id, rewritten value, statement id or seen range moved is
one statement dead and one live) and records the difference as a flush
does (:mod:`lakehouse_assets.tables.feed`): a ``version`` row for the
translog version the build committed and the statements version it
published, a ``live`` row per new or changed statement under its new
canonical id, a ``dead`` row per gone or changed one under its old. The
incremental export (:mod:`lakehouse_assets.incremental`) then re-renders
only the canonical entities those rows name — a merge or split of a
cluster, the entities whose references it rewrote, a leaf's changed
entities — byte for byte what a full pass writes (the property test
``test_properties_collections.py`` checks it).

The comparison is exact, not derived from the leaves' feeds and the changed
edges: it reads the collection's old rows and the new ones once more (one
shuffle of each), which at 1M statements is seconds, against the minutes of
a full export it saves when a change is small. A build whose difference is
large records no rows, only the version's absence: the export's full pass
is then the cheaper one (it says so), as after a flush that changed most
entities.

Crash safety is the flush's: the feed commit comes after the translog's, so
a build that dies between the two leaves a translog version the feed does
not cover, and the next export takes its full path.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pyarrow as pa

from lakehouse_assets.flush.commits import commit_changes
from lakehouse_assets.tables import feed
from lakehouse_assets.tables.parquet_files import write_table
from lakehouse_assets.tables.schemas import CHANGES_SCHEMA, STATEMENTS_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.locks import Fence

#: Above this many changed statements the build records no feed rows: the
#: export's full pass is cheaper than re-rendering most entities one by one.
MAX_FEED_ROWS = 2_000_000

#: The columns a feed row keeps of a changed statement.
KEYS = ("origin", "id", "canonical_id")


def changed_statements(new: DataFrame, old: DataFrame) -> pa.Table | None:
    """``origin``, ``id``, ``canonical_id`` and ``change`` (live / dead) of every
    statement that differs between the collection's old live rows and its new
    ones, in any column; None when more than :data:`MAX_FEED_ROWS` differ."""
    from pyspark.sql import functions as F

    columns = sorted(STATEMENTS_SCHEMA.names)
    new, old = new.select(*columns), old.select(*columns)
    live = new.exceptAll(old).select(*KEYS, F.lit(feed.LIVE).alias("change"))
    dead = old.exceptAll(new).select(*KEYS, F.lit(feed.DEAD).alias("change"))
    rows = live.unionByName(dead).limit(MAX_FEED_ROWS + 1).toArrow()
    return None if rows.num_rows > MAX_FEED_ROWS else rows


def record(
    ds: DatasetContext,
    rows: pa.Table,
    *,
    translog_version: int,
    statements_version: int,
    fence: Fence,
) -> None:
    """Commit a build's feed rows (:func:`changed_statements`) and the row that says
    ``translog_version`` is covered, under the build's lock fence, as a flush
    commits its own (:func:`.flush.commits.commit_changes`)."""
    build_id = f"collection-{uuid.uuid4().hex}"
    table = feed.feed_table(translog_version, statements_version, build_id, rows["change"], rows)
    location = ds.changes_table
    actions = write_table(
        table, location.uri, location.storage_options, CHANGES_SCHEMA, prefix="changes"
    )
    commit_changes(ds, actions, build_id, fence, translog_version, operation="collection")
