"""Who wrote a table's commits: the lakehouse, or another writer.

Every commit a lakehouse operation makes carries commit metadata
(:data:`~.delta.OWN_COMMIT_KEYS`: ``lakehouse.operation`` and the like). A
commit without it that adds or removes data was made by another writer (a
delta-rs ``delete()``, ``write_deltalake`` or an ``OPTIMIZE`` of another
tool). What the lakehouse derives from a table by its own bookkeeping (the
change feed, the graph index's update, the freshness tags of the exports)
knows nothing of such a commit, so a reader of that bookkeeping asks
:func:`foreign_commits` first and takes its full path when there are any.

Read from the commits' own log entries (small JSON files), newest table
version from the log; an entry that is gone (cleaned up after a checkpoint)
or unreadable counts as foreign: nothing says who wrote it.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from lakehouse_assets.errors import LockedError
from lakehouse_assets.tables.delta import (
    OWN_COMMIT_KEYS,
    PUBLISHED_APP_ID,
    CommitFence,
    DeltaLocation,
    commit,
)
from lakehouse_assets.tables.schemas import TRANSLOG_SCHEMA
from lakehouse_assets.tables.snapshot import _commit_file

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext

log = logging.getLogger(__name__)


def commit_actions(location: DeltaLocation, version: int) -> list[dict[str, Any]] | None:
    """The actions of a table's log entry ``version`` (None if gone or unreadable)."""
    fs, path = _commit_file(location, version)
    try:
        with fs.open_input_stream(path) as src:
            text = src.read().decode("utf-8")
        return [a for a in (json.loads(line) for line in text.splitlines() if line.strip())]
    except (OSError, ValueError):
        return None


def is_foreign(actions: list[dict[str, Any]] | None) -> bool:
    """Whether a commit changed data without a lakehouse operation's metadata."""
    if actions is None:
        return True
    info: dict[str, Any] = {}
    changes_data = False
    for action in actions:
        if not isinstance(action, dict):
            continue
        if isinstance(action.get("commitInfo"), dict):
            info = action["commitInfo"]
        for kind in ("add", "remove"):
            if isinstance(action.get(kind), dict) and action[kind].get("dataChange", True):
                changes_data = True
    return changes_data and not any(key in info for key in OWN_COMMIT_KEYS)


def foreign_commits(
    location: DeltaLocation, since: int | None, until: int | None = None
) -> list[int]:
    """The versions after ``since`` (all, with None) up to ``until`` (default: the
    table's latest) that another writer made (:func:`is_foreign`)."""
    if until is None:
        table = location.table()
        if table is None:
            return []
        until = table.version()
    start = -1 if since is None else since
    return [v for v in range(start + 1, until + 1) if is_foreign(commit_actions(location, v))]


def adopt_foreign_statements(
    statements: DeltaLocation, translog: DeltaLocation, fence: CommitFence, dataset: str
) -> list[int]:
    """Make readers see the statements table's commits by other writers.

    Readers read the statements table at the version the translog publishes
    (:data:`~.delta.PUBLISHED_APP_ID`), which a flush moves to its own commit
    and so past any commit another writer made before it. Until then, another
    writer's commit (a delta-rs ``delete()`` or append) is read by no one and
    covered by no version. Called by a reader's flush-first with the table lock
    held (``fence``): when the commits after the published version hold one by
    another writer, a translog commit without data publishes the latest, so the
    next export renders what the tables hold and the next version's diff says
    so. Returns those foreign versions (empty: nothing done).
    """
    table = translog.table()
    current = statements.table()
    if table is None or current is None:
        return []
    published = table.transaction_version(PUBLISHED_APP_ID)
    latest = current.version()
    if published is None or latest <= published:
        return []
    foreign = foreign_commits(statements, published, latest)
    if foreign:
        commit(
            translog,
            [],
            schema=TRANSLOG_SCHEMA,
            metadata={
                "lakehouse.operation": "adopt",
                "dataset": dataset,
                "foreign_statements_versions": ",".join(map(str, foreign)),
            },
            fence=fence,
            read_version=table.version(),
            publishes=latest,
        )
    return foreign


def adopt_foreign(ds: DatasetContext, *, wait: float) -> list[int]:
    """Another writer's commits to the statements table, which no flush published,
    published to readers before an export (:func:`.tables.writers.adopt_foreign_statements`):
    what ``make`` exports and publishes is then what the tables hold. A look at
    two table versions when there are none; the lock only when there are.
    Skipped (empty) while another writer holds the lock."""
    translog, statements = ds.translog_table.table(), ds.statements_table.table()
    if translog is None or statements is None:
        return []
    published = translog.transaction_version(PUBLISHED_APP_ID)
    if published is None or statements.version() <= published:
        return []
    try:
        with ds.table_lock("flush", wait=wait) as lock:
            adopted = adopt_foreign_statements(
                ds.statements_table, ds.translog_table, lock.fence(), ds.name
            )
    except LockedError:
        return []
    if adopted:
        log.warning(
            "%s: statements table version(s) %s were written by another writer: published "
            "to readers; the next version's diff says what they changed",
            ds.name,
            adopted,
        )
    return adopted
