"""A collection's judgements: nomenklatura's resolver table, kept as a Delta table.

The table has nomenklatura's columns (``target``, ``source``, ``judgement``,
``score``, ``user``, ``created_at``, ``deleted_at``) and its history rules: a
pair has at most one live row (``deleted_at`` null); a new judgement of the
pair marks the old row deleted at the new one's ``created_at``; ``target`` is
the greater id of the pair (:func:`.resolver.pair`). It is filled from
nomenklatura's own formats:

- its **SQL table** (``NOMENKLATURA_DB_URL``: a SQLite file or PostgreSQL;
  table ``resolver`` by default): every row, history included, replaces the
  lake's table, so the lake holds what the resolver holds;
- its **JSON-lines dump** (``Resolver.dump``: ``[target, source, judgement,
  score, user, created_at]`` per line): each line supersedes the pair's live
  row, as nomenklatura's ``Resolver.load`` does.

and written back as that dump (:func:`dump_lines`, byte for byte what
nomenklatura writes for the same live edges). Every change rewrites the
canonical-id table (:mod:`.resolver`) in the same call and moves the
collection's ``resolver/last_updated`` tag: a change of judgements is a change
of the collection.

Bad input stops the load with :class:`InvalidInputError` naming the
collection, the file (or the SQL table) and the line; nothing is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse_assets import conventions as cv
from lakehouse_assets.collections.resolver import (
    CANONICAL_SCHEMA,
    NK_PREFIX,
    Clusters,
    clusters,
    order_key,
    pair,
)
from lakehouse_assets.errors import InvalidInputError
from lakehouse_assets.tables.delta import DeltaLocation
from lakehouse_assets.tables.snapshot import Snapshot, read_files

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext

#: nomenklatura's ``Judgement`` values.
JUDGEMENTS = ("positive", "negative", "unsure", "no_judgement")

#: nomenklatura's resolver table (``nomenklatura.resolver.Resolver``), less its row id.
JUDGEMENTS_SCHEMA = pa.schema(
    [
        ("target", pa.string()),
        ("source", pa.string()),
        ("judgement", pa.string()),
        ("score", pa.float64()),
        ("user", pa.string()),
        ("created_at", pa.string()),
        ("deleted_at", pa.string()),
    ]
)

#: The longest id nomenklatura's table stores (``Unicode(512)``).
MAX_ID = 512


def timestamp(ts: datetime | None = None) -> str:
    """nomenklatura's ``timestamp()``: ISO 8601 cut at 28 characters."""
    return (ts or datetime.now(UTC)).isoformat()[:28]


@dataclass(frozen=True)
class Edge:
    """One row of the resolver table."""

    target: str
    source: str
    judgement: str
    score: float | None
    user: str | None
    created_at: str | None
    deleted_at: str | None = None

    def line(self) -> str:
        """nomenklatura's ``Edge.to_line``."""
        row = [self.target, self.source, self.judgement, self.score, self.user, self.created_at]
        return json.dumps(row) + "\n"


def judgements_table(ds: DatasetContext) -> DeltaLocation:
    return DeltaLocation(
        ds.store.full_uri(cv.dataset_path(ds.name, cv.RESOLVER_JUDGEMENTS)),
        ds.store.storage_options(),
    )


def canonical_table(ds: DatasetContext) -> DeltaLocation:
    return DeltaLocation(
        ds.store.full_uri(cv.dataset_path(ds.name, cv.RESOLVER_CANONICAL)),
        ds.store.storage_options(),
    )


# --- reading nomenklatura's formats ---------------------------------------------


def _edge(values: dict[str, Any], bad: Any) -> Edge:
    """An edge from a row of either format; ``bad(message)`` raises the located error."""
    ids = []
    for key in ("target", "source"):
        value = values.get(key)
        if not isinstance(value, str) or not value.strip():
            bad(f"{key} must be a non-empty entity id, got {value!r}")
        try:
            ids.append(cv.text(value, key, MAX_ID))
        except ValueError as exc:
            bad(str(exc))
    if ids[0] == ids[1]:
        bad(f"target and source are the same id {ids[0]!r}")
    judgement = values.get("judgement")
    if judgement not in JUDGEMENTS:
        bad(f"judgement must be one of {', '.join(JUDGEMENTS)}, got {judgement!r}")
    score = values.get("score")
    if score is not None and (
        isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score)
    ):
        bad(f"score must be a number or null, got {score!r}")
    for key in ("user", "created_at", "deleted_at"):
        if values.get(key) is not None and not isinstance(values[key], str):
            bad(f"{key} must be a string or null, got {values[key]!r}")
    target, source = pair(ids[0], ids[1])
    return Edge(
        target,
        source,
        str(judgement),
        None if score is None else float(score),
        values.get("user") or None,
        values.get("created_at") or None,
        values.get("deleted_at") or None,
    )


