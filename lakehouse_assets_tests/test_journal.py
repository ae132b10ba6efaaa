"""Journal and tenant API on real SQLite and real PostgreSQL."""

from __future__ import annotations

import io
import multiprocessing as mp
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from followthemoney import model
from followthemoney.statement import Statement
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, select

from lakehouse_assets import Lakehouse
from lakehouse_assets import conventions as cv
from lakehouse_assets.errors import ConfigurationError, InvalidInputError
from lakehouse_assets.journal import Journal, journal_table
from lakehouse_assets_tests.conftest import sample_entities


@pytest.fixture
def lake_with_journal(tmp_path: Path, journal_url: str) -> Lakehouse:
    return Lakehouse(tmp_path / "lake", journal_url=journal_url)


def test_in_memory_journal_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="in-memory"):
        Journal("sqlite:///:memory:")


def test_add_entity_writes_followthemoney_statements(
    lake_with_journal: Lakehouse, dataset_name: str
) -> None:
    ds = lake_with_journal.create_dataset(dataset_name)
    entity = sample_entities()[0]
    n = ds.add_entity(entity, origin="crawler")
    proxy = model.get_proxy(entity, cleaned=False)
    expected = {s.id for s in Statement.from_entity(proxy, dataset_name)}
    stored = ds.journal.live_entity_statements(dataset_name, entity["id"])  # type: ignore[arg-type]
    assert n == len(expected) == len(stored)
    assert {s.id for s in stored} == expected
    assert {s.origin for s in stored} == {"crawler"}
    assert all(s.first_seen for s in stored)
    assert ds.core_tags.get(cv.JOURNAL_LAST_UPDATED) is not None


def test_bulk_commits_once_on_exit(lake_with_journal: Lakehouse, dataset_name: str) -> None:
    ds = lake_with_journal.create_dataset(dataset_name)
    with ds.bulk("bulk") as bulk:
        for ent in sample_entities():
            bulk.add_entity(ent)
        assert ds.core_tags.get(cv.JOURNAL_LAST_UPDATED) is None
    assert ds.journal.count(dataset_name) == bulk.count > 0
    assert ds.core_tags.get(cv.JOURNAL_LAST_UPDATED) is not None


def test_bulk_rolls_back_everything_on_error(
    lake_with_journal: Lakehouse, dataset_name: str
) -> None:
    ds = lake_with_journal.create_dataset(dataset_name)
    ds.settings.journal_batch_size = 5  # make sure batches were already inserted
    with pytest.raises(RuntimeError), ds.bulk("bulk") as bulk:
        for ent in sample_entities():
            bulk.add_entity(ent)
        raise RuntimeError("tenant crashed")
    assert ds.journal.count(dataset_name) == 0
    assert ds.core_tags.get(cv.JOURNAL_LAST_UPDATED) is None


def test_write_entities_is_all_or_nothing(lake_with_journal: Lakehouse, dataset_name: str) -> None:
    ds = lake_with_journal.create_dataset(dataset_name)
    lines = [orjson.dumps(e) for e in sample_entities()]
    lines.insert(7, b'{"id": "broken", "schema": "Person", "properties": {"name": ["x"]')
    with pytest.raises(
        InvalidInputError,
        match=rf"dataset '{dataset_name}', file 'in.json', line 8\] malformed JSON",
    ):
        ds.write_entities(io.BytesIO(b"\n".join(lines)), source="in.json")
    assert ds.journal.count(dataset_name) == 0


def journal_rows(lake: Lakehouse, dataset: str) -> list[dict[str, object]]:
    """Every journal row of a dataset, sorted, without what differs between two
    writes of the same input to two datasets (dataset, statement id, write and
    its time, seq)."""
    skip = {"dataset", "id", "write_id", "first_seen", "last_seen", "seq", "flush_id"}
    cols = [c for c in journal_table.columns if c.name not in skip]
    q = select(*cols).where(journal_table.c.dataset == dataset)
    with lake.journal.engine.connect() as conn:
        return sorted((dict(r._mapping) for r in conn.execute(q)), key=repr)


