"""Incremental exports and the change feed they read (issue 34).

An export after a small flush is built from the last export and the flush's
change feed; it must be byte for byte what a forced full pass writes for the
same snapshot. Where the feed has a gap (a compaction, a flush that died
between its translog and feed commits, a lake without a feed) the export
takes its full path and says why; a crash at the incremental pass's fault
points, then a rerun, gives the same bytes.
"""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lakehouse_assets import conventions as cv
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets.tables.feed import changes_between, statements_changed
from lakehouse_assets_tests.conftest import make_bucket, sample_entities
from lakehouse_assets_tests.helpers.crash import crash

THREE = ["statements", "entities", "statistics"]
FILES = (cv.STATEMENTS_CSV, cv.ENTITIES_JSON, cv.STATISTICS_JSON)


def exported(ds: Dataset) -> dict[str, bytes]:
    return {p: ds.store.read_bytes(cv.dataset_path(ds.name, p)) for p in FILES}


def rebuilt(ds: Dataset) -> dict[str, bytes]:
    """What a forced full pass writes for the current snapshot."""
    result = ds.export(THREE, force=True)
    assert result.mode == "full" and result.reason == "forced"
    return exported(ds)


def entity(entity_id: str, name: str, *, country: str | None = None) -> dict[str, Any]:
    props: dict[str, list[str]] = {"name": [name]}
    if country:
        props["country"] = [country]
    return {"id": entity_id, "schema": "Person", "properties": props}


def wait_for_the_next_second() -> None:
    """Until the clock's whole second is later than every seen time written so far."""
    start = datetime.now(UTC).replace(microsecond=0)
    while datetime.now(UTC).replace(microsecond=0) <= start:
        time.sleep(0.01)


@pytest.fixture
def ds(tmp_path: Path) -> Dataset:
    lake = Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{tmp_path / 'journal.sqlite'}")
    ds = lake.create_dataset("incr")
    for e in sample_entities()[:6]:
        ds.add_entity(e, origin="crawl")
    ds.add_entity(entity("p-zz", "Zed Last", country="de"), origin="crawl")
    ds.flush()
    first = ds.export(THREE)
    assert first.mode == "full"
    assert first.reason is not None and "no export state" in first.reason
    return ds


def test_small_change_is_incremental_and_byte_identical(spark: Any, ds: Dataset) -> None:
    base = sample_entities()
    ds.add_entity(entity("p-aa", "Anna First", country="fr"), origin="crawl")  # new, sorts first
    ds.add_entity(entity("p-mm", "Mia Middle"), origin="enrich")  # new, a second origin
    changed = {**base[1], "properties": {**base[1]["properties"], "notes": ["one more"]}}
    ds.add_entity(changed, origin="crawl")  # re-written with one more value
    ds.delete_entity(str(base[2]["id"]))  # deleted
    ds.delete_entity("p-zz")  # the last entity of the files
    flushed = ds.flush()
    changes = changes_between(
        ds.changes_table, ds.translog_table, flushed.translog_version - 1, flushed.translog_version
    )
    assert changes.gap is None
    assert {"p-aa", "p-mm", "p-zz", str(base[1]["id"]), str(base[2]["id"])} <= set(changes.entities)
    result = ds.export(THREE)
    assert result.mode == "incremental", result.reason
    written = result.written["statements"]
    assert written["mode"] == "incremental" and written["entities_touched"] == len(changes.entities)
    assert written["bytes_carried"] > 0
    incremental = exported(ds)
    assert b"p-zz" not in incremental[cv.ENTITIES_JSON]
    assert incremental == rebuilt(ds)
    # an incremental export from the state a full pass left, and one from an incremental one
    ds.add_entity(entity("p-zz", "Zed Back", country="de"), origin="crawl")  # deleted, re-added
    ds.flush()
    # index.json publishes a version: a translog commit that changes no data
    assert ds.export([*THREE, "index"]).mode == "incremental"
    ds.delete_entity("p-aa")
    ds.flush()
    assert ds.export(THREE).mode == "incremental"
    incremental = exported(ds)
    assert incremental == rebuilt(ds)


