"""Writes: NDJSON bulk writes of entities and statements, deletes.

A body is received whole into a staging file first (bounded by
``LAKEHOUSE_API_MAX_BODY_BYTES``: 413), then written through the facade in
one journal transaction: a bad line is 422 naming the line and nothing is
written, as with ``lakehouse write``. A client that goes away before the body
ends leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request
from fastapi.responses import PlainTextResponse
from starlette.concurrency import run_in_threadpool

from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import InvalidInputError
from lakehouse_assets.lake import Dataset
from lakehouse_assets.server.deps import DatasetDep, receive_body

router = APIRouter(tags=["writes"])
#: how a body is named in the errors of its lines
SOURCE = "request body"

Origin = Annotated[str, Query(description="The origin the statements are written under.")]
NDJSON_BODY: dict[str, Any] = {
    "requestBody": {
        "content": {"application/x-ndjson": {"schema": {"type": "string"}}},
        "required": True,
    }
}


def _write_entities(ds: Dataset, path: Path, origin: str) -> dict[str, int | str]:
    with path.open("rb") as fh:
        bulk = ds.write_entities(fh, origin=origin, source=SOURCE)
    return {
        "entities": bulk.entities,
        "statements": bulk.count,
        "write_id": bulk.write.write_id,
        "tenant": bulk.write.tenant,
    }


@router.post("/{dataset}/_api/entities", openapi_extra=NDJSON_BODY)
async def write_entities(
    ds: DatasetDep, request: Request, origin: Origin = cv.DEFAULT_ORIGIN
) -> dict[str, int | str]:
    """Write FtM entities, one JSON object a line, all or nothing.

    Answers the number of entities and statements written, the write's id and
    its tenant (the token's: the journal records it); a bad line is 422
    with the line's number, and nothing of the body is written."""
    cv.origin(origin)
    path = await receive_body(request, ds.settings.api_max_body_bytes, "body")
    try:
        return await run_in_threadpool(_write_entities, ds, path, origin)
    finally:
        path.unlink(missing_ok=True)


def _statement_lines(path: Path, ds: Dataset, origin: str) -> Iterator[Any]:
    from lakehouse_assets.entities import make_statement

    with path.open("rb") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise InvalidInputError(
                    f"not JSON: {exc}", dataset=ds.name, source=SOURCE, line=number
                ) from None
            if not isinstance(row, dict):
                raise InvalidInputError(
                    "not a JSON object", dataset=ds.name, source=SOURCE, line=number
                )
            yield make_statement(row, dataset=ds.name, origin=origin, source=SOURCE, line=number)


def _write_statements(ds: Dataset, path: Path, origin: str) -> dict[str, int | str]:
    with ds.bulk(origin) as bulk:
        for stmt in _statement_lines(path, ds, origin):
            bulk.add_statement(stmt)
    return {"statements": bulk.count, "write_id": bulk.write.write_id, "tenant": bulk.write.tenant}


@router.post("/{dataset}/_api/statements", openapi_extra=NDJSON_BODY)
async def write_statements(
    ds: DatasetDep, request: Request, origin: Origin = cv.DEFAULT_ORIGIN
) -> dict[str, int | str]:
    """Write statements in followthemoney's statement form (its dict: ``entity_id``,
    ``schema``, ``prop``, ``value``, ...), one a line, all or nothing."""
    cv.origin(origin)
    path = await receive_body(request, ds.settings.api_max_body_bytes, "body")
    try:
        return await run_in_threadpool(_write_statements, ds, path, origin)
    finally:
        path.unlink(missing_ok=True)


#: the peer's statement columns taken from a journal/bulk row (the rest is its own:
#: shard, bucket, the id it computed, its fragment, its seen times)
ARROW_COLUMNS = ("entity_id", "schema", "prop", "value", "lang", "original_value", "external")


def _write_arrow(ds: Dataset, path: Path) -> int:
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            table = pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidInputError(
            f"not an Arrow IPC stream: {exc}", dataset=ds.name, source=SOURCE
        ) from None
    if table.num_rows == 0:
        return 0
    missing = {"entity_id", "schema", "prop", "value"} - set(table.column_names)
    if missing:
        raise InvalidInputError(
            f"Missing statement column: {', '.join(sorted(missing))}", dataset=ds.name
        )
    origins = set(table.column("origin").to_pylist()) if "origin" in table.column_names else {None}
    if len(origins) > 1:
        raise InvalidInputError("one origin a batch, as the peer's writer sends", dataset=ds.name)
    origin = cv.origin(origins.pop() or cv.DEFAULT_ORIGIN)
    from lakehouse_assets.entities import make_statement

    with ds.bulk(origin) as bulk:
        for number, row in enumerate(table.to_pylist(), 1):
            refused = None
            if row.get("deleted_at") is not None:
                refused = "a tombstone: delete with DELETE /{dataset}/_api/entities/{id}"
            elif row.get("fragment"):
                refused = "a statement with a fragment: fragments are not stored here"
            if refused:
                raise InvalidInputError(refused, dataset=ds.name, source=SOURCE, line=number)
            data = {k: row[k] for k in ARROW_COLUMNS if row.get(k) is not None}
            bulk.add_statement(
                make_statement(data, dataset=ds.name, origin=origin, source=SOURCE, line=number)
            )
    return bulk.count


@router.post(
    "/{dataset}/_api/journal/bulk",
    response_class=PlainTextResponse,
    openapi_extra={
        "requestBody": {
            "content": {"application/vnd.apache.arrow.stream": {"schema": {"type": "string"}}}
        }
    },
)
async def journal_bulk(ds: DatasetDep, request: Request) -> str:
    """The peer's bulk write: an Arrow IPC stream of its statement rows, written all
    or nothing (a bad row is 422 naming it); answers the count as text. Its shard,
    bucket, id, seen times are its own and not kept; tombstones and fragments are
    refused."""
    path = await receive_body(request, ds.settings.api_max_body_bytes, "body")
    try:
        return str(await run_in_threadpool(_write_arrow, ds, path))
    finally:
        path.unlink(missing_ok=True)


@router.delete("/{dataset}/_api/entities/{entity_id}", response_class=PlainTextResponse)
def delete_entity(ds: DatasetDep, entity_id: str, origin: str | None = None) -> str:
    """Tombstone every statement of an entity (of ``origin`` only, if given); answers
    how many, as text (the peer's answer)."""
    cv.entity_id(entity_id)
    if origin is not None:
        cv.origin(origin)
    return str(ds.delete_entity(entity_id, origin=origin))


@router.delete(
    "/{dataset}/_api/entities/{entity_id}/statements/{statement_id}",
    response_class=PlainTextResponse,
)
def delete_statement(ds: DatasetDep, entity_id: str, statement_id: str) -> str:
    """Tombstone one live statement of an entity by its id (404 when it has none such)."""
    cv.entity_id(entity_id)
    cv.entity_id(statement_id, "statement id")
    for stmt in ds.stored_statements(entity_id):
        if stmt.id == statement_id:
            ds.delete_statement(stmt)
            return "1"
    from lakehouse_assets.errors import SourceNotFoundError

    raise SourceNotFoundError(
        f"entity {entity_id!r} of dataset {ds.name!r} has no live statement {statement_id!r}"
    )
