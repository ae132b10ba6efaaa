"""The flush's change feed: which statements each translog version made live or dead.

Every flush batch commits its translog rewrite (one translog version), then,
under the same lock fence, one commit to ``entities/changes``
(:data:`~.schemas.CHANGES_SCHEMA`): a ``version`` row saying the version is
covered, and a row per statement the batch wrote (``live``: new, or written
again so its seen range moved) or deleted (``dead``), with its entity's
canonical id. A reader that wants what changed between two translog versions
(:func:`changes_between`) gets the union of their rows, or a gap: a version
with no ``version`` row that changed data was made by something else (a
compaction), by
a flush that died between its two commits (its rerun commits a later version
that is covered), or before the lake had a feed. A gap is not an error: the
reader takes its full path, and says why.

The first version of a translog (a dataset's first flush) is not recorded:
no reader can have seen an earlier one, and its rows are every statement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets.tables.delta import DeltaLocation
from lakehouse_assets.tables.schemas import CHANGES_SCHEMA
from lakehouse_assets.tables.snapshot import Snapshot, _commit_file, arrow_dataset
from lakehouse_assets.tables.writers import commit_actions, is_foreign

#: the ``change`` values of the feed's rows
VERSION, LIVE, DEAD = "version", "live", "dead"
#: Commit metadata of a feed commit: the translog version whose rows it adds.
TRANSLOG_VERSION_KEY = "lakehouse.translog_version"


@dataclass(frozen=True)
class Changes:
    """What changed between two translog versions, or why that is not known."""

    #: canonical ids of the entities with a statement made live or dead (sorted)
    entities: tuple[str, ...] = ()
    #: statements made live / dead (rows of the feed)
    live: int = 0
    dead: int = 0
    #: why the change is not known (the caller takes its full path); None if known
    gap: str | None = None


def changes_between(
    changes: DeltaLocation,
    translog: DeltaLocation,
    since: int | None,
    until: int | None,
    *,
    statements: DeltaLocation | None = None,
    statements_since: int | None = None,
    statements_until: int | None = None,
) -> Changes:
    """The entities changed by translog versions ``since`` (excluded) to ``until``.

    ``since`` is the version a previous result was built from; every version
    after it up to ``until`` must be covered by the feed or change no data
    (:func:`changes_no_data`: a published version's commit, an optimize), or
    the answer is a gap with its reason. With ``statements`` the same holds for
    the statements table's versions ``statements_since`` (excluded) to
    ``statements_until``: each must be one a recorded flush published, or change
    no data; a commit by another writer (a delta-rs ``delete()``, say) changes
    rows no flush recorded, so it is a gap.
    """
    rows = _feed_rows(
        changes,
        translog,
        since,
        until,
        ["translog_version", "statements_version", "change", "canonical_id"],
    )
    if isinstance(rows, str):
        return Changes(gap=rows)
    if rows is None:
        return Changes()
    kind = rows.column("change")
    if statements is not None and statements_since is not None and statements_until is not None:
        made = set(rows.column("statements_version").to_pylist())
        foreign = _unaccounted(statements, statements_since, statements_until, made)
        if foreign:
            return Changes(
                gap=f"statements table version(s) {foreign} not made by a recorded flush "
                "(a commit by another writer)"
            )
    stmts = rows.filter(pc.not_equal(kind, VERSION))
    ids = pc.unique(stmts.column("canonical_id").combine_chunks().drop_null())
    return Changes(
        entities=tuple(sorted(ids.to_pylist())),
        live=int(pc.sum(pc.equal(stmts.column("change"), LIVE)).as_py() or 0),
        dead=int(pc.sum(pc.equal(stmts.column("change"), DEAD)).as_py() or 0),
    )


def _feed_rows(
    changes: DeltaLocation,
    translog: DeltaLocation,
    since: int | None,
    until: int | None,
    columns: list[str],
) -> pa.Table | str | None:
    """The feed's rows (``columns``, ``change`` among them) of translog versions
    ``since`` (excluded) to ``until``; a gap's reason if a version is not
    covered; None if there is nothing between the two."""
    if since is None or until is None:
        return "no earlier translog version to start from"
    if until < since:
        return f"translog version {until} is older than {since}"
    if until == since:
        return None
    snapshot = Snapshot.load(changes)
    if snapshot.version is None:
        return "the lake has no change feed yet (written by flushes since issue 34)"
    rewritten = _rewritten_since(changes, since, snapshot.version)
    if rewritten is not None:
        return (
            f"change feed version {rewritten} was not made by a flush (another writer "
            "changed the feed)"
        )
    window = (pc.field("translog_version") > since) & (pc.field("translog_version") <= until)
    rows = arrow_dataset(snapshot.files, CHANGES_SCHEMA, changes.storage_options).to_table(
        columns=list(dict.fromkeys(["translog_version", "change", *columns])), filter=window
    )
    kind = rows.column("change")
    covered = set(rows.filter(pc.equal(kind, VERSION)).column("translog_version").to_pylist())
    missing = _unaccounted(translog, since, until, covered)
    if missing:
        return (
            f"translog version(s) {missing} not in the change feed (a compaction, or "
            "a flush that died before recording its change)"
        )
    return rows


def _rewritten_since(changes: DeltaLocation, since: int, latest: int) -> int | None:
    """The newest commit of the feed, back to the one that recorded translog
    version ``since``, that another writer made (None: all the flushes' own).

    A reader of the window after ``since`` trusts the rows those commits hold;
    a delta-rs ``delete()`` or rewrite of the feed would hide changes from it
    (the incremental export would publish without them). Commits from before
    the translog version was recorded in their metadata are read back to the
    start of the feed."""
    for version in range(latest, -1, -1):
        actions = commit_actions(changes, version)
        if is_foreign(actions):
            return version
        for action in actions or ():
            recorded = (action.get("commitInfo") or {}).get(TRANSLOG_VERSION_KEY)
            if recorded is not None and int(recorded) <= since:
                return None
    return None


def statements_changed(
    changes: DeltaLocation,
    translog: DeltaLocation,
    since: int | None,
    until: int | None,
    *,
    limit: int,
) -> pa.Table | None:
    """The statements (``origin``, ``id``, ``canonical_id``, unique) the flushes of
    translog versions ``since`` (excluded) to ``until`` made live or dead: every
    statement whose translog row differs between the two versions, and no other
    but one written again within the second it was last seen (seen times have
    one-second resolution, so its row did not move; a re-render of its entity
    changes nothing). None on a gap (see :func:`changes_between`) or when more
    than ``limit`` (the caller's full path is then the cheaper read)."""
    rows = _feed_rows(changes, translog, since, until, ["origin", "id", "canonical_id"])
    if isinstance(rows, str):
        return None
    keys = ["origin", "id", "canonical_id"]
    if rows is None:
        return CHANGES_SCHEMA.empty_table().select(keys)
    rows = rows.filter(pc.not_equal(rows.column("change"), VERSION))
    if rows.num_rows > limit:
        return None
    return rows.select(keys).group_by(keys).aggregate([])


def _unaccounted(location: DeltaLocation, since: int, until: int, known: set[int]) -> str:
    """The versions ``since`` (excluded) to ``until`` of a table that are neither
    in ``known`` nor free of data changes, shown (the first five); empty if none."""
    versions = [
        v
        for v in range(since + 1, until + 1)
        if v not in known and not changes_no_data(location, v)
    ]
    return ", ".join(str(v) for v in versions[:5]) + (" ..." if len(versions) > 5 else "")


def changes_no_data(location: DeltaLocation, version: int) -> bool:
    """True if a commit adds and removes no data: only app transactions (a published
    version's commit, :mod:`lakehouse_assets.versions`), or files rewritten with
    ``dataChange`` false (optimize). Read from the commit's own log entry; an
    entry that is gone (log clean-up) or unreadable counts as a change."""
    fs, path = _commit_file(location, version)
    try:
        with fs.open_input_stream(path) as src:
            lines = src.read().decode("utf-8").splitlines()
        for line in lines:
            action = json.loads(line) if line.strip() else {}
            for kind in ("add", "remove"):
                if kind in action and action[kind].get("dataChange", True):
                    return False
    except (OSError, ValueError):
        return False
    return True


def feed_table(
    translog_version: int,
    statements_version: int | None,
    flush_id: str,
    change: pa.Array | pa.ChunkedArray,
    keys: pa.Table,
    *,
    ordered: bool = True,
) -> pa.Table:
    """The feed's rows of one translog version, in its files' order: the
    ``version`` row, then one row per statement (``change``: live or dead, and
    its ``origin``, ``id``, ``canonical_id`` in ``keys``), by canonical id, or
    in ``keys``' order where not ``ordered``.

    No reader needs the order (each filters the feed by translog version and
    takes the unique canonical ids): it keeps a daily change's small file tidy.
    A first build's batches after its first each record about a million new
    statements, whose sort by two string columns was 0.75-1.05 s of a batch's
    4.6 s, on one core (10M statements: 9 such batches), so they are written
    as they come (``ordered`` False)."""
    rows = keys.num_rows + 1
    table = pa.table(
        {
            "translog_version": pa.repeat(pa.scalar(translog_version, pa.int64()), rows),
            "statements_version": pa.repeat(pa.scalar(statements_version, pa.int64()), rows),
            "flush_id": pa.repeat(pa.scalar(flush_id, pa.string()), rows),
            "change": pa.concat_arrays(
                [pa.array([VERSION], pa.string()), _array(change).cast(pa.string())]
            ),
            **{
                name: pa.concat_arrays(
                    [pa.nulls(1, pa.string()), _array(keys[name]).cast(pa.string())]
                )
                for name in ("origin", "id", "canonical_id")
            },
        },
        schema=CHANGES_SCHEMA,
    )
    if not ordered:
        return table
    return table.take(
        pc.sort_indices(
            table,
            sort_keys=[("canonical_id", "ascending", "at_start"), ("id", "ascending", "at_start")],
        )
    )


def _array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def version_row(translog_version: int, statements_version: int | None, flush_id: str) -> pa.Table:
    """The row that says a translog version is covered by the feed."""
    return pa.table(
        {
            "translog_version": [translog_version],
            "statements_version": [statements_version],
            "flush_id": [flush_id],
            "change": [VERSION],
            "origin": [None],
            "id": [None],
            "canonical_id": [None],
        },
        schema=CHANGES_SCHEMA,
    )
