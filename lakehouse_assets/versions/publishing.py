"""Publishing a version: manifest, chain entry, Delta tag, diff, pointers.

The write order a crash cannot make inconsistent, the race for a sequence
number, the follow-up steps (:func:`_finish`) any later publisher completes,
and the freshness checks that hold exports to the head
(:func:`published_intact`, :func:`covers`).
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from deltalake.exceptions import DeltaError

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults
from lakehouse_assets.conventions import (
    MANIFEST,
    chain_entry_path,
    diff_index_path,
    diff_path,
    latest_path,
)
from lakehouse_assets.errors import ConcurrentWriteError, LakehouseError
from lakehouse_assets.staging import scratch_dir
from lakehouse_assets.tables.delta import DeltaLocation, commit
from lakehouse_assets.tables.schemas import TRANSLOG_SCHEMA
from lakehouse_assets.tables.snapshot import DatasetSnapshot
from lakehouse_assets.tables.writers import foreign_commits
from lakehouse_assets.versions.asof import (
    VersionDamagedError,
    VersionExpiredError,
    snapshot_at,
)
from lakehouse_assets.versions.catalog_index import write_catalog
from lakehouse_assets.versions.chain import Version, head
from lakehouse_assets.versions.diffs import (
    _Digest,
    diff_from_export,
    diff_from_lines,
    render_diff,
)
from lakehouse_assets.versions.feed import (
    DIFF_INDEX_FORMAT,
    delta_retention,
    delta_versions,
    diff_index_entry,
    stamp_index,
)
from lakehouse_assets.versions.hashes import canonical_json, manifest_hash, sha256_of
from lakehouse_assets.versions.manifest import (
    build_manifest,
    graph_state_core,
    table_files,
    unchanged,
)

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.export_state import Trusted
    from lakehouse_assets.incremental import ChangedLines

log = logging.getLogger(__name__)


#: The app transaction of the translog commit that carries a manifest hash.
VERSION_APP_ID: Final = "lakehouse-version"
#: Commit metadata keys of that commit.
META_HASH: Final = "lakehouse.manifest_hash"
META_SEQUENCE: Final = "lakehouse.sequence"
#: How often a publisher that lost the race for a sequence retries on the new head.
PUBLISH_ATTEMPTS: Final = 5


@dataclass(slots=True)
class PublishResult:
    """What :func:`publish` did."""

    version: Version | None = None
    skipped: str | None = None
    diff: dict[str, Any] | None = None
    attempts: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sequence": self.version.sequence if self.version else None,
            "hash": self.version.hash if self.version else None,
            "version_id": self.version.version_id if self.version else None,
            "skipped": self.skipped,
            "diff": self.diff,
        }


def publish(
    ds: DatasetContext,
    snapshot: DatasetSnapshot,
    *,
    index_text: str,
    statements_fresh: bool,
    entities_fresh: bool = False,
    metadata: Mapping[str, Any] | None = None,
    known_exports: MutableMapping[str, Any] | None = None,
    logical: str | None = None,
    parent_hash: str | None = None,
    changed_lines: ChangedLines | None = None,
    same_entities: bool = False,
) -> PublishResult:
    """Write the manifest of a new version, link it, tag the Delta history, write its diff.

    ``parent_hash``: publish only on that head (a rewrite that kept the head's
    statements, :func:`publish_relayout`; skipped if another version came first).
    ``changed_lines``: an incremental export's lines of the entities it changed;
    when they go from the parent's snapshot to this one, the diff is made from
    them (:func:`diff_from_lines`) rather than from the tables.
    ``same_entities``: ``snapshot`` rewrites the parent's tables keeping every
    live statement (:func:`publish_relayout`): no entity changed, so the diff is
    empty and neither snapshot is read for it (a whole rewritten translog
    joined with the old one was the largest part of an optimize's memory in
    this process).

    Called by ``export_index`` after ``index.json`` was written. Skips (returns
    without a version) when nothing changed since the head. The diff is
    computed first and its hash goes into the manifest; the files are
    written in an order a crash cannot make inconsistent: diff and manifest
    (paths unique to this publisher), then the chain entry (put-if-absent:
    the serialization point), then the Delta tag and the pointers. A
    publisher that loses the race for a sequence number removes its files
    and rebuilds on the new head; after :data:`PUBLISH_ATTEMPTS` it fails
    with :class:`ConcurrentWriteError`.
    """
    result = PublishResult()
    delta_retention(ds.store, ds.name)  # a bad config.yml fails before anything is written
    for attempt in range(1, PUBLISH_ATTEMPTS + 1):
        result.attempts = attempt
        parent = head(ds)
        if parent is not None:
            _finish(ds, parent)  # a publisher that died after its chain entry
        if parent_hash is not None and (parent is None or parent.hash != parent_hash):
            result.skipped = "another version was published meanwhile"
            return result
        created = cv.utcnow()
        if parent is not None and created <= parent.created_at:  # monotonic, even with clock skew
            created = parent.created_at + timedelta(microseconds=1)
        # index.json names the version it belongs to (followthemoney's `version`)
        text = stamp_index(ds, index_text, created, (parent.sequence if parent else 0) + 1, parent)
        manifest = build_manifest(
            ds,
            snapshot,
            parent,
            index_text=text,
            statements_fresh=statements_fresh,
            metadata=metadata,
            created_at=created,
            known_exports=known_exports,
            logical=logical,
        )
        if unchanged(manifest, parent):
            result.skipped = f"nothing changed since version {parent.sequence if parent else 0}"
            return result
        with tempfile.TemporaryDirectory(dir=scratch_dir(ds.settings), prefix="diff-") as tmp:
            diff_file = Path(tmp) / "diff.json"
            old = None
            try:
                if parent is not None and not same_entities:
                    old = snapshot_at(ds, parent)
            except (VersionExpiredError, VersionDamagedError) as exc:
                manifest["diff"] = {"skipped": str(exc)}
            else:
                with diff_file.open("wb") as fh:
                    sink = _Digest(fh)
                    if same_entities:
                        source, counts = "none (the same entities)", {"ADD": 0, "MOD": 0, "DEL": 0}
                    elif old is None and entities_fresh:  # every entity is new: the export
                        source, counts = "the export", diff_from_export(ds, sink)
                    elif (
                        old is not None
                        and changed_lines is not None
                        and tuple(changed_lines.until) == tuple(snapshot.versions)
                        and _same_content(ds, changed_lines.since, old)
                    ):
                        source = "the incremental export's lines"
                        counts = diff_from_lines(changed_lines, sink)
                    else:
                        source, counts = "the tables", render_diff(ds, old, snapshot, sink)
                    log.info("%s: the version's diff made from %s", ds.name, source)
                manifest["diff"] = {
                    "path": diff_path(ds.name, manifest["snapshot_id"]).split("/", 1)[1],
                    "size": sink.size,
                    "sha256": sink.sha256.hexdigest(),
                    "counts": counts,
                }
            path = cv.dataset_version(ds.name, MANIFEST, created)
            digest = manifest_hash(manifest)
            written = [path, cv.dataset_version(ds.name, cv.INDEX, created)]
            if "path" in manifest["diff"]:
                written.append(cv.dataset_path(ds.name, manifest["diff"]["path"]))
                ds.store.put_file(written[-1], diff_file)
        ds.store.write_text(written[1], text)
        ds.store.put_if_absent(path, json.dumps(manifest, indent=1, ensure_ascii=False).encode())
        faults.point("publish.after_files")
        entry = {"sequence": manifest["sequence"], "path": path, "hash": digest}
        if not ds.store.put_if_absent(
            chain_entry_path(ds.name, manifest["sequence"]), canonical_json(entry)
        ):
            log.info(
                "%s: version %d was published by another writer; retrying on it",
                ds.name,
                manifest["sequence"],
            )
            for stale in written:
                ds.store.delete(stale)
            continue
        faults.point("publish.after_entry")
        version = Version(manifest["sequence"], path, digest, manifest)
        _finish(ds, version)
        result.version = version
        result.diff = manifest["diff"]
        write_catalog(ds.store, ds.sibling, snapshot=True)
        return result
    raise ConcurrentWriteError(
        f"Dataset {ds.name!r}: lost the race to publish a version {PUBLISH_ATTEMPTS} times; "
        "run `make` again"
    )


def publish_relayout(
    ds: DatasetContext, snapshot: DatasetSnapshot, parent: Version, operation: str
) -> PublishResult:
    """Publish ``snapshot``, a rewrite of ``parent``'s tables that kept every live
    statement (compact, optimize), so that the files readers now read are
    covered by the head: the parent's logical hash, exports and ``index.json``
    carried over (the exports render the same statements), the new files
    hashed. Skipped when another version was published meanwhile, or when the
    parent's published ``index.json`` is not what it recorded (verify says so).
    """
    published = next((e for e in parent.manifest["exports"] if e["kind"] == "index"), None)
    copy = cv.dataset_version(ds.name, cv.INDEX, parent.created_at)
    if published is None or not ds.store.exists(copy) or sha256_of(ds, copy) != published["sha256"]:
        return PublishResult(
            skipped=f"version {parent.sequence}'s index.json is missing or altered: "
            "run `lakehouse verify`"
        )
    # the hashes the parent recorded (a file altered since keeps failing verify)
    known: dict[str, Any] = {
        e["path"]: {"path": e["path"], "size": e["size"], "sha256": e["sha256"]}
        for e in parent.manifest["exports"]
        if e["kind"] != "index"
    }
    return publish(
        ds,
        snapshot,
        index_text=ds.store.read_text(copy),
        statements_fresh=False,
        metadata={"operation": operation},
        known_exports=known,
        logical=str(parent.manifest["logical_hash"]),
        parent_hash=parent.hash,
        same_entities=True,
    )


def published_intact(ds: DatasetContext, kind: str) -> bool:
    """Whether the export ``kind`` (or the live ``index.json``) is byte for byte
    what the head's manifest recorded: the condition, beside the tags, for an
    export to count as fresh. Tags are lake files like any other, so they
    never excuse a difference; an export the head does not list (written
    after it) is not fresh either. With nothing published, nothing to hold
    the file to: the tags decide, and the first version records it.
    """
    from lakehouse_assets.freshness import EXPORTS, INDEX

    try:
        version = head(ds)
    except (LakehouseError, ValueError, KeyError):
        return False
    if version is None:
        return True
    rel = EXPORTS[kind][0]
    entry = next((e for e in version.manifest.get("exports", []) if e["path"] == rel), None)
    full = cv.dataset_path(ds.name, rel)
    if entry is None or not ds.store.exists(full) or ds.store.size(full) != entry["size"]:
        return False
    if kind == INDEX:  # and the pointer names the head (make writes it again)
        latest = latest_path(ds.name)
        if not ds.store.exists(latest):
            return False
        try:
            if json.loads(ds.store.read_text(latest)).get("hash") != version.hash:
                return False
        except (ValueError, AttributeError):
            return False
    return sha256_of(ds, full) == str(entry["sha256"])


def foreign_since_head(ds: DatasetContext) -> list[str]:
    """The commits after the head's table versions (every commit, with no version
    yet) that another writer made (:func:`~lakehouse_assets.tables.writers.foreign_commits`),
    as ``statements v7``: the exports' freshness tags know nothing of them, so
    ``make`` rebuilds every export and publishes what the tables now hold."""
    try:
        version = head(ds)
    except (LakehouseError, ValueError, KeyError):
        version = None
    found = []
    for name, location in (("statements", ds.statements_table), ("translog", ds.translog_table)):
        since = version.table_version(name) if version is not None else None
        found += [f"{name} v{v}" for v in foreign_commits(location, since)]
    return found


def trusted_export_state(ds: DatasetContext) -> Trusted | None:
    """The head's record of the export state, for the next incremental export
    (:func:`~lakehouse_assets.incremental.attempt`); None without a version."""
    from lakehouse_assets.export_state import Trusted

    try:
        version = head(ds)
    except (LakehouseError, ValueError, KeyError):
        return Trusted(0, None)  # a head that cannot be read vouches for nothing
    if version is None:
        return None
    record = (version.manifest.get("caches") or {}).get("export_state")
    return Trusted(version.sequence, record if isinstance(record, dict) else None)


def graph_unpublished(ds: DatasetContext) -> bool:
    """Whether the graph index is not the one the head published (built or
    updated since, without the fields every update rewrites): ``make`` then
    publishes a version even when every export is fresh, so what it changed
    is covered and ``verify`` has no unpublished work to report."""
    state_path = cv.dataset_path(ds.name, cv.GRAPH_STATE)
    try:
        version = head(ds)
    except (LakehouseError, ValueError, KeyError):
        return False
    if version is None or not ds.store.exists(state_path):
        return False
    recorded = version.manifest.get("graph") or {}
    try:
        core = graph_state_core(ds.store.read_bytes(state_path))
    except ValueError:
        return True  # not JSON: make rebuilds and publishes it
    return core != recorded.get("state_core_sha256")


def covers(version: Version, snapshot: DatasetSnapshot) -> bool:
    """Whether ``version``'s manifest names exactly the data files of ``snapshot``."""
    files = table_files(version.manifest)
    return files.get("statements", set()) == {
        f.path for f in snapshot.statements.files
    } and files.get("translog", set()) == {f.path for f in snapshot.translog.files}


