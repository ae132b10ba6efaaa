"""Flush: journal → Delta statements (by origin) + translog, on real Spark and delta-rs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse_assets import conventions as cv
from lakehouse_assets.flush import needs_flush, plan_batches
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets.tables.snapshot import Snapshot
from lakehouse_assets_tests.conftest import examples, run_python, sample_entities
from lakehouse_assets_tests.helpers.data import table_rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: the data-plane group: ``make test`` runs it with Spark Connect and in process
#: the flush in every Spark mode: Connect, the default local[*] in process, the cluster
pytestmark = [pytest.mark.spark_modes, pytest.mark.local_mode]


@pytest.mark.spark_free
def test_plan_batches_groups_buckets_up_to_the_row_budget() -> None:
    assert plan_batches([(0, 5), (1, 5), (2, 5), (7, 20)], 10) == [[0, 1], [2], [7]]
    assert plan_batches([], 10) == []
    assert plan_batches([(3, 50)], 10) == [[3]]  # a bucket never splits
    # a remainder under a quarter of a batch joins the one before
    assert plan_batches([(0, 10), (1, 10), (2, 2)], 20) == [[0, 1, 2]]
    assert plan_batches([(0, 10), (1, 10), (2, 5)], 20) == [[0, 1], [2]]


def test_flush_new_duplicate_and_tombstone(spark: SparkSession, lake: Lakehouse) -> None:
    ds = lake.create_dataset("flushing")
    entities = sample_entities()
    written = sum(ds.add_entity(e, origin="import") for e in entities)
    assert needs_flush(ds)

    first = ds.flush()
    assert first.new == written and first.duplicates == 0 and first.tombstones == 0
    assert ds.journal.count(ds.name) == 0
    assert not needs_flush(ds)
    rows = table_rows(ds)
    assert len(rows) == written and {r["origin"] for r in rows} == {"import"}
    assert len({r["id"] for r in rows}) == written
    log = table_rows(ds, "translog")
    assert len(log) == written and all(r["deleted_at"] is None for r in log)
    tags = ds.core_tags
    assert tags.get(cv.JOURNAL_LAST_FLUSHED) is not None
    updated = tags.get(cv.STATEMENTS_LAST_UPDATED)
    assert updated is not None

    # the same entities again: duplicates only, the main table does not grow
    again = sum(ds.add_entity(e, origin="import") for e in entities)
    person = next(e for e in entities if e["schema"] == "Person")
    removed = ds.delete_entity(str(person["id"]))
    assert removed > 0  # found in the Delta table, not only in the journal
    second = ds.flush()
    assert second.new == 0
    assert second.tombstones == removed
    assert second.duplicates == again - removed
    # the person's statements were written, then deleted before this flush: each
    # write is superseded by its delete, and every journal row is counted once
    assert second.superseded == removed and second.ignored_tombstones == 0
    parts = ("new", "duplicates", "tombstones", "superseded", "ignored_tombstones")
    assert sum(getattr(second, p) for p in parts) == second.journal_rows == again + removed
    assert len(table_rows(ds)) == written
    log = {(r["origin"], r["id"]): r for r in table_rows(ds, "translog")}
    dead = [r for r in log.values() if r["deleted_at"] is not None]
    assert len(dead) == removed
    assert tags.get(cv.STATEMENTS_LAST_UPDATED) > updated  # type: ignore[operator]

    # an empty flush: last_flushed moves, statements/last_updated does not
    before = tags.get(cv.STATEMENTS_LAST_UPDATED)
    flushed_before = tags.get(cv.JOURNAL_LAST_FLUSHED)
    third = ds.flush()
    assert third.new == 0 and third.journal_rows == 0
    assert tags.get(cv.STATEMENTS_LAST_UPDATED) == before
    assert tags.get(cv.JOURNAL_LAST_FLUSHED) > flushed_before  # type: ignore[operator]

    # written and deleted before its first flush: nothing stored, the delete ignored
    passing = {"id": "passing", "schema": "Person", "properties": {"name": ["Brief"]}}
    brief = ds.add_entity(passing)
    assert ds.delete_entity("passing") == brief
    fourth = ds.flush()
    assert (fourth.new, fourth.tombstones, fourth.duplicates) == (0, 0, 0)
    assert fourth.superseded == fourth.ignored_tombstones == brief
    assert fourth.journal_rows == 2 * brief and ds.get_entity("passing") is None

    # deleted statements are gone from reads
    assert ds.get_entity(str(person["id"])) is None
    assert ds.get_entity(str(entities[0]["id"])) is not None or entities[0] is person


def test_a_journal_the_tasks_cannot_open_is_read_on_the_driver(
    spark: SparkSession, local_lake: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Spark Connect server on another machine cannot open a SQLite journal
    file: the driver reads and reduces the claimed rows and stages them. Both
    ways give the same tables and the same counts, for a first flush (nothing
    stored: its tombstones are counted without a Spark job) and a later one."""
    from lakehouse_assets.spark import journal_source

    def write_and_delete(ds) -> None:  # type: ignore[no-untyped-def]
        for entity in sample_entities():
            ds.add_entity(entity, origin="import")
        ds.add_entity({"id": "passing", "schema": "Person", "properties": {"name": ["Brief"]}})
        ds.delete_entity("passing")

    def counts(result) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
        parts = ("new", "duplicates", "tombstones", "superseded", "ignored_tombstones")
        return tuple(getattr(result, p) for p in parts) + (result.journal_rows,)

    def content(ds) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
        """Each stored statement (ids hash the dataset's name) and whether it is live."""
        keys = ("origin", "canonical_id", "schema", "prop", "value")
        stored = {r["id"]: tuple(r[k] for k in keys) for r in table_rows(ds)}
        log = {r["id"]: r["deleted_at"] is None for r in table_rows(ds, "translog")}
        assert set(log) == set(stored)
        return sorted((*stored[i], log[i]) for i in stored)

    # a batch this small is read on the driver anyway (flush_driver_rows): have
    # the tasks read it, as they read larger ones
    monkeypatch.setattr(local_lake.settings, "flush_driver_rows", 0)
    tasks, driver = local_lake.create_dataset("tasks"), local_lake.create_dataset("driver")
    results: dict[str, list[tuple[int, ...]]] = {"tasks": [], "driver": []}
    for ds in (tasks, driver):
        if ds is driver:
            # (the flush imports it where it reads the journal: patched at its source)
            monkeypatch.setattr(journal_source, "reachable", lambda *_: False)
        write_and_delete(ds)
        results[ds.name].append(counts(ds.flush()))
        person = next(e for e in sample_entities() if e["schema"] == "Person")
        ds.add_entity(sample_entities()[0], origin="import")
        ds.delete_entity(str(person["id"]))
        results[ds.name].append(counts(ds.flush()))
    assert results["tasks"] == results["driver"]
    first, second = results["tasks"]
    assert first[0] > 0 and first[4] > 0  # new, and the brief entity's ignored tombstones
    assert second[1] > 0 and second[2] > 0  # duplicates and tombstones of stored statements
    assert content(tasks) == content(driver)


