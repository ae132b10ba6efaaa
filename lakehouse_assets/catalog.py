"""The catalog's ``config.yml``: lake-wide defaults every process of the lake shares.

``{lake}/config.yml`` lives with the data, so the CLI on a laptop, a Dagster
code location and a tenant's script opening the same lake agree on where its
journal is and how long vacuum keeps old files, without each setting the same
environment. Example::

    name: catalog
    title: Investigations
    dataset_defaults:
      publisher: {name: ACME Research, url: https://acme.example.org}
      license: https://creativecommons.org/licenses/by/4.0/
    journal_url: postgresql://lake@db.internal/journal
    retention:
      vacuum_retention_hours: 336

Every value is resolved with the same precedence (the first that is set wins):

1. an explicit argument (``Lakehouse(journal_url=...)``, the CLI's ``--journal-url``,
   a Dagster resource's field; keyword arguments to ``create_dataset``);
2. the environment (``LAKEHOUSE_JOURNAL_URL``, ``LAKEHOUSE_VACUUM_RETENTION_HOURS``,
   or ``./lakehouse.env``) and ``Settings`` fields set in code;
3. the catalog ``config.yml``;
4. the built-in default (:class:`~lakehouse_assets.settings.Settings`).

A config.yml that is not valid YAML, has an unknown key, a duplicate key or a
value of the wrong type or out of range stops every command with
:class:`~lakehouse_assets.errors.InvalidConfigError` naming the file and each
problem: a typo never silently falls back to a default. It is read bounded
(:mod:`lakehouse_assets.bounded`: at most 1 MiB, 64 levels deep) and must be a
regular file: in a local lake a ``config.yml`` that is a directory, a symbolic
link or anything but a file is an error naming the path, so a link planted to
another file (a secret) is never read, and no error ever quotes the file's text.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lakehouse_assets import conventions as cv
from lakehouse_assets.bounded import BoundedParseError, load_yaml
from lakehouse_assets.errors import InvalidConfigError, SourceNotFoundError
from lakehouse_assets.journal_urls import checked_journal_url
from lakehouse_assets.settings import MAX_RETENTION_HOURS, Settings
from lakehouse_assets.storage import LocalStore, Store

#: The largest config.yml read (a real one is a few hundred bytes).
MAX_CONFIG_BYTES = 1024 * 1024

#: Fields of a dataset's metadata (``DatasetModel``) the catalog may not
#: default: name and title are the dataset's own; counts, dates and children
#: are computed.
NOT_DEFAULTED = (
    "name",
    "title",
    "children",
    "updated_at",
    "last_export",
    "entity_count",
    "thing_count",
)


def dataset_default_fields() -> tuple[str, ...]:
    """Fields of a dataset's metadata the catalog may default: descriptive ones.

    A function, not a constant: followthemoney is imported only where it is
    used (about 0.5 s of every CLI command that never touches an entity)."""
    from followthemoney.dataset.dataset import DatasetModel

    return tuple(name for name in DatasetModel.model_fields if name not in NOT_DEFAULTED)


#: Where a setting's value came from (see the precedence in the module docstring).
Source = Literal["argument", "environment", "config.yml", "default"]


def describe_errors(exc: ValidationError) -> str:
    """``retention.vacuum_retention_hours: Input should be a valid integer; ...``."""
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "(top level)"
        message = error["msg"].removeprefix("Value error, ")
        value = error.get("input")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] not in ("missing", "value_error") and isinstance(
            value, str | int | float | bool
        ):
            # a validator's own message (value_error) says what it needs to:
            # the journal URL's hides its password, which the input would show
            shown = repr(value)
            message = f"{message} (got {shown[:60]}{'...' if len(shown) > 60 else ''})"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


class RetentionConfig(BaseModel):
    """How long the lake keeps what it no longer needs."""

    model_config = ConfigDict(extra="forbid")

    vacuum_retention_hours: int | None = Field(
        default=None,
        ge=0,
        le=MAX_RETENTION_HOURS,
        description="vacuum keeps files a version younger than this still needs "
        "(LAKEHOUSE_VACUUM_RETENTION_HOURS overrides it).",
    )

    @field_validator("vacuum_retention_hours", mode="before")
    @classmethod
    def _not_a_bool(cls, value: Any) -> Any:
        """``true`` is not a number of hours (pydantic would take it as 1)."""
        if isinstance(value, bool):
            raise ValueError(f"a number of hours is expected, not {str(value).lower()}")
        return value


class CatalogConfig(BaseModel):
    """The catalog ``config.yml`` of a lake.

    Precedence of every value, the first set wins: explicit argument >
    environment variable (``LAKEHOUSE_*``, ``./lakehouse.env``) > this file >
    built-in default. ``dataset_defaults`` apply when a dataset is created
    and the caller did not give the field; an existing dataset's config.yml
    is never rewritten from them.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(default="catalog", description="Name of the catalog.")
    title: str | None = Field(default=None, description="Human-readable title of the catalog.")
    dataset_defaults: dict[str, Any] = Field(
        default_factory=dict,
        description="Dataset metadata fields (publisher, license, summary, ...) a new "
        "dataset gets unless its creator gives them.",
    )
    journal_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the lake's journal (LAKEHOUSE_JOURNAL_URL and "
        "--journal-url override it).",
    )
    retention: RetentionConfig = Field(default_factory=RetentionConfig)

    @field_validator("journal_url")
    @classmethod
    def _durable_journal(cls, value: str | None) -> str | None:
        """A SQLite file or a PostgreSQL server (:mod:`lakehouse_assets.journal_urls`)."""
        return checked_journal_url(value) if value else value

    @field_validator("dataset_defaults")
    @classmethod
    def _dataset_fields(cls, value: dict[str, Any]) -> dict[str, Any]:
        from followthemoney.dataset.dataset import DatasetModel

        allowed = dataset_default_fields()
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise ValueError(
                f"unknown dataset field(s) {', '.join(unknown)} (allowed: {', '.join(allowed)})"
            )
        try:
            DatasetModel.model_validate({"name": "defaults", "title": "defaults", **value})
        except ValidationError as exc:
            raise ValueError(describe_errors(exc)) from None
        return value