def _finish(ds: DatasetContext, version: Version) -> None:
    """What follows a chain entry, idempotent: the Delta tag, the diffs' index (with
    yente's ``versions``, :mod:`.feed`), latest."""
    _tag_delta(ds, version)
    faults.point("publish.after_tag")
    index_path = diff_index_path(ds.name)
    index: dict[str, Any] = (
        json.loads(ds.store.read_text(index_path))
        if ds.store.exists(index_path)
        else {"dataset": ds.name, "format": DIFF_INDEX_FORMAT, "diffs": []}
    )
    if not any(d["sequence"] == version.sequence for d in index["diffs"]):
        index["diffs"].append(diff_index_entry(version))
        index["diffs"].sort(key=lambda d: d["sequence"])
        index["versions"] = delta_versions(ds, index["diffs"], delta_retention(ds.store, ds.name))
        ds.store.write_text(index_path, json.dumps(index, indent=1))
    # the live index.json is the head's, written only here (after the chain entry)
    published = next((e for e in version.manifest["exports"] if e["kind"] == "index"), None)
    live = cv.dataset_path(ds.name, cv.INDEX)
    if published is not None and (
        not ds.store.exists(live) or sha256_of(ds, live) != published["sha256"]
    ):
        copy = cv.dataset_version(ds.name, cv.INDEX, version.created_at)
        if ds.store.exists(copy):
            ds.store.write_bytes(live, ds.store.read_bytes(copy))
    latest = latest_path(ds.name)
    current = json.loads(ds.store.read_text(latest)) if ds.store.exists(latest) else None
    if current is None or int(current["sequence"]) < version.sequence:
        entry = {"sequence": version.sequence, "path": version.path, "hash": version.hash}
        ds.store.write_text(latest, json.dumps(entry))


