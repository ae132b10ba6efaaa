"""Tampering with a published lake: every kind is caught by plain ``verify``.

One lake is built per module (three makes with a graph index, a delete and a
compact, then a compact of a fully published dataset, which publishes a
version of its own); each tamper kind works on a copy of its folder, so a
kind costs a copy and a ``verify``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from lakehouse_assets import conventions as cv
from lakehouse_assets import versions
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets.tables.delta import commit
from lakehouse_assets.tables.schemas import TRANSLOG_SCHEMA
from lakehouse_assets_tests.conftest import make_bucket, sample_entities

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAME = "tampered"
HEAD = 4


def open_lake(root: Path) -> Lakehouse:
    return Lakehouse(root / "lake", journal_url=f"sqlite:///{root / 'journal.sqlite'}")


@pytest.fixture(scope="module")
def published(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local lake with four published versions and a graph index: changes, more
    changes (graph current), a delete compacted before make, and a compact of a
    published dataset (version 4, published by compact itself)."""
    root = tmp_path_factory.mktemp("tamper")
    ds = open_lake(root).create_dataset(NAME)
    entities = sample_entities()
    for e in entities[:5]:
        ds.add_entity(e)
    ds.make()
    from lakehouse_assets import graph

    graph.rebuild(ds)
    for e in entities[5:]:
        ds.add_entity(e)
    ds.make()
    ds.delete_entity(str(entities[2]["id"]))
    ds.flush()
    ds.compact()
    ds.make()
    compacted = ds.compact()
    assert compacted.published and compacted.published["sequence"] == HEAD
    report = ds.verify(deep=True)
    assert report.ok and not report.notes, (report.problems, report.notes)
    return root


def dataset(root: Path) -> Dataset:
    return open_lake(root).dataset(NAME)


# --- where things are ----------------------------------------------------------


def D(root: Path) -> Path:  # noqa: N802 - the dataset folder
    return root / "lake" / NAME


def chain_entry(root: Path, seq: int) -> Path:
    return D(root) / "versions/chain" / f"{seq:010d}.json"


def manifest_path(root: Path, seq: int) -> Path:
    return root / "lake" / json.loads(chain_entry(root, seq).read_text())["path"]


def manifest(root: Path, seq: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(manifest_path(root, seq).read_text())
    return data


def table_dir(table: str) -> str:
    return cv.STATEMENTS_TABLE if table == "statements" else cv.TRANSLOG_TABLE


def head_file(root: Path, table: str, index: int = 0) -> Path:
    rel = manifest(root, HEAD)["tables"][table]["files"][index]["path"]
    return D(root) / table_dir(table) / rel


def old_file(root: Path, table: str) -> Path:
    """A data file of version 1 that later versions replaced (compact)."""
    head = {f["path"] for f in manifest(root, HEAD)["tables"][table]["files"]}
    rel = next(
        f["path"] for f in manifest(root, 1)["tables"][table]["files"] if f["path"] not in head
    )
    return D(root) / table_dir(table) / rel


def log_entry(root: Path, table: str, version: int) -> Path:
    return D(root) / table_dir(table) / "_delta_log" / f"{version:020d}.json"


def graph_file(root: Path, table: str) -> Path:
    entry = next(f for f in manifest(root, HEAD)["graph"]["files"] if f["table"] == table)
    return D(root) / entry["table"] / entry["path"]


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def edit_json(path: Path, change: Callable[[Any], Any]) -> None:
    data = json.loads(path.read_text())
    result = change(data)
    path.write_text(json.dumps(data if result is None else result, indent=1))


def later_tag(root: Path, tag: str) -> None:
    """An export's tag moved past everything (what a rewrite after the head leaves)."""
    path = D(root) / "tags" / cv.LAKEHOUSE_TENANT / tag
    path.write_text((cv.utcnow() + timedelta(hours=1)).isoformat())


def rewrite_manifest(root: Path, seq: int, change: Callable[[dict[str, Any]], None]) -> None:
    """Edit a manifest and re-hash its chain entry (a forger covering their tracks)."""
    path = manifest_path(root, seq)
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    edit_json(chain_entry(root, seq), lambda e: e.update(hash=versions.manifest_hash(data)))


# --- the tampering ---------------------------------------------------------------


def export_edited_with_later_tag(root: Path) -> None:
    flip(D(root) / cv.STATEMENTS_CSV, 200)
    later_tag(root, cv.EXPORTS_STATEMENTS)


def statistics_edited_with_later_tag(root: Path) -> None:
    edit_json(D(root) / cv.STATISTICS_JSON, lambda s: s.update(entity_count=1))
    later_tag(root, cv.EXPORTS_STATISTICS)


def entities_line_dropped(root: Path) -> None:
    path = D(root) / cv.ENTITIES_JSON
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[1:]))
    later_tag(root, cv.EXPORTS_ENTITIES)


