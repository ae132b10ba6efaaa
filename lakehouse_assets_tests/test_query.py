"""Interactive reads through DuckDB: get, query with ftmq filters, origin, flush-first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from ftmq.query import M, P, Query
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse_assets.lake import Lakehouse
from lakehouse_assets_tests.conftest import examples, sample_entities

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_get_and_query(spark: SparkSession, lake: Lakehouse) -> None:
    ds = lake.create_dataset("querying")
    entities = sample_entities()
    for e in entities:
        ds.add_entity(e, origin="crawl")
    person = next(e for e in entities if e["schema"] == "Person")
    ds.add_entity(
        {"id": person["id"], "schema": "Person", "properties": {"nationality": ["at"]}},
        origin="enrich",
    )
    # query flushes first by default
    everything = list(ds.query())
    assert len(everything) == len(entities)
    assert ds.journal.count(ds.name) == 0

    got = ds.get_entity(str(person["id"]))
    assert got is not None and got.schema.name == "Person"
    assert "at" in got.get("nationality")
    assert set(got.to_dict()["origin"]) == {"crawl", "enrich"}
    only_enrich = ds.get_entity(str(person["id"]), origin="enrich")
    assert only_enrich is not None and only_enrich.get("name") == []
    assert ds.get_entity("no-such-entity") is None

    people = list(ds.query(Query().where(M(schema="Person"))))
    assert {e.id for e in people} == {e["id"] for e in entities if e["schema"] == "Person"}
    german = list(ds.query(Query().where(M(schema="Company"), P(jurisdiction="de"))))
    assert [e.id for e in german] == ["acme-trading"]
    some = list(ds.query(entity_ids=["acme-trading", str(person["id"])]))
    assert sorted(e.id for e in some) == sorted(["acme-trading", str(person["id"])])


def test_query_without_flush_does_not_see_the_journal(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    ds = local_lake.create_dataset("noflush")
    entities = sample_entities()
    ds.add_entity(entities[0])
    assert list(ds.query(flush=False)) == []
    assert ds.get_entity(str(entities[0]["id"])) is None  # get does not flush by default
    assert ds.get_entity(str(entities[0]["id"]), flush=True) is not None
    ds.add_entity(entities[1])
    assert len(list(ds.query(flush=False))) == 1
    assert len(list(ds.query())) == 2


def test_query_streams_a_range_of_buckets_at_a_time(spark: SparkSession, lake: Lakehouse) -> None:
    """A query without ids reads the table in chunks (bounded memory) and still
    returns every live entity whole, once: the same as reading it in one go."""
    from lakehouse_assets.query import bucket_ranges, live_chunks

    ds = lake.create_dataset("chunked")
    people = [
        {"id": f"p-{i}", "schema": "Person", "properties": {"name": [f"Person {i}"]}}
        for i in range(120)
    ]
    ds.write_entities([json.dumps(p).encode() for p in people], origin="a")
    ds.write_entities(
        [
            json.dumps(
                {"id": f"p-{i}", "schema": "Person", "properties": {"nationality": ["de"]}}
            ).encode()
            for i in range(0, 120, 3)
        ],
        origin="b",
    )
    ds.delete_entity("p-7")
    ds.flush()
    whole = {e.id: e.to_dict() for e in ds.query(flush=False)}
    assert len(whole) == 119 and "p-7" not in whole

    ds.settings = ds.settings.model_copy(update={"query_chunk_bytes": 1})
    ranges = bucket_ranges(ds.snapshot(), 1)
    assert len(ranges) > 10  # one bucket per range: many chunks
    assert ranges[0][0] == 0 and ranges[-1][1] == 255
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    chunks = list(live_chunks(ds))
    assert len(chunks) > 10
    streamed = [e for e in ds.query(flush=False)]
    assert len(streamed) == len({e.id for e in streamed})  # no entity split over chunks
    assert {e.id: e.to_dict() for e in streamed} == whole
    assert [e.id for e in streamed] == list(whole)  # the same order, whatever the chunks
    assert sorted(whole["p-3"]["properties"]["nationality"]) == ["de"]
    # a read by ids, bucket by bucket (few buckets) or as one query (many): the
    # same entities as the whole table holds, the deleted one absent, origins kept
    from lakehouse_assets.journal import bucket_of
    from lakehouse_assets.query import POINT_BUCKETS

    for ids in (["p-3", "p-4", "p-7"], [f"p-{i}" for i in range(0, 120, 4)] + ["p-7", "nobody"]):
        wanted = {i for i in ids if i in whole}
        got = {e.id: e.to_dict() for e in ds.query(entity_ids=ids, flush=False)}
        assert got == {i: whole[i] for i in wanted}
    assert len({bucket_of(f"p-{i}") for i in range(0, 120, 4)}) > POINT_BUCKETS
    only_b = {e.id for e in ds.query(entity_ids=["p-3", "p-4"], origin="b", flush=False)}
    assert only_b == {"p-3"}
    many = [f"p-{i}" for i in range(0, 120, 4)]  # many buckets, one origin
    many_b = {e.id for e in ds.query(entity_ids=many, origin="b", flush=False)}
    assert many_b == {i for i in many if int(i[2:]) % 3 == 0}


def test_a_schema_filter_reads_only_the_entities_that_can_match(
    spark: SparkSession, lake: Lakehouse
) -> None:
    """``schemata`` is applied to the tables (only entities with a statement of a
    wanted schema are read), yet gives what ftmq's schema filter gives on every
    entity: an entity written as LegalEntity by one origin and as Company by
    another is a Company, not a LegalEntity; an unknown schema is an error."""
    from lakehouse_assets.errors import InvalidInputError

    ds = lake.create_dataset("schemata")
    entities = sample_entities()
    ds.write_entities([json.dumps(e).encode() for e in entities], origin="crawl")
    merged = [
        {"id": "merged", "schema": "LegalEntity", "properties": {"name": ["Merged"]}},
        {"id": "legal", "schema": "LegalEntity", "properties": {"name": ["Only legal"]}},
    ]
    ds.write_entities([json.dumps(e).encode() for e in merged], origin="a")
    ds.add_entity(
        {"id": "merged", "schema": "Company", "properties": {"jurisdiction": ["de"]}},
        origin="b",
    )
    ds.delete_entity(str(entities[0]["id"]))
    ds.flush()
    everything = list(ds.query(flush=False))
    names = {e.schema.name for e in everything} | {"LegalEntity", "Thing"}
    # every schema on its own with one bucket range per chunk (the case where a
    # chunk can miss an entity's other statements), then the merged entity's two
    # schemata and all together in one chunk
    singles = [[n] for n in sorted(names)]
    if lake.store.uri.startswith("s3:"):
        # every chunk a round of ranged reads of the S3 server (70 s for them all):
        # there the merged entity's two schemata, the chunking itself on a folder
        singles = [["Company"], ["LegalEntity"]]
    for chunk_bytes, cases in (
        (1, [*singles, sorted(names)]),
        (32 * 1024 * 1024, [["Company"], ["LegalEntity"], sorted(names)]),
    ):
        ds.settings = ds.settings.model_copy(update={"query_chunk_bytes": chunk_bytes})
        for wanted in cases:
            expected = [
                e.to_dict() for e in ds.query(Query().where(M(schema__in=wanted)), flush=False)
            ]
            assert expected == [e.to_dict() for e in everything if e.schema.name in wanted]
            got = [e.to_dict() for e in ds.query(schemata=wanted, flush=False)]
            assert got == expected, wanted
    companies = {e.id for e in ds.query(schemata=["Company"], flush=False)}
    assert "merged" in companies and str(entities[0]["id"]) not in companies
    assert [e.id for e in ds.query(schemata=["LegalEntity"], flush=False)] == ["legal"]
    by_id = ds.query(entity_ids=["merged", "legal"], schemata=["Company"], flush=False)
    assert [e.id for e in by_id] == ["merged"]
    with_props = ds.query(Query().where(P(jurisdiction="de")), schemata=["Company"], flush=False)
    assert "merged" in {e.id for e in with_props}
    try:
        list(ds.query(schemata=["Compnay"], flush=False))
    except InvalidInputError as exc:
        assert "Compnay" in str(exc) and "schemata" in str(exc)
    else:
        raise AssertionError("an unknown schema must be an error")


def test_reads_follow_every_commit_of_the_tables(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """Readers keep the latest snapshot between reads (loading it costs a get's
    budget) and must still see each new commit: a flush made through another
    Lakehouse object, and a dataset deleted and created again under the same name."""
    import shutil

    ds = local_lake.create_dataset("following")
    entities = sample_entities()
    first, second = entities[0], entities[1]
    ds.add_entity(first)
    got = ds.get_entity(str(first["id"]), flush=True)
    assert got is not None and got.schema.name == first["schema"]
    assert ds.get_entity(str(second["id"])) is None

    other = Lakehouse(settings=local_lake.settings).dataset("following")
    other.add_entity(second)
    other.flush()
    assert ds.get_entity(str(second["id"])) is not None  # no flush of its own

    shutil.rmtree(Path(local_lake.settings.lake_uri) / "following")
    again = local_lake.create_dataset("following")
    again.add_entity(second)
    again.flush()
    assert ds.get_entity(str(first["id"])) is None
    assert again.get_entity(str(second["id"])) is not None


@settings(max_examples=examples(60, 400), deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.integers(0, 6), st.sampled_from("abcdefgh"), st.integers(0, 3)),
        max_size=60,
    ),
    files=st.integers(1, 4),
    ordered=st.booleans(),
    group_rows=st.integers(1, 8),
    wanted=st.sets(st.sampled_from("abcdefghz"), max_size=6),
)
def test_a_read_of_many_keys_by_row_groups_finds_what_a_scan_finds(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[int, str, int]],
    files: int,
    ordered: bool,
    group_rows: int,
    wanted: set[str],
) -> None:
    """:func:`rows_of` picks row groups by their (bucket, key) min/max: what it
    returns is every row a filter over all rows keeps, whether the files are
    sorted by bucket and key (as ours are) or not (another writer's), in row
    groups of any size."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lakehouse_assets.tables.probe import rows_of
    from lakehouse_assets.tables.snapshot import DataFile

    # a key's bucket is a function of the key, as an entity's or a statement's is
    bucket = {key: ord(key) % 7 for key in "abcdefghz"}
    table = [(bucket[k], k, v, n) for n, (_b, k, v) in enumerate(rows)]
    schema = pa.schema([("bucket", pa.int32()), ("key", pa.string()), ("value", pa.int64())])
    folder = tmp_path_factory.mktemp("rows-of")
    data_files = []
    for part in range(files):
        chunk = table[part::files]
        if ordered:
            chunk.sort()
        path = folder / f"part-{part}.parquet"
        pq.write_table(
            pa.table(
                {
                    "bucket": pa.array([r[0] for r in chunk], pa.int32()),
                    "key": [r[1] for r in chunk],
                    "value": pa.array([r[2] * 1000 + r[3] for r in chunk], pa.int64()),
                },
                schema=schema,
            ),
            path,
            row_group_size=group_rows,
        )
        data_files.append(DataFile(path.as_uri(), path.name, path.stat().st_size, {}, None, None))
    keys = sorted(wanted)
    found = rows_of(data_files, schema, {}, [bucket[k] for k in keys], keys, key_column="key")
    expected = sorted((r[0], r[1], r[2] * 1000 + r[3]) for r in table if r[1] in wanted)
    assert found.schema == schema
    assert sorted(zip(*(found.column(c).to_pylist() for c in schema.names), strict=True)) == (
        expected
    )


def test_deleting_many_entities_at_once_equals_deleting_them_one_by_one(
    spark: SparkSession, lake: Lakehouse
) -> None:
    """``delete_entities`` (the CLI's ``entities delete``, one read of the tables
    and one journal write for all the ids) tombstones what ``delete_entity``
    does for each id: statements flushed and still in the journal, of one
    origin when asked; unknown and repeated ids count as such."""
    people = [
        {"id": f"d-{i}", "schema": "Person", "properties": {"name": [f"Person {i}"]}}
        for i in range(40)
    ]
    at_once, one_by_one = lake.create_dataset("at_once"), lake.create_dataset("one_by_one")
    for ds in (at_once, one_by_one):
        ds.write_entities([json.dumps(p).encode() for p in people], origin="a")
        ds.flush()
        for p in people[::4]:  # a second origin, still in the journal
            ds.add_entity({**p, "properties": {"nationality": ["de"]}}, origin="b")
    gone = [f"d-{i}" for i in range(0, 40, 3)] + ["d-3", "nobody"]
    only_b = [f"d-{i}" for i in range(0, 40, 4)]
    counts = at_once.delete_entities(gone)
    counts_b = at_once.delete_entities(only_b, origin="b")
    assert counts == {e: one_by_one.delete_entity(e) for e in dict.fromkeys(gone)}
    assert counts_b == {e: one_by_one.delete_entity(e, origin="b") for e in only_b}
    assert counts["nobody"] == 0 and counts["d-0"] > counts["d-3"] > 0  # two origins, one
    assert counts_b["d-0"] == 0 and counts_b["d-4"] > 0  # d-0 already gone; d-4 of b
    # (the datasets' names and the times of writing differ; the contents not)
    left = [{e.id: e.to_dict() for e in ds.query()} for ds in (at_once, one_by_one)]
    assert {i: e["properties"] for i, e in left[0].items()} == {
        i: e["properties"] for i, e in left[1].items()
    }
    assert len(left[0]) == 40 - 14 and "d-4" in left[0] and "d-3" not in left[0]
    assert "nationality" not in left[0]["d-4"]["properties"]