def read_dump(lines: Iterable[str | bytes], *, dataset: str, source: str) -> list[Edge]:
    """Edges of nomenklatura's JSON-lines dump (blank lines skipped), validated."""
    edges = []
    for number, raw in enumerate(lines, 1):
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if not text.strip():
            continue

        def bad(message: str, number: int = number) -> None:
            raise InvalidInputError(message, dataset=dataset, source=source, line=number)

        try:
            row = json.loads(text)
        except ValueError as exc:
            bad(f"not JSON: {exc}")
        if not isinstance(row, list) or len(row) not in (6, 7):
            bad(
                "expected a JSON list [target, source, judgement, score, user, created_at]"
                f"{'' if not isinstance(row, list) else f', got {len(row)} items'}"
            )
        keys = ("target", "source", "judgement", "score", "user", "created_at", "deleted_at")
        edges.append(_edge(dict(zip(keys, row, strict=False)), bad))
    return edges


def read_sql(url: str, *, dataset: str, table: str = "resolver") -> list[Edge]:
    """Every row of nomenklatura's resolver table at a SQLAlchemy URL (history
    included), in its row order."""
    import sqlalchemy as sa

    if not table.replace("_", "").isalnum():
        raise InvalidInputError(f"invalid SQL table name {table!r}", dataset=dataset)
    engine = sa.create_engine(url)
    where = f"{engine.url.render_as_string(hide_password=True)} table {table}"
    try:
        meta = sa.MetaData()
        resolver = sa.Table(table, meta, autoload_with=engine)
        columns = [resolver.c[k] for k in JUDGEMENTS_SCHEMA.names]
        order = [resolver.c.id] if "id" in resolver.c else []
        with engine.connect() as conn:
            rows = conn.execute(sa.select(*columns).order_by(*order)).mappings().all()
    except (sa.exc.NoSuchTableError, KeyError) as exc:
        raise InvalidInputError(
            f"not a nomenklatura resolver table ({exc})", dataset=dataset, source=where
        ) from None
    finally:
        engine.dispose()
    edges = []
    for number, row in enumerate(rows, 1):

        def bad(message: str, number: int = number) -> None:
            raise InvalidInputError(message, dataset=dataset, source=where, line=number)

        edges.append(_edge(dict(row), bad))
    return edges


# --- the table in the lake ----------------------------------------------------------


def rows(ds: DatasetContext) -> list[Edge]:
    """Every row of the collection's judgements table (none before the first load)."""
    location = judgements_table(ds)
    snap = Snapshot.load(location)
    if snap.version is None:
        return []
    data = read_files(snap.files, JUDGEMENTS_SCHEMA, location.storage_options)
    return [Edge(**r) for r in data.to_pylist()]


def supersede(current: list[Edge], new: Iterable[Edge]) -> list[Edge]:
    """``current`` with each new edge appended, the pair's live row marked deleted
    at its time (nomenklatura's ``Resolver._register``)."""
    out = list(current)
    live = {(e.target, e.source): i for i, e in enumerate(out) if e.deleted_at is None}
    for edge in new:
        key = (edge.target, edge.source)
        if key in live:
            old = out[live[key]]
            out[live[key]] = Edge(**{**old.__dict__, "deleted_at": edge.created_at or timestamp()})
        if edge.deleted_at is None:
            live[key] = len(out)
        out.append(edge)
    return out


def live(edges: Iterable[Edge]) -> list[Edge]:
    """The live judged edges in nomenklatura's dump order (``created_at``, then as stored)."""
    kept = [e for e in edges if e.deleted_at is None and e.judgement != "no_judgement"]
    return sorted(kept, key=lambda e: e.created_at or "")


def dump_lines(edges: Iterable[Edge]) -> Iterator[str]:
    """nomenklatura's ``Resolver.dump``: one line per live judged edge."""
    for edge in live(edges):
        yield edge.line()


def resolve(edges: Iterable[Edge]) -> Clusters:
    """The clusters and canonical ids the live judgements give (:func:`.resolver.clusters`)."""
    current = [e for e in edges if e.deleted_at is None]
    return clusters(
        ((e.target, e.source) for e in current if e.judgement == "positive"),
        (
            (e.target, e.source, e.judgement)
            for e in current
            if e.judgement in ("negative", "unsure")
        ),
    )


