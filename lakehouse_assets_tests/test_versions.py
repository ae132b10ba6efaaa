"""Versions: manifests, the hash-linked chain, verify against tampering, as-of reads, diffs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults, versions
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.versions.manifest import _totals
from lakehouse_assets_tests.conftest import cli_args, examples, sample_entities
from lakehouse_assets_tests.helpers.data import entities_of, normal

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def read(ds: Dataset, path: str) -> bytes:
    return ds.store.read_bytes(cv.dataset_path(ds.name, path))


def renamed(entity: dict[str, Any], prop: str, value: str) -> dict[str, Any]:
    """The same entity with one more property value (a modification)."""
    changed = json.loads(json.dumps(entity))
    changed["properties"].setdefault(prop, []).append(value)
    return changed


# --- publishing ------------------------------------------------------------------


def test_a_versions_totals_agree_however_they_are_counted(
    spark: SparkSession, lake: Lakehouse
) -> None:
    """A manifest's live-statement totals come from the statements export that was
    just written, or from the translog (DuckDB, bounded memory): both equal to
    counting the translog's live ids in memory, with a statement live in two origins counted once and one
    deleted in one origin but live in the other still live."""
    import pyarrow.compute as pc

    from lakehouse_assets.tables.schemas import TRANSLOG_SCHEMA
    from lakehouse_assets.tables.snapshot import arrow_dataset

    ds = lake.create_dataset("totals")
    entities = sample_entities()
    ds.write_entities([json.dumps(e).encode() for e in entities], origin="a")
    ds.write_entities([json.dumps(e).encode() for e in entities[:3]], origin="b")
    ds.delete_entity(str(entities[3]["id"]))  # both origins' statements of it
    ds.delete_entity(str(entities[0]["id"]), origin="b")  # still live in "a"
    ds.make()
    snapshot = ds.snapshot()
    log = arrow_dataset(
        snapshot.translog.files, TRANSLOG_SCHEMA, ds.statements_table.storage_options
    ).to_table()
    live = log.filter(pc.is_null(log.column("deleted_at")))
    expected = {
        "live_statements": pc.count_distinct(live.column("id")).as_py(),
        "first_seen": pc.min(live.column("first_seen")).as_py(),
        "last_seen": pc.max(live.column("last_seen")).as_py(),
    }
    assert live.num_rows > expected["live_statements"] > 0  # some ids live twice
    head = ds.versions()[-1]
    published = {k: head.manifest["totals"][k] for k in expected}
    assert published == expected  # counted by the export
    assert _totals(ds, snapshot) == expected  # counted from the translog
    counted = _totals(ds, snapshot, live_statements=expected["live_statements"])
    assert counted == expected  # the export's count, the translog's seen range
    csv = read(ds, cv.STATEMENTS_CSV)
    assert expected["live_statements"] == csv.count(b"\n") - 1


def test_each_change_publishes_one_linked_version(spark: SparkSession, lake: Lakehouse) -> None:
    ds = lake.create_dataset("versioned")
    entities = sample_entities()
    for e in entities[:5]:
        ds.add_entity(e)
    first = ds.make().written["index"]["version"]
    assert first["sequence"] == 1 and first["diff"]["counts"] == {"ADD": 5, "MOD": 0, "DEL": 0}
    # nothing new: no version, index.json kept as it was
    index_before = read(ds, cv.INDEX)
    again = ds.make(force=True).written["index"]["version"]
    assert again["sequence"] is None and "nothing changed" in again["skipped"]
    assert read(ds, cv.INDEX) == index_before
    for e in entities[5:]:
        ds.add_entity(e)
    ds.delete_entity(str(entities[0]["id"]))
    second = ds.make().written["index"]["version"]
    assert second["sequence"] == 2
    assert second["diff"]["counts"]["DEL"] == 1
    assert second["diff"]["counts"]["ADD"] == len(entities) - 5

    history = ds.versions()
    assert [v.sequence for v in history] == [1, 2]
    v1, v2 = history
    m = v2.manifest
    # Lode: self-describing, explicit metadata, parent, files with sizes, checksums, stats
    assert m["schema"] == versions.MANIFEST_SCHEMA and m["dataset"] == ds.name
    assert m["metadata"] == {} and m["parent_snapshot_id"] == v1.snapshot_id
    assert m["parent_hash"] == v1.hash == versions.manifest_hash(v1.manifest)
    assert v2.created_at > v1.created_at
    files = m["tables"]["statements"]["files"]
    assert files and all(len(f["sha256"]) == 64 and f["size"] > 0 for f in files)
    assert sum(f["stats"]["rows"] for f in files) == m["totals"]["statements"]
    assert all("canonical_id" in f["stats"]["columns"] for f in files)
    assert m["tables"]["translog"]["log"], "the Delta log entries since the parent are hashed"
    # the logical hash is statements.csv's, and the exports are listed with their hashes
    csv = read(ds, cv.STATEMENTS_CSV)
    assert m["logical_hash"] == versions.multihash(hashlib.sha256(csv).digest())
    assert {e["kind"] for e in m["exports"]} == {"statements", "entities", "statistics", "index"}
    assert m["totals"]["entities"] == len(entities) - 1
    assert m["totals"]["live_statements"] == csv.count(b"\n") - 1
    # the published index.json is the live one; latest.json and the Delta history name the head
    assert read(ds, cv.INDEX) == ds.store.read_bytes(
        cv.dataset_version(ds.name, cv.INDEX, v2.created_at)
    )
    assert json.loads(ds.store.read_text(versions.latest_path(ds.name)))["hash"] == v2.hash
    assert versions.delta_tags(ds) == {1: v1.hash, 2: v2.hash}
    report = ds.verify(deep=True)
    assert report.ok, report.problems
    assert report.versions == 2 and report.head == v2.hash


def test_racing_publishers_make_one_version(spark: SparkSession, lake: Lakehouse) -> None:
    """Two publishers of the same snapshot: one sequence number, one winner; the
    loser retries on the new head, finds nothing changed and publishes nothing."""
    ds = lake.create_dataset("racing")
    for e in sample_entities()[:4]:
        ds.add_entity(e)
    ds.export(["statements", "entities", "statistics"])
    snapshot = ds.snapshot()
    both = threading.Barrier(2, timeout=60)
    results: list[versions.PublishResult] = []
    errors: list[BaseException] = []

    def publisher() -> None:
        try:
            results.append(versions.publish(ds, snapshot, index_text="{}", statements_fresh=True))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=publisher) for _ in range(2)]
    with faults.on("publish.after_files", both.wait):
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors
    published = [r for r in results if r.version is not None]
    assert len(published) == 1 and published[0].version is not None
    loser = next(r for r in results if r.version is None)
    assert loser.attempts == 2 and "nothing changed since version 1" in str(loser.skipped)
    assert [v.sequence for v in ds.versions()] == [1]
    # the loser removed what it had written: one manifest under versions/
    manifests = [
        p
        for p in ds.store.list(cv.dataset_path(ds.name, "versions"))
        if p.endswith(versions.MANIFEST)
    ]
    assert len(manifests) == 1
    assert ds.verify().ok


PUBLISH = """
import sys
from lakehouse_assets.lake import Lakehouse
lake = Lakehouse(sys.argv[1], journal_url=sys.argv[2])
lake.dataset(sys.argv[3]).make()
"""


@pytest.mark.parametrize("point", faults.PUBLISH_POINTS)
def test_a_publish_killed_at_any_point_is_finished_by_the_next(
    spark: SparkSession, local_lake: Lakehouse, point: str
) -> None:
    ds = local_lake.create_dataset("killed")
    entities = sample_entities()
    for e in entities[:4]:
        ds.add_entity(e)
    ds.make()
    for e in entities[4:8]:
        ds.add_entity(e)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            PUBLISH,
            local_lake.store.uri,
            local_lake.settings.resolved_journal_url(),
            ds.name,
        ],
        env={**os.environ, "LAKEHOUSE_CRASH_AT": point},
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    ds.make()  # finishes (or redoes) the publish
    history = ds.versions()
    assert [v.sequence for v in history] == [1, 2]
    assert history[-1].manifest["totals"]["entities"] == 8
    report = ds.verify(deep=True)
    assert report.ok, report.problems
    assert versions.delta_tags(ds) == {v.sequence: v.hash for v in history}
    assert read(ds, cv.INDEX) == ds.store.read_bytes(
        cv.dataset_version(ds.name, cv.INDEX, history[-1].created_at)
    )


# --- as-of reads -------------------------------------------------------------------


def test_as_of_reads_equal_what_each_version_exported(spark: SparkSession, lake: Lakehouse) -> None:
    """After writes, deletes, a modification, compact and optimize, every earlier
    version reads back exactly as it was exported then."""
    ds = lake.create_dataset("as_of")
    entities = sample_entities()
    exported: dict[int, dict[str, bytes]] = {}

    def publish() -> int:
        seq = ds.make().written["index"]["version"]["sequence"]
        assert seq is not None
        exported[seq] = {
            "statements": read(ds, cv.STATEMENTS_CSV),
            "entities": read(ds, cv.ENTITIES_JSON),
            "statistics": read(ds, cv.STATISTICS_JSON),
        }
        return int(seq)

    for e in entities[:6]:
        ds.add_entity(e)
    publish()
    doomed = str(entities[0]["id"])
    ds.delete_entity(doomed)
    ds.add_entity(renamed(entities[1], "summary", "changed in version 2"))
    publish()
    ds.compact()
    for e in entities[6:]:
        ds.add_entity(e)
    publish()
    ds.optimize()
    ds.add_entity(entities[0])  # back again
    publish()

    for seq, files in exported.items():
        out = io.BytesIO()
        ds.export_as_of(seq, "statements", out)
        assert out.getvalue() == files["statements"], f"statements.csv of version {seq}"
        out = io.BytesIO()
        ds.export_as_of(seq, "entities", out)
        assert entities_of(out.getvalue()) == entities_of(files["entities"])
        streamed = b"\n".join(orjson.dumps(e) for e in ds.stream_entities(as_of=seq))
        assert entities_of(streamed) == entities_of(files["entities"])
        out = io.BytesIO()
        ds.export_as_of(seq, "statistics", out)
        got, want = json.loads(out.getvalue()), json.loads(files["statistics"])
        assert got["entity_count"] == want["entity_count"]
        assert got["things"]["total"] == want["things"]["total"]
    # compact and optimize of a published dataset published versions of their own
    made = sorted(exported)
    assert made == [1, 2, 4, 6]
    assert [ds.version(s).manifest["metadata"] for s in (3, 5)] == [  # type: ignore[union-attr]
        {"operation": "compact"},
        {"operation": "optimize"},
    ]
    # they changed no entity: their diffs are empty without reading the tables, as
    # the tables' own diff from the parent's snapshot says
    for seq in (3, 5):
        relayout, parent = ds.version(seq), ds.version(seq - 1)
        assert relayout is not None and parent is not None
        assert relayout.manifest["diff"]["counts"] == {"ADD": 0, "MOD": 0, "DEL": 0}
        assert relayout.manifest["diff"]["size"] == 0
        tables_say = versions.entity_changes(
            ds, versions.snapshot_at(ds, parent), versions.snapshot_at(ds, relayout)
        )
        assert list(tables_say) == []
    # point reads: the deleted entity exists in the first make, not in the next two, again
    # in the last
    assert [ds.get_entity(doomed, as_of=s) is not None for s in made] == [
        True,
        False,
        False,
        True,
    ]
    # by snapshot id and by time
    v2 = ds.versions()[1]
    assert ds.version(v2.snapshot_id) == v2
    assert ds.version(v2.manifest["created_at"]) == v2
    with pytest.raises(versions.VersionNotFoundError, match="no version 9"):
        ds.version(9)
    with pytest.raises(versions.VersionNotFoundError, match="no published version at"):
        ds.version("2001-01-01T00:00:00")
    assert ds.verify(deep=True).ok


def test_an_as_of_read_beyond_vacuum_retention_says_what_to_set(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    ds = local_lake.create_dataset("vacuumed")
    entities = sample_entities()
    for e in entities[:4]:
        ds.add_entity(e)
    ds.make()
    ds.delete_entity(str(entities[0]["id"]))
    ds.make()
    ds.optimize(vacuum=True, retention_hours=0)
    with pytest.raises(versions.VersionExpiredError, match="LAKEHOUSE_VACUUM_RETENTION_HOURS"):
        ds.get_entity(str(entities[1]["id"]), as_of=1)
    # the head is still readable, and verify accepts files vacuumed after being replaced
    assert ds.get_entity(str(entities[1]["id"]), as_of=2) is not None
    report = ds.verify()
    assert report.ok, report.problems


# --- diffs ---------------------------------------------------------------------------


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 11)),
        st.tuples(st.just("delete"), st.integers(0, 11)),
        st.tuples(st.just("modify"), st.integers(0, 11)),
        st.tuples(st.just("compact"), st.just(0)),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=examples(3, 25))
@given(history=st.lists(OPS, min_size=1, max_size=examples(3, 5)))
def test_parent_export_plus_diff_is_the_new_export(
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
    history: list[list[tuple[str, int]]],
) -> None:
    root = tmp_path_factory.mktemp("diffs")
    lake = Lakehouse(root / "lake", journal_url=f"sqlite:///{root / 'journal.sqlite'}")
    ds = lake.create_dataset("diffs")
    entities = sample_entities()
    for e in entities[:4]:
        ds.add_entity(e)
    ds.make()
    state = entities_of(read(ds, cv.ENTITIES_JSON))
    for step, ops in enumerate(history):
        for op, i in ops:
            entity = entities[i % len(entities)]
            if op == "add":
                ds.add_entity(entity)
            elif op == "delete":
                ds.delete_entity(str(entity["id"]))
            elif op == "modify":
                ds.add_entity(renamed(entity, "summary", f"step {step}"))
            else:
                ds.flush()
                ds.compact()
        written = ds.make().written
        version = written["index"]["version"] if "index" in written else {"sequence": None}
        now = entities_of(read(ds, cv.ENTITIES_JSON))
        if version["sequence"] is None:
            assert now == state  # nothing published means nothing changed
            continue
        diff = read(ds, version["diff"]["path"])
        applied = dict(state)
        for line in diff.splitlines():
            change = orjson.loads(line)
            assert change["op"] in ("ADD", "MOD", "DEL")
            eid = change["entity"]["id"]
            if change["op"] == "DEL":
                assert eid in applied
                del applied[eid]
            else:
                assert (eid in applied) == (change["op"] == "MOD")
                applied[eid] = normal(change["entity"])
        assert applied == now
        state = now
    index = json.loads(ds.store.read_text(versions.diff_index_path(ds.name)))
    assert [d["sequence"] for d in index["diffs"]] == [v.sequence for v in ds.versions()]


# --- verify against tampering ---------------------------------------------------------


@pytest.fixture(scope="module")
def published(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local lake with three published versions (changes, deletes, compact)."""
    root = tmp_path_factory.mktemp("published")
    lake = Lakehouse(root / "lake", journal_url=f"sqlite:///{root / 'journal.sqlite'}")
    ds = lake.create_dataset("tampered")
    entities = sample_entities()
    for e in entities[:5]:
        ds.add_entity(e)
    ds.make()
    for e in entities[5:]:
        ds.add_entity(e)
    ds.make()
    ds.delete_entity(str(entities[2]["id"]))
    ds.flush()
    ds.compact()
    ds.make()
    assert ds.verify(deep=True).ok
    return root


