"""One root error for everything the lakehouse raises on purpose.

Each subclass says what went wrong and, through ``retryable``, whether trying
again may help (a held lock, a flaky network) or whether the input must be
fixed first (a bad name, a malformed line). Messages always name the dataset,
file and line where they apply, so an operator can act on them directly.
"""

from __future__ import annotations


class LakehouseError(Exception):
    """Root of every error the lakehouse raises deliberately."""

    #: True when the same call may succeed later without changing its input.
    retryable: bool = False


class InvalidNameError(LakehouseError, ValueError):
    """A dataset, tenant, tag key or file id is not a safe, valid name."""


class InvalidInputError(LakehouseError, ValueError):
    """Input data (entities, statements, CSV, JSON) cannot be accepted.

    Carries the location so that bulk imports say exactly where to look.
    """

    def __init__(
        self,
        message: str,
        *,
        dataset: str | None = None,
        source: str | None = None,
        line: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.source = source
        self.line = line
        where = []
        if dataset is not None:
            where.append(f"dataset {dataset!r}")
        if source is not None:
            where.append(f"file {source!r}")
        if line is not None:
            where.append(f"line {line}")
        prefix = f"[{', '.join(where)}] " if where else ""
        super().__init__(f"{prefix}{message}")
        self.reason = message

    def __reduce__(self) -> tuple[object, ...]:
        # Keep the location when the error crosses a process boundary.
        return (
            _rebuild_invalid_input,
            (self.reason, self.dataset, self.source, self.line),
        )


def _rebuild_invalid_input(
    message: str, dataset: str | None, source: str | None, line: int | None
) -> InvalidInputError:
    return InvalidInputError(message, dataset=dataset, source=source, line=line)


class SourceNotFoundError(LakehouseError, FileNotFoundError):
    """A file, URI or archive entry that was asked for does not exist."""


class SourceUnreachableError(LakehouseError, OSError):
    """A remote source could not be reached (network, DNS, refused)."""

    retryable = True


class ChecksumMismatchError(LakehouseError, ValueError):
    """A file's content does not match the checksum the caller gave for it."""


class DatasetNotFoundError(LakehouseError, LookupError):
    """The dataset has not been created in this lake."""


class LockedError(LakehouseError):
    """A lock is held by another live process."""

    retryable = True


class DatasetBusyError(LakehouseError):
    """A dataset still has work in flight (journal rows not flushed) and was not
    deleted: ``--force`` deletes it and that work."""


class LockLostError(LakehouseError):
    """A writer's lock was broken (it was paused past the TTL, or unlocked by hand).

    Raised before anything is committed: the writer stops, the next run redoes
    its work under a lock of its own.
    """

    retryable = True


class ConcurrentWriteError(LakehouseError):
    """Another writer committed to the same Delta table meanwhile; nothing was committed."""

    retryable = True


class ConfigurationError(LakehouseError):
    """The environment or settings are incomplete (missing Java, bad URI...)."""


class InvalidConfigError(ConfigurationError, ValueError):
    """A configuration file of the lake (``config.yml``) cannot be used.

    The message names the file and every problem in it (YAML syntax with its
    line, an unknown key, a value of the wrong type).
    """


class MissingDependencyError(ConfigurationError, ImportError):
    """An optional dependency is missing; the message names the install line."""


class NonDurableJournalError(ConfigurationError, ValueError):
    """A journal URL that names neither a SQLite file nor a PostgreSQL server.

    An in-memory or temporary SQLite database (``sqlite://``, ``:memory:``,
    ``file::memory:?uri=true``, ``mode=memory``...) would forget acknowledged
    writes when the process exits; see :mod:`lakehouse_assets.journal_urls`.
    """


class InvalidSettingError(ConfigurationError):
    """A setting from the environment (``LAKEHOUSE_*``, ``./lakehouse.env``) or
    ``Settings(...)`` has a value of the wrong type or outside its range.

    Not a ``ValueError``: raised by ``Settings.__init__`` itself, so pydantic
    does not wrap it again.
    """


class CollectionError(LakehouseError, ValueError):
    """A collection cannot be built as configured: a child that does not exist, a
    cycle of children, a cluster of entities whose schemata have nothing in
    common. Fix the catalog or the judgements; retrying changes nothing."""


class ExportMemoryError(ConfigurationError, MemoryError):
    """DuckDB's full export pass on the driver ran out of the memory its setting
    allows (``LAKEHOUSE_EXPORT_DUCKDB_MEMORY_LIMIT``); nothing was replaced.

    With ``LAKEHOUSE_EXPORT_ENGINE=auto`` the export goes on with Spark's pass;
    with ``duckdb`` the message names the settings to raise or change."""
