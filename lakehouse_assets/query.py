"""Interactive reads: get one entity, small filtered queries, stream the export.

These must answer in milliseconds, so they never start Spark: pyarrow scans
the snapshot's Parquet files as the Delta log lists them (local and S3 lakes
alike), pruning row groups by their statistics on ``bucket`` and
``canonical_id``, and joins the matching translog rows in memory. Live
statements are the main table's rows whose translog row is not deleted, with
``first_seen``/``last_seen`` taken from the translog: the rule the Spark
exports apply too. (DuckDB reads the same files; for a point read its
connection set-up alone cost more than the whole pyarrow path.)
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from followthemoney import model
from followthemoney.dataset import Dataset as FtmDataset
from followthemoney.statement import Statement
from followthemoney.statement.entity import StatementEntity

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidInputError, SourceNotFoundError
from lakehouse_assets.journal import BUCKETS, bucket_of, statement_from_mapping
from lakehouse_assets.spark.sql import csv_line_sql
from lakehouse_assets.tables.arrays import values_array
from lakehouse_assets.tables.lookups import point_lookup
from lakehouse_assets.tables.probe import rows_of
from lakehouse_assets.tables.schemas import (
    STATEMENT_FIELDS,
    STATEMENTS_PARTITION,
    STATEMENTS_SCHEMA,
    TRANSLOG_SCHEMA,
)
from lakehouse_assets.tables.snapshot import DatasetSnapshot, arrow_dataset

if TYPE_CHECKING:
    from ftmq.query import Query

    from lakehouse_assets.context import DatasetContext

LIVE_SCHEMA = pa.schema([STATEMENTS_SCHEMA.field(c) for c in (*STATEMENT_FIELDS, "origin")])

#: Order of statements in reads and exports: entity, property, value.
SORT = ("canonical_id", "prop", "value", "origin", "id")


@lru_cache(maxsize=64)
def ftm_dataset(name: str) -> FtmDataset:
    """The followthemoney dataset object statements and entities refer to."""
    return FtmDataset.make({"name": name, "title": name})


def live_statements(
    ds: DatasetContext,
    *,
    entity_ids: Sequence[str] | None = None,
    origin: str | None = None,
    snapshot: DatasetSnapshot | None = None,
    bucket_range: tuple[int, int] | None = None,
    schemata: Collection[str] | None = None,
) -> pa.Table:
    """Live statements (optionally of some entities / one origin / a range of
    buckets), sorted, as Arrow.

    ``schemata`` narrows a scan to the entities that have a statement of one of
    those schemata: the only ones whose entity can be of such a schema
    (followthemoney's ``common_schema`` merges two schemata into one of the two,
    so an entity's schema is always one of its statements'). It is a pre-filter,
    not the filter: such an entity can still merge into another schema, so the
    caller checks the aggregated entity (:func:`query` does).

    Reads one :class:`DatasetSnapshot` (the latest unless given) from start to end.
    """
    buckets = sorted({bucket_of(e) for e in entity_ids}) if entity_ids else None
    span = (buckets[0], buckets[-1]) if buckets else bucket_range
    options = ds.statements_table.storage_options
    snapshot = snapshot or ds.snapshot()
    main_files = snapshot.statements.select(span)
    if not main_files:
        return pa.Table.from_batches([], schema=LIVE_SCHEMA)
    log_files = snapshot.translog.select(span)
    log_columns = ["origin", "id", "first_seen", "last_seen", "deleted_at"]
    if buckets and entity_ids:
        # a point read (get, trace, refs' captions): bloom filters and statistics
        rows, log = _point_read(ds, snapshot, entity_ids, origin, log_columns)
        if rows.num_rows == 0:
            return pa.Table.from_batches([], schema=LIVE_SCHEMA)
    else:
        # pyarrow filters the scans (pruning row groups by their statistics); the
        # filters are ours, so they bind to whatever string type a file was written
        # with (delta-rs writes string_view, Spark plain string).
        where: pc.Expression | None = None
        if bucket_range is not None:
            low, high = bucket_range
            where = (pc.field("bucket") >= low) & (pc.field("bucket") <= high)
        if origin is not None:
            match = pc.field("origin") == cv.origin(origin)
            where = match if where is None else where & match
        main = arrow_dataset(main_files, STATEMENTS_SCHEMA, options, partition=STATEMENTS_PARTITION)
        if schemata:
            # two narrow columns first: the entities that may match, so the rows
            # read, joined, sorted and made into Python objects are only theirs
            of_schema = pc.field("schema").isin(list(schemata))
            keys = main.to_table(
                columns=["canonical_id"],
                filter=of_schema if where is None else where & of_schema,
            )
            if keys.num_rows == 0:
                return pa.Table.from_batches([], schema=LIVE_SCHEMA)
            candidates = pc.field("canonical_id").isin(
                pc.unique(keys.column("canonical_id").combine_chunks())
            )
            where = candidates if where is None else where & candidates
        rows = main.to_table(filter=where)
        if rows.num_rows == 0:
            return pa.Table.from_batches([], schema=LIVE_SCHEMA)
        log_filter = pc.field("id").isin(rows.column("id").combine_chunks())
        if bucket_range is not None:
            low, high = bucket_range
            log_filter = (pc.field("bucket") >= low) & (pc.field("bucket") <= high) & log_filter
        log = arrow_dataset(log_files, TRANSLOG_SCHEMA, options).to_table(
            columns=log_columns, filter=log_filter
        )
    log = log.rename_columns(["origin", "id", "t_first", "t_last", "deleted_at"])
    if buckets and entity_ids:
        joined = _with_translog(rows, log)
    else:
        joined = rows.join(log, keys=["origin", "id"], join_type="left outer")
    live = joined.filter(pc.is_null(joined.column("deleted_at")))
    first = pc.coalesce(live.column("t_first"), live.column("first_seen"))
    last = pc.coalesce(live.column("t_last"), live.column("last_seen"))
    live = live.set_column(live.schema.get_field_index("first_seen"), "first_seen", first)
    live = live.set_column(live.schema.get_field_index("last_seen"), "last_seen", last)
    # a scan's chunks come in bucket order, each sorted by bucket first: the
    # order of a query's entities does not depend on where chunks are cut
    order = SORT if buckets and entity_ids else ("bucket", *SORT)
    return live.sort_by([(c, "ascending") for c in order]).select(LIVE_SCHEMA.names)


def _with_translog(rows: pa.Table, log: pa.Table) -> pa.Table:
    """``rows`` with the columns of their translog row (``log`` renamed as in
    :func:`live_statements`; NULL where a row has none): the left join on
    (origin, id) of a point read's few rows, by ``index_in`` on the two keys
    joined. pyarrow's ``Table.join`` would do it, but Acero imports
    pyarrow.dataset and with it pandas: a third of a ``get``'s wall time."""

    # NUL cannot be in an origin (a checked name) or a statement id (a hash)
    nul = values_array(["\0"], pa.string())[0]

    def keys(table: pa.Table) -> pa.Array:
        origin, ids = table.column("origin").combine_chunks(), table.column("id").combine_chunks()
        return pc.binary_join_element_wise(origin, ids, nul)

    at = pc.index_in(keys(rows), value_set=keys(log))
    found = log.take(at)
    for name in ("t_first", "t_last", "deleted_at"):
        rows = rows.append_column(log.schema.field(name), found.column(name))
    return rows