def save(ds: DatasetContext, edges: list[Edge], operation: str) -> Clusters:
    """Replace the judgements table with ``edges`` and the canonical-id table with
    what they give, then move ``resolver/last_updated``."""
    from deltalake import CommitProperties, write_deltalake

    table = pa.Table.from_pylist([e.__dict__ for e in edges], schema=JUDGEMENTS_SCHEMA)
    result = resolve(edges)
    meta = {"lakehouse.operation": f"resolver {operation}", "dataset": ds.name}
    for location, data in ((judgements_table(ds), table), (canonical_table(ds), result.table())):
        write_deltalake(
            location.uri,
            data,
            mode="overwrite",
            storage_options=dict(location.storage_options) or None,
            commit_properties=CommitProperties(custom_metadata=meta),
        )
    ds.core_tags.touch(cv.RESOLVER_LAST_UPDATED)
    return result


@contextmanager
def changing(ds: DatasetContext) -> Iterator[None]:
    """One change of a collection's judgements at a time (``locks/lakehouse/resolver``,
    waited for up to ``LAKEHOUSE_LOCK_WAIT_SECONDS``): each is a read, a merge
    and a rewrite of the table, so two at once would lose one."""
    lock = ds.operation_lock("resolver", tenant=cv.LAKEHOUSE_TENANT)
    lock.acquire(wait=ds.settings.lock_wait_seconds)
    try:
        yield
    finally:
        lock.release()


def canonical_rows(ds: DatasetContext) -> pa.Table:
    """The canonical-id table (:data:`~.resolver.CANONICAL_SCHEMA`; empty before a load)."""
    location = canonical_table(ds)
    snap = Snapshot.load(location)
    if snap.version is None:
        return CANONICAL_SCHEMA.empty_table()
    data = read_files(snap.files, CANONICAL_SCHEMA, location.storage_options)
    return data.sort_by("entity_id")


def decide(
    ds: DatasetContext,
    left: str,
    right: str,
    judgement: str,
    *,
    user: str | None = None,
    now: str | None = None,
) -> str:
    """Record one judgement as nomenklatura's ``Resolver.decide`` does; the id the
    pair now resolves to (the edge's target).

    A positive judgement between clusters that have no canonical id (no ``NK-``
    id, no QID) links both to a new ``NK-`` id instead of to each other, so the
    merged entity has a stable name of its own."""
    if judgement not in JUDGEMENTS:
        raise InvalidInputError(
            f"judgement must be one of {', '.join(JUDGEMENTS)}, got {judgement!r}",
            dataset=ds.name,
        )
    left = cv.text(left, "entity id", MAX_ID)
    right = cv.text(right, "entity id", MAX_ID)
    with changing(ds):
        return _decide(ds, *pair(left, right), judgement, user or ds.tenant, now or timestamp())


def _decide(
    ds: DatasetContext, target: str, source: str, judgement: str, who: str, created: str
) -> str:
    import shortuuid  # nomenklatura's NK- ids are shortuuids (its dependency, and ftmq's)

    current = rows(ds)
    new: list[Edge] = []
    if judgement == "positive":
        merged = resolve(current)
        members = {target, source}
        for node in (target, source):
            canon = merged.get(node)
            members.update(m for m, c in merged.canonical.items() if c == canon)
        greatest = max(members, key=order_key)
        if order_key(greatest)[0] == 1:  # no canonical id among them: make one
            canonical = f"{NK_PREFIX}{shortuuid.uuid()}"
            new = [
                Edge(canonical, node, "positive", None, who, created) for node in (source, target)
            ]
            # the pair's own live row, if any, is removed: the two edges replace it
            current = [
                Edge(**{**e.__dict__, "deleted_at": created})
                if e.deleted_at is None and (e.target, e.source) == (target, source)
                else e
                for e in current
            ]
            save(ds, supersede(current, new), "decide")
            return canonical
    new = [Edge(target, source, judgement, None, who, created)]
    save(ds, supersede(current, new), "decide")
    return target


def load_dump(ds: DatasetContext, lines: Iterable[str | bytes], *, source: str) -> Clusters:
    """Load nomenklatura's JSON-lines dump into the collection's judgements (each
    line superseding its pair's live row); all or nothing."""
    edges = read_dump(lines, dataset=ds.name, source=source)
    with changing(ds):
        return save(ds, supersede(rows(ds), edges), "load")


def load_sql(ds: DatasetContext, url: str, *, table: str = "resolver") -> Clusters:
    """Replace the collection's judgements with nomenklatura's SQL table (history included)."""
    edges = read_sql(url, dataset=ds.name, table=table)
    with changing(ds):
        return save(ds, edges, "load")


def changed_ids(before: pa.Table, after: pa.Table) -> set[str]:
    """The ids whose canonical id differs between two canonical-id tables (what a
    change of judgements touches)."""
    old = dict(
        zip(before["entity_id"].to_pylist(), before["canonical_id"].to_pylist(), strict=True)
    )
    new = dict(zip(after["entity_id"].to_pylist(), after["canonical_id"].to_pylist(), strict=True))
    return {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