def test_write_entities_in_parallel_matches_serial(
    tmp_path: Path, journal_url: str, dataset_name: str
) -> None:
    """The worker-pool path stores exactly the rows of the in-process path and of
    entity-by-entity writes, column for column (on PostgreSQL the workers encode
    ``COPY`` input themselves; the others go through rows)."""
    lake = Lakehouse(tmp_path / "lake", journal_url=journal_url)
    lines = []
    for i in range(1700):  # > PARALLEL_AFTER_LINES lines in total
        for ent in sample_entities():
            lines.append(orjson.dumps({**ent, "id": f"{ent['id']}-{i}"}))
    data = b"\n".join(lines)
    par = lake.create_dataset(dataset_name)
    ser = lake.create_dataset(dataset_name + "_s")
    one = lake.create_dataset(dataset_name + "_o")
    bulk_par = par.write_entities(io.BytesIO(data), workers=2)
    bulk_ser = ser.write_entities(io.BytesIO(data), workers=1)
    with one.bulk() as bulk_one:
        for line in lines[:3000]:
            bulk_one.add_entity(orjson.loads(line))
    assert bulk_par.entities == bulk_ser.entities == len(lines)
    assert bulk_par.count == bulk_ser.count == par.journal.count(dataset_name)
    # ids embed the dataset name: compare everything else across the three,
    # and the ids of one entity against followthemoney's own
    par_rows = journal_rows(lake, dataset_name)
    assert len(par_rows) == bulk_par.count > 0
    assert par_rows == journal_rows(lake, dataset_name + "_s")
    one_rows = journal_rows(lake, dataset_name + "_o")
    assert len(one_rows) == bulk_one.count > 0
    written_one_by_one = {r["entity_id"] for r in one_rows}
    assert [r for r in par_rows if r["entity_id"] in written_one_by_one] == one_rows
    first = orjson.loads(lines[0])["id"]
    expected = {
        s.id
        for s in Statement.from_entity(
            model.get_proxy(orjson.loads(lines[0]), cleaned=False), dataset_name
        )
    }
    assert {s.id for s in par.journal.live_entity_statements(dataset_name, first)} == expected
    with lake.journal.engine.connect() as conn:
        writes = conn.execute(
            select(
                journal_table.c.write_id,
                journal_table.c.tenant,
                journal_table.c.first_seen,
                journal_table.c.last_seen,
            )
            .where(journal_table.c.dataset == dataset_name)
            .distinct()
        ).all()
    write = bulk_par.write
    assert [tuple(w) for w in writes] == [
        (write.write_id, write.tenant, bulk_par.seen, bulk_par.seen)
    ]


def test_parallel_validation_reads_its_input_as_it_goes() -> None:
    """The worker pool takes a few chunks ahead of the writer, not the whole input:
    memory stays flat however large the file (Pool.imap read it all ahead)."""
    from lakehouse_assets.ingest import CHUNK_LINES, IN_FLIGHT, PARALLEL_AFTER_LINES, convert_lines

    total = 100 * CHUNK_LINES
    taken = 0

    def lines() -> Iterator[bytes]:
        nonlocal taken
        for i in range(total):
            taken += 1
            yield orjson.dumps(
                {"id": f"e-{i}", "schema": "Person", "properties": {"name": [f"P {i}"]}}
            )

    results = convert_lines(
        lines(), dataset="d", origin="o", source=None, seen="2026-01-01", workers=2
    )
    first = next(results)
    assert first.lines == CHUNK_LINES and first.rows[0][4] == "e-0"  # entity_id
    ahead = PARALLEL_AFTER_LINES + (IN_FLIGHT * 2 + 1) * CHUNK_LINES
    assert CHUNK_LINES < taken <= ahead < total
    second = next(results)  # in order
    assert second.rows[0][4] == f"e-{CHUNK_LINES}"
    results.close()  # the pool stops; the rest is never read
    assert taken <= ahead + CHUNK_LINES