def rows_by_id(
    ds: DatasetContext,
    snapshot: DatasetSnapshot,
    keys: pa.Table,
    columns: Sequence[str] | None = None,
) -> pa.Table:
    """Statement rows (live or not) whose ``id`` is in ``keys`` (a table with ``id``
    and ``bucket`` columns), reading only the files of those buckets."""
    if keys.num_rows == 0:
        return STATEMENTS_SCHEMA.empty_table().select(list(columns or STATEMENTS_SCHEMA.names))
    buckets = pc.unique(keys.column("bucket")).to_pylist()
    files = [
        f
        for f in snapshot.statements.files
        if f.min_bucket is None
        or f.max_bucket is None
        or any(f.min_bucket <= b <= f.max_bucket for b in buckets)
    ]
    where = pc.field("bucket").isin(buckets) & pc.field("id").isin(
        keys.column("id").combine_chunks()
    )
    return arrow_dataset(
        files,
        STATEMENTS_SCHEMA,
        ds.statements_table.storage_options,
        partition=STATEMENTS_PARTITION,
    ).to_table(columns=list(columns) if columns else None, filter=where)


def bucket_ranges(snapshot: DatasetSnapshot, chunk_bytes: int) -> list[tuple[int, int]]:
    """Ranges of buckets whose statements hold about ``chunk_bytes`` of Parquet
    each (by the files' sizes and bucket statistics in the Delta log)."""
    weight = [0.0] * BUCKETS
    for f in snapshot.statements.files:
        low = f.min_bucket if f.min_bucket is not None else 0
        high = f.max_bucket if f.max_bucket is not None else BUCKETS - 1
        share = f.size / (high - low + 1)
        for b in range(low, high + 1):
            weight[b] += share
    ranges: list[tuple[int, int]] = []
    start, acc = 0, 0.0
    for b in range(BUCKETS):
        acc += weight[b]
        if acc >= chunk_bytes:
            ranges.append((start, b))
            start, acc = b + 1, 0.0
    if start < BUCKETS:
        ranges.append((start, BUCKETS - 1))
    return ranges