def test_a_small_batch_is_read_by_the_driver_a_larger_one_by_tasks(
    spark: SparkSession, local_lake: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's tasks reading the journal start Python workers (seconds on a cold
    session); a batch of at most ``flush_driver_rows`` journal rows (a daily
    change) is read and reduced by the driver instead, the same rows either way.
    A larger first batch (nothing stored in its buckets) is read by Spark's tasks,
    or, where Spark would be a JVM of this process, by the flush's own worker
    processes (issue 49: no Spark job follows it)."""
    from lakehouse_assets.flush import spark_batch
    from lakehouse_assets.spark import journal_source
    from lakehouse_assets.spark.session import in_this_process

    used: list[str] = []
    real, real_stage = journal_source.journal_frame, spark_batch.stage_batch

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        used.append("tasks")
        return real(*args, **kwargs)

    def staged(*args, **kwargs):  # type: ignore[no-untyped-def]
        used.append("workers")
        return real_stage(*args, **kwargs)

    monkeypatch.setattr(journal_source, "journal_frame", counted)
    monkeypatch.setattr(spark_batch, "stage_batch", staged)
    small, large = local_lake.create_dataset("small"), local_lake.create_dataset("large")
    rows = {
        ds.name: sum(ds.add_entity(e, origin="a") for e in sample_entities())
        for ds in (small, large)
    }
    assert (
        local_lake.settings.flush_driver_rows > 0
        and rows["small"] <= local_lake.settings.flush_driver_rows
    )
    assert small.flush().new == rows["small"] and used == []
    monkeypatch.setattr(local_lake.settings, "flush_driver_rows", rows["large"] - 1)
    readers = "workers" if in_this_process(local_lake.settings) else "tasks"
    assert large.flush().new == rows["large"] and used == [readers]
    assert len(table_rows(small)) == len(table_rows(large))


def test_flush_in_many_batches_equals_one_batch(
    spark: SparkSession, local_lake: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches, and tasks within a batch (a task reads at most ``TASK_ROWS``
    journal rows, whole buckets), cut the work, never the result."""
    from lakehouse_assets.flush import spark_batch
    from lakehouse_assets.spark import journal_source

    one = local_lake.create_dataset("one_batch")
    many = local_lake.create_dataset("many_batches")
    tasks = local_lake.create_dataset("many_tasks")
    for ds in (one, many, tasks):
        for e in sample_entities():
            ds.add_entity(e, origin="a")
        ds.add_entity(sample_entities()[0], origin="b")  # same statements, other origin
    r1 = one.flush()
    r2 = many.flush(batch_rows=10)
    assert r1.batches == 1 and r2.batches > 3
    assert r1.new == r2.new
    monkeypatch.setattr(spark_batch, "TASK_ROWS", 3)
    monkeypatch.setattr(local_lake.settings, "flush_driver_rows", 0)  # tasks read it
    staged: list[int] = []
    real, real_stage = journal_source.journal_frame, spark_batch.stage_batch

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        frame, rows, deleted, files = real(*args, **kwargs)
        staged.append(len(frame.inputFiles()))
        return frame, rows, deleted, files

    def by_workers(*args, **kwargs):  # type: ignore[no-untyped-def]
        files = real_stage(*args, **kwargs)  # (a first batch, Spark in this process)
        staged.append(len(files))
        return files

    monkeypatch.setattr(journal_source, "journal_frame", counted)
    monkeypatch.setattr(spark_batch, "stage_batch", by_workers)
    r3 = tasks.flush()
    assert r3.batches == 1 and r3.new == r1.new
    assert staged and staged[0] > 3  # one staged file per task (or worker's range)

    # statement ids hash the dataset name: compare everything else
    def content(ds):  # type: ignore[no-untyped-def]
        skip = ("id", "dataset", "first_seen", "last_seen")
        rows = [{k: v for k, v in r.items() if k not in skip} for r in table_rows(ds)]
        return sorted(rows, key=lambda r: (r["origin"], r["canonical_id"], r["prop"], r["value"]))

    assert content(one) == content(many) == content(tasks)
    assert table_rows(one, "translog") and {r["origin"] for r in table_rows(many)} == {"a", "b"}


