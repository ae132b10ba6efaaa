"""What ``lakehouse verify`` checks beyond the chain: that every file a reader
trusts is covered by the head's manifest, or reported.

:func:`versions.verify` replays the chain and re-hashes what each manifest
names. A reader trusts more than that, and each of these is held to the head:

- **the tables as they are now** (:func:`check_after_head`): every commit
  after the versions the head names must be one a lakehouse operation made
  (its commit metadata says which); a commit of a foreign writer (a delta-rs
  ``delete()``, say) is a problem. Every data file the current snapshot reads
  is named by the head's manifest (and hashed by verify), or was added by one
  of those lakehouse commits (data flushed and not published yet: a note,
  with its size held to its Delta add action), or it is a problem;
- **the graph index** (:func:`check_graph`): ``graph/state.json`` (without the
  fields every update rewrites) and every file it lists, by their hashes in
  the head's manifest; an update after the head, by the index's own commits,
  is a note until ``make`` publishes it;
- **the diffs' index** (:func:`check_diff_index`): an entry per version, as
  the version's manifest records its diff;
- **the catalog** (:func:`check_catalog`): the lake's ``index.json`` and each
  of its snapshots name versions of the chain, with their hashes (a catalog
  may lag behind the head, never name what the chain does not have).

Commits are attributed by reading the Delta log's JSON entries directly (no
table is loaded per commit).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from lakehouse_assets import conventions as cv
from lakehouse_assets.conventions import diff_index_path
from lakehouse_assets.tables.delta import OWN_COMMIT_KEYS, DeltaLocation
from lakehouse_assets.tables.snapshot import Snapshot
from lakehouse_assets.versions.feed import (
    DIFF_INDEX_FORMAT,
    LAKEHOUSE_VERSION,
    catalog_record,
    diff_index_entry,
)
from lakehouse_assets.versions.manifest import graph_state_core
from lakehouse_assets.versions.report import Problem, VerifyReport

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.versions.chain import Version

#: Lakehouse commits that change no row a reader reads.
NO_DATA_OPERATIONS: Final = ("vacuum",)


@dataclass(slots=True)
class Commit:
    """One Delta log entry: its commit info and the files it added."""

    version: int
    path: str
    info: dict[str, Any] | None
    adds: dict[str, int] = field(default_factory=dict)
    #: path → deletion time (ms) of the files the commit removed
    removes: dict[str, int] = field(default_factory=dict)

    @property
    def ours(self) -> bool:
        return self.info is not None and any(k in self.info for k in OWN_COMMIT_KEYS)

    @property
    def operation(self) -> str:
        info = self.info or {}
        return str(info.get("lakehouse.operation") or info.get("operation") or "unknown")

    @property
    def changes_data(self) -> bool:
        """A lakehouse commit that readers see (not a version anchor, not a vacuum)."""
        info = self.info or {}
        return (
            "lakehouse.manifest_hash" not in info
            and info.get("lakehouse.operation") not in NO_DATA_OPERATIONS
            and bool(info.get("lakehouse.operation"))
        )


def read_commit(ds: DatasetContext, table_dir: str, version: int) -> Commit | None:
    """A table's log entry ``version`` (None if it is not there: cleaned up after
    a checkpoint, or removed)."""
    path = cv.dataset_path(ds.name, table_dir, "_delta_log", f"{version:020d}.json")
    if not ds.store.exists(path):
        return None
    commit = Commit(version, path, None)
    for line in ds.store.read_text(path).splitlines():
        try:
            action = json.loads(line)
        except ValueError:
            continue  # an unparsable line: the hashed log entries report rewrites
        if not isinstance(action, dict):
            continue
        if isinstance(action.get("commitInfo"), dict):
            commit.info = action["commitInfo"]
        add = action.get("add")
        if isinstance(add, dict) and "path" in add:
            commit.adds[str(add["path"])] = int(add.get("size") or 0)
        remove = action.get("remove")
        if isinstance(remove, dict) and "path" in remove:
            commit.removes[str(remove["path"])] = int(remove.get("deletionTimestamp") or 0)
    return commit


def vacuum_ran(location: DeltaLocation) -> bool:
    """Whether a vacuum is on record in a table's Delta history (a vacuum writes a
    ``VACUUM END`` commit): only then may a file a version names be gone."""
    try:
        table = location.table()
        history = [] if table is None else table.history()
    except Exception:  # noqa: BLE001 - an unreadable log proves no vacuum
        return False
    return any(str(info.get("operation", "")).startswith("VACUUM") for info in history)


def vacuumable(
    ds: DatasetContext, table_dir: str, location: DeltaLocation, trusted_until: int | None = None
) -> Callable[[str], bool]:
    """Whether a vacuum on record may have deleted a file of the table: one that a
    commit removed at least the vacuum's retention before the vacuum ran (a
    ``VACUUM START`` commit records its time and retention). A file deleted
    inside the retention window, or with no vacuum at all, was not removed by
    the lakehouse. When log entries were cleaned up (after a checkpoint), any
    recorded vacuum counts, as nothing finer can be told.

    With ``trusted_until`` (the table version the head names, whose log entries
    the manifests hashed), a vacuum commit after it counts only if the
    lakehouse stamped it: a vacuum forged by another writer excuses nothing.
    """
    try:
        commits, missing = commits_after(ds, table_dir, location, None)
    except Exception:  # noqa: BLE001 - an unreadable log proves no vacuum
        return lambda path: False
    if missing:
        coarse = vacuum_ran(location)
        return lambda path: coarse
    removed: dict[str, int] = {}
    horizons = []  # files removed before this time may have been vacuumed
    for commit in commits:
        removed.update(commit.removes)
        info = commit.info or {}
        if info.get("operation") == "VACUUM START" and (
            trusted_until is None or commit.version <= trusted_until or commit.ours
        ):
            params = info.get("operationParameters") or {}
            retention = str(
                params.get("specifiedRetentionMillis") or params.get("defaultRetentionMillis")
            )
            try:
                horizons.append(int(info["timestamp"]) - int(retention))
            except (KeyError, TypeError, ValueError):
                continue
    horizon = max(horizons, default=None)
    return lambda path: horizon is not None and path in removed and removed[path] <= horizon


def commits_after(
    ds: DatasetContext, table_dir: str, location: DeltaLocation, since: int | None
) -> tuple[list[Commit], list[int]]:
    """The log entries after version ``since`` up to the table's latest, and the
    versions whose entries are missing."""
    table = location.table()
    if table is None:
        return [], []
    found, missing = [], []
    for version in range((-1 if since is None else since) + 1, table.version() + 1):
        commit = read_commit(ds, table_dir, version)
        if commit is None:
            missing.append(version)
        else:
            found.append(commit)
    return found, missing


def check_after_head(ds: DatasetContext, head: Version, report: VerifyReport) -> None:
    """Commits after the head's table versions, and the files readers read now."""
    added: dict[str, dict[str, int]] = {}
    unpublished: list[str] = []
    for name, table_dir, location in (
        ("statements", cv.STATEMENTS_TABLE, ds.statements_table),
        ("translog", cv.TRANSLOG_TABLE, ds.translog_table),
        ("changes", cv.CHANGES_TABLE, ds.changes_table),
    ):
        try:
            commits, missing = commits_after(ds, table_dir, location, head.table_version(name))
        except Exception as exc:  # noqa: BLE001 - a broken log is reported, not raised
            report.problems.append(Problem(None, table_dir, f"Delta log unreadable: {exc}"))
            continue
        if missing:
            report.notes.append(
                f"{table_dir}: log entries {missing[0]}..{missing[-1]} after version "
                f"{head.sequence} are gone (cleaned up after a checkpoint?): not attributed"
            )
        added[name] = {}
        for commit in commits:
            if not commit.ours and commit.operation.startswith("VACUUM"):
                # changes no row; a release before vacuums were stamped, or another
                # writer's vacuum (which excuses no missing file: see vacuumable)
                report.notes.append(
                    f"{commit.path}: a vacuum the lakehouse did not stamp (an older release?)"
                )
                continue
            if not commit.ours:
                report.problems.append(
                    Problem(
                        None,
                        commit.path,
                        f"commit {commit.version} ({commit.operation}) after version "
                        f"{head.sequence} was not made by a lakehouse operation "
                        "(a foreign writer changed the table)",
                    )
                )
                continue
            added[name].update(commit.adds)
            if commit.changes_data:
                unpublished.append(f"{name} v{commit.version} {commit.operation}")
    if unpublished:
        report.notes.append(
            f"{len(unpublished)} lakehouse commits after version {head.sequence} are not "
            f"published yet ({', '.join(unpublished[:5])}{', …' if len(unpublished) > 5 else ''})"
            ": their files are covered by no manifest until `make` publishes them"
        )
    try:
        snapshot = ds.snapshot()
    except Exception:  # noqa: BLE001 - reported by verify's own table checks
        return
    for name, table_dir, snap in (
        ("statements", cv.STATEMENTS_TABLE, snapshot.statements),
        ("translog", cv.TRANSLOG_TABLE, snapshot.translog),
        ("changes", cv.CHANGES_TABLE, Snapshot.load(ds.changes_table)),
    ):
        if name not in added:
            continue
        named = {
            f["path"] for f in (head.manifest.get("tables", {}).get(name) or {}).get("files", [])
        }
        for file in snap.files:
            if file.path in named:
                continue  # hashed against the manifest by verify
            path = cv.dataset_path(ds.name, table_dir, file.path)
            if file.path not in added.get(name, {}):
                report.problems.append(
                    Problem(
                        None,
                        path,
                        "read by the table but covered by no version "
                        "(and added by no lakehouse commit after the head)",
                    )
                )
            elif not ds.store.exists(path):
                report.problems.append(Problem(None, path, "unpublished data file is missing"))
            elif ds.store.size(path) != added[name][file.path]:
                report.problems.append(
                    Problem(None, path, "unpublished data file's size differs from its commit")
                )