#: Up to this many buckets, a point read queries each bucket on its own (its
#: files only, its ids only); above it, one query over the files of the span.
#: DuckDB prunes row groups well by min/max and bloom filters for one bucket,
#: poorly for an IN list spread over buckets; but each query reopens its files,
#: which costs more than the pruning saves where files are large and hold many
#: buckets (a table not yet optimized) and the buckets are many. Measured with
#: `refs` (the captions of the other entities), 200 lookups: 10M median 380 ->
#: 110 ms, p95 3.0 -> 2.1 s; 1M median 169 -> 71 ms, p95 388 -> 407 ms. With 64
#: the 10M p95 was 1.3 s but the 1M p95 0.83 s; a rule by the files' bytes did
#: worse than either.
POINT_BUCKETS = 8


def _point_read(
    ds: DatasetContext,
    snapshot: DatasetSnapshot,
    entity_ids: Sequence[str],
    origin: str | None,
    log_columns: list[str],
) -> tuple[pa.Table, pa.Table]:
    """The statement rows of some entities (live or not) and their translog rows."""
    options = ds.statements_table.storage_options
    groups: dict[int, list[str]] = {}
    for entity_id in entity_ids:
        groups.setdefault(bucket_of(entity_id), []).append(entity_id)
    wanted = cv.origin(origin) if origin is not None else None
    if len(groups) > POINT_BUCKETS:
        return _many_points(ds, snapshot, groups, wanted, log_columns)
    spans = [((b, b), [b], ids) for b, ids in sorted(groups.items())]
    rows_parts, log_parts = [], []
    for span, buckets, ids in spans:
        files = snapshot.statements.select(span)
        if wanted is not None:
            files = [f for f in files if f.partition_values.get("origin") == wanted]
        rows = point_lookup(
            files,
            STATEMENTS_SCHEMA,
            options,
            {"bucket": buckets, "canonical_id": ids},
            partition=STATEMENTS_PARTITION,
        )
        if rows.num_rows == 0:
            continue
        rows_parts.append(rows)
        log_parts.append(
            point_lookup(
                snapshot.translog.select(span),
                TRANSLOG_SCHEMA,
                options,
                {"bucket": buckets, "id": pc.unique(rows.column("id")).to_pylist()},
                columns=log_columns,
            )
        )
    if not rows_parts:
        return STATEMENTS_SCHEMA.empty_table(), TRANSLOG_SCHEMA.empty_table().select(log_columns)
    return (
        pa.concat_tables(rows_parts, promote_options="permissive"),
        pa.concat_tables(log_parts, promote_options="permissive"),
    )


