"""``lakehouse verify``: replay the chain and re-hash what each manifest references.

The chain, its anchor in the Delta history, the files every version names
and the head's exports are checked here; what readers read beyond the chain
(commits after the head, the graph index, the diffs' index, the catalog) is
checked by :mod:`lakehouse_assets.versions.coverage`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from lakehouse_assets import conventions as cv
from lakehouse_assets.conventions import CHAIN, _table_dir, chain_entry_path, latest_path
from lakehouse_assets.errors import LakehouseError
from lakehouse_assets.tables.delta import DeltaLocation, add_actions
from lakehouse_assets.tables.snapshot import Snapshot
from lakehouse_assets.versions import coverage as verify_coverage
from lakehouse_assets.versions.asof import snapshot_at
from lakehouse_assets.versions.chain import Version
from lakehouse_assets.versions.coverage import vacuumable
from lakehouse_assets.versions.hashes import manifest_hash, sha256_of
from lakehouse_assets.versions.manifest import MANIFEST_SCHEMA
from lakehouse_assets.versions.publishing import delta_tags
from lakehouse_assets.versions.render import logical_hash
from lakehouse_assets.versions.report import Problem, VerifyReport

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


def _covered_tables(ds: DatasetContext) -> tuple[tuple[str, DeltaLocation], ...]:
    """The tables a manifest covers, by the name it gives them: the statements,
    the translog and the change feed (which incremental exports trust)."""
    return (
        ("statements", ds.statements_table),
        ("translog", ds.translog_table),
        ("changes", ds.changes_table),
    )


class _Hasher:
    """Hashes each lake file once per verify (versions share their data files)."""

    def __init__(self, ds: DatasetContext, report: VerifyReport) -> None:
        self.ds = ds
        self.report = report
        self.cache: dict[str, str | None] = {}

    def sha256(self, path: str) -> str | None:
        if path not in self.cache:
            if not self.ds.store.exists(path):
                self.cache[path] = None
            else:
                self.cache[path] = sha256_of(self.ds, path)
                self.report.files_hashed += 1
                self.report.bytes_hashed += self.ds.store.size(path)
        return self.cache[path]


def _chain_entries(ds: DatasetContext, report: VerifyReport) -> list[tuple[int, dict[str, Any]]]:
    prefix = cv.dataset_path(ds.name, cv.VERSIONS, CHAIN) + "/"
    entries = []
    for path in sorted(ds.store.list(prefix)):
        name = path.rsplit("/", 1)[-1]
        stem = name.removesuffix(".json")
        if not stem.isdigit():
            report.problems.append(Problem(None, path, "unexpected file in the chain"))
            continue
        try:
            entry = json.loads(ds.store.read_text(path))
            assert isinstance(entry, dict) and {"sequence", "path", "hash"} <= set(entry)
        except (ValueError, AssertionError):
            report.problems.append(Problem(int(stem), path, "chain entry is not valid"))
            continue
        if int(entry["sequence"]) != int(stem):
            report.problems.append(
                Problem(int(stem), path, f"chain entry says sequence {entry['sequence']}")
            )
        entries.append((int(stem), entry))
    return entries


def verify(
    ds: DatasetContext, *, deep: bool = False, trusted_head: str | None = None
) -> VerifyReport:
    """Replay the chain and re-hash what it references (see the module docstring).

    - the chain: sequence numbers 1..N without gaps, each manifest's hash as its
      entry records it, parent hashes and snapshot ids linking each version to
      the one before, creation times strictly increasing, ``latest.json`` and
      (if given) a hash the caller trusts naming the head;
    - the Delta history: each version's hash in the translog's commit metadata,
      the log entries each manifest hashed;
    - the anchor: the newest version a translog commit carries is the chain's
      head (a version removed from the chain, with its files, pointer and
      catalog entry, is still anchored in the Delta history);
    - the files: every data file a version references (one a later version
      replaced may be gone only if a vacuum is on record), the head's exports
      and live ``index.json`` byte for byte (no tag excuses a difference),
      every version's published ``index.json`` and diff;
    - what readers read now (:mod:`lakehouse_assets.versions.coverage`): every
      commit after the head made by a lakehouse operation, every file of the
      current snapshot named by the head or added by such a commit, the graph
      index's state and files, the diffs' index, the catalog and its snapshots;
    - with ``deep``, the head's logical hash recomputed from the tables.
    """
    report = VerifyReport(ds.name, deep=deep)
    hasher = _Hasher(ds, report)
    entries = _chain_entries(ds, report)
    report.versions = len(entries)
    if not entries:
        if trusted_head:
            report.problems.append(Problem(None, "versions/", "no versions, but a head was given"))
        return report
    versions: list[Version] = []
    previous: Version | None = None
    expected = 1
    for seq, entry in entries:
        if seq != expected:
            report.problems.append(
                Problem(seq, chain_entry_path(ds.name, seq), f"sequence gap: expected {expected}")
            )
        expected = seq + 1
        path = str(entry["path"])
        if not ds.store.exists(path):
            report.problems.append(Problem(seq, path, "manifest is missing"))
            previous = None
            continue
        try:
            manifest = json.loads(ds.store.read_text(path))
        except ValueError:
            report.problems.append(Problem(seq, path, "manifest is not valid JSON"))
            previous = None
            continue
        version = Version(seq, path, str(entry["hash"]), manifest)
        if manifest_hash(manifest) != entry["hash"]:
            report.problems.append(
                Problem(seq, path, "manifest was altered: its hash differs from the chain's")
            )
        _check_links(ds, version, previous, report)
        versions.append(version)
        previous = version
    head_version = versions[-1] if versions else None
    report.head = entries[-1][1]["hash"]
    _check_pointer(ds, entries, trusted_head, report)
    try:
        tags = delta_tags(ds)
    except Exception as exc:  # a broken Delta log
        report.problems.append(Problem(None, cv.TRANSLOG_TABLE, f"Delta log unreadable: {exc}"))
        tags = {}
    newest = max(tags, default=0)
    if newest > entries[-1][0]:
        # the translog still anchors a version the chain no longer has: rolled back
        report.problems.append(
            Problem(
                newest,
                cv.TRANSLOG_TABLE,
                f"a Delta commit anchors version {newest} ({tags[newest][:17]}…) but the "
                f"chain ends at version {entries[-1][0]}: versions were removed",
            )
        )
    for version in versions:
        tagged = tags.get(version.sequence)
        if tagged is None:
            report.problems.append(
                Problem(version.sequence, cv.TRANSLOG_TABLE, "no Delta commit carries this version")
            )
        elif tagged != version.hash:
            report.problems.append(
                Problem(
                    version.sequence,
                    cv.TRANSLOG_TABLE,
                    f"the Delta commit metadata names another manifest ({tagged[:17]}…)",
                )
            )
    try:
        latest = ds.snapshot()
        current = {
            "statements": {f.path for f in latest.statements.files},
            "translog": {f.path for f in latest.translog.files},
            "changes": {f.path for f in Snapshot.load(ds.changes_table).files},
        }
    except Exception as exc:  # a broken Delta log
        report.problems.append(Problem(None, "tables", f"Delta log unreadable: {exc}"))
        current = {}
    vacuumed = {
        name: vacuumable(
            ds,
            _table_dir(name),
            location,
            head_version.table_version(name) if head_version is not None else None,
        )
        for name, location in _covered_tables(ds)
    }
    for version in versions:
        _check_files(ds, version, current, vacuumed, hasher, report)
    if head_version is not None:
        _check_head_tables(ds, head_version, report)
        _check_exports(ds, head_version, hasher, report)
        verify_coverage.check_after_head(ds, head_version, report)
        verify_coverage.check_graph(ds, head_version, hasher.sha256, report)
        verify_coverage.check_export_state(ds, head_version, report)
        verify_coverage.check_diff_index(ds, versions, report)
        verify_coverage.check_catalog(ds, versions, report)
        if deep:
            try:
                snapshot = snapshot_at(ds, head_version)
                logical, _ = logical_hash(ds, snapshot)
            except LakehouseError as exc:
                report.problems.append(Problem(head_version.sequence, "tables", str(exc)))
            except Exception as exc:  # unreadable Parquet, say
                report.problems.append(
                    Problem(head_version.sequence, "tables", f"cannot be read: {exc}")
                )
            else:
                if logical != head_version.manifest.get("logical_hash"):
                    report.problems.append(
                        Problem(
                            head_version.sequence,
                            cv.STATEMENTS_TABLE,
                            "the live statements do not hash to the manifest's logical hash",
                        )
                    )
            _check_statistics(ds, head_version, report)
    return report


def _sorted_stats(stats: Any) -> Any:
    """statistics.json without list order (ftmq lists what it met in that order)."""
    if isinstance(stats, dict):
        return {k: _sorted_stats(v) for k, v in stats.items()}
    if isinstance(stats, list):
        return sorted(
            (_sorted_stats(v) for v in stats), key=lambda v: json.dumps(v, sort_keys=True)
        )
    return stats


def _check_statistics(ds: DatasetContext, head: Version, report: VerifyReport) -> None:
    """``--deep``: statistics.json recomputed by ftmq's ``Collector`` from the
    published entities.ftm.json (which plain verify holds to the manifest): an
    incremental export's aggregates are a cache, and a wrong one would publish
    wrong counts beside right entities."""
    from followthemoney import ValueEntity
    from ftmq.model.stats import Collector

    stats_path = cv.dataset_path(ds.name, cv.STATISTICS_JSON)
    entities_path = cv.dataset_path(ds.name, cv.ENTITIES_JSON)
    if not ds.store.exists(stats_path) or not ds.store.exists(entities_path):
        return
    collector = Collector()  # type: ignore[no-untyped-call]
    with ds.store.open_read(entities_path) as fh:
        for line in fh:
            if line.strip():
                collector.collect(ValueEntity.from_dict(json.loads(line)))
    want = collector.export().model_dump(mode="json")
    try:
        got = json.loads(ds.store.read_text(stats_path))
    except ValueError:
        got = None
    if _sorted_stats(got) != _sorted_stats(want):
        report.problems.append(
            Problem(
                head.sequence,
                stats_path,
                "statistics differ from those of the published entities "
                f"(entity_count {got.get('entity_count') if isinstance(got, dict) else '?'}, "
                f"recomputed {want.get('entity_count')})",
            )
        )


def _check_links(
    ds: DatasetContext, version: Version, previous: Version | None, report: VerifyReport
) -> None:
    m, seq, path = version.manifest, version.sequence, version.path
    if m.get("schema") != MANIFEST_SCHEMA:
        report.problems.append(Problem(seq, path, f"unknown manifest schema {m.get('schema')}"))
    if m.get("dataset") != ds.name:
        report.problems.append(Problem(seq, path, f"manifest of dataset {m.get('dataset')!r}"))
    if m.get("sequence") != seq:
        report.problems.append(Problem(seq, path, f"manifest says sequence {m.get('sequence')}"))
    if not isinstance(m.get("metadata"), dict):
        report.problems.append(Problem(seq, path, "metadata object is missing"))
    try:
        created = datetime.fromisoformat(str(m.get("created_at")))
    except ValueError:
        report.problems.append(Problem(seq, path, "creation time is not a time"))
        return
    if cv.path_timestamp(created) != m.get("snapshot_id") or str(m.get("snapshot_id")) not in path:
        report.problems.append(Problem(seq, path, "snapshot id does not match its time and path"))
    if seq == 1:
        if m.get("parent_hash") is not None:
            report.problems.append(Problem(seq, path, "first version names a parent"))
        return
    if previous is None or previous.sequence != seq - 1:
        return  # the gap or broken parent was reported
    if m.get("parent_hash") != previous.hash:
        report.problems.append(
            Problem(seq, path, "parent hash does not match the previous version's manifest")
        )
    if m.get("parent_snapshot_id") != previous.snapshot_id:
        report.problems.append(Problem(seq, path, "parent snapshot id does not match"))
    if created <= previous.created_at:
        report.problems.append(
            Problem(seq, path, "created before its parent: time must increase along the chain")
        )


def _check_pointer(
    ds: DatasetContext,
    entries: list[tuple[int, dict[str, Any]]],
    trusted_head: str | None,
    report: VerifyReport,
) -> None:
    by_seq = dict(entries)
    latest = latest_path(ds.name)
    if not ds.store.exists(latest):
        # a missing pointer names no head at all
        # (a publish interrupted before it, or removed): make writes it again
        report.problems.append(Problem(None, latest, "head pointer is missing (run make)"))
    else:
        try:
            pointer = json.loads(ds.store.read_text(latest))
            seq = int(pointer["sequence"])
        except (ValueError, KeyError, TypeError):
            report.problems.append(Problem(None, latest, "not a valid pointer"))
        else:
            entry = by_seq.get(seq)
            if (
                entry is None
                or entry["hash"] != pointer.get("hash")
                or entry["path"] != pointer.get("path")
            ):
                report.problems.append(
                    Problem(seq, latest, "points at a manifest the chain does not have")
                )
            elif seq < entries[-1][0]:
                # readers outside the lakehouse trust the pointer: an older
                # version there is a rollback (or a publish that died before
                # writing it, which the next make finishes)
                report.problems.append(
                    Problem(
                        seq,
                        latest,
                        f"names version {seq} but the head is {entries[-1][0]}: rolled "
                        "back, or a publish was interrupted (make writes it again)",
                    )
                )
    if trusted_head and entries[-1][1]["hash"] != trusted_head:
        report.problems.append(
            Problem(
                entries[-1][0], "versions/", f"the head is not the trusted {trusted_head[:17]}…"
            )
        )


def _check_files(
    ds: DatasetContext,
    version: Version,
    current: Mapping[str, set[str]],
    vacuumed: Mapping[str, Callable[[str], bool]],
    hasher: _Hasher,
    report: VerifyReport,
) -> None:
    seq = version.sequence
    for name, table in version.manifest.get("tables", {}).items():
        root = _table_dir(name)
        for entry in table.get("log", []):
            path = cv.dataset_path(ds.name, root, entry["path"])
            sha = hasher.sha256(path)
            if sha is None:
                report.problems.append(Problem(seq, path, "Delta log entry is missing"))
            elif sha != entry["sha256"]:
                report.problems.append(Problem(seq, path, "Delta log entry was rewritten"))
        for entry in table.get("files", []):
            path = cv.dataset_path(ds.name, root, entry["path"])
            sha = hasher.sha256(path)
            if sha is None:
                if entry["path"] in current.get(name, set()):
                    report.problems.append(Problem(seq, path, "data file is missing"))
                elif not vacuumed[name](entry["path"]):
                    report.problems.append(
                        Problem(seq, path, "data file is missing and no vacuum removed it")
                    )
                continue  # replaced by a later version and vacuumed: expected
            if sha != entry["sha256"]:
                report.problems.append(Problem(seq, path, "data file content differs"))
    index = cv.dataset_version(ds.name, cv.INDEX, version.created_at)
    published = next((e for e in version.manifest.get("exports", []) if e["kind"] == "index"), None)
    if published is not None:
        sha = hasher.sha256(index)
        if sha is None:
            report.problems.append(Problem(seq, index, "published index.json is missing"))
        elif sha != published["sha256"]:
            report.problems.append(Problem(seq, index, "published index.json differs"))
    diff = version.manifest.get("diff") or {}
    if "path" in diff:
        path = cv.dataset_path(ds.name, diff["path"])
        sha = hasher.sha256(path)
        if sha is None:
            report.problems.append(Problem(seq, path, "diff is missing"))
        elif sha != diff["sha256"]:
            report.problems.append(Problem(seq, path, "diff differs"))


def _check_head_tables(ds: DatasetContext, version: Version, report: VerifyReport) -> None:
    """The Delta log at the head's versions lists exactly the files the manifest names."""
    for name, location in _covered_tables(ds):
        entry = version.manifest.get("tables", {}).get(name)
        if entry is None:
            continue
        try:
            dt = location.table(int(entry["version"]))
        except Exception as exc:
            report.problems.append(
                Problem(version.sequence, _table_dir(name), f"Delta log cannot be read: {exc}")
            )
            continue
        if dt is None:
            report.problems.append(Problem(version.sequence, _table_dir(name), "table is gone"))
            continue
        actions = add_actions(dt)
        listed = {(str(a["path"]), int(a["size_bytes"])) for a in actions}
        named = {(f["path"], int(f["size"])) for f in entry.get("files", [])}
        for path, _ in sorted(listed - named):
            report.problems.append(
                Problem(
                    version.sequence, f"{_table_dir(name)}/{path}", "data file not in the manifest"
                )
            )
        for path, _ in sorted(named - listed):
            report.problems.append(
                Problem(
                    version.sequence, f"{_table_dir(name)}/{path}", "data file not in the Delta log"
                )
            )


def _check_exports(
    ds: DatasetContext, version: Version, hasher: _Hasher, report: VerifyReport
) -> None:
    """The head's exports and live ``index.json``, byte for byte as it recorded them.

    No tag excuses a difference: tags are files of the lake like any other, so
    an export rewritten after the head (by a run that has not published yet)
    is reported too; ``make`` rewrites such a file and publishes.
    """
    for entry in version.manifest.get("exports", []):
        path = cv.dataset_path(ds.name, entry["path"])
        sha = hasher.sha256(path)
        if sha == entry["sha256"]:
            continue
        report.problems.append(
            Problem(
                version.sequence,
                path,
                "export is missing"
                if sha is None
                else "export differs from the head's manifest (tampered, or written after "
                "it and not published: run make)",
            )
        )