def roll_back_head(root: Path) -> None:
    """Remove version 4 everywhere a reader looks, but the Delta commit that anchors it."""
    head = manifest(root, HEAD)
    shutil.rmtree(manifest_path(root, HEAD).parent)
    (D(root) / head["diff"]["path"]).unlink()
    chain_entry(root, HEAD).unlink()
    previous = json.loads(chain_entry(root, HEAD - 1).read_text())
    (D(root) / "versions/latest.json").write_text(json.dumps(previous))
    shutil.copy(manifest_path(root, HEAD - 1).with_name("index.json"), D(root) / "index.json")
    edit_json(
        D(root) / versions.DIFFS / "index.json",
        lambda i: i.update(diffs=[d for d in i["diffs"] if d["sequence"] < HEAD]),
    )
    old = manifest(root, HEAD - 1)

    def catalog(data: dict[str, Any]) -> None:
        data["datasets"][0]["version"] = cv.version_id(datetime.fromisoformat(old["created_at"]))
        data["datasets"][0][versions.LAKEHOUSE_VERSION] = {
            "sequence": HEAD - 1,
            "hash": previous["hash"],
            "logical_hash": old["logical_hash"],
            "published_at": old["created_at"],
            "manifest": previous["path"],
        }

    edit_json(root / "lake" / cv.CATALOG_INDEX, catalog)
    for snapshot in sorted((root / "lake/versions").rglob("index.json"))[-1:]:
        snapshot.unlink()


def forge_name_in_head_file(root: Path) -> None:
    """A value rewritten in the head's statements file (what ``get`` then returns)."""
    path = head_file(root, "statements")
    table = pq.read_table(path)
    values = table.column("value").to_pylist()
    i = table.column("prop").to_pylist().index("name")
    values[i] = "Forged Name"
    index = table.schema.get_field_index("value")
    table = table.set_column(index, table.schema.field(index), pa.array(values, pa.string()))
    pq.write_table(table, path)


def foreign_delete(root: Path, table: str) -> None:
    """A delta-rs ``DeltaTable.delete()`` commit after the head."""
    path = head_file(root, table)
    first = pq.read_table(path, columns=["id"]).column("id")[0].as_py()
    DeltaTable(str(D(root) / table_dir(table))).delete(f"id = '{first}'")


def forge_anchor(root: Path) -> None:
    """A Delta commit anchoring a version 5 the chain does not have."""
    ds = dataset(root)
    commit(
        ds.translog_table,
        [],
        schema=TRANSLOG_SCHEMA,
        metadata={versions.META_HASH: versions.SHA256_PREFIX + "5" * 64, versions.META_SEQUENCE: 5},
    )


def add_data_file_to_head_commit(root: Path) -> None:
    """A copy of a data file added to the head's statements commit."""
    version = manifest(root, HEAD)["tables"]["statements"]["version"]
    source = head_file(root, "statements")
    copy = source.with_name("part-forged.parquet")
    shutil.copy(source, copy)
    rel = str(copy.relative_to(D(root) / cv.STATEMENTS_TABLE))
    log = log_entry(root, "statements", version)
    lines = log.read_text().splitlines()
    add = next(json.loads(line) for line in lines if '"add"' in line)
    add["add"]["path"] = rel
    log.write_text("\n".join([*lines, json.dumps(add)]) + "\n")