def _many_points(
    ds: DatasetContext,
    snapshot: DatasetSnapshot,
    groups: dict[int, list[str]],
    origin: str | None,
    log_columns: list[str],
) -> tuple[pa.Table, pa.Table]:
    """:func:`_point_read` of entities in many buckets: the row groups each
    entity's and then each of its statements' (bucket, key) can be in, by
    min/max (:func:`.tables.probe.rows_of`), rather than a scan of the span."""
    options = ds.statements_table.storage_options
    span = (min(groups), max(groups))
    files = snapshot.statements.select(span)
    if origin is not None:
        files = [f for f in files if f.partition_values.get(STATEMENTS_PARTITION) == origin]
    buckets = [b for b, ids in groups.items() for _ in ids]
    entity_ids = [e for ids in groups.values() for e in ids]
    rows = rows_of(
        files,
        STATEMENTS_SCHEMA,
        options,
        buckets,
        entity_ids,
        key_column="canonical_id",
        partition=STATEMENTS_PARTITION,
    )
    log = rows_of(
        snapshot.translog.select(span),
        TRANSLOG_SCHEMA,
        options,
        rows.column("bucket").to_pylist(),
        rows.column("id").to_pylist(),
        key_column="id",
        columns=log_columns,
    )
    return rows, log


def live_chunks(
    ds: DatasetContext,
    *,
    origin: str | None = None,
    snapshot: DatasetSnapshot | None = None,
    schemata: Collection[str] | None = None,
) -> Iterator[pa.Table]:
    """Every live statement of one snapshot (of the entities that may be of one of
    ``schemata``: see :func:`live_statements`), a range of buckets at a time.

    Memory stays bounded by ``query_chunk_bytes`` (of Parquet) however large the
    table: each chunk is sorted by entity, and an entity's statements are all in
    one bucket, so entities come whole, in bucket order.
    """
    snapshot = snapshot or ds.snapshot()
    for span in bucket_ranges(snapshot, ds.settings.query_chunk_bytes):
        chunk = live_statements(
            ds, origin=origin, snapshot=snapshot, bucket_range=span, schemata=schemata
        )
        if chunk.num_rows:
            yield chunk


def sorted_live_batches(
    ds: DatasetContext, snapshot: DatasetSnapshot, batch_rows: int = 50_000
) -> Iterator[pa.RecordBatch]:
    """Every live statement of a snapshot in export order (globally sorted by
    :data:`SORT`, as the Spark exports range-partition them), streamed.

    DuckDB sorts (spilling to its temp folder beyond its memory limit) over
    the snapshot's files as pyarrow datasets; the join and the first_seen /
    last_seen rule are :func:`live_statements`'s. Used where a Python
    rendering must equal an export byte for byte (exports of an earlier
    version, the logical hash); :func:`live_chunks` is cheaper where bucket
    order will do.
    """
    import duckdb

    options = ds.statements_table.storage_options
    main = arrow_dataset(  # noqa: F841 (DuckDB reads the local by name)
        snapshot.statements.files, STATEMENTS_SCHEMA, options, partition=STATEMENTS_PARTITION
    )
    log = arrow_dataset(snapshot.translog.files, TRANSLOG_SCHEMA, options)  # noqa: F841
    fields = ", ".join(
        f"coalesce(l.{c}, m.{c}) AS {c}" if c in ("first_seen", "last_seen") else f"m.{c}"
        for c in LIVE_SCHEMA.names
    )
    order = ", ".join(f"m.{c}" for c in SORT)
    con = duckdb.connect(config={"threads": 1})
    try:
        reader = con.execute(
            f"SELECT {fields} FROM main m LEFT JOIN log l ON m.origin = l.origin AND m.id = l.id "
            f"WHERE l.deleted_at IS NULL ORDER BY {order}"
        ).to_arrow_reader(batch_rows)
        for batch in reader:
            yield batch.cast(LIVE_SCHEMA) if batch.schema != LIVE_SCHEMA else batch
    finally:
        con.close()


def csv_header() -> bytes:
    """The header line of followthemoney's statement CSV."""
    from followthemoney.statement.serialize import CSV_COLUMNS

    return (",".join(f'"{c}"' for c in CSV_COLUMNS) + "\n").encode("utf-8")


def string_data(lines: pa.Array) -> memoryview | None:
    """The bytes of a string array's values end to end, without a copy (None if empty)."""
    if not isinstance(lines, pa.LargeStringArray | pa.StringArray):
        lines = lines.cast(pa.large_string())
    _, offsets, data = lines.buffers()
    width = 8 if isinstance(lines, pa.LargeStringArray) else 4
    first, last = lines.offset, lines.offset + len(lines)
    start = int.from_bytes(offsets[first * width : (first + 1) * width], "little")
    end = int.from_bytes(offsets[last * width : (last + 1) * width], "little")
    if data is None or end <= start:
        return None
    return memoryview(data)[start:end]