def test_tombstone_before_flush_never_reaches_the_table(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    ds = local_lake.create_dataset("early_delete")
    entity = sample_entities()[0]
    n = ds.add_entity(entity)
    assert ds.delete_entity(str(entity["id"])) == n
    result = ds.flush()
    assert result.new == 0 and result.journal_rows == 2 * n
    assert table_rows(ds) == [] and table_rows(ds, "translog") == []
    # written again after the delete: live again
    ds.add_entity(entity)
    assert ds.flush().new == n
    assert ds.get_entity(str(entity["id"])) is not None


def test_rewrite_after_delete_revives_and_keeps_first_seen(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    ds = local_lake.create_dataset("revive")
    entity = sample_entities()[0]
    n = ds.add_entity(entity)
    ds.flush()
    first = {r["id"]: r["first_seen"] for r in table_rows(ds, "translog")}
    ds.delete_entity(str(entity["id"]))
    ds.flush()
    assert ds.get_entity(str(entity["id"])) is None
    ds.add_entity(entity)
    result = ds.flush()
    assert result.new == 0 and result.duplicates == n
    log = table_rows(ds, "translog")
    assert all(r["deleted_at"] is None for r in log)
    assert {r["id"]: r["first_seen"] for r in log} == first
    assert ds.get_entity(str(entity["id"])) is not None


def test_tables_are_standard_delta_for_other_readers(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    ds = local_lake.create_dataset("readers")
    for e in sample_entities():
        ds.add_entity(e, origin="mapping:0af3.v1")
    n = ds.flush().new
    table = DeltaTable(ds.statements_table.uri)
    assert table.metadata().partition_columns == ["origin"]
    data = pa.table(table.to_pyarrow_dataset().to_table())
    assert data.num_rows == n and set(data.column("origin").to_pylist()) == {"mapping:0af3.v1"}
    files = [f.uri for f in Snapshot.load(ds.statements_table).files]
    count = duckdb.sql(f"SELECT count(DISTINCT id) FROM read_parquet({files!r})").fetchone()
    assert count == (n,)
    assert DeltaTable(ds.translog_table.uri).to_pyarrow_dataset().count_rows() == n


# --- the reduce of a batch of journal events (Arrow, no Spark) ------------------------


def reference_reduce(
    events: list[dict[str, object]],
) -> dict[tuple[object, object], dict[str, object]]:
    """The rule, spelled out: per (origin, id), columns of the first live event
    (of the first event when none is live), the earliest first_seen, the latest last_seen, the last event's deleted_at,
    the tenant and write of the first and of the last event."""
    out: dict[tuple[object, object], dict[str, object]] = {}
    for event in sorted(events, key=lambda e: e["seq"]):  # type: ignore[arg-type, return-value]
        key = (event["origin"], event["id"])
        row = out.setdefault(
            key,
            {
                "first_seen": None,
                "last_seen": None,
                "first_tenant": event["tenant"],
                "first_write": event["write_id"],
            },
        )
        columns = ("schema", "value", "canonical_id", "lang")
        if "value" not in row or (event["deleted_at"] is None and not row.get("_live")):
            row.update({c: event[c] for c in columns})
            row["_live"] = event["deleted_at"] is None
        fs, ls = event["first_seen"], event["last_seen"]
        row["first_seen"] = fs if row["first_seen"] is None else min(row["first_seen"], fs)  # type: ignore[type-var]
        row["last_seen"] = ls if row["last_seen"] is None else max(row["last_seen"], ls)  # type: ignore[type-var]
        row["deleted_at"] = event["deleted_at"]
        row["last_tenant"], row["last_write"] = event["tenant"], event["write_id"]
    return out


@pytest.mark.spark_free
@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),  # origin
            st.sampled_from(["s1", "s2", "s3", "s4"]),  # statement id
            st.sampled_from(["Person", "LegalEntity"]),  # schema (may differ per event)
            st.booleans(),  # tombstone?
            st.integers(0, 9),  # seen time
            st.sampled_from(["alice", "bob"]),  # tenant
            st.integers(0, 3),  # write (several events may share one)
        ),
        min_size=1,
        max_size=30,
    ),
    st.randoms(),
)
def test_reduce_events_follows_the_rule(
    raw: list[tuple[str, str, str, bool, int, str, int]], rnd: Any
) -> None:
    from lakehouse_assets.journal import EVENTS_SCHEMA
    from lakehouse_assets.reduce import REDUCED_SCHEMA, reduce_events

    events = []
    for seq, (origin, sid, schema, tomb, t, tenant, write) in enumerate(raw):
        ts = f"2026-01-01T00:00:0{t}"
        events.append(
            {
                "seq": seq,
                "dataset": "d",
                "bucket": 3,
                "origin": origin,
                "canonical_id": f"e-{sid}",
                "entity_id": f"e-{sid}",
                "id": sid,
                "prop": "name",
                "prop_type": "name",
                "schema": schema,
                "value": f"v-{schema}",
                "lang": None,
                "original_value": None,
                "external": False,
                "first_seen": ts,
                "last_seen": ts,
                "deleted_at": ts if tomb else None,
                "tenant": tenant,
                "write_id": f"20260101T00000{write}Z-{tenant}",
            }
        )
    shuffled = list(events)
    rnd.shuffle(shuffled)  # the journal hands rows in no particular order
    got = reduce_events(pa.Table.from_pylist(shuffled, schema=EVENTS_SCHEMA))
    assert got.schema == REDUCED_SCHEMA
    rows = {(r["origin"], r["id"]): r for r in got.to_pylist()}
    want = reference_reduce(events)
    assert set(rows) == set(want) and got.num_rows == len(want)
    for key, expected in want.items():
        for column, value in expected.items():
            if column != "_live":
                assert rows[key][column] == value, (key, column)