def rewrite_delta_tag(root: Path) -> None:
    """The head's hash in the translog's commit metadata replaced."""
    head_hash = versions.manifest_hash(manifest(root, HEAD))
    for log in sorted((D(root) / cv.TRANSLOG_TABLE / "_delta_log").glob("*.json")):
        text = log.read_text()
        if head_hash in text:
            log.write_text(text.replace(head_hash, versions.SHA256_PREFIX + "0" * 64))
            return
    raise AssertionError("no commit carries the head's hash")


def remove_anchor(root: Path) -> None:
    """The translog commit that carries the head's hash removed (the table's last)."""
    head_hash = versions.manifest_hash(manifest(root, HEAD))
    logs = sorted((D(root) / cv.TRANSLOG_TABLE / "_delta_log").glob("*.json"))
    assert head_hash in logs[-1].read_text()
    logs[-1].unlink()


def vacuum(root: Path, hours: int) -> None:
    """A lakehouse vacuum of the statements table (as optimize --vacuum runs it)."""
    from lakehouse_assets.maintenance import _vacuum_table

    _vacuum_table(dataset(root).statements_table, timedelta(hours=hours))


def removed_inside_retention(root: Path) -> None:
    """A replaced file deleted by hand, then a vacuum whose retention still kept it."""
    old_file(root, "statements").unlink()
    vacuum(root, 1000)


def foreign_vacuum(root: Path) -> None:
    """delta-rs's own vacuum (no lakehouse stamp) removing the files compact replaced."""
    table = DeltaTable(str(D(root) / cv.STATEMENTS_TABLE))
    assert table.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)


def swap_manifests(root: Path) -> None:
    one, two = manifest_path(root, 1), manifest_path(root, 2)
    a, b = one.read_bytes(), two.read_bytes()
    one.write_bytes(b)
    two.write_bytes(a)


def graph_generation_dropped(root: Path) -> None:
    """A generation dropped from graph/state.json: lookups then ignore its edges."""
    edit_json(D(root) / cv.GRAPH_STATE, lambda s: s.update(generations=s["generations"][:1]))


def graph_file_list_edited(root: Path) -> None:
    def drop(state: dict[str, Any]) -> None:
        state["files"][cv.GRAPH_BY_TARGET] = state["files"][cv.GRAPH_BY_TARGET][1:]

    edit_json(D(root) / cv.GRAPH_STATE, drop)


def catalog_forged(root: Path) -> None:
    edit_json(
        root / "lake" / cv.CATALOG_INDEX,
        lambda c: c["datasets"][0][versions.LAKEHOUSE_VERSION].update(
            logical_hash=versions.SHA256_PREFIX + "3" * 64
        ),
    )


def catalog_snapshot_forged(root: Path) -> None:
    snapshot = sorted((root / "lake/versions").rglob("index.json"))[0]
    edit_json(
        snapshot,
        lambda c: c["datasets"][0][versions.LAKEHOUSE_VERSION].update(
            hash=versions.SHA256_PREFIX + "4" * 64
        ),
    )