def statement_csv_buffers(
    ds: DatasetContext, snapshot: DatasetSnapshot, *, threads: int = 2
) -> Iterator[tuple[memoryview, int]]:
    """``statements.csv`` of a snapshot (header included) as a stream of byte buffers
    and the number of statement lines in each,
    rendered by DuckDB in SQL: the bytes followthemoney's ``CSVStatementWriter``
    writes for the same statements (every field quoted, ``"`` doubled, ``\n``
    line ends, booleans ``t``/``f``), in export order, a statement written by
    two origins once (the first in sort order).

    About six times faster than building a ``Statement`` per row and writing
    it with the csv module (:func:`first_origin` and the reference rendering in
    :func:`versions.render_export`, which tests compare this with); used for
    the logical hash and exports of an earlier version. The buffers are the
    string data of Arrow arrays, handed on without a copy.
    """
    import duckdb

    options = ds.statements_table.storage_options
    main = arrow_dataset(  # noqa: F841 (DuckDB reads the local by name)
        snapshot.statements.files, STATEMENTS_SCHEMA, options, partition=STATEMENTS_PARTITION
    )
    log = arrow_dataset(snapshot.translog.files, TRANSLOG_SCHEMA, options)  # noqa: F841

    def column(name: str) -> str:
        return (
            f"coalesce(l.{name}, m.{name})" if name in ("first_seen", "last_seen") else f"m.{name}"
        )

    line = csv_line_sql(column) + " || chr(10)"
    order = ", ".join(f"m.{c}" for c in SORT)
    yield memoryview(csv_header()), 0
    con = duckdb.connect(config={"threads": threads})
    try:
        reader = con.execute(
            f"SELECT {line} AS line FROM main m "
            "LEFT JOIN log l ON m.origin = l.origin AND m.id = l.id "
            "WHERE l.deleted_at IS NULL "
            "QUALIFY row_number() OVER "
            "(PARTITION BY m.canonical_id, m.id ORDER BY m.prop, m.value, m.origin) = 1 "
            f"ORDER BY {order}"
        ).to_arrow_reader(100_000)
        for batch in reader:
            data = string_data(batch.column(0))
            if data is not None:
                yield data, batch.num_rows
    finally:
        con.close()


def to_statements(table: pa.Table | pa.RecordBatch) -> Iterator[Statement]:
    batches = [table] if isinstance(table, pa.RecordBatch) else table.to_batches(10_000)
    for batch in batches:
        for row in batch.to_pylist():
            yield statement_from_mapping(row)


def first_origin(statements: Iterable[Statement]) -> Iterator[Statement]:
    """Statements sorted by entity with a statement written by two origins once
    (the first in sort order), as the exports keep it."""
    current: str | None = None
    seen: set[str] = set()
    for stmt in statements:
        if stmt.canonical_id != current:
            current, seen = stmt.canonical_id, set()
        if stmt.id in seen:
            continue
        seen.add(stmt.id or "")
        yield stmt


def aggregate(dataset: str, statements: Iterable[Statement]) -> Iterator[StatementEntity]:
    """Group statements sorted by canonical id into followthemoney entities."""
    meta = ftm_dataset(dataset)
    current: list[Statement] = []
    for stmt in statements:
        if current and stmt.canonical_id != current[0].canonical_id:
            yield StatementEntity.from_statements(meta, current)
            current = []
        current.append(stmt)
    if current:
        yield StatementEntity.from_statements(meta, current)


def check_schemata(ds: DatasetContext, schemata: Collection[str] | None) -> frozenset[str]:
    """The schema names a read keeps, each checked against the FtM model."""
    wanted = frozenset(schemata or ())
    for name in sorted(wanted):
        if model.get(name) is None:
            raise InvalidInputError(f"Dataset {ds.name!r}: unknown FtM schema {name!r}")
    return wanted