_log_row = st.tuples(
    st.sampled_from(["a", "b"]),  # origin
    st.sampled_from(["s1", "s2", "s3", "s4", "s5"]),  # statement id
    st.integers(0, 3),  # bucket
    st.integers(1, 5),  # first_seen
    st.integers(1, 5),  # last_seen - first_seen
    st.sampled_from([None, "2026-02-01T00:00:00"]),  # deleted_at
    st.sampled_from(["t1", "t2"]),  # tenant
)


@pytest.mark.spark_free
@settings(max_examples=examples(50, 500), deadline=None)
@given(stored=st.lists(_log_row, max_size=12), updates=st.lists(_log_row, max_size=8))
def test_merge_rows_follows_the_rule(
    stored: list[tuple[Any, ...]], updates: list[tuple[Any, ...]]
) -> None:
    """The driver's translog merge (:func:`.tables.translog.merge_rows`, which
    joins only the stored rows an update touches) applies the rule to every
    row: the seen range widens, the deletion and last tenant are the update's,
    the first tenant the stored row's; untouched rows are kept as they are;
    the result is sorted as a file's rows are."""
    from lakehouse_assets.tables.schemas import TRANSLOG_SCHEMA
    from lakehouse_assets.tables.translog import merge_rows

    def table(
        rows: list[tuple[Any, ...]],
    ) -> tuple[pa.Table, dict[tuple[str, str], dict[str, Any]]]:
        unique = {}
        for origin, sid, bucket, first, span, deleted, tenant in rows:
            unique[(origin, sid)] = {
                "id": sid,
                "bucket": bucket,
                "first_seen": f"2026-01-0{first}T00:00:00",
                "last_seen": f"2026-01-{first + span:02d}T00:00:00",
                "deleted_at": deleted,
                "origin": origin,
                "first_tenant": tenant,
                "first_write": f"w-{tenant}",
                "last_tenant": tenant,
                "last_write": f"w-{tenant}",
            }
        return pa.Table.from_pylist(list(unique.values()), schema=TRANSLOG_SCHEMA), unique

    stored_table, old = table(stored)
    update_table, new = table(updates)
    got = merge_rows(stored_table, update_table).to_pylist()
    want = dict(old)
    for key, row in new.items():
        if key not in old:
            want[key] = row
            continue
        want[key] = {
            **row,
            "first_seen": min(old[key]["first_seen"], row["first_seen"]),
            "last_seen": max(old[key]["last_seen"], row["last_seen"]),
            "first_tenant": old[key]["first_tenant"],
            "first_write": old[key]["first_write"],
        }
    assert sorted(got, key=lambda r: (r["origin"], r["id"])) == sorted(
        want.values(), key=lambda r: (r["origin"], r["id"])
    )
    assert [(r["bucket"], r["origin"], r["id"]) for r in got] == sorted(
        (r["bucket"], r["origin"], r["id"]) for r in got
    )