def _same_content(
    ds: DatasetContext, since: tuple[int | None, int | None], old: DatasetSnapshot
) -> bool:
    """Whether the snapshot at versions ``since`` (where an incremental export's
    lines start) holds what ``old`` (the parent version's snapshot) holds.

    The same versions, or later translog commits that changed no data: the
    commit :func:`_tag_delta` leaves is one, so an export pinned after a
    publish (``export --force`` right after ``make``) starts from a translog
    version one past its parent's. Without this its next version's diff was
    read from the tables (5-11 s at 1M-10M statements) instead of made from
    the lines in hand."""
    if tuple(since) == tuple(old.versions):
        return True
    if since[1] is None:
        return False
    try:
        at = ds.snapshot(since[1])
    except DeltaError:  # its log entry is gone: the diff is read from the tables
        return False
    return at.content_key == old.content_key


def _tag_delta(ds: DatasetContext, version: Version) -> None:
    """The translog commit that carries ``version``'s manifest hash (idempotent)."""
    location = ds.translog_table
    table = location.table()
    if table is None:
        return
    done = table.transaction_version(VERSION_APP_ID)
    if done is not None and done >= version.sequence:
        return
    with ds.table_lock("publish"):
        commit(
            location,
            [],
            schema=TRANSLOG_SCHEMA,
            app_id=VERSION_APP_ID,
            app_version=version.sequence,
            metadata={META_HASH: version.hash, META_SEQUENCE: version.sequence},
            publishes=_published(location),
        )


def _published(location: DeltaLocation) -> int | None:
    from lakehouse_assets.tables.delta import PUBLISHED_APP_ID

    table = location.table()
    return None if table is None else table.transaction_version(PUBLISHED_APP_ID)


def delta_tags(ds: DatasetContext) -> dict[int, str]:
    """sequence → manifest hash, as the translog's commit metadata records them."""
    table = ds.translog_table.table()
    if table is None:
        return {}
    found: dict[int, str] = {}
    for info in table.history():
        if META_HASH in info and META_SEQUENCE in info:
            found[int(info[META_SEQUENCE])] = str(info[META_HASH])
    return found
