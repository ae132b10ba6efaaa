"""Queue items and their payloads: the pydantic models, and the checks of a pushed action.

What an item is (``QueueItem``), what each action's payload holds, and how a
pushed payload is brought to its stored form (:func:`normalize_payload`); the
names in a payload that become paths are checked by the conventions here, when
an item is pushed and again when it is consumed. See :mod:`lakehouse_assets.queue`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Final, Literal, cast, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from lakehouse_assets import conventions as cv
from lakehouse_assets.catalog import describe_errors
from lakehouse_assets.errors import InvalidInputError

Action = Literal["UPSERT", "DELETE"]
Resource = Literal["entity", "file"]
State = Literal["pending", "done", "failed", "invalid"]
ACTIONS: Final[tuple[str, ...]] = get_args(Action)
RESOURCES: Final[tuple[str, ...]] = get_args(Resource)
STATES: Final[tuple[str, ...]] = get_args(State)

#: The longest URI, key, name and media type a file UPSERT may carry.
TEXT_LIMITS: Final = {"uri": 4096, "key": 4096, "name": 1024, "mimetype": 255}


# --- items ----------------------------------------------------------------------


class _Payload(BaseModel):
    """An action's payload. The names in it that become paths (origin, checksum,
    file id) are checked by the conventions here, whichever payload holds them."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("origin", check_fields=False)
    @classmethod
    def _origin(cls, value: str | None) -> str | None:
        return None if value is None else cv.origin(value)

    @field_validator("checksum", check_fields=False)
    @classmethod
    def _checksum(cls, value: str | None) -> str | None:
        return None if value is None else cv.checksum(value.lower())

    @field_validator("file_id", check_fields=False)
    @classmethod
    def _file_id(cls, value: str | None) -> str | None:
        return None if value is None else cv.file_id(value)

    @field_validator("entity_id", check_fields=False)
    @classmethod
    def _entity_id(cls, value: str) -> str:
        return cv.entity_id(value)

    @field_validator("uri", "key", "name", "mimetype", check_fields=False)
    @classmethod
    def _text(cls, value: str | None, info: ValidationInfo) -> str | None:
        name = info.field_name or "text"
        return None if value is None else cv.text(value, name, TEXT_LIMITS.get(name, 4096))


class EntityUpsert(_Payload):
    """Add or update an entity: its statements go to the journal."""

    entity: dict[str, Any]
    origin: str = cv.DEFAULT_ORIGIN

    @field_validator("entity")
    @classmethod
    def _entity(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "id" in value:
            cv.entity_id(value["id"])
        return value


class EntityDelete(_Payload):
    """Tombstone the live statements of an entity (of one origin, if given)."""

    entity_id: str = Field(min_length=1)
    origin: str | None = None


class FileUpsert(_Payload):
    """Archive a file from a path or URI (what :meth:`Archive.put` takes)."""

    uri: str = Field(min_length=1)
    checksum: str | None = None
    file_id: str | None = None
    key: str | None = None
    name: str | None = None
    mimetype: str | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    #: also write the file's Document entity into the journal
    document: bool = False


class FileDelete(_Payload):
    """Remove one file's metadata entry (the blob stays, as for :meth:`Archive.delete`)."""

    file_id: str
    checksum: str | None = None


PAYLOADS: Final[dict[tuple[str, str], type[_Payload]]] = {
    ("UPSERT", "entity"): EntityUpsert,
    ("DELETE", "entity"): EntityDelete,
    ("UPSERT", "file"): FileUpsert,
    ("DELETE", "file"): FileDelete,
}


class QueueItem(BaseModel):
    """One queued action of a tenant."""

    model_config = ConfigDict(extra="forbid")

    id: str
    tenant: str
    action: Action
    resource: Resource
    payload: dict[str, Any]
    created_at: datetime

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        return cv.queue_item_id(value)

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str) -> str:
        return cv.tenant_name(value)

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        # a time without a zone is UTC, as every time the lake writes
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)

    def parsed(self) -> _Payload:
        """The payload as its action's model (``ValidationError`` if it does not fit)."""
        return PAYLOADS[(self.action, self.resource)].model_validate(self.payload)

    def summary(self) -> str:
        """What the item is about, in a few words: an entity id, a URI, a file id."""
        p = self.payload
        entity = p.get("entity")
        value = (
            (entity.get("id") if isinstance(entity, dict) else None)
            or p.get("entity_id")
            or p.get("uri")
            or p.get("file_id")
        )
        return str(value) if value is not None else ""


def normalize_payload(
    action: str, resource: str, payload: Any
) -> tuple[Action, Resource, dict[str, Any]]:
    """Check an action and its payload; the payload in its stored form.

    Accepts a bare FtM entity dict for UPSERT entity (``origin`` may sit beside
    its keys) and ``id`` for ``entity_id``. Raises ``InvalidInputError``.
    """
    act, res = action.upper(), resource.lower()
    if act not in ACTIONS or res not in RESOURCES:
        raise InvalidInputError(
            f"unknown queue action {action!r} {resource!r}: use UPSERT or DELETE, "
            "and entity or file"
        )
    if not isinstance(payload, dict):
        raise InvalidInputError(
            f"{act} {res} payload must be a JSON object, got {type(payload).__name__}"
        )
    data = dict(payload)
    if (act, res) == ("UPSERT", "entity") and "entity" not in data and "schema" in data:
        origin = data.pop("origin", None)
        data = {"entity": data} | ({"origin": origin} if origin is not None else {})
    if (act, res) == ("DELETE", "entity") and "entity_id" not in data and "id" in data:
        data["entity_id"] = data.pop("id")
    try:
        model = PAYLOADS[(act, res)].model_validate(data)
    except ValidationError as exc:
        raise InvalidInputError(f"{act} {res} payload: {describe_errors(exc)}") from None
    return (
        cast(Action, act),
        cast(Resource, res),
        model.model_dump(mode="json", exclude_defaults=True),
    )
