"""Reads: an entity, queries streamed as NDJSON, the export's entities, versions, status.

A streamed read is started before the answer is: its first entity is read
(and with it the query checked, the journal flushed when asked) while the
status can still say 422 or 404; after the 200 the rest streams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.concurrency import run_in_threadpool

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import SourceNotFoundError
from lakehouse_assets.server.deps import NDJSON, DatasetDep

if TYPE_CHECKING:
    from ftmq.query import Query as FtmQuery

router = APIRouter(tags=["reads"])

AsOf = Annotated[
    str | None,
    Query(description="A published version: its sequence number, snapshot id or a time."),
]


class QueryBody(BaseModel):
    """The peer's query body (``flush_first``, ``query``: an ``ftmq.Query.to_dict()``),
    extended with the facade's filters. Complexity is capped as the peer caps it:
    ``LAKEHOUSE_API_QUERY_MAX_FILTER_KEYS`` leaves, ``LAKEHOUSE_API_QUERY_MAX_IN_VALUES``
    values in an ``in``/``not_in`` list (422 beyond)."""

    model_config = ConfigDict(extra="forbid")

    flush_first: bool = False
    query: dict[str, Any] | None = None
    entity_ids: list[str] | None = Field(default=None, max_length=10_000)
    schemata: list[str] | None = Field(default=None, max_length=1_000)
    origin: str | None = None
    as_of: str | None = None

    @field_validator("entity_ids")
    @classmethod
    def _ids(cls, value: list[str] | None) -> list[str] | None:
        for item in value or ():
            cv.entity_id(item)
        return value

    @field_validator("origin")
    @classmethod
    def _origin(cls, value: str | None) -> str | None:
        return None if value is None else cv.origin(value)

    def to_query(self, max_filters: int, max_in: int) -> FtmQuery | None:
        """The ftmq query, or ``ValueError`` (422) when it is malformed or too complex."""
        if not self.query:
            return None
        from ftmq.query import Query as FtmQuery

        try:
            q = FtmQuery.from_dict(self.query)
        except Exception as exc:  # ftmq raises what its parsing meets
            raise ValueError(f"Invalid query json: `{exc}`") from None
        leaves = list(q.q.iter_leaves()) if q.q else []
        if len(leaves) > max_filters:
            raise ValueError(f"query has {len(leaves)} filter conditions; maximum is {max_filters}")
        for leaf in leaves:
            if str(leaf.comparator) in ("in", "not_in") and len(leaf.value) > max_in:
                raise ValueError(
                    f"`{leaf.key}__{leaf.comparator}` has {len(leaf.value)} values; "
                    f"maximum is {max_in}"
                )
        return q


#: NDJSON is sent in chunks of about this many bytes: each chunk is one hop to a
#: worker thread and one send, so a line at a time cost half the query's rate
STREAM_CHUNK = 256 * 1024


def _lines(items: Iterator[Any], dump: Callable[[Any], Any]) -> Iterator[bytes]:
    for item in items:
        yield orjson.dumps(dump(item), option=orjson.OPT_APPEND_NEWLINE)


def _chunked(first: bytes, lines: Iterator[bytes]) -> Iterator[bytes]:
    yield first  # at once: a slow query's client sees its first entity early
    buffer: list[bytes] = []
    size = 0
    for line in lines:
        buffer.append(line)
        size += len(line)
        if size >= STREAM_CHUNK:
            yield b"".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield b"".join(buffer)


async def stream(items: Iterator[Any], dump: Callable[[Any], Any]) -> StreamingResponse:
    """NDJSON of ``items``, the first one read before the answer starts."""
    lines = _lines(items, dump)
    first = await run_in_threadpool(next, lines, None)
    body = iter(()) if first is None else _chunked(first, lines)
    return StreamingResponse(body, media_type=NDJSON)


def _run_query(ds: DatasetDep, body: QueryBody) -> Iterator[Any]:
    s = ds.settings
    q = body.to_query(s.api_query_max_filter_keys, s.api_query_max_in_values)
    return ds.query(
        q,
        entity_ids=body.entity_ids,
        origin=body.origin,
        schemata=body.schemata,
        flush=body.flush_first,
        as_of=body.as_of,
    )


@router.post("/{dataset}/_api/entities/query")
async def query_entities(ds: DatasetDep, body: QueryBody) -> StreamingResponse:
    """Entities matching the query, NDJSON of followthemoney's ``to_statement_dict()``
    (id, caption, schema, statements), as the peer streams them."""
    return await stream(_run_query(ds, body), lambda e: e.to_statement_dict())


@router.post("/{dataset}/_api/entities/statements/query")
async def query_statements(ds: DatasetDep, body: QueryBody) -> StreamingResponse:
    """The statements of the matching entities, NDJSON of ``Statement.to_dict()``."""

    def statements() -> Iterator[Any]:
        for entity in _run_query(ds, body):
            yield from entity.statements

    return await stream(statements(), lambda s: s.to_dict())


@router.get("/{dataset}/_api/entities/stats")
def entities_stats(ds: DatasetDep) -> Any:
    """The dataset's statistics (its last ``exports/statistics.json``; 404 before one)."""
    path = cv.dataset_path(ds.name, cv.STATISTICS_JSON)
    if not ds.store.exists(path):
        raise SourceNotFoundError(f"dataset {ds.name!r} has no statistics export yet")
    return orjson.loads(ds.store.read_bytes(path))