def _graph_commits_ours(ds: DatasetContext, recorded: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether the graph index's tables moved past the versions a manifest recorded,
    and whether every commit since was the index's own."""
    from lakehouse_assets import graph

    moved = False
    ours = True
    for name, table in (
        ("by_source", graph.BY_SOURCE),
        ("by_target", graph.BY_TARGET),
        ("tombstones", graph.TOMBSTONES),
    ):
        since = recorded.get(name)
        commits, _ = commits_after(
            ds, table, graph.table_location(ds, table), None if since is None else int(since)
        )
        moved = moved or bool(commits)
        ours = ours and all(c.ours or c.operation.startswith("VACUUM") for c in commits)
    return moved, ours


def _only_dangling_forgotten(ds: DatasetContext, path: str, recorded: Mapping[str, Any]) -> bool:
    """Whether graph/state.json is the head's but for ``dangling`` set to unknown:
    what an update that wrote no edge leaves when entities came or went (the
    count is known again after a rebuild; make publishes the update)."""
    try:
        data = json.loads(ds.store.read_bytes(path))
    except ValueError:
        return False
    if not isinstance(data, dict) or data.get("dangling") is not None or "dangling" not in recorded:
        return False
    restored = json.dumps({**data, "dangling": recorded["dangling"]}).encode()
    return bool(graph_state_core(restored) == recorded["state_core_sha256"])


def check_graph(
    ds: DatasetContext, head: Version, sha256: Callable[[str], str | None], report: VerifyReport
) -> None:
    """``graph/state.json`` and the index files it lists, as the head recorded them."""
    state_path = cv.dataset_path(ds.name, cv.GRAPH_STATE)
    recorded = head.manifest.get("graph")
    present = ds.store.exists(state_path)
    if recorded is None:
        if present:
            try:
                moved, ours = _graph_commits_ours(ds, {})
            except Exception:  # noqa: BLE001 - an unreadable graph log proves nothing
                moved = ours = False
            if moved and ours:
                report.notes.append(
                    f"the graph index was built after version {head.sequence} and is not "
                    "published yet (run make)"
                )
            else:
                report.problems.append(
                    Problem(head.sequence, state_path, "graph state is covered by no version")
                )
        return
    if not present:
        report.problems.append(Problem(head.sequence, state_path, "graph state is missing"))
        return
    try:
        core = graph_state_core(ds.store.read_bytes(state_path))
    except ValueError:
        report.problems.append(Problem(head.sequence, state_path, "graph state is not JSON"))
        return
    if "state_core_sha256" not in recorded:
        report.notes.append(
            f"version {head.sequence} was published before graph files were hashed: "
            "the graph index is checked from the next version on"
        )
        return
    if core != recorded["state_core_sha256"]:
        try:
            moved, ours = _graph_commits_ours(ds, recorded.get("tables") or {})
        except Exception:  # noqa: BLE001 - an unreadable graph log proves nothing
            moved = ours = False
        if (moved and ours) or _only_dangling_forgotten(ds, state_path, recorded):
            report.notes.append(
                f"the graph index was updated after version {head.sequence} and is not "
                "published yet (run make)"
            )
        else:
            report.problems.append(
                Problem(head.sequence, state_path, "graph state differs from the head's manifest")
            )
        return
    for entry in recorded.get("files", []):
        path = cv.dataset_path(ds.name, entry["table"], entry["path"])
        sha = sha256(path)
        if sha is None:
            report.problems.append(Problem(head.sequence, path, "graph index file is missing"))
        elif sha != entry["sha256"]:
            report.problems.append(Problem(head.sequence, path, "graph index file differs"))


def check_export_state(ds: DatasetContext, head: Version, report: VerifyReport) -> None:
    """``exports/_state`` (what the next incremental export subtracts from and
    splices into) as the head recorded it: a state no version covers would be
    trusted by no export, and one altered would launder wrong statistics."""
    from lakehouse_assets.export_state import state_digests

    caches = head.manifest.get("caches")
    path = cv.dataset_path(ds.name, cv.EXPORT_STATE, "state.json")
    if caches is None:
        report.notes.append(
            f"version {head.sequence} was published before the export state was covered: "
            "it is checked from the next version on"
        )
        return
    recorded = caches.get("export_state")
    found = state_digests(ds)
    if recorded == found:
        return
    if found is None:
        report.problems.append(Problem(head.sequence, path, "export state is missing"))
    else:
        report.problems.append(
            Problem(
                head.sequence,
                path,
                "export state differs from the head's manifest (altered, or written by an "
                "export and not published: run make)",
            )
        )


#: The keys of the diffs' index: nothing else is written, so nothing else may be there.
DIFF_INDEX_KEYS: Final = frozenset({"dataset", "format", "diffs", "versions"})


def check_diff_index(ds: DatasetContext, versions: Sequence[Version], report: VerifyReport) -> None:
    """``diffs/entities.ftm.json/index.json`` as publishing writes it: its own
    fields, an entry per version equal to what the version's manifest gives
    (:func:`~.feed.diff_index_entry`), and yente's ``versions``: each naming its
    own diff, a run of consecutive versions up to the newest (a version left
    out of the middle would make yente skip its changes)."""
    path = diff_index_path(ds.name)
    if not versions:
        return
    if not ds.store.exists(path):
        report.problems.append(Problem(None, path, "diff index is missing"))
        return
    try:
        data = json.loads(ds.store.read_text(path))
        entries = {int(d["sequence"]): d for d in data["diffs"]}
    except (ValueError, KeyError, TypeError):
        report.problems.append(Problem(None, path, "diff index is not valid"))
        return
    if set(data) != DIFF_INDEX_KEYS or (
        data.get("dataset"),
        data.get("format"),
    ) != (ds.name, DIFF_INDEX_FORMAT):
        report.problems.append(
            Problem(None, path, "diff index fields differ from what publishing writes")
        )
    by_seq = {v.sequence: v for v in versions}
    for seq in sorted(set(entries) - set(by_seq)):
        report.problems.append(Problem(seq, path, "diff index names a version the chain lacks"))
    # yente's delta index: each version id names that version's own diff
    by_id = {v.version_id: v for v in versions}
    listed = data.get("versions")
    if not isinstance(listed, dict):
        report.problems.append(Problem(None, path, "delta index `versions` is not valid"))
        listed = {}
    for vid, url in listed.items():
        version = by_id.get(vid)
        diff = (version.manifest.get("diff") or {}) if version else {}
        name = str(diff.get("path", "")).rsplit("/", 1)[-1]
        if version is None or not name or (not str(url).endswith("/" + name) and url != name):
            report.problems.append(
                Problem(
                    version.sequence if version else None,
                    path,
                    f"delta index names {vid!r} with a file that is not its diff",
                )
            )
    window = sorted(by_id[v].sequence for v in listed if v in by_id)
    newest = max(entries, default=0)
    newest_diff = (
        "path" in (by_seq[newest].manifest.get("diff") or {}) if newest in by_seq else False
    )
    if window != list(range(newest - len(window) + 1, newest + 1)) or (newest_diff and not window):
        report.problems.append(
            Problem(
                None,
                path,
                "delta index `versions` is not the run of versions up to the newest "
                f"(lists {window[:3]}{'…' if len(window) > 3 else ''}): yente would skip changes",
            )
        )
    for version in versions:
        entry = entries.get(version.sequence)
        if entry is None:
            report.problems.append(Problem(version.sequence, path, "diff index lacks the version"))
            continue
        if entry != diff_index_entry(version):
            report.problems.append(
                Problem(version.sequence, path, "diff index entry differs from the manifest")
            )


def _catalog_entry(
    ds: DatasetContext, path: str, versions: Mapping[int, Version], report: VerifyReport
) -> int | None:
    """Check the dataset's entry of one catalog file; the sequence it names."""
    try:
        data = json.loads(ds.store.read_text(path))
        listed = [d for d in data["datasets"] if d.get("name") == ds.name]
    except (ValueError, KeyError, TypeError, AttributeError):
        report.problems.append(Problem(None, path, "catalog index is not valid"))
        return None
    if not listed:
        return None
    # the lake's record (an object under `version` before followthemoney's model)
    named = listed[0].get(LAKEHOUSE_VERSION, listed[0].get("version"))
    if named is None:
        return None
    try:
        version = versions.get(int(named["sequence"]))
    except (KeyError, TypeError, ValueError):
        version = None
    if (
        version is None
        or named != catalog_record(version)
        or (LAKEHOUSE_VERSION in listed[0] and listed[0].get("version") != version.version_id)
    ):
        report.problems.append(
            Problem(None, path, f"catalog names a version of {ds.name!r} the chain does not have")
        )
        return None
    return version.sequence


def check_catalog(ds: DatasetContext, versions: Sequence[Version], report: VerifyReport) -> None:
    """The lake's ``index.json`` and its snapshots name versions of the chain."""
    if not versions:
        return
    by_seq = {v.sequence: v for v in versions}
    if not ds.store.exists(cv.CATALOG_INDEX):
        report.problems.append(Problem(None, cv.CATALOG_INDEX, "catalog index is missing"))
    else:
        seq = _catalog_entry(ds, cv.CATALOG_INDEX, by_seq, report)
        head = versions[-1].sequence
        if seq is not None and seq < head:
            report.notes.append(
                f"the catalog index lags: it names version {seq}, the head is {head}"
            )
        elif seq is None and not any(
            p.message.startswith("catalog") and p.file == cv.CATALOG_INDEX for p in report.problems
        ):
            report.problems.append(
                Problem(None, cv.CATALOG_INDEX, f"catalog does not list {ds.name!r}'s versions")
            )
    for path in sorted(ds.store.list(cv.VERSIONS + "/")):
        if path.endswith("/" + cv.CATALOG_INDEX):
            _catalog_entry(ds, path, by_seq, report)