def test_a_bad_line_deep_in_a_parallel_write_commits_nothing(tmp_path: Path) -> None:
    """A bad line that a worker finds, long after the first chunks were inserted,
    aborts the whole bulk: the error names the line, the journal stays empty."""
    lake = Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{tmp_path / 'j.sqlite'}")
    ds = lake.create_dataset("deep")
    bad_line = 30_001
    lines = [
        orjson.dumps({"id": f"e-{i}", "schema": "Person", "properties": {"name": [f"P {i}"]}})
        for i in range(1, 40_001)
    ]
    lines[bad_line - 1] = b'{"id": "e-bad", "schema": "Spaceship", "properties": {}}'
    with pytest.raises(InvalidInputError) as failed:
        ds.write_entities(io.BytesIO(b"\n".join(lines)), workers=2)
    assert f"line {bad_line}" in str(failed.value) and "Spaceship" in str(failed.value)
    assert ds.journal.count("deep") == 0


def test_delete_entity_writes_tombstones(lake_with_journal: Lakehouse, dataset_name: str) -> None:
    ds = lake_with_journal.create_dataset(dataset_name)
    ents = sample_entities()
    for ent in ents[:3]:
        ds.add_entity(ent, origin="a")
    target = str(ents[0]["id"])
    before = ds.journal.live_entity_statements(dataset_name, target)
    assert ds.delete_entity(target) == len(before) > 0
    assert ds.journal.live_entity_statements(dataset_name, target) == []
    assert ds.journal.live_entity_statements(dataset_name, str(ents[1]["id"]))
    # the journal keeps the history: writes + tombstones
    assert ds.journal.count(dataset_name) == sum(
        len(ds.journal.entity_rows(dataset_name, str(e["id"]))) for e in ents[:3]
    )
    assert ds.delete_entity(target) == 0  # nothing left to delete


def test_delete_statement(lake_with_journal: Lakehouse, dataset_name: str) -> None:
    ds = lake_with_journal.create_dataset(dataset_name)
    ent = sample_entities()[0]
    ds.add_entity(ent, origin="a")
    stmts = ds.journal.live_entity_statements(dataset_name, str(ent["id"]))
    name = next(s for s in stmts if s.prop == "name")
    ds.delete_statement(name)
    left = ds.journal.live_entity_statements(dataset_name, str(ent["id"]))
    assert {s.id for s in left} == {s.id for s in stmts} - {name.id}


def test_add_statements_validates(lake_with_journal: Lakehouse, dataset_name: str) -> None:
    ds = lake_with_journal.create_dataset(dataset_name)
    good = Statement(
        entity_id="e1", prop="name", schema="Person", value="Ann", dataset=dataset_name
    )
    assert ds.add_statements([good], origin="x") == 1
    with ds.bulk("x") as bulk, pytest.raises(InvalidInputError, match="no property 'nope'"):
        bulk.add_statement({"entity_id": "e1", "prop": "nope", "schema": "Person", "value": "v"})
    with (
        pytest.raises(InvalidInputError, match="does not match followthemoney's id"),
        ds.bulk("x") as bulk,
    ):
        bulk.add_statement(
            {"entity_id": "e1", "prop": "name", "schema": "Person", "value": "v", "id": "f" * 40}
        )
    assert ds.journal.count(dataset_name) == 1


def _writer(args: tuple[str, str, str, int]) -> int:
    lake_dir, journal_url, dataset, worker = args
    lake = Lakehouse(lake_dir, journal_url=journal_url)
    ds = lake.dataset(dataset)
    total = 0
    for batch in range(5):
        with ds.bulk(f"w{worker}") as bulk:
            for i in range(40):
                total += bulk.add_entity(
                    {
                        "id": f"w{worker}-{batch}-{i}",
                        "schema": "Person",
                        "properties": {"name": [f"P {i}"]},
                    }
                )
    return total


def test_concurrent_writers_lose_nothing(
    tmp_path: Path, journal_url: str, dataset_name: str
) -> None:
    """Four processes write to one dataset's journal at once; every row arrives."""
    lake = Lakehouse(tmp_path / "lake", journal_url=journal_url)
    lake.create_dataset(dataset_name)
    lake.journal.dispose()
    ctx = mp.get_context("spawn")
    args = [(str(tmp_path / "lake"), journal_url, dataset_name, w) for w in range(4)]
    with ctx.Pool(4) as pool:
        written = pool.map(_writer, args)
    assert sum(written) == 4 * 5 * 40 * 2
    assert lake.journal.count(dataset_name) == sum(written)


