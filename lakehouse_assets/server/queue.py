"""The queue push: a tenant queues an action (UPSERT/DELETE of an entity or a file)
for the queue's consumer (the ``queue_sensor``, or ``lakehouse queue consume``).

The item is queued as the token's tenant and checked now (an invalid entity or
name is 422 and nothing is queued), as ``Dataset.queue.push`` does. A file
UPSERT over HTTP must name a URL (``http(s)://``, ``s3://``): a local path
would name a file of the server's host, so it is refused; to send a file's
bytes, upload it (``POST /{dataset}/_api/archive``). The consumer applies the
queue's own source policy to the URL (public addresses only).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict

from lakehouse_assets.access import local_path
from lakehouse_assets.errors import InvalidInputError
from lakehouse_assets.server.deps import DatasetDep

router = APIRouter(tags=["queue"])


class PushBody(BaseModel):
    """``{"action": "UPSERT" | "DELETE", "resource": "entity" | "file", "payload": {...}}``."""

    model_config = ConfigDict(extra="forbid")

    action: str
    resource: str
    payload: dict[str, Any]


@router.post("/{dataset}/_api/queue", status_code=201)
def push(ds: DatasetDep, body: PushBody) -> dict[str, Any]:
    """Queue an action as the token's tenant; answers the item (its id, time, payload)."""
    uri = body.payload.get("uri")
    if body.resource.lower() == "file" and isinstance(uri, str) and local_path(uri) is not None:
        raise InvalidInputError(
            f"queue item names the local path {uri[:80]!r}: over HTTP a file is a URL "
            "(http(s)://, s3://), or upload its bytes to POST /{dataset}/_api/archive",
            dataset=ds.name,
        )
    item = ds.queue.push(body.action, body.resource, body.payload)
    data: dict[str, Any] = item.model_dump(mode="json")
    return data


@router.get("/{dataset}/_api/queue")
def pending(ds: DatasetDep) -> dict[str, int]:
    """How many of the tenant's queued items wait for the consumer."""
    return {"pending": ds.queue.pending_count(ds.tenant)}