@pytest.mark.spark_free
def test_a_flush_tasks_worker_imports_no_followthemoney() -> None:
    """Spark keeps a Python worker per running task and per data-source planner;
    each imports what unpickling its task needs. The journal source's task
    (read, reduce, stage) must not pull in followthemoney or the public
    package surface: at 10M that was 150 MB more per worker, 12 workers."""

    probe = (
        "import sys\n"
        "import lakehouse_assets\n"
        "assert 'lakehouse_assets.lake' not in sys.modules, 'package init imports lake'\n"
        "from lakehouse_assets.spark.journal_source import JournalReader, JournalSource\n"
        "from lakehouse_assets.journal import Claim\n"
        "from lakehouse_assets.journal_duckdb import read_sqlite_natively, sqlite_path\n"
        "from lakehouse_assets.reduce import reduce_events\n"
        "from lakehouse_assets.tables.spark_io import stage_table\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] == 'followthemoney'\n"
        "               or m in ('lakehouse_assets.flush', 'lakehouse_assets.lake'))\n"
        "print(','.join(heavy))\n"
    )
    done = run_python(probe)
    assert done.stdout.strip() == ""
    # and the public names still load on first use
    import lakehouse_assets

    assert lakehouse_assets.Lakehouse is Lakehouse
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = lakehouse_assets.Nope  # type: ignore[attr-defined]


def _commit_actions(location: Any, version: int) -> tuple[list[str], list[str]]:
    """The paths a Delta commit added and removed, from its own log entry."""
    import json

    entry = Path(location.uri.removeprefix("file://")) / "_delta_log" / f"{version:020d}.json"
    actions = [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]
    return (
        [a["add"]["path"] for a in actions if "add" in a],
        [a["remove"]["path"] for a in actions if "remove" in a],
    )