def query(
    ds: DatasetContext,
    q: Query | None = None,
    *,
    entity_ids: Sequence[str] | None = None,
    origin: str | None = None,
    schemata: Collection[str] | None = None,
    snapshot: DatasetSnapshot | None = None,
) -> Iterator[StatementEntity]:
    """Entities from live statements, filtered by ids, origin, schema and an ftmq
    ``Query``.

    With ids: those entities, sorted by id. Without: every live entity, streamed
    a range of buckets at a time (bounded memory; see :func:`live_chunks`).
    ``schemata`` keeps the entities of those schemata (exact names, as ftmq's
    ``schema__in``); unlike the same filter in ``q``, it is applied to the
    tables, so only the entities that may match are read and aggregated.
    ``snapshot`` reads that snapshot (a published version's, see
    :func:`lakehouse_assets.versions.version_snapshot`); the current one by
    default.

    A read never flushes: the facade (:meth:`lakehouse_assets.lake.Dataset.query`)
    decides whether to flush the journal before it reads.
    """
    wanted = check_schemata(ds, schemata)
    if entity_ids:
        tables: Iterable[pa.Table] = [
            live_statements(ds, entity_ids=entity_ids, origin=origin, snapshot=snapshot)
        ]
    else:
        tables = live_chunks(ds, origin=origin, snapshot=snapshot, schemata=wanted)
    entities = aggregate(ds.name, (s for t in tables for s in to_statements(t)))
    if wanted:
        entities = (e for e in entities if e.schema.name in wanted)
    if q is not None:
        for entity in q.apply_iter(entities):
            assert isinstance(entity, StatementEntity)
            yield entity
    else:
        yield from entities


def get_entity(
    ds: DatasetContext,
    entity_id: str,
    *,
    origin: str | None = None,
    snapshot: DatasetSnapshot | None = None,
) -> StatementEntity | None:
    """One entity by id (optionally only its statements from ``origin``)."""
    for entity in query(ds, entity_ids=[entity_id], origin=origin, snapshot=snapshot):
        return entity
    return None


def entities_export(ds: DatasetContext) -> str:
    """The lake path of the dataset's ``entities.ftm.json`` (a clear error if the
    entities were never exported)."""
    path = cv.dataset_path(ds.name, cv.ENTITIES_JSON)
    if not ds.store.exists(path):
        raise SourceNotFoundError(
            f"Dataset {ds.name!r} has no {cv.ENTITIES_JSON} yet; "
            f"run `lakehouse -d {ds.name} export entities` first"
        )
    return path


def stream_entities(
    ds: DatasetContext, snapshot: DatasetSnapshot | None = None
) -> Iterator[dict[str, Any]]:
    """Entities of the last ``entities.ftm.json`` export (no flush, no Spark).

    With ``snapshot`` (a published version's), the entities of that version,
    read from the tables as they were then (what ``entities.ftm.json`` held at
    that version).
    """
    if snapshot is not None:
        batches = sorted_live_batches(ds, snapshot)  # in the export's order
        statements = (s for b in batches for s in to_statements(b))
        for entity in aggregate(ds.name, first_origin(statements)):
            yield entity.to_dict()
        return
    with ds.store.open_read(entities_export(ds)) as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def stored_statements(ds: DatasetContext, entity_id: str) -> list[Statement]:
    """Live statements of an entity: in the Delta table and still in the journal."""
    return stored_statements_of(ds, [entity_id])[entity_id]


def stored_statements_of(
    ds: DatasetContext, entity_ids: Sequence[str]
) -> dict[str, list[Statement]]:
    """:func:`stored_statements` of many entities, with one read of the tables
    (a delete of thousands of entities read them an entity at a time: 4,351
    took about 4 min at 10M statements)."""
    for entity_id in entity_ids:
        cv.entity_id(entity_id)
    found: dict[str, dict[tuple[str | None, str | None], Statement]] = {e: {} for e in entity_ids}
    if entity_ids:
        for stmt in to_statements(live_statements(ds, entity_ids=list(found))):
            if stmt.canonical_id in found:
                found[stmt.canonical_id][(stmt.origin, stmt.id)] = stmt
    for entity_id, pending in ds.journal.live_statements_of(ds.name, list(found)).items():
        for stmt in pending:
            found[entity_id][(stmt.origin, stmt.id)] = stmt
    return {e: list(stmts.values()) for e, stmts in found.items()}