def test_the_feed_names_the_statements_whose_translog_rows_changed(spark: Any, ds: Dataset) -> None:
    """:func:`statements_changed` (what the graph index's update reads instead of
    every rewritten translog file's tombstones) is exactly the statements whose
    translog rows differ between two versions, read whole here; None on a gap
    or past its limit."""
    from deltalake import DeltaTable

    def translog_rows(version: int) -> set[tuple[Any, ...]]:
        rows = DeltaTable(ds.translog_table.uri, version=version).to_pyarrow_table()
        names = ["origin", "id", "first_seen", "last_seen", "deleted_at"]
        return set(zip(*(rows.column(n).to_pylist() for n in names), strict=True))

    since = ds.snapshot().translog.version
    assert since is not None
    base = sample_entities()
    ds.add_entity(entity("p-aa", "Anna First", country="fr"), origin="crawl")
    ds.add_entity({**base[1], "properties": {"notes": ["one more"]}}, origin="enrich")
    ds.delete_entity(str(base[2]["id"]))
    ds.flush()
    # seen times have one-second resolution: a statement written again in the
    # second it was stored keeps its translog row, though the feed names it
    wait_for_the_next_second()
    ds.add_entity(entity("p-zz", "Zed Again"), origin="crawl")  # re-seen: its range moves
    until = ds.flush().translog_version
    changed = statements_changed(ds.changes_table, ds.translog_table, since, until, limit=10**6)
    assert changed is not None and changed.num_rows > 0
    before, after = translog_rows(since), translog_rows(until)
    differ = {(r[0], r[1]) for r in before ^ after}
    keys = zip(changed.column("origin").to_pylist(), changed.column("id").to_pylist(), strict=True)
    assert set(keys) == differ
    ids = set(changed.column("canonical_id").to_pylist())
    assert {"p-aa", "p-zz", str(base[1]["id"]), str(base[2]["id"])} <= ids
    assert (
        statements_changed(
            ds.changes_table, ds.translog_table, since, until, limit=changed.num_rows - 1
        )
        is None
    )
    ds.delete_entity("p-aa")
    ds.flush()
    assert ds.compact().removed_translog > 0  # a version the feed does not cover
    after_compact = ds.snapshot().translog.version
    assert (
        statements_changed(ds.changes_table, ds.translog_table, until, after_compact, limit=10**6)
        is None
    )


def test_a_gap_in_the_feed_takes_the_full_path_and_says_why(spark: Any, ds: Dataset) -> None:
    ds.add_entity(entity("p-aa", "Anna First"), origin="crawl")
    ds.delete_entity("p-zz")
    ds.flush()
    # a translog version the feed does not cover (a compaction with nothing dead
    # to drop commits nothing: no gap)
    assert ds.compact().removed_translog > 0
    result = ds.export(THREE)
    assert result.mode == "full"
    assert result.reason is not None and "not in the change feed" in result.reason
    assert result.written["entities"]["reason"] == result.reason
    assert exported(ds) == rebuilt(ds)
    # a lake whose feed is gone (an older lake): full, and said so
    ds.add_entity(entity("p-bb", "Bob"), origin="crawl")
    ds.flush()
    changes = ds.store.full_uri(cv.dataset_path(ds.name, cv.CHANGES_TABLE))
    import shutil

    shutil.rmtree(changes)
    result = ds.export(THREE)
    assert result.mode == "full" and "no change feed" in str(result.reason)


def test_a_state_that_does_not_match_the_files_takes_the_full_path(spark: Any, ds: Dataset) -> None:
    path = cv.dataset_path(ds.name, cv.ENTITIES_JSON)
    data = ds.store.read_bytes(path)
    ds.store.write_bytes(path, data.replace(b'"Person"', b'"PERSON"', 1))  # same size
    ds.add_entity(entity("p-aa", "Anna First"), origin="crawl")
    ds.flush()
    result = ds.export(THREE)
    assert result.mode == "full"
    assert "is not the file the export state describes" in str(result.reason)
    assert exported(ds) == rebuilt(ds)


@pytest.mark.parametrize("point", ["export.after_splice", "export.before_state"])
def test_a_crash_in_the_incremental_pass_then_a_rerun_gives_the_same_bytes(
    spark: Any, ds: Dataset, point: str
) -> None:
    ds.add_entity(entity("p-aa", "Anna First"), origin="crawl")
    ds.delete_entity(str(sample_entities()[0]["id"]))
    ds.flush()
    assert crash(ds, "export_incremental", point)  # killed in the incremental pass
    result = ds.export(THREE)
    assert result.mode in ("incremental", "full")
    after = exported(ds)
    assert after == rebuilt(ds)


def test_a_crash_between_the_translog_and_the_feed_is_a_gap(spark: Any, ds: Dataset) -> None:
    ds.add_entity(entity("p-aa", "Anna First"), origin="crawl")
    assert crash(ds, "flush", "flush.before_changes_commit")
    ds.flush()  # the rerun: its own translog version is in the feed, the dead one's not
    result = ds.export(THREE)
    assert result.mode == "full" and "not in the change feed" in str(result.reason)
    assert exported(ds) == rebuilt(ds)
    ds.add_entity(entity("p-bb", "Bob"), origin="crawl")
    ds.flush()
    assert ds.export(THREE).mode == "incremental"
    assert exported(ds) == rebuilt(ds)


