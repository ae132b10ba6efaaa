"""A flush batch's journal events reduced to one row per statement.

Its own small module because Spark's Python workers run it (the journal
source's tasks): they import this, not the flush and everything it needs.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets.tables.schemas import PROVENANCE_FIELDS, STATEMENT_FIELDS, STATEMENTS_SCHEMA

#: Columns of a statement the reduce takes from its first live event.
_STATEMENT_COLUMNS = tuple(
    c for c in STATEMENT_FIELDS if c not in ("id", "first_seen", "last_seen")
)
#: The reduced batch: a statement's columns, its seen range, the last event's
#: tombstone, and the tenant and write of its first and last events.
REDUCED_SCHEMA = pa.schema(
    [
        *STATEMENTS_SCHEMA,
        pa.field("deleted_at", pa.string()),
        *(pa.field(name, pa.string()) for name in PROVENANCE_FIELDS),
    ]
)
#: Provenance field → (journal column, aggregation over a statement's events in order).
_PROVENANCE_SOURCES = {
    "first_tenant": ("tenant", "first"),
    "first_write": ("write_id", "first"),
    "last_tenant": ("tenant", "last"),
    "last_write": ("write_id", "last"),
}


def reduce_events(events: pa.Table) -> pa.Table:
    """One row per (origin, id) of a batch of journal events (:data:`REDUCED_SCHEMA`).

    A statement's columns come from its first live (not tombstone) event (with
    none, from its first tombstone, which carries the stored statement's
    columns: a statement deleted twice before a flush keeps its entity's
    canonical id, which the change feed records), its
    ``first_seen`` is the earliest, ``last_seen`` the latest, ``deleted_at``
    the last event's (NULL: written last, so live), and the tenant and write
    of its first and its last event. Done in Arrow on the
    driver, where the batch already is: most statements have one event in a
    batch and pass straight through (a hash count finds them); only those
    with several events go through the ordered aggregation. (Spark's
    ``min_by`` over a struct of strings cannot hash-aggregate: it sorts the
    whole batch, 18 s per million rows here against well under one.)
    """
    names = REDUCED_SCHEMA.names
    keys = ["origin", "id"]
    counts = events.group_by(keys).aggregate([("seq", "count")])
    repeated = counts.filter(pc.greater(counts["seq_count"], 1))
    # a statement with one event: it is its first and its last
    for name, (source, _) in _PROVENANCE_SOURCES.items():
        events = events.append_column(name, events[source])
    if repeated.num_rows == 0:
        return events.select(names)
    key = pc.binary_join_element_wise(events["origin"], events["id"], "\x1f")
    mask = pc.is_in(
        key,
        value_set=pc.binary_join_element_wise(repeated["origin"], repeated["id"], "\x1f"),
    )
    single = events.filter(pc.invert(mask)).select(names)
    multi = events.filter(mask).sort_by("seq")
    keep_nulls = pc.ScalarAggregateOptions(skip_nulls=False)
    live = multi.filter(pc.is_null(multi["deleted_at"]))
    firsts = live.group_by(keys, use_threads=False).aggregate(
        [(c, "first", keep_nulls) for c in _STATEMENT_COLUMNS if c != "origin"]
    )
    seen = multi.group_by(keys, use_threads=False).aggregate(
        [
            ("first_seen", "min"),
            ("last_seen", "max"),
            ("deleted_at", "last", keep_nulls),
            ("bucket", "first"),
            *((source, agg, keep_nulls) for source, agg in _PROVENANCE_SOURCES.values()),
        ]
    )
    # a statement with no live event in the batch: its first tombstone's columns
    tombstoned = multi.group_by(keys, use_threads=False).aggregate(
        [(c, "first", keep_nulls) for c in _STATEMENT_COLUMNS if c != "origin"]
    )
    tombstoned = tombstoned.rename_columns(
        [n if n in keys else f"{n}_tombstone" for n in tombstoned.column_names]
    )
    firsts = firsts.append_column("_live", pa.repeat(True, firsts.num_rows))
    joined = seen.join(firsts, keys=keys, join_type="left outer").join(
        tombstoned, keys=keys, join_type="left outer"
    )
    live_event = pc.is_valid(joined["_live"])
    for column in _STATEMENT_COLUMNS:
        if column != "origin":
            name = f"{column}_first"
            chosen = pc.if_else(live_event, joined[name], joined[f"{name}_tombstone"])
            joined = joined.set_column(joined.schema.get_field_index(name), name, chosen)
    columns = {
        name: joined[name if name in keys else f"{name}_{agg}"]
        for name, agg in [
            *((c, "first") for c in _STATEMENT_COLUMNS if c != "origin"),
            ("first_seen", "min"),
            ("last_seen", "max"),
            ("deleted_at", "last"),
            ("bucket", "first"),
            ("origin", ""),
            ("id", ""),
        ]
    }
    for name, (source, agg) in _PROVENANCE_SOURCES.items():
        columns[name] = joined[f"{source}_{agg}"]
    many = pa.table(
        [columns[n].cast(f.type) for n, f in zip(names, REDUCED_SCHEMA, strict=True)], names=names
    )
    return pa.concat_tables([single, many])