@router.get("/{dataset}/_api/entities/statements/version", response_class=PlainTextResponse)
def statements_version(ds: DatasetDep) -> str:
    """The statements table's current Delta version, as text; empty before the first
    flush (0.9.0's answer, which its client reads back as ``None``)."""
    version = ds.snapshot().versions[0]
    return "" if version is None else str(version)


@router.get("/{dataset}/_api/entities")
async def stream_entities(ds: DatasetDep, as_of: AsOf = None) -> StreamingResponse:
    """The entities of the last ``entities.ftm.json`` export (or of a version), NDJSON."""
    return await stream(ds.stream_entities(as_of=as_of), lambda d: d)


@router.get("/{dataset}/_api/entities/{entity_id}/refs")
def refs(
    ds: DatasetDep,
    entity_id: str,
    direction: Literal["in", "out", "both"] = "in",
    prop: Annotated[list[str] | None, Query(max_length=100)] = None,
    schema: Annotated[list[str] | None, Query(max_length=100)] = None,
    as_of: AsOf = None,
) -> list[dict[str, Any]]:
    """The edges at an entity from the graph index (``lakehouse refs``): the other
    entity's id, schema and caption; ``in`` who points at it, ``out`` what it points at."""
    from lakehouse_assets import graph
    from lakehouse_assets.versions import version_snapshot

    cv.entity_id(entity_id)
    return graph.refs(
        ds,
        entity_id,
        direction=direction,
        props=prop,
        schemata=schema,
        snapshot=None if as_of is None else version_snapshot(ds, as_of),
    )


@router.get("/{dataset}/_api/entities/{entity_id}/neighbours")
async def neighbours(
    ds: DatasetDep,
    entity_id: str,
    depth: Annotated[int, Query(ge=0, le=5)] = 1,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
) -> StreamingResponse:
    """The network around an entity (itself first), FtM JSON lines (``lakehouse neighbours``)."""
    from lakehouse_assets import graph

    cv.entity_id(entity_id)
    return await stream(graph.neighbours(ds, entity_id, depth=depth, limit=limit), lambda d: d)


@router.get("/{dataset}/_api/diff")
async def diff(
    ds: DatasetDep,
    old: Annotated[str, Query(alias="from", description="The older version.")],
    new: Annotated[str, Query(alias="to", description="The newer version.")],
) -> StreamingResponse:
    """The entities changed from version ``from`` to ``to``: ``{"op", "entity"}`` lines
    (yente's delta format, ``lakehouse diff``)."""
    from lakehouse_assets.versions import changes_between, resolve

    def changes() -> Iterator[dict[str, Any]]:
        yield from changes_between(ds, resolve(ds, old), resolve(ds, new))

    return await stream(changes(), lambda d: d)


@router.get("/{dataset}/_api/entities/{entity_id}")
def get_entity(
    ds: DatasetDep,
    entity_id: str,
    as_of: AsOf = None,
    origin: str | None = None,
    flush: bool = False,
) -> Any:
    """One entity as FtM JSON (404 when it has no live statement). ``flush`` first
    moves the journal into the tables, so unflushed writes are seen."""
    if origin is not None:
        cv.origin(origin)
    entity = ds.get_entity(entity_id, origin=origin, flush=flush, as_of=as_of)
    if entity is None:
        raise SourceNotFoundError(f"dataset {ds.name!r} has no entity {entity_id!r}")
    return entity.to_dict()


@router.get("/{dataset}/_api/journal/count", response_class=PlainTextResponse)
def journal_count(ds: DatasetDep) -> str:
    """Journal rows waiting for a flush, as text (the peer's route)."""
    return str(ds.journal.count(ds.name))


@router.get("/{dataset}/_api/versions")
def versions(ds: DatasetDep) -> list[dict[str, Any]]:
    """Every published version, oldest first (``lakehouse versions``)."""
    return [v.summary() for v in ds.versions()]


@router.get("/{dataset}/_api/trace/{key}")
def trace(ds: DatasetDep, key: str) -> list[dict[str, Any]]:
    """Provenance of an entity's statements, or of one statement by its id."""
    return ds.trace(key)


@router.get("/{dataset}/_api/status")
def status(ds: DatasetDep, request: Request) -> dict[str, Any]:
    """What the dataset holds: journal rows waiting, table versions, the head version,
    the tenant's operation jobs on this server (a short form of ``lakehouse status``)."""
    statements, translog = ds.snapshot().versions
    head = ds.version()
    return {
        "dataset": ds.name,
        "tenant": ds.tenant,
        "journal_pending": ds.journal.count(ds.name),
        "tables": {"statements": statements, "translog": translog},
        "version": head.summary() if head is not None else None,
        "jobs": request.app.state.worker.jobs_of(ds.name),
    }
