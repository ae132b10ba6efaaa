"""As-of reads: the tables at the Delta versions a published version names.

What a reader gets when those files are gone: :class:`VersionExpiredError`
(a vacuum on record removed them: which retention to set) or
:class:`VersionDamagedError` (nothing that keeps a record removed them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lakehouse_assets import conventions as cv
from lakehouse_assets.conventions import _table_dir
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.tables.snapshot import DatasetSnapshot
from lakehouse_assets.versions.chain import Version, resolve
from lakehouse_assets.versions.coverage import vacuumable

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


class VersionExpiredError(LakehouseError):
    """The files of a published version were removed by vacuum."""


class VersionDamagedError(LakehouseError):
    """Files of a published version are gone although no vacuum removed them."""


def version_snapshot(ds: DatasetContext, as_of: str | int) -> DatasetSnapshot:
    """The snapshot of the published version ``as_of`` names (a sequence number,
    snapshot id or time; see :func:`~lakehouse_assets.versions.chain.resolve`):
    what the facade hands the reads, which do not resolve versions themselves."""
    return snapshot_at(ds, resolve(ds, as_of))


def snapshot_at(ds: DatasetContext, version: Version) -> DatasetSnapshot:
    """The snapshot a version was built from (Delta time travel), if its files remain."""
    translog_version = version.table_version("translog")
    if translog_version is None:
        return DatasetSnapshot.load(ds.statements_table, ds.translog_table, None)
    try:
        snapshot = DatasetSnapshot.load(ds.statements_table, ds.translog_table, translog_version)
    except Exception as exc:  # the log entries themselves were cleaned up
        raise _expired(ds, version, f"its Delta log is gone ({exc})") from exc
    tables = (
        ("statements", ds.statements_table, snapshot.statements),
        ("translog", ds.translog_table, snapshot.translog),
    )
    gone = {
        name: [
            f.path
            for f in snap.files
            if not ds.store.exists(cv.dataset_path(ds.name, _table_dir(name), f.path))
        ]
        for name, _, snap in tables
    }
    missing = [path for paths in gone.values() for path in paths]
    if missing:
        if not all(
            all(map(vacuumable(ds, _table_dir(name), location), gone[name]))
            for name, location, _ in tables
            if gone[name]
        ):
            # nothing that keeps a record removed them: lost or tampered
            raise VersionDamagedError(
                f"Dataset {ds.name!r} version {version.sequence} cannot be read: "
                f"{len(missing)} of its files are missing ({missing[0]}, …) and no vacuum "
                "removed them (none ran, or they were inside its retention window): they "
                "were removed outside the lakehouse (run `lakehouse verify`)"
            )
        raise _expired(ds, version, f"{len(missing)} of its files were vacuumed ({missing[0]}, …)")
    return snapshot


def _expired(ds: DatasetContext, version: Version, why: str) -> VersionExpiredError:
    age = cv.utcnow() - version.created_at
    hours = int(age.total_seconds() // 3600) + 1
    return VersionExpiredError(
        f"Dataset {ds.name!r} version {version.sequence} ({version.manifest['created_at']}) "
        f"can no longer be read: {why}. Vacuum keeps "
        f"{ds.settings.vacuum_retention_hours} h; set LAKEHOUSE_VACUUM_RETENTION_HOURS "
        f"to at least {hours} to keep versions this old"
    )