#: Text COPY has rules for: its CSV quoting, its end-of-data marker, line ends.
AWKWARD_TEXT = ["", '"', ",", "\\", "\\.", "a\n\\.\nb", "\r\n", "\t", "null", "\\N", "ü 中"]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    values=st.lists(
        st.one_of(
            st.sampled_from(AWKWARD_TEXT),
            st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00")),
        ),
        min_size=1,
        max_size=8,
    ),
    langs=st.lists(st.sampled_from([None, "", "deu"]), min_size=8, max_size=8),
)
def test_rows_come_back_as_written(
    lake_with_journal: Lakehouse, dataset_name: str, values: list[str], langs: list[str | None]
) -> None:
    """Whatever text a statement holds, the journal returns the rows exactly as they
    were written (PostgreSQL's bulk path is ``COPY`` in CSV made by Arrow: quotes,
    ``\\.`` on a line of its own, empty strings against NULL, line ends), and the
    flush's reader (``COPY ... TO STDOUT``) reads them back the same."""
    journal = lake_with_journal.journal
    journal.clear(dataset_name)
    rows = [
        (dataset_name, i % 256, "origin", f"e{i}", f"e{i}", f"s{i}", "name", "name", "Person")
        + (value, langs[i], value or None, i % 2 == 0, "2026-01-01T00:00:00", None, None)
        for i, value in enumerate(values)
    ]
    from lakehouse_assets.journal import Write

    journal.write(rows, Write.new("tests"))
    assert list(journal.rows(dataset_name)) == rows
    if journal.dialect == "postgresql":
        claim = journal.claim(dataset_name, "flush-test")
        table = journal.read_claimed(claim, list(range(256)))
        assert sorted(table.column("value").to_pylist()) == sorted(values)
        assert sorted(table.column("lang").to_pylist(), key=str) == sorted(
            langs[: len(values)], key=str
        )
    else:  # the flush tasks' reader: the query runs in SQLite, text comes back typed
        from lakehouse_assets.journal import EVENTS_SCHEMA
        from lakehouse_assets.journal_duckdb import read_sqlite_natively, sqlite_path

        path = sqlite_path(journal.url)
        assert path is not None
        claim = journal.claim(dataset_name, "flush-test")
        fields = ("bucket", "value", "lang", "original_value", "external", "first_seen")
        for low, high in ((0, 255), (1, 3)):
            table = read_sqlite_natively(path, claim, low, high)
            assert table.schema == EVENTS_SCHEMA
            got = sorted(zip(*(table.column(f).to_pylist() for f in fields), strict=True), key=repr)
            expected = [
                (r[1], r[9], r[10], r[11], r[12], r[13]) for r in rows if low <= r[1] <= high
            ]
            assert got == sorted(expected, key=repr)
    journal.clear(dataset_name)


@pytest.mark.parametrize(
    "others",
    [
        "nothing",
        "an earlier dataset",
        "a later dataset",
        "a later write",
        "lower buckets",
        "higher buckets",
    ],
)
def test_releasing_a_claim_deletes_exactly_the_claimed_rows(
    lake_with_journal: Lakehouse, dataset_name: str, others: str
) -> None:
    """A flush's release deletes its claimed rows of the released buckets and
    nothing else, whatever else the journal holds. (On SQLite, a journal that
    holds nothing else is emptied at once, by the truncate optimisation; any
    other row makes it delete row by row.)"""
    from lakehouse_assets.journal import Write

    journal = lake_with_journal.journal

    def rows(dataset: str, buckets: range, tag: str) -> list[tuple[object, ...]]:
        return [
            (dataset, b, "origin", f"{tag}{b}", f"{tag}{b}", f"{tag}{b}s", "name", "name")
            + ("Person", f"{tag} {b}", None, None, False, "2026-01-01T00:00:00", None, None)
            for b in buckets
        ]

    claimed = range(10, 20)
    kept: list[tuple[object, ...]] = []
    if others == "an earlier dataset":
        kept = rows(dataset_name[:-1], claimed, "e")  # a prefix sorts first
    elif others == "a later dataset":
        kept = rows(dataset_name + "z", claimed, "l")
    elif others == "lower buckets":
        kept = rows(dataset_name, range(0, 10), "b")
    elif others == "higher buckets":
        kept = rows(dataset_name, range(20, 30), "a")
    if kept:  # written first: another dataset's rows have lower row ids than the claim's
        journal.write(kept, Write.new("tests"))
    journal.write(rows(dataset_name, claimed, "c"), Write.new("tests"))
    claim = journal.claim(dataset_name, "flush-test")
    if others == "a later write":  # committed after the claim: the next flush's
        kept = rows(dataset_name, claimed, "w")
        journal.write(kept, Write.new("tests"))

    deletes: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        if statement.lstrip().upper().startswith("DELETE"):
            deletes.append(" ".join(statement.split()))

    event.listen(journal.engine, "before_cursor_execute", seen)
    try:
        assert journal.release_claimed(claim, list(claimed)) == len(claimed)
    finally:
        event.remove(journal.engine, "before_cursor_execute", seen)
    truncated = f"DELETE FROM {journal_table.name}" in deletes
    assert truncated == (journal.dialect == "sqlite" and others == "nothing"), deletes
    datasets = {str(r[0]) for r in kept} | {dataset_name}
    survivors = [row for dataset in datasets for row in journal.rows(dataset)]
    assert sorted(survivors, key=repr) == sorted(kept, key=repr)
    for dataset in datasets:
        journal.clear(dataset)