def test_incremental_on_an_s3_lake(spark: Any, s3_settings: Settings, tmp_path: Path) -> None:
    lake = Lakehouse(
        f"s3://{make_bucket(s3_settings)}/lake",
        settings=s3_settings,
        journal_url=f"sqlite:///{tmp_path / 'journal.sqlite'}",
    )
    ds = lake.create_dataset("incr_s3")
    for e in sample_entities()[:5]:
        ds.add_entity(e, origin="crawl")
    assert ds.export(THREE).mode == "full"
    ds.add_entity(entity("p-aa", "Anna First", country="fr"), origin="enrich")
    ds.delete_entity(str(sample_entities()[3]["id"]))
    result = ds.export(THREE)
    assert result.mode == "incremental", result.reason
    assert exported(ds) == rebuilt(ds)


@pytest.fixture
def diffs_from_lines(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, int]]:
    """The counts of each version diff made from an incremental export's lines
    (the real :func:`diff_from_lines`, recorded), not read from the tables."""
    from lakehouse_assets.versions import publishing

    made: list[dict[str, int]] = []
    real = publishing.diff_from_lines

    def from_lines(*args: Any) -> dict[str, int]:
        made.append(real(*args))
        return made[-1]

    monkeypatch.setattr(publishing, "diff_from_lines", from_lines)
    return made


def test_the_version_diff_of_an_incremental_export_is_the_tables_diff(
    spark: Any, ds: Dataset, diffs_from_lines: list[dict[str, int]]
) -> None:
    """An incremental export has the changed entities' lines before and after in
    hand: the version's diff is made from them, and holds the changes the tables
    give (:func:`versions.render_diff`), each entity as its line in the export."""
    import io

    import orjson

    from lakehouse_assets import versions
    from lakehouse_assets.journal import bucket_of

    made = diffs_from_lines
    ds.export(["index"])  # version 1: the first export
    base = sample_entities()
    ds.add_entity(entity("p-aa", "Anna First", country="fr"), origin="crawl")  # ADD
    changed = {**base[1], "properties": {**base[1]["properties"], "notes": ["one more"]}}
    ds.add_entity(changed, origin="crawl")  # MOD
    ds.delete_entity(str(base[2]["id"]))  # DEL
    ds.add_entity(base[3], origin="crawl")  # written again as it was: its seen range moves
    result = ds.export([*THREE, "index"])
    assert result.mode == "incremental", result.reason
    diff = result.written["index"]["version"]["diff"]
    ops = [
        orjson.loads(line)
        for line in ds.store.read_bytes(cv.dataset_path(ds.name, diff["path"])).splitlines()
    ]
    old, new = (versions.snapshot_at(ds, v) for v in ds.versions()[-2:])
    tables = io.BytesIO()
    counts = versions.render_diff(ds, old, new, tables)
    from_tables = [orjson.loads(line) for line in tables.getvalue().splitlines()]
    assert made == [diff["counts"]]  # made from the lines
    assert diff["counts"] == counts and counts["ADD"] == counts["DEL"] == 1
    assert [(o["op"], o["entity"]["id"]) for o in ops] == [
        (o["op"], o["entity"]["id"]) for o in from_tables
    ]
    ids = [o["entity"]["id"] for o in ops]
    assert ids == sorted(ids, key=lambda i: (bucket_of(i), i))
    lines = {
        e["id"]: e
        for e in map(
            orjson.loads,
            ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON)).splitlines(),
        )
    }
    for op in ops:
        if op["op"] != "DEL":
            assert op["entity"] == lines[op["entity"]["id"]]
        else:
            assert op["entity"]["id"] == str(base[2]["id"]) and op["entity"]["id"] not in lines