def diff_index_edit(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    return lambda root: edit_json(D(root) / versions.DIFFS / "index.json", change)


def _count_forged(index: dict[str, Any]) -> None:
    index["diffs"][1]["counts"]["ADD"] += 1


def _middle_version_dropped(index: dict[str, Any]) -> None:
    """yente would apply version 1's delta, then 3's: version 2's changes lost."""
    second = next(d for d in index["diffs"] if d["sequence"] == 2)
    del index["versions"][second["version"]]


def _extra_diff(index: dict[str, Any]) -> None:
    index["diffs"].append({**index["diffs"][-1], "sequence": 9})


#: name → (tamper, what one of the problems must say)
TAMPERING: dict[str, tuple[Callable[[Path], None], str]] = {
    # exports and index.json
    "export byte edited": (
        lambda r: flip(D(r) / cv.STATEMENTS_CSV, 200),
        "exports/statements.csv: export differs",
    ),
    "export edited, then its tag moved later": (
        export_edited_with_later_tag,
        "exports/statements.csv: export differs",
    ),
    "statistics edited, then its tag moved later": (
        statistics_edited_with_later_tag,
        "statistics.json: export differs",
    ),
    "entity dropped from entities.ftm.json, tag moved later": (
        entities_line_dropped,
        "entities.ftm.json: export differs",
    ),
    "export truncated": (
        lambda r: (D(r) / cv.ENTITIES_JSON).write_bytes(
            (D(r) / cv.ENTITIES_JSON).read_bytes()[:100]
        ),
        "entities.ftm.json: export differs",
    ),
    "export removed": (
        lambda r: (D(r) / cv.STATISTICS_JSON).unlink(),
        "statistics.json: export is missing",
    ),
    "live index.json edited": (
        lambda r: (D(r) / "index.json").write_text("{}"),
        f"{NAME}/index.json: export differs",
    ),
    "live index.json replaced by an older version's": (
        lambda r: shutil.copy(manifest_path(r, 1).with_name("index.json"), D(r) / "index.json"),
        f"{NAME}/index.json: export differs",
    ),
    "live index.json removed": (
        lambda r: (D(r) / "index.json").unlink(),
        f"{NAME}/index.json: export is missing",
    ),
    "published index.json of an old version edited": (
        lambda r: flip(manifest_path(r, 1).with_name("index.json"), 10),
        "published index.json differs",
    ),
    # the chain
    "whole head version rolled back": (roll_back_head, "versions were removed"),
    "head chain entry removed": (lambda r: chain_entry(r, HEAD).unlink(), "versions were removed"),
    "Delta anchor of a version the chain lacks": (forge_anchor, "versions were removed"),
    "manifest edited": (
        lambda r: manifest_path(r, 2).write_text(
            manifest_path(r, 2)
            .read_text()
            .replace('"live_statements": ', '"live_statements": 1', 1)
        ),
        "version 2: ",
    ),
    "manifest removed": (lambda r: manifest_path(r, 2).unlink(), "manifest is missing"),
    "manifest not JSON": (
        lambda r: manifest_path(r, 3).write_text("{"),
        "manifest is not valid JSON",
    ),
    "manifests reordered": (swap_manifests, "manifest was altered"),
    "chain entry removed": (lambda r: chain_entry(r, 2).unlink(), "sequence gap"),
    "chain entry not JSON": (
        lambda r: chain_entry(r, 2).write_text("["),
        "chain entry is not valid",
    ),
    "unexpected file in the chain": (
        lambda r: (D(r) / "versions/chain/extra.json").write_text("{}"),
        "unexpected file in the chain",
    ),
    "forged parent hash": (
        lambda r: rewrite_manifest(
            r, 3, lambda m: m.update(parent_hash=versions.SHA256_PREFIX + "2" * 64)
        ),
        "parent hash does not match",
    ),
    "sequence number edited": (
        lambda r: rewrite_manifest(r, 2, lambda m: m.update(sequence=7)),
        "manifest says sequence 7",
    ),
    "time moved before the parent": (
        lambda r: rewrite_manifest(
            r, 2, lambda m: m.update(created_at="2001-01-01T00:00:00+00:00")
        ),
        "created before its parent",
    ),
    "head manifest rewritten and re-hashed": (
        lambda r: rewrite_manifest(r, HEAD, lambda m: m["totals"].update(entities=1)),
        "names another manifest",
    ),
    "latest pointer forged": (
        lambda r: edit_json(
            D(r) / "versions/latest.json",
            lambda p: p.update(hash=versions.SHA256_PREFIX + "1" * 64),
        ),
        "points at a manifest the chain does not have",
    ),
    "latest pointer rolled back to the previous version": (
        lambda r: (D(r) / "versions/latest.json").write_text(chain_entry(r, HEAD - 1).read_text()),
        "but the head is 4",
    ),
    "latest pointer removed": (
        lambda r: (D(r) / "versions/latest.json").unlink(),
        "head pointer is missing",
    ),
    # the tables
    "parquet file truncated": (
        lambda r: head_file(r, "statements").write_bytes(
            head_file(r, "statements").read_bytes()[:-100]
        ),
        "data file content differs",
    ),
    "name rewritten in a file compact wrote": (
        forge_name_in_head_file,
        "data file content differs",
    ),
    "head data file removed": (
        lambda r: head_file(r, "statements").unlink(),
        "data file is missing",
    ),
    "replaced data file removed, no vacuum ran": (
        lambda r: old_file(r, "statements").unlink(),
        "data file is missing and no vacuum removed it",
    ),
    "replaced data file removed inside a vacuum's retention": (
        removed_inside_retention,
        "data file is missing and no vacuum removed it",
    ),
    "replaced data files removed by a foreign vacuum": (
        foreign_vacuum,
        "data file is missing and no vacuum removed it",
    ),
    "translog file edited": (
        lambda r: flip(head_file(r, "translog"), 40),
        "data file content differs",
    ),
    "translog file replaced by an older one": (
        lambda r: shutil.copy(old_file(r, "translog"), head_file(r, "translog")),
        "data file content differs",
    ),
    "data file added to a commit": (add_data_file_to_head_commit, "Delta log entry was rewritten"),
    "Delta log entry rewritten": (
        lambda r: log_entry(r, "statements", 0).write_text(
            log_entry(r, "statements", 0)
            .read_text()
            .replace('\\"numRecords\\":', '\\"numRecords\\":1', 1)
        ),
        "Delta log entry was rewritten",
    ),
    "Delta log entry removed": (
        lambda r: log_entry(r, "translog", 1).unlink(),
        "Delta log entry is missing",
    ),
    "Delta commit metadata rewritten": (rewrite_delta_tag, "names another manifest"),
    "Delta commit anchoring the head removed": (remove_anchor, "no Delta commit carries"),
    "foreign delete() on the translog after the head": (
        lambda r: foreign_delete(r, "translog"),
        "was not made by a lakehouse operation",
    ),
    "foreign delete() on the statements after the head": (
        lambda r: foreign_delete(r, "statements"),
        "was not made by a lakehouse operation",
    ),
    # diffs
    "diff edited": (
        lambda r: flip(D(r) / manifest(r, 2)["diff"]["path"], 5),
        "diff differs",
    ),
    "diff removed": (lambda r: (D(r) / manifest(r, 3)["diff"]["path"]).unlink(), "diff is missing"),
    "diff index removed": (
        lambda r: (D(r) / versions.DIFFS / "index.json").unlink(),
        "diff index is missing",
    ),
    "diff index counts forged": (diff_index_edit(_count_forged), "diff index entry differs"),
    "diff index entry removed": (
        diff_index_edit(lambda i: i.update(diffs=i["diffs"][:-1])),
        "diff index lacks the version",
    ),
    "diff index names a version the chain lacks": (
        diff_index_edit(_extra_diff),
        "diff index names a version the chain lacks",
    ),
    "diff index format edited": (
        diff_index_edit(lambda i: i.update(format="entities.ftm.json")),
        "diff index fields differ",
    ),
    "diff index entry's own field edited": (
        diff_index_edit(lambda i: i["diffs"][1].update(parent_sequence=7)),
        "diff index entry differs",
    ),
    "delta index: a version left out of the middle": (
        diff_index_edit(_middle_version_dropped),
        "not the run of versions up to the newest",
    ),
    # the graph index
    "graph state: generation dropped": (graph_generation_dropped, "graph state differs"),
    "graph state: file list edited": (graph_file_list_edited, "graph state differs"),
    "graph state removed": (lambda r: (D(r) / cv.GRAPH_STATE).unlink(), "graph state is missing"),
    "graph index file edited": (
        lambda r: flip(graph_file(r, cv.GRAPH_BY_SOURCE), 30),
        "graph index file differs",
    ),
    "graph index file removed": (
        lambda r: graph_file(r, cv.GRAPH_BY_TARGET).unlink(),
        "graph index file is missing",
    ),
    # the catalog
    "catalog entry forged": (catalog_forged, "catalog names a version"),
    "catalog snapshot forged": (catalog_snapshot_forged, "catalog names a version"),
    "catalog index removed": (
        lambda r: (r / "lake" / cv.CATALOG_INDEX).unlink(),
        "catalog index is missing",
    ),
    "dataset dropped from the catalog": (
        lambda r: edit_json(r / "lake" / cv.CATALOG_INDEX, lambda c: c.update(datasets=[])),
        "catalog does not list",
    ),
}


def test_the_tamper_set_is_large() -> None:
    assert len(TAMPERING) >= 40


@pytest.mark.parametrize("kind", sorted(TAMPERING))
def test_verify_catches_every_kind_of_tampering(published: Path, tmp_path: Path, kind: str) -> None:
    root = tmp_path / "copy"
    shutil.copytree(published, root)
    ds = dataset(root)
    assert ds.verify().ok
    tamper, expected = TAMPERING[kind]
    tamper(root)
    report = ds.verify()
    problems = [str(p) for p in report.problems]
    assert not report.ok, f"{kind} was not detected (notes: {report.notes})"
    assert any(expected in p for p in problems), problems


#: Kinds tried again on the loopback S3 server (the tampered copy uploaded).
S3_KINDS = (
    "",  # nothing tampered: the uploaded copy verifies
    "export edited, then its tag moved later",
    "whole head version rolled back",
    "head data file removed",
    "foreign delete() on the translog after the head",
    "graph state: generation dropped",
    "diff index counts forged",
    "catalog snapshot forged",
    "latest pointer removed",
)


@pytest.mark.parametrize("kind", S3_KINDS)
def test_verify_catches_tampering_on_s3(
    published: Path, tmp_path: Path, s3_settings: Settings, kind: str
) -> None:
    """The same checks through the S3 store: a (tampered) copy uploaded to a bucket."""
    root = tmp_path / "copy"
    shutil.copytree(published, root)
    if kind:
        TAMPERING[kind][0](root)
    lake = Lakehouse(
        f"s3://{make_bucket(s3_settings)}/lake",
        settings=s3_settings,
        journal_url=f"sqlite:///{root / 'journal.sqlite'}",
    )
    for file in sorted((root / "lake").rglob("*")):
        if file.is_file():
            lake.store.put_file(file.relative_to(root / "lake").as_posix(), file)
    report = lake.dataset(NAME).verify()
    problems = [str(p) for p in report.problems]
    if not kind:
        assert report.ok and not report.notes, (problems, report.notes)
        return
    assert any(TAMPERING[kind][1] in p for p in problems), problems


def copy_of(published: Path, tmp_path: Path) -> tuple[Path, Dataset]:
    root = tmp_path / "copy"
    shutil.copytree(published, root)
    return root, dataset(root)


def test_compact_of_a_published_dataset_leaves_every_file_covered(
    published: Path, tmp_path: Path
) -> None:
    """The fixture's last compact published version 4: the head names exactly the
    files the tables read, so a file compact wrote is hashed like any other."""
    _, ds = copy_of(published, tmp_path)
    head = ds.version()
    assert head is not None and head.sequence == HEAD
    assert head.manifest["metadata"] == {"operation": "compact"}
    assert head.manifest["logical_hash"] == manifest_of(ds, HEAD - 1)["logical_hash"]
    assert versions.covers(head, ds.snapshot())


def manifest_of(ds: Dataset, seq: int) -> dict[str, Any]:
    version = ds.version(seq)
    assert version is not None
    return version.manifest


def test_files_a_vacuum_removed_are_no_problem(published: Path, tmp_path: Path) -> None:
    """A vacuum with no retention removes the files compact replaced: verify accepts
    that (its commits are the lakehouse's), and an as-of read names the retention."""
    root, ds = copy_of(published, tmp_path)
    replaced = old_file(root, "statements")
    vacuum(root, 0)
    assert not replaced.exists()
    report = ds.verify()
    assert report.ok, report.problems
    with pytest.raises(versions.VersionExpiredError, match="LAKEHOUSE_VACUUM_RETENTION_HOURS"):
        ds.get_entity(str(sample_entities()[0]["id"]), as_of=1)


def test_make_rewrites_an_export_that_differs_from_its_manifest(
    spark: SparkSession, published: Path, tmp_path: Path
) -> None:
    """A tampered statements.csv with a later tag is not fresh: make writes it again."""
    root, ds = copy_of(published, tmp_path)
    original = (D(root) / cv.STATEMENTS_CSV).read_bytes()
    export_edited_with_later_tag(root)
    (D(root) / "versions/latest.json").unlink()  # and make writes the pointer again
    made = ds.make()
    assert "statements" in made.written
    assert (D(root) / cv.STATEMENTS_CSV).read_bytes() == original
    assert (D(root) / "versions/latest.json").exists()
    report = ds.verify()
    assert report.ok, report.problems


def test_an_as_of_read_of_a_removed_file_blames_no_vacuum(published: Path, tmp_path: Path) -> None:
    """A version's file deleted by hand (no vacuum ever ran): the as-of read says the
    file is missing, not that vacuum's retention was too short."""
    root, ds = copy_of(published, tmp_path)
    entity = str(sample_entities()[0]["id"])
    assert ds.get_entity(entity, as_of=1) is not None
    old_file(root, "statements").unlink()
    with pytest.raises(versions.VersionDamagedError, match="no vacuum removed them"):
        ds.get_entity(entity, as_of=1)


def test_a_flush_after_the_head_is_a_note_and_make_covers_it(
    spark: SparkSession, published: Path, tmp_path: Path
) -> None:
    """Lakehouse commits after the head (a flush not made yet) are named in a note,
    not a problem; the next make publishes them and optimize publishes its merge."""
    root, ds = copy_of(published, tmp_path)
    ds.add_entity({"id": "late", "schema": "Person", "properties": {"name": ["Late Comer"]}})
    ds.flush()
    report = ds.verify()
    assert report.ok, report.problems
    assert any("not published yet" in n for n in report.notes), report.notes
    # an unpublished file is held to the size its (lakehouse) commit recorded
    forged = tmp_path / "forged"
    shutil.copytree(root, forged)
    head = ds.version()
    assert head is not None
    named = {f["path"] for f in head.manifest["tables"]["translog"]["files"]}
    new = next(f for f in ds.snapshot().translog.files if f.path not in named)
    target = D(forged) / cv.TRANSLOG_TABLE / new.path
    target.write_bytes(target.read_bytes()[:-10])
    problems = [str(p) for p in dataset(forged).verify().problems]
    assert any("size differs from its commit" in p for p in problems), problems
    ds.make()
    optimized = ds.optimize()
    assert optimized.files_removed and optimized.published, optimized.as_dict()
    head = ds.version()
    assert head is not None and versions.covers(head, ds.snapshot())
    report = ds.verify(deep=True)
    assert report.ok and not report.notes, (report.problems, report.notes)


def test_a_graph_rebuild_after_the_head_is_a_note(published: Path, tmp_path: Path) -> None:
    """The graph index rebuilt by its own commits after the head: not published yet
    (a note), where the same state.json edited by hand is a problem."""
    from lakehouse_assets import graph

    root, ds = copy_of(published, tmp_path)
    graph.rebuild(ds)
    report = ds.verify()
    assert report.ok, report.problems
    assert any("graph index was updated after version" in n for n in report.notes), report.notes