def test_a_release_holds_the_write_lock_while_it_checks(tmp_path: Path) -> None:
    """Whether the journal holds only the claimed rows is checked under SQLite's
    write lock: a write arriving meanwhile waits, so it can never be emptied
    away with the claimed rows."""
    import sqlite3

    from lakehouse_assets.journal import Write

    journal = Journal(f"sqlite:///{tmp_path}/journal.sqlite")
    row = ("d", 1, "o", "e", "e", "s", "name", "name", "Person", "v")
    journal.write([(*row, None, None, False, None, None, None)], Write.new("tests"))
    claim = journal.claim("d", "flush-test")
    with journal.engine.begin() as conn:
        assert journal._only_these(conn, claim, 1, 1)
        other = sqlite3.connect(tmp_path / "journal.sqlite", timeout=0.2)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute(f"DELETE FROM {journal_table.name}")
        other.close()
    assert journal.count("d") == 1


def test_a_command_leaves_no_write_ahead_log_behind(tmp_path: Path) -> None:
    """A CLI command closes its SQLite journal at exit (it skips the interpreter's
    teardown, which would have): the last connection checkpoints the WAL into
    the database and deletes it, so the next command does not first read the
    whole WAL to rebuild its index. The rows are all there."""
    import os
    import subprocess
    import sys

    exe = str(Path(sys.executable).parent / "lakehouse")
    db = tmp_path / "journal.sqlite"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE_")}
    env["LAKEHOUSE_LAKE_URI"] = str(tmp_path / "lake")
    env["LAKEHOUSE_JOURNAL_URL"] = f"sqlite:///{db}"
    data = tmp_path / "entities.ftm.json"
    data.write_bytes(b"\n".join(orjson.dumps(e) for e in sample_entities()))
    for args in (
        ["datasets", "create", "wal"],
        ["-d", "wal", "entities", "write", "-i", str(data)],
    ):
        res = subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)
        assert res.returncode == 0, res.stderr
    assert db.exists()
    assert not db.with_name(db.name + "-wal").exists()
    journal = Journal(f"sqlite:///{db}")
    expected = sum(
        len(list(Statement.from_entity(model.get_proxy(e), "wal"))) for e in sample_entities()
    )
    assert journal.count("wal") == expected > 0
    journal.dispose()