def test_the_diff_is_made_from_the_lines_after_a_forced_export_of_the_published_snapshot(
    spark: Any, ds: Dataset, diffs_from_lines: list[dict[str, int]]
) -> None:
    """A version's publish leaves a translog commit that changes no data, so an
    export pinned after it (``export --force`` right after ``make``) starts the
    next incremental export's lines one translog version past the parent
    version's snapshot: same content, and the diff is still made from the lines
    (it was read from the tables). An export without a version between leaves
    a state no version covers: not trusted, the tables give the diff."""
    import io

    from lakehouse_assets import versions

    made = diffs_from_lines
    base = sample_entities()
    ds.export(["index"])  # version 1
    published = versions.snapshot_at(ds, ds.versions()[-1])
    rebuilt(ds)  # a forced full pass, pinned after version 1's translog commit
    assert ds.snapshot().versions != published.versions
    assert ds.snapshot().content_key == published.content_key
    ds.add_entity(entity("p-ab", "Abel New", country="fr"), origin="crawl")
    ds.delete_entity(str(base[2]["id"]))
    result = ds.export([*THREE, "index"])  # version 2
    assert result.mode == "incremental", result.reason
    counts = result.written["index"]["version"]["diff"]["counts"]
    assert made == [counts]
    old, new = (versions.snapshot_at(ds, v) for v in ds.versions()[-2:])
    assert versions.render_diff(ds, old, new, io.BytesIO()) == counts
    assert counts == {"ADD": 1, "MOD": 0, "DEL": 1}

    # an export no version published: its state is covered by no version, so the
    # next export does not trust it (a full pass, issue 52) and the tables give the diff
    ds.add_entity(entity("p-ac", "Acton Newer"), origin="crawl")
    assert ds.export(THREE).mode == "incremental"  # no version: the state moves on
    ds.delete_entity("p-ab")
    result = ds.export([*THREE, "index"])  # version 3, from version 2
    assert result.mode == "full" and "not the one version 2 recorded" in str(result.reason)
    assert len(made) == 1
    assert result.written["index"]["version"]["diff"]["counts"] == {"ADD": 1, "MOD": 0, "DEL": 1}
    # and the state that version covers is trusted again
    ds.add_entity(entity("p-ad", "Adda Newest"), origin="crawl")
    assert ds.export([*THREE, "index"]).mode == "incremental"


def test_an_entity_deleted_twice_before_a_flush_leaves_the_incremental_export(
    spark: Any, ds: Dataset
) -> None:
    """A delete reads the entity's live statements from the table and the journal;
    the table still holds them after a first delete, so a second one before the
    flush writes their tombstones again. The reduced statement must keep its
    entity's canonical id (from a tombstone: it has no live event), or the change
    feed would not name the entity and the incremental export would keep it.
    Found by the thorough profile of ``test_properties_incremental``."""
    from lakehouse_assets.tables.feed import changes_between

    gone = str(sample_entities()[1]["id"])
    assert ds.delete_entity(gone) > 0
    assert ds.delete_entity(gone) > 0  # the same tombstones again
    flushed = ds.flush()
    assert flushed.tombstones > 0
    changes = changes_between(
        ds.changes_table, ds.translog_table, flushed.translog_version - 1, flushed.translog_version
    )
    assert gone in changes.entities
    result = ds.export(THREE)
    assert result.mode == "incremental", result.reason
    incremental = exported(ds)
    assert f'"id":"{gone}"'.encode() not in incremental[cv.ENTITIES_JSON]
    assert incremental == rebuilt(ds)


def test_a_splice_carries_old_bytes_by_the_kernel_or_by_writes_alike(tmp_path: Path) -> None:
    """The bytes an incremental export carries over from the old file go by
    ``copy_file_range`` where the old file is a local file (a write from Python
    cost 8-10 s of 2.7 GB at 10M statements) and by writes otherwise (an S3
    stream): the same new file either way, lines and carried ranges in order."""
    import io

    from lakehouse_assets.incremental import _NewFile, _pump

    old = bytes(range(256)) * 4099  # ~1 MB, odd-sized
    (tmp_path / "old").write_bytes(old)
    ranges = [(0, 10), (300, 70_000), (70_000, 70_001), (500_000, len(old))]

    def splice(src: Any, name: str) -> tuple[bytes, bool]:
        digest_old, digest_new = hashlib.sha256(), hashlib.sha256()
        with open(tmp_path / name, "wb") as file:
            out = _NewFile(file, src)
            kernel = out.src_fd is not None
            position = 0
            for number, (start, end) in enumerate(ranges):
                out.write(f"line {number}\n".encode())
                _pump(src, start - position, digest_old)
                _pump(src, end - start, digest_old, out, digest_new, at=start)
                position = end
            file.flush()
        return (tmp_path / name).read_bytes(), kernel

    with open(tmp_path / "old", "rb") as src:
        by_kernel, kernel = splice(src, "kernel")
    by_writes, written = splice(io.BufferedReader(io.BytesIO(old)), "writes")  # type: ignore[arg-type]
    assert kernel and not written
    expected = b"".join(f"line {n}\n".encode() + old[a:b] for n, (a, b) in enumerate(ranges))
    assert by_kernel == expected == by_writes