def parse_catalog_config(text: str | bytes, where: str) -> CatalogConfig:
    """Read ``config.yml`` text; ``InvalidConfigError`` naming ``where`` and the problem
    (bounded: :data:`MAX_CONFIG_BYTES`, 64 levels, no duplicate keys; never quoting the text)."""
    try:
        raw = load_yaml(text, max_bytes=MAX_CONFIG_BYTES)
    except BoundedParseError as exc:
        raise InvalidConfigError(f"{where}: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InvalidConfigError(
            f"{where}: expected a mapping of settings, got {type(raw).__name__}"
        )
    try:
        return CatalogConfig.model_validate(raw)
    except ValidationError as exc:
        raise InvalidConfigError(f"{where}: {describe_errors(exc)}") from None


def _read_local_config(store: LocalStore, where: str) -> bytes | None:
    """A local lake's config.yml (None: it has none), which must be a regular file.

    A directory used to be skipped as "no config" and a symbolic link was
    followed (to a secret file, whose lines the YAML error then printed):
    both are errors naming the path. The file is opened without following a
    link (``O_NOFOLLOW``: no window between a check and the open) and without
    blocking (a FIFO), then judged by ``fstat``.
    """
    path = store.local_path(cv.CATALOG_CONFIG)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except (FileNotFoundError, NotADirectoryError):
        return None  # (a file as the lake root is the store's to report)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InvalidConfigError(
                f"{where}: is a symbolic link; the catalog config.yml must be a regular "
                "file in the lake (links are not followed)"
            ) from None
        raise InvalidConfigError(f"{where}: cannot be read ({exc.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise InvalidConfigError(
            f"{where}: is {kind}; the catalog config.yml must be a regular file in the lake"
        )
    with os.fdopen(fd, "rb") as fh:
        return fh.read(MAX_CONFIG_BYTES + 1)


def load_catalog_config(store: Store) -> CatalogConfig | None:
    """The lake's catalog ``config.yml``, or None when the lake has none.

    At most :data:`MAX_CONFIG_BYTES` are read (one more byte says it is too big)."""
    where = store.full_uri(cv.CATALOG_CONFIG)
    if isinstance(store, LocalStore):
        data = _read_local_config(store, where)
    else:
        try:
            with store.open_read(cv.CATALOG_CONFIG) as fh:
                data = fh.read(MAX_CONFIG_BYTES + 1)
        except SourceNotFoundError:
            data = None
    return None if data is None else parse_catalog_config(data, where)


def dataset_names(store: Store) -> list[str]:
    """Names of the datasets in a lake (folders with a config.yml)."""
    names = []
    for name in store.list_dirs(""):
        if cv.is_dataset_folder(name) and store.exists(cv.dataset_path(name, cv.CONFIG)):
            names.append(name)
    return names


def load_dataset_config(store: Store, dataset: str) -> dict[str, Any]:
    """A dataset's ``config.yml`` as a mapping (empty when blank), read with the
    same bounds as the catalog's (size, depth, aliases, duplicate keys).

    The dataset configs were read with a plain ``yaml.safe_load``: a
    10,000-deep file raised RecursionError in every command that lists the
    catalog. ``InvalidConfigError`` names the file and the problem, never its text.
    """
    path = cv.dataset_path(dataset, cv.CONFIG)
    where = store.full_uri(path)
    with store.open_read(path) as fh:
        data = fh.read(MAX_CONFIG_BYTES + 1)
    try:
        raw = load_yaml(data, max_bytes=MAX_CONFIG_BYTES)
    except BoundedParseError as exc:
        raise InvalidConfigError(f"{where}: {exc}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidConfigError(f"{where}: expected a mapping, got {type(raw).__name__}")
    return raw


def apply_catalog_config(
    settings: Settings, config: CatalogConfig | None, explicit: set[str]
) -> tuple[Settings, dict[str, Source]]:
    """``settings`` with the config's values where neither an argument nor the
    environment set them, and where each value came from."""
    values: dict[str, Any] = {"journal_url": None, "vacuum_retention_hours": None}
    if config is not None:
        values = {
            "journal_url": config.journal_url,
            "vacuum_retention_hours": config.retention.vacuum_retention_hours,
        }
    updates: dict[str, Any] = {}
    sources: dict[str, Source] = {}
    for field, value in values.items():
        if field in explicit:
            sources[field] = "argument"
        elif field in settings.model_fields_set:
            sources[field] = "environment"
        elif value is not None:
            updates[field] = value
            sources[field] = "config.yml"
        else:
            sources[field] = "default"
    if updates:
        # model_copy marks the fields as set: nothing downstream re-applies defaults
        settings = settings.model_copy(update=updates)
    return settings, sources