def _manifest(root: Path, seq: int) -> Path:
    entry = json.loads((root / "lake/tampered/versions/chain" / f"{seq:010d}.json").read_text())
    return root / "lake" / entry["path"]


def _rewrite_manifest(root: Path, seq: int, change: Callable[[dict[str, Any]], None]) -> None:
    """Edit a manifest and re-hash its chain entry (a forger covering their tracks)."""
    path = _manifest(root, seq)
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))
    entry_path = root / "lake/tampered/versions/chain" / f"{seq:010d}.json"
    entry = json.loads(entry_path.read_text())
    entry["hash"] = versions.manifest_hash(manifest)
    entry_path.write_text(json.dumps(entry))


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _head_file(root: Path, table: str) -> Path:
    manifest = json.loads(_manifest(root, 3).read_text())
    rel = manifest["tables"][table]["files"][0]["path"]
    folder = cv.STATEMENTS_TABLE if table == "statements" else cv.TRANSLOG_TABLE
    return root / "lake/tampered" / folder / rel


def _log(root: Path, table: str, version: int) -> Path:
    folder = cv.STATEMENTS_TABLE if table == "statements" else cv.TRANSLOG_TABLE
    return root / "lake/tampered" / folder / "_delta_log" / f"{version:020d}.json"


def _edit_footer(path: Path) -> None:
    """Change one byte inside the Parquet footer (where the statistics live)."""
    data = path.read_bytes()
    footer = int.from_bytes(data[-8:-4], "little")
    _flip(path, len(data) - 8 - footer // 2)


def _add_data_file(root: Path) -> None:
    """A copy of a data file added to the head's statements commit."""
    manifest = json.loads(_manifest(root, 3).read_text())
    version = manifest["tables"]["statements"]["version"]
    source = _head_file(root, "statements")
    copy = source.with_name("part-forged.parquet")
    shutil.copy(source, copy)
    rel = str(copy.relative_to(root / "lake/tampered" / cv.STATEMENTS_TABLE))
    log = _log(root, "statements", version)
    lines = log.read_text().splitlines()
    add = next(json.loads(line) for line in lines if '"add"' in line)
    add["add"]["path"] = rel
    log.write_text("\n".join([*lines, json.dumps(add)]) + "\n")


def _rewrite_log_stats(root: Path) -> None:
    log = _log(root, "statements", 0)
    text = log.read_text()
    assert '\\"numRecords\\":' in text
    log.write_text(text.replace('\\"numRecords\\":', '\\"numRecords\\":1', 1))


def _rewrite_delta_tag(root: Path) -> None:
    """The head's hash in the translog's commit metadata replaced."""
    folder = root / "lake/tampered" / cv.TRANSLOG_TABLE / "_delta_log"
    head = json.loads(_manifest(root, 3).read_text())
    head_hash = versions.manifest_hash(head)
    for log in sorted(folder.glob("*.json")):
        text = log.read_text()
        if head_hash in text:
            log.write_text(text.replace(head_hash, versions.SHA256_PREFIX + "0" * 64))
            return
    raise AssertionError("no commit carries the head's hash")


def _swap_manifests(root: Path) -> None:
    one, two = _manifest(root, 1), _manifest(root, 2)
    a, b = one.read_bytes(), two.read_bytes()
    one.write_bytes(b)
    two.write_bytes(a)


def _forge_latest(root: Path) -> None:
    path = root / "lake/tampered/versions/latest.json"
    pointer = json.loads(path.read_text())
    pointer["hash"] = versions.SHA256_PREFIX + "1" * 64
    path.write_text(json.dumps(pointer))


def _diff_file(root: Path, seq: int) -> Path:
    manifest = json.loads(_manifest(root, seq).read_text())
    return root / "lake/tampered" / manifest["diff"]["path"]


def _published_index(root: Path, seq: int) -> Path:
    return _manifest(root, seq).with_name("index.json")


#: name → (tamper, what the failure must name)
TAMPERING: dict[str, tuple[Callable[[Path], None], str]] = {
    "export byte edited": (
        lambda r: _flip(r / "lake/tampered/exports/statements.csv", 200),
        "exports/statements.csv: export differs",
    ),
    "export truncated": (
        lambda r: (r / "lake/tampered/entities.ftm.json").write_bytes(
            (r / "lake/tampered/entities.ftm.json").read_bytes()[:100]
        ),
        "entities.ftm.json: export differs",
    ),
    "export removed": (
        lambda r: (r / "lake/tampered/exports/statistics.json").unlink(),
        "statistics.json: export is missing",
    ),
    "live index.json edited": (
        lambda r: (r / "lake/tampered/index.json").write_text("{}"),
        "tampered/index.json: export differs",
    ),
    "published index.json of an old version edited": (
        lambda r: _flip(_published_index(r, 1), 10),
        "version 1: ",
    ),
    "parquet file truncated": (
        lambda r: _head_file(r, "statements").write_bytes(
            _head_file(r, "statements").read_bytes()[:-100]
        ),
        "data file content differs",
    ),
    "parquet footer statistic edited": (
        lambda r: _edit_footer(_head_file(r, "statements")),
        "data file content differs",
    ),
    "data file removed": (
        lambda r: _head_file(r, "statements").unlink(),
        "data file is missing",
    ),
    "translog file edited": (
        lambda r: _flip(_head_file(r, "translog"), 40),
        "data file content differs",
    ),
    "data file added to a commit": (_add_data_file, "Delta log entry was rewritten"),
    "Delta log entry rewritten": (_rewrite_log_stats, "Delta log entry was rewritten"),
    "Delta log entry removed": (
        lambda r: _log(r, "translog", 1).unlink(),
        "Delta log entry is missing",
    ),
    "Delta commit metadata rewritten": (_rewrite_delta_tag, "names another manifest"),
    "manifest edited": (
        lambda r: _manifest(r, 2).write_text(
            _manifest(r, 2).read_text().replace('"live_statements": ', '"live_statements": 1', 1)
        ),
        "version 2: ",
    ),
    "manifest removed": (lambda r: _manifest(r, 2).unlink(), "manifest is missing"),
    "manifests reordered": (_swap_manifests, "manifest was altered"),
    "chain entry removed": (
        lambda r: (r / "lake/tampered/versions/chain/0000000002.json").unlink(),
        "sequence gap",
    ),
    "forged parent hash": (
        lambda r: _rewrite_manifest(
            r, 3, lambda m: m.update(parent_hash=versions.SHA256_PREFIX + "2" * 64)
        ),
        "parent hash does not match",
    ),
    "sequence number edited": (
        lambda r: _rewrite_manifest(r, 2, lambda m: m.update(sequence=7)),
        "manifest says sequence 7",
    ),
    "time moved before the parent": (
        lambda r: _rewrite_manifest(
            r, 2, lambda m: m.update(created_at="2001-01-01T00:00:00+00:00")
        ),
        "created before its parent",
    ),
    "head manifest rewritten and re-hashed": (
        lambda r: _rewrite_manifest(r, 3, lambda m: m["totals"].update(entities=1)),
        "names another manifest",
    ),
    "latest pointer forged": (_forge_latest, "points at a manifest the chain does not have"),
    "diff edited": (lambda r: _flip(_diff_file(r, 2), 5), "diff differs"),
    "diff removed": (lambda r: _diff_file(r, 3).unlink(), "diff is missing"),
}


@pytest.mark.parametrize("kind", sorted(TAMPERING))
def test_verify_names_every_kind_of_tampering(published: Path, tmp_path: Path, kind: str) -> None:
    root = tmp_path / "copy"
    shutil.copytree(published, root)
    lake = Lakehouse(root / "lake", journal_url=f"sqlite:///{root / 'journal.sqlite'}")
    ds = lake.dataset("tampered")
    assert ds.verify().ok
    tamper, expected = TAMPERING[kind]
    tamper(root)
    report = ds.verify()
    assert not report.ok, f"{kind} was not detected"
    assert any(expected in str(p) for p in report.problems), [str(p) for p in report.problems]


def test_verify_checks_a_trusted_head(published: Path) -> None:
    lake = Lakehouse(published / "lake", journal_url=f"sqlite:///{published / 'journal.sqlite'}")
    ds = lake.dataset("tampered")
    head = ds.version()
    assert head is not None and ds.verify(trusted_head=head.hash).ok
    older = ds.version(2)
    assert older is not None
    report = ds.verify(trusted_head=older.hash)
    assert not report.ok and "not the trusted" in str(report.problems[0])


# --- provenance, catalog, CLI ------------------------------------------------------


def test_trace_names_origin_file_and_versions(
    spark: SparkSession, local_lake: Lakehouse, tmp_path: Path
) -> None:
    ds = local_lake.create_dataset("traced")
    entities = sample_entities()
    for e in entities[:3]:
        ds.add_entity(e, origin="import")
    source = tmp_path / "memo.txt"
    source.write_text("a memo")
    meta = ds.add_file(str(source), create_document=True)
    ds.make()
    doomed = str(entities[0]["id"])
    ds.delete_entity(doomed)
    ds.add_entity(entities[3], origin="import")
    ds.make()

    gone = ds.trace(doomed)
    assert gone and all(s["source"]["origin"] == "import" for s in gone)
    assert all((s["published_in"], s["removed_in"]) == (1, 2) for s in gone)
    assert all(s["deleted_at"] for s in gone)
    later = ds.trace(str(entities[3]["id"]))
    assert later and all((s["published_in"], s["removed_in"]) == (2, None) for s in later)
    # a Document's statements lead to the archived file
    document = ds.trace(meta.checksum)
    assert document and document[0]["source"]["origin"] == "archive"
    archived = document[0]["source"]["archive"][0]
    assert archived["checksum"] == meta.checksum and archived["name"] == "memo.txt"
    # one statement by its id
    one = ds.trace(str(later[0]["id"]))
    assert [s["id"] for s in one] == [later[0]["id"]]
    assert ds.trace("no-such-thing") == []
    # the catalog lists the head of every dataset, and keeps a snapshot per publish
    catalog = json.loads(local_lake.store.read_text(cv.CATALOG_INDEX))
    head = ds.version()
    assert head is not None
    (entry,) = [d for d in catalog["datasets"] if d["name"] == ds.name]
    assert entry["version"] == head.version_id  # followthemoney's field
    assert entry[versions.LAKEHOUSE_VERSION]["hash"] == head.hash
    assert entry[versions.LAKEHOUSE_VERSION]["logical_hash"] == head.manifest["logical_hash"]
    assert len([p for p in local_lake.store.list("versions/") if p.endswith("index.json")]) >= 2


def test_trace_names_the_tenant_and_write(spark: SparkSession, local_lake: Lakehouse) -> None:
    """Provenance recorded at write time: every journal row carries its tenant and
    write id, and the translog keeps the first and the last write of each statement."""
    from lakehouse_assets.journal import write_time

    alice = Lakehouse(settings=local_lake.settings, tenant="alice")
    bob = Lakehouse(settings=local_lake.settings, tenant="bob")
    ds = alice.create_dataset("written")
    entities = sample_entities()
    with ds.bulk(origin="import") as first:
        first.add_entity(entities[0])
        first.add_entity(entities[1])
    assert first.write.tenant == "alice"
    ds.make()
    same = bob.dataset(ds.name)
    with same.bulk(origin="import") as second:  # the same statements again
        second.add_entity(entities[0])
    same.make()
    trace = {s["id"]: s for s in ds.trace(str(entities[0]["id"]))}
    assert trace
    for item in trace.values():
        assert item["written_by"]["tenant"] == "alice"
        assert item["written_by"]["write_id"] == first.write.write_id
        assert item["last_written_by"]["write_id"] == second.write.write_id
        assert item["last_written_by"]["tenant"] == "bob"
    started = write_time(first.write.write_id)
    assert started is not None and started[:4] == cv.utcnow().strftime("%Y")
    # untouched by bob: first and last write are alice's
    other = ds.trace(str(entities[1]["id"]))
    assert other and all(s["last_written_by"] == s["written_by"] for s in other)
    # a delete is a write too: the last writer is the deleting tenant
    assert same.delete_entity(str(entities[0]["id"])) == len(trace)
    same.make()
    gone = ds.trace(str(entities[0]["id"]))
    assert gone and all(s["deleted_at"] for s in gone)
    assert all(s["written_by"]["write_id"] == first.write.write_id for s in gone)
    deleters = {s["last_written_by"]["write_id"] for s in gone}
    assert len(deleters) == 1 and second.write.write_id not in deleters
    assert all(s["last_written_by"]["tenant"] == "bob" for s in gone)


def test_a_version_records_the_graph_index_current(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """make builds the graph index (first), updates it (then) before publishing, and
    the manifest names its table versions, what it reflects, its edge count and
    its state file's hash."""
    from lakehouse_assets import graph

    ds = local_lake.create_dataset("graphed")
    entities = sample_entities()
    for e in entities:
        ds.add_entity(e)
    first = ds.make()
    head = ds.version()
    assert first.graph is not None and head is not None
    assert head.manifest["graph"]["current"] is True  # built by the first make
    ownership = next(e for e in entities if e["schema"] == "Ownership")
    ds.add_entity({**ownership, "id": "own-copy"})
    made = ds.make()
    assert made.graph is not None and made.graph["added"] == 2
    head = ds.version()
    assert head is not None and head.sequence == 2
    recorded = head.manifest["graph"]
    assert recorded["current"] is True
    assert recorded["reflects"] == {
        "statements": head.table_version("statements"),
        "translog": head.table_version("translog"),
    }
    assert recorded["edges"] == graph.status(ds)["edges"]
    state = ds.store.read_bytes(cv.dataset_path(ds.name, cv.GRAPH_STATE))
    assert recorded["state_sha256"] == hashlib.sha256(state).hexdigest()
    assert all(isinstance(v, int) for v in recorded["tables"].values())
    assert ds.verify().ok


OLD_JOURNAL = {  # the journal table as versions before provenance created it
    "sqlite": "seq INTEGER PRIMARY KEY AUTOINCREMENT",
    "postgresql": "seq BIGSERIAL PRIMARY KEY",
}
OLD_COLUMNS = (
    "dataset VARCHAR(128) NOT NULL, bucket INTEGER NOT NULL, origin VARCHAR(255) NOT NULL, "
    "canonical_id VARCHAR(1024) NOT NULL, entity_id VARCHAR(1024) NOT NULL, "
    "id VARCHAR(64) NOT NULL, prop VARCHAR(255) NOT NULL, prop_type VARCHAR(64) NOT NULL, "
    "schema VARCHAR(255) NOT NULL, value TEXT NOT NULL, lang VARCHAR(16), original_value TEXT, "
    "external BOOLEAN NOT NULL, first_seen VARCHAR(32), last_seen VARCHAR(32), "
    "deleted_at VARCHAR(32), flush_id VARCHAR(32)"
)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def old_journal(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A journal made by a version before provenance, holding one unflushed row: a
    SQLite file, or a database of its own on the PostgreSQL server."""
    import uuid

    import sqlalchemy as sa

    from lakehouse_assets.journal import bucket_of

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.sqlite'}"
        admin, name = None, None
    else:
        server = str(request.getfixturevalue("postgres_url"))
        name = f"lakehouse_old_{uuid.uuid4().hex[:8]}"
        admin = sa.create_engine(
            server.replace("postgresql://", "postgresql+psycopg2://"), isolation_level="AUTOCOMMIT"
        )
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        url = server.rsplit("/", 1)[0] + f"/{name}"
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://"))
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE TABLE lakehouse_journal ({OLD_JOURNAL[request.param]}, {OLD_COLUMNS})"
        )
        conn.execute(
            sa.text(
                "INSERT INTO lakehouse_journal (dataset, bucket, origin, canonical_id, entity_id, "
                "id, prop, prop_type, schema, value, external, first_seen, last_seen) VALUES "
                "('migrated', :bucket, 'default', 'old-1', 'old-1', 'sid-old', 'name', 'name', "
                "'Person', 'Old Person', false, '2025-01-01T00:00:00', '2025-01-01T00:00:00')"
            ),
            {"bucket": bucket_of("old-1")},
        )
    engine.dispose()
    yield url
    if admin is not None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


def test_an_old_journal_gains_provenance_and_keeps_its_rows(
    spark: SparkSession, old_journal: str, tmp_path: Path
) -> None:
    """Opening a journal made before provenance adds its columns (SQLite and
    PostgreSQL); its unflushed rows flush with unknown writers, new writes with theirs."""
    lake = Lakehouse(tmp_path / "lake", journal_url=old_journal, tenant="carol")
    ds = lake.create_dataset("migrated")
    assert lake.journal.count("migrated") == 1
    ds.add_entity({"id": "new-1", "schema": "Person", "properties": {"name": ["New Person"]}})
    assert ds.flush().new == 3  # the old row, the new entity's name and its id statement
    (old,) = ds.trace("old-1")
    assert old["written_by"] is None and old["last_written_by"] is None
    assert old["value"] == "Old Person"
    new = ds.trace("new-1")
    assert new and all(s["written_by"]["tenant"] == "carol" for s in new)
    assert lake.journal.count("migrated") == 0


def test_cli_versions_verify_as_of(spark: SparkSession, local_lake: Lakehouse) -> None:
    from click.testing import CliRunner

    from lakehouse_assets.cli import cli

    ds = local_lake.create_dataset("cli_versions")
    entities = sample_entities()
    for e in entities[:3]:
        ds.add_entity(e)
    ds.make()
    base = cli_args(ds)
    runner = CliRunner()
    out = runner.invoke(cli, [*base, "verify"])  # one version: said in the singular
    assert out.exit_code == 0 and out.output.startswith("ok: cli_versions: 1 version, head")
    ds.delete_entity(str(entities[0]["id"]))
    ds.make()
    out = runner.invoke(cli, [*base, "versions"])
    assert out.exit_code == 0, out.output
    assert "add 3" in out.output and "del 1" in out.output
    out = runner.invoke(cli, [*base, "versions", "--json"])
    assert [json.loads(line)["sequence"] for line in out.output.splitlines()] == [1, 2]
    out = runner.invoke(cli, [*base, "verify", "--deep"])
    assert out.exit_code == 0 and out.output.startswith("ok: cli_versions: 2 versions")
    out = runner.invoke(cli, [*base, "get", str(entities[0]["id"]), "--as-of", "1"])
    assert out.exit_code == 0 and json.loads(out.output)["id"] == entities[0]["id"]
    out = runner.invoke(cli, [*base, "get", str(entities[0]["id"]), "--as-of", "2"])
    assert out.exit_code == 1
    out = runner.invoke(cli, [*base, "export", "statements", "--as-of", "1"])
    assert out.exit_code == 0 and out.output.startswith('"canonical_id","entity_id"')
    out = runner.invoke(cli, [*base, "query", "--as-of", "5"])
    assert out.exit_code == 1 and "has no version 5" in out.output
    out = runner.invoke(cli, [*base, "stream", "--as-of", "next tuesday"])
    assert out.exit_code == 1 and "not a version number" in out.output
    out = runner.invoke(cli, [*base, "trace", str(entities[1]["id"])])
    assert out.exit_code == 0 and json.loads(out.output.splitlines()[0])["published_in"] == 1
    # tampering: exit 1, the file named
    csv = Path(local_lake.store.uri.removeprefix("file://")) / ds.name / cv.STATEMENTS_CSV
    csv.write_bytes(csv.read_bytes().replace(b",", b";", 1))
    out = runner.invoke(cli, [*base, "verify"])
    assert out.exit_code == 1 and "exports/statements.csv: export differs" in out.output


def test_the_translog_diff_joins_a_bucket_range_at_a_time(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A version's diff (and the graph index's update) compares the translog rows
    two snapshots do not share; after a daily change that is the whole
    translog, which in one DuckDB join ran out of its memory limit at 10M
    statements. It joins a bucket range at a time: the same rows as one join."""
    from lakehouse_assets.tables import changes

    lake = Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{tmp_path / 'journal.sqlite'}")
    ds = lake.create_dataset("sliced")
    entities = sample_entities()
    for e in entities:
        ds.add_entity(e)
    ds.flush()
    before = ds.snapshot()
    for e in entities[::3]:
        ds.add_entity(renamed(e, "summary", "again"))
    for e in entities[1::4]:
        ds.delete_entity(str(e["id"]))
    ds.add_entity({"id": "new-one", "schema": "Person", "properties": {"name": ["New"]}})
    ds.flush()
    after = ds.snapshot()

    def rows() -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        new, old = changes.changed_translog_rows(ds, before, after)
        return tuple(sorted(tuple(r.values()) for r in t.to_pylist()) for t in (new, old))  # type: ignore[return-value]

    whole = rows()
    slices: list[int] = []
    real = changes._bucket_slices

    def counted(*args: Any) -> list[tuple[int, int]]:
        found = real(*args)
        slices.append(len(found))
        return found

    monkeypatch.setattr(changes, "_bucket_slices", counted)
    monkeypatch.setattr(changes, "SLICE_ROWS", 5)
    sliced = rows()
    assert slices and slices[0] > 5  # many bucket ranges, each joined on its own
    assert sliced == whole
    assert whole[0] and whole[1]  # rows changed on both sides
    assert len(whole[0]) > len(whole[1])  # the new entity's statements only on the new