def test_the_write_ahead_log_is_cut_back_after_a_big_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While another process keeps the journal open (a Dagster daemon, say) the
    WAL is never deleted; after a checkpoint it is cut back to the limit
    instead of keeping the size of the largest write ever made."""
    import sqlite3

    from lakehouse_assets import journal_sqlite
    from lakehouse_assets.journal import Write

    limit = 256 * 1024
    monkeypatch.setattr(journal_sqlite, "WAL_SIZE_LIMIT", limit)
    db = tmp_path / "journal.sqlite"
    wal = db.with_name(db.name + "-wal")
    journal = Journal(f"sqlite:///{db}")
    other = sqlite3.connect(db)  # the other process's idle connection
    other.execute("SELECT count(*) FROM lakehouse_journal").fetchall()
    try:
        row = ("d", 1, "o", "e", "e", "s", "name", "name", "Person", "v" * 500)
        big = [(*row, None, None, False, None, None, None)] * 20_000
        journal.write(big, Write.new("tests"))
        assert wal.stat().st_size > 10 * limit  # the big write went through the WAL
        journal.write([big[0]], Write.new("tests"))  # the next write restarts the WAL
        assert wal.stat().st_size <= limit
        assert journal.count("d") == 20_001
        assert other.execute("SELECT count(*) FROM lakehouse_journal").fetchone() == (20_001,)
    finally:
        other.close()
        journal.dispose()


def test_releasing_a_flushed_journal_does_not_rewrite_its_pages(tmp_path: Path) -> None:
    """A journal holding nothing but a flush's claim is emptied by freeing its
    pages: nothing is written through the WAL for them (Debian's SQLite zeroes
    freed pages unless told otherwise, which rewrote the whole journal). The
    next write reuses the freed pages, so the file does not grow."""
    from lakehouse_assets.journal import Write

    db = tmp_path / "journal.sqlite"
    wal = db.with_name(db.name + "-wal")
    journal = Journal(f"sqlite:///{db}")
    row = ("d", 7, "o", "e", "e", "s", "name", "name", "Person", "v" * 500)
    rows = [(*row, None, None, False, None, None, None)] * 20_000
    journal.write(rows, Write.new("tests"))
    journal.dispose()  # the last connection checkpoints the WAL away
    assert not wal.exists()
    size = db.stat().st_size
    assert size > 10_000_000
    claim = journal.claim("d", "flush-test")
    assert journal.release_claimed(claim, [7]) == 20_000
    assert journal.count("d") == 0
    assert wal.stat().st_size < size / 20  # not a rewrite of the freed pages
    journal.write(rows, Write.new("tests"))
    assert journal.count("d") == 20_000
    journal.dispose()
    assert db.stat().st_size <= size * 1.05


def test_live_statements_of_many_entities_are_each_entitys_latest_events(
    lake_with_journal: Lakehouse, dataset_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``live_statements_of`` (a query per few hundred ids, where a delete of
    thousands asked once per id) gives each entity the statements whose last
    event is not a tombstone, by entity or canonical id, against the journal's
    rows read in order; ids asked twice or unknown are answered too."""
    from lakehouse_assets import journal as journal_module
    from lakehouse_assets.journal import COLUMNS, row_statement

    monkeypatch.setattr(journal_module, "IDS_PER_QUERY", 3)  # several queries
    ds = lake_with_journal.create_dataset(dataset_name)
    entities = sample_entities()
    for e in entities:
        ds.add_entity(e, origin="a")
        ds.add_entity({**e, "properties": {"summary": ["again"]}}, origin="b")
    for e in entities[::3]:
        ds.delete_statement(ds.journal.live_entity_statements(dataset_name, str(e["id"]))[0])
    ids = [str(e["id"]) for e in entities] + [str(entities[0]["id"]), "nobody"]
    got = ds.journal.live_statements_of(dataset_name, ids)
    latest: dict[str, dict[tuple[str, str], tuple[object, ...]]] = {}
    for row in ds.journal.rows(dataset_name):
        for owner in {row[COLUMNS.index("entity_id")], row[COLUMNS.index("canonical_id")]}:
            key = (row[COLUMNS.index("id")], row[COLUMNS.index("origin")])
            latest.setdefault(owner, {})[key] = row
    deleted = COLUMNS.index("deleted_at")
    assert set(got) == set(ids)
    for entity_id in ids:
        want = [row_statement(r) for r in latest.get(entity_id, {}).values() if r[deleted] is None]
        assert sorted(s.id for s in got[entity_id]) == sorted(s.id for s in want)
    assert got["nobody"] == []
    assert all(got[str(e["id"])] for e in entities)
    first = str(entities[0]["id"])
    assert len(got[first]) == len(latest[first]) - 1  # one of its statements tombstoned