def test_the_scan_and_the_probe_find_the_same_stored_statements(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Which of a batch's statements the table holds is found by a probe of its
    row groups on the driver (a table of up to ``PROBE_ROWS`` statements, or a
    small share of a larger one) or by a Spark scan of its buckets: a flush of
    the same events takes the same decisions either way."""
    from lakehouse_assets.flush import driver

    entities = sample_entities()
    person = next(e for e in entities if e["schema"] == "Person")

    def run(name: str) -> tuple[list[tuple[int, ...]], list[tuple[Any, ...]]]:
        lake = Lakehouse(tmp_path / name, journal_url=f"sqlite:///{tmp_path / name}.sqlite")
        ds = lake.create_dataset("newness")
        for e in entities[: len(entities) // 2]:
            ds.add_entity(e, origin="import")
        ds.flush()
        for e in entities:  # half of them stored already, half new
            ds.add_entity(e, origin="import")
        ds.delete_entity(str(person["id"]))
        done = ds.flush()
        counts = [done.new, done.duplicates, done.tombstones, done.ignored_tombstones]
        log = table_rows(ds, "translog")
        return [tuple(counts), (done.row_groups_total,)], sorted(
            (r["origin"], r["id"], r["deleted_at"] is None) for r in log
        )

    probed = run("probed")
    monkeypatch.setattr(driver, "PROBE_STATEMENTS", 0)  # no keys: the scan of old
    scanned = run("scanned")
    assert probed[0][1] != (0,) and scanned[0][1] == (0,)  # each took its path
    assert probed[0][0] == scanned[0][0] and probed[1] == scanned[1]
    assert probed[0][0][2] > 0 and probed[0][0][1] > 0


def test_a_small_flush_touches_only_what_holds_its_statements(
    spark: SparkSession, local_lake: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: a flush costs in proportion to its input, not to the table. New
    statements only add files (no translog file is rewritten); an entity written
    again rewrites only the translog file that holds its statements; the newness
    check reads the row groups that can hold the batch's entities, not the table."""
    from lakehouse_assets.tables import parquet_files

    # small row groups, so that a test-sized table has many (the files' layout is
    # the real one: sorted by bucket, then entity / statement id)
    monkeypatch.setattr(parquet_files, "ROW_GROUP_ROWS", 8)
    ds = local_lake.create_dataset("proportional")

    def person(i: int, *names: str) -> dict[str, Any]:
        return {"id": f"p{i}", "schema": "Person", "properties": {"name": [f"P {i}", *names]}}

    stored = sum(ds.add_entity(person(i), origin="import") for i in range(200))
    ds.flush()
    flushes = 3
    for group in range(flushes):  # small flushes of new entities, spread over the buckets
        written = sum(
            ds.add_entity(person(i), origin="import")
            for i in range(1000 + 3 * group, 1003 + 3 * group)
        )
        result = ds.flush()
        stored += written
        assert result.new == written and result.translog_version is not None
        added, removed = _commit_actions(ds.translog_table, result.translog_version)
        assert len(added) == 1
        assert removed == []  # old code: every translog file overlapping the buckets
        assert result.translog_files_rewritten == 0
    log_files = Snapshot.load(ds.translog_table).files
    assert len(log_files) == 1 + flushes
    p3 = {r["id"] for r in table_rows(ds) if r["canonical_id"] == "p3"}
    holding = {
        f.path
        for f in log_files
        if p3 & set(pq.read_table(f.uri.removeprefix("file://")).column("id").to_pylist())
    }
    assert len(holding) == 1

    # one entity of the first flush written again with one more value
    n = ds.add_entity(person(3, "again"), origin="import")
    result = ds.flush()
    assert result.new == 1 and result.duplicates == n - 1
    added, removed = _commit_actions(ds.translog_table, result.translog_version or 0)
    assert set(removed) == holding and len(added) == 1
    assert result.translog_files_rewritten == 1
    # the newness check and the translog probe read a few row groups of many
    assert 0 < result.row_groups_read * 4 < result.row_groups_total

    # and the tables are what they should be: one translog row per stored statement
    rows = table_rows(ds)
    log = table_rows(ds, "translog")
    assert len(rows) == stored + 1
    assert [(r["origin"], r["id"]) for r in log] == [(r["origin"], r["id"]) for r in rows]
    assert all(r["deleted_at"] is None for r in log)
    entity = ds.get_entity("p3")
    assert entity is not None and "again" in entity.get("name")


#: a small pool: writes and deletes of the same entities meet in a few flushes
_POOL = ("p1", "p2", "p3", "c1")
_SEEN = ("2024-01-01T00:00:00", "2024-06-01T00:00:00", "2025-01-01T00:00:00")
_flush_operation = st.one_of(
    st.tuples(
        st.just("write"),
        st.sampled_from(_POOL),
        st.sampled_from(["a", "b"]),  # origin
        st.lists(st.sampled_from(["Ann", "Bo", "Cy", "Di"]), min_size=1, max_size=3),
        st.sampled_from(_SEEN),
        st.sampled_from(_SEEN),
    ),
    st.tuples(st.just("delete"), st.sampled_from(_POOL), st.sampled_from([None, "a"])),
)
_lakes = iter(range(10**9))


@pytest.mark.on_cluster
@settings(max_examples=examples(2, 25), deadline=None)
@given(batches=st.lists(st.lists(_flush_operation, min_size=1, max_size=6), min_size=1, max_size=3))
def test_the_driver_and_spark_flush_a_batch_alike(
    spark: SparkSession,
    lake: Lakehouse,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    batches: list[list[Any]],
) -> None:
    """Issue 34: a small batch is flushed by the driver in Arrow (no Spark job,
    no JVM to start), a larger one by Spark. The same operations flushed both
    ways give the same statements, the same translog rows (the seen range and
    tenants; deletes happen at different instants), the same change feed and
    the same counts: re-writes that widen the seen range, deletes then
    re-adds, two origins, tombstones of statements never stored."""
    from lakehouse_assets.flush import driver as flush_module
    from lakehouse_assets.tables.schemas import CHANGES_SCHEMA
    from lakehouse_assets.tables.snapshot import read_files

    n = next(_lakes)
    opened = {}
    for path in ("driver", "spark"):
        name = f"{path}-{n}"
        if lake.store.uri.startswith("s3://"):
            root: str | Path = f"{lake.store.uri.rsplit('/', 1)[0]}/{name}"
        else:
            root = tmp_path / name
        journal = f"sqlite:///{tmp_path / f'{name}.sqlite'}"
        opened[path] = Lakehouse(root, settings=lake.settings, journal_url=journal)
    opened["spark"].settings.flush_driver_rows = 0  # Spark's tasks read the journal
    assert opened["driver"].settings.flush_driver_rows > 0
    took: list[bool] = []
    real = flush_module._flush_batch_on_driver

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        took.append(real(*args, **kwargs))
        return took[-1]

    monkeypatch.setattr(flush_module, "_flush_batch_on_driver", recorded)

    def apply(ds, batch) -> Any:  # type: ignore[no-untyped-def]
        for op in batch:
            if op[0] == "write":
                _, eid, origin, names, seen_a, seen_b = op
                first, last = sorted((seen_a, seen_b))
                entity = {"id": eid, "schema": "Person", "properties": {"name": names}}
                ds.add_entity({**entity, "first_seen": first, "last_seen": last}, origin=origin)
            else:
                ds.delete_entity(op[1], origin=op[2])
        return ds.flush()

    def state(ds) -> tuple[Any, ...]:  # type: ignore[no-untyped-def]
        log = [
            (
                r["origin"],
                r["id"],
                r["bucket"],
                r["first_tenant"],
                r["last_tenant"],
                "dead" if r["deleted_at"] else (r["first_seen"], r["last_seen"]),
            )
            for r in table_rows(ds, "translog")
        ]
        changes = ds.changes_table
        snapshot = Snapshot.load(changes)
        feed_rows = sorted(
            tuple(str(r[c]) for c in ("translog_version", "change", "origin", "id", "canonical_id"))
            for r in read_files(snapshot.files, CHANGES_SCHEMA, changes.storage_options).to_pylist()
        )
        return table_rows(ds), log, feed_rows

    parts = ("new", "duplicates", "tombstones", "superseded", "ignored_tombstones")
    datasets = {path: lake_.create_dataset("same") for path, lake_ in opened.items()}
    flushed = 0
    for batch in batches:
        results = {path: apply(ds, batch) for path, ds in datasets.items()}
        flushed += results["driver"].journal_rows > 0
        counts = {
            path: (
                tuple(getattr(r, p) for p in parts),
                r.journal_rows,
                r.statements_version,
                r.translog_version,
            )
            for path, r in results.items()
        }
        assert counts["driver"] == counts["spark"]
        assert state(datasets["driver"]) == state(datasets["spark"])
    # every batch of the driver's lake took the driver's path, none of the other's
    assert took == [True] * flushed


def test_a_change_spread_over_every_file_is_merged_on_the_driver_up_to_its_bound(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: a daily change of a large table holds a statement in every
    translog file. Up to ``flush_driver_merge_rows`` stored rows the driver
    merges it, file by file and a batch of rows at a time (no Spark job);
    beyond, Spark does. Both give the same tables, counts and change feed."""
    from lakehouse_assets.flush import driver as flush_module
    from lakehouse_assets.settings import Settings
    from lakehouse_assets.tables import parquet_files, probe
    from lakehouse_assets.tables.schemas import CHANGES_SCHEMA
    from lakehouse_assets.tables.snapshot import read_files

    # many small row groups, and probes that read them a few rows at a time
    monkeypatch.setattr(parquet_files, "ROW_GROUP_ROWS", 8)
    monkeypatch.setattr(probe, "READ_BATCH_ROWS", 5)
    took: list[bool] = []
    real = flush_module._flush_batch_on_driver

    def recorded(*args: Any, **kwargs: Any) -> bool:
        took.append(real(*args, **kwargs))
        return took[-1]

    monkeypatch.setattr(flush_module, "_flush_batch_on_driver", recorded)

    def person(i: int, *names: str) -> dict[str, Any]:
        return {
            "id": f"p{i}",
            "schema": "Person",
            "properties": {"name": [f"P {i}", *names]},
            "first_seen": "2024-01-01T00:00:00",
            "last_seen": f"2024-0{2 + len(names)}-01T00:00:00",
        }

    def run(name: str, bound: int) -> tuple[Any, ...]:
        lake = Lakehouse(tmp_path / name, journal_url=f"sqlite:///{tmp_path / name}.sqlite")
        ds = lake.create_dataset("spread")
        for group in range(3):  # three flushes of new entities: three translog files
            for i in range(group * 30, group * 30 + 30):
                ds.add_entity(person(i), origin="import")
            ds.flush()
        assert len(Snapshot.load(ds.translog_table).files) == 3
        took.clear()
        lake.settings.flush_driver_merge_rows = bound
        # the change: entities of every file written again, some deleted, some new
        for i in range(0, 90, 7):
            ds.add_entity(person(i, "again"), origin="import")
        for i in range(3, 90, 11):
            ds.delete_entity(f"p{i}", origin="import")
        for i in range(500, 510):
            ds.add_entity(person(i), origin="import")
        done = ds.flush()
        log = [
            (r["origin"], r["id"], r["bucket"], r["first_seen"], r["last_seen"])
            + (r["deleted_at"] is None,)
            for r in table_rows(ds, "translog")
        ]
        changes = Snapshot.load(ds.changes_table)
        feed_rows = sorted(
            tuple(str(r[c]) for c in ("translog_version", "change", "origin", "id"))
            for r in read_files(
                changes.files, CHANGES_SCHEMA, ds.changes_table.storage_options
            ).to_pylist()
        )
        counts = (done.new, done.duplicates, done.tombstones, done.translog_files_rewritten)
        return took[:], counts, table_rows(ds), log, feed_rows

    driver = run("driver", Settings().flush_driver_merge_rows)
    spark_run = run("spark", 1)
    assert driver[0] == [True] and spark_run[0] == [False]  # each took its path
    assert driver[1][3] == 3  # every translog file merged again
    assert driver[1:] == spark_run[1:]
    assert driver[1][0] > 0 and driver[1][1] > 0 and driver[1][2] > 0


@pytest.mark.driver
def test_the_translog_says_while_it_changes_no_stored_row(
    spark: SparkSession, local_lake: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 49: flushes that only store new statements (a first build, by Spark's
    tasks and the driver, or by the driver alone) mark their translog commits
    (``main_is_live``: readers skip the join); a duplicate or a delete ends it,
    for good, and a published version's commit in between changes nothing."""
    from lakehouse_assets.tables.translog import main_is_live

    def live(ds: Any) -> bool:
        return main_is_live(ds.translog_table, Snapshot.load(ds.translog_table).version)

    entities = sample_entities()
    for name, driver_rows in (("by_tasks", 0), ("by_driver", 10**6)):
        monkeypatch.setattr(local_lake.settings, "flush_driver_rows", driver_rows)
        ds = local_lake.create_dataset(name)
        assert live(ds)  # no translog: nothing to change
        for e in entities[: len(entities) // 2]:
            ds.add_entity(e, origin="import")
        first = ds.flush()
        assert first.new > 0 and live(ds)
        for e in entities[len(entities) // 2 :]:  # new statements only, in stored buckets
            ds.add_entity(e, origin="import")
        assert ds.flush().duplicates == 0 and live(ds)
        ds.make()  # publishes a version: a translog commit without data
        assert live(ds)
        ds.add_entity(entities[0], origin="import")  # written again: its seen range widens
        assert ds.flush().duplicates > 0 and not live(ds)
        ds.add_entity({"id": "later", "schema": "Person", "properties": {"name": ["Later"]}})
        assert ds.flush().new > 0 and not live(ds)  # not again, once a row was changed
