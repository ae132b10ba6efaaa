"""Spark writes Parquet, delta-rs commits it: standard Delta, on disk and on S3."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import fs as pafs

from lakehouse_assets import Settings
from lakehouse_assets.tables.delta import (
    DeltaLocation,
    add_action,
    commit,
    committed_version,
    snapshot_files,
    unique_file_name,
)
from lakehouse_assets_tests.conftest import make_bucket

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SCHEMA = pa.schema([("id", pa.string()), ("value", pa.string()), ("origin", pa.string())])


def spark_partitioned_files(
    spark: SparkSession, staging: Path, rows: list[tuple[str, str, str]]
) -> dict[str, list[Path]]:
    """Let Spark write Parquet per origin; return files by origin (from our data, not dir names)."""
    out: dict[str, list[Path]] = {}
    for origin in sorted({r[2] for r in rows}):
        part = [(i, v) for i, v, o in rows if o == origin]
        target = staging / f"batch-{len(out)}"
        spark.createDataFrame(part, "id string, value string").coalesce(1).write.parquet(
            str(target)
        )
        out[origin] = sorted(target.glob("part-*.parquet"))
    return out


def test_spark_parquet_committed_by_delta_rs_is_standard_delta(
    spark: SparkSession, tmp_path: Path
) -> None:
    rows = [("s1", "Ann", "crawl"), ("s2", "Bob", "crawl"), ("s3", "Müller", "ümlaut:src")]
    table_dir = tmp_path / "statements"
    loc = DeltaLocation(str(table_dir), {})
    actions = []
    for origin, files in spark_partitioned_files(spark, tmp_path / "staging", rows).items():
        for f in files:
            rel = f"origin={origin}/{unique_file_name()}"
            (table_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, table_dir / rel)
            meta = pq.read_metadata(table_dir / rel)
            actions.append(
                add_action(rel, (table_dir / rel).stat().st_size, meta, {"origin": origin})
            )
    version = commit(
        loc, actions, schema=SCHEMA, partition_by=["origin"], app_id="flush:test", app_version=7
    )
    assert version == 0
    assert committed_version(loc, "flush:test") == 7
    # delta-rs reads it back, partition values from the log (non-ASCII intact)
    table = loc.table()
    assert table is not None
    data = table.to_pyarrow_dataset().to_table().sort_by("id").to_pylist()
    assert [(r["id"], r["value"], r["origin"]) for r in data] == rows
    # DuckDB reads the snapshot's Parquet files
    files = snapshot_files(loc)
    got = duckdb.sql(f"SELECT count(*), min(value) FROM read_parquet({files!r})").fetchone()
    assert got == (3, "Ann")
    # stats were taken from the footers, so delta-rs can prune on them
    stats = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert sum(s["num_records"] for s in stats) == 3
    assert {s["min.id"] for s in stats} == {"s1", "s3"}


def test_second_commit_appends_and_time_travel(spark: SparkSession, tmp_path: Path) -> None:
    loc = DeltaLocation(str(tmp_path / "t"), {})

    def write(name: str, ids: list[str]) -> None:
        rel = f"origin=a/{name}"
        path = tmp_path / "t" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": ids, "value": ids}), path)
        commit(
            loc,
            [add_action(rel, path.stat().st_size, pq.read_metadata(path), {"origin": "a"})],
            schema=SCHEMA,
            partition_by=["origin"],
        )

    write(unique_file_name(), ["1", "2"])
    write(unique_file_name(), ["3"])
    assert len(snapshot_files(loc)) == 2 and len(snapshot_files(loc, version=0)) == 1
    old = loc.table(version=0)
    assert old is not None and old.to_pyarrow_dataset().count_rows() == 2


def test_a_commit_with_new_columns_evolves_the_table(tmp_path: Path) -> None:
    """A table made before a column existed (a translog without provenance) gains it
    in its Delta schema on the next commit, so every Delta reader sees it; rows of
    the old files read it as NULL."""
    loc = DeltaLocation(str(tmp_path / "t"), {})
    wide = SCHEMA.append(pa.field("writer", pa.string()))

    def write(name: str, table: pa.Table, schema: pa.Schema) -> int:
        path = tmp_path / "t" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        action = add_action(name, path.stat().st_size, pq.read_metadata(path), {})
        return commit(loc, [action], schema=schema, metadata={"step": name})

    write("old.parquet", pa.table({"id": ["1"], "value": ["a"], "origin": ["o"]}), SCHEMA)
    version = write(
        "new.parquet",
        pa.table({"id": ["2"], "value": ["b"], "origin": ["o"], "writer": ["alice"]}),
        wide,
    )
    assert version == 2  # the schema change, then the data
    table = loc.table()
    assert table is not None
    assert [f.name for f in table.schema().fields] == wide.names
    rows = table.to_pyarrow_dataset().to_table().sort_by("id").to_pylist()
    assert [(r["id"], r["writer"]) for r in rows] == [("1", None), ("2", "alice")]
    files = snapshot_files(loc)
    got = duckdb.sql(
        f"SELECT count(*), count(writer) FROM read_parquet({files!r}, union_by_name=true)"
    ).fetchone()
    assert got == (2, 1)
    # the schema change is its own commit, saying what it added (newest first)
    change = {c["version"]: c for c in table.history()}[1]
    assert change["lakehouse.schema"] == "added writer" and change["step"] == "new.parquet"
    # a later commit with the same schema changes nothing in it
    more = pa.table({"id": ["3"], "value": ["c"], "origin": ["o"], "writer": [None]}, schema=wide)
    assert write("more.parquet", more, wide) == 3


def test_commit_on_s3(tmp_path: Path, s3_settings: Settings) -> None:
    bucket = make_bucket(s3_settings)
    assert s3_settings.s3_endpoint_url is not None
    options = {
        "AWS_ENDPOINT_URL": s3_settings.s3_endpoint_url,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": "us-east-1",
    }
    s3 = pafs.S3FileSystem(
        endpoint_override=s3_settings.s3_endpoint_url,
        scheme="http",
        access_key="testing",
        secret_key="testing",
        region="us-east-1",
    )
    loc = DeltaLocation(f"s3://{bucket}/lake/ds/entities/statements", options)
    rel = f"origin=x/{unique_file_name()}"
    key = f"{bucket}/lake/ds/entities/statements/{rel}"
    pq.write_table(pa.table({"id": ["a", "b"], "value": ["1", "2"]}), key, filesystem=s3)
    info = s3.get_file_info(key)
    meta = pq.read_metadata(key, filesystem=s3)
    commit(
        loc,
        [add_action(rel, info.size, meta, {"origin": "x"})],
        schema=SCHEMA,
        partition_by=["origin"],
        app_id="flush:ds",
        app_version=1,
    )
    assert committed_version(loc, "flush:ds") == 1
    files = snapshot_files(loc)
    assert len(files) == 1 and files[0].startswith(f"s3://{bucket}/")
    ds = pads.dataset([f.removeprefix("s3://") for f in files], filesystem=s3, format="parquet")
    assert sorted(ds.to_table().column("id").to_pylist()) == ["a", "b"]


def test_missing_table_reads_as_empty(tmp_path: Path) -> None:
    loc = DeltaLocation(str(tmp_path / "none"), {})
    assert loc.table() is None and snapshot_files(loc) == [] and committed_version(loc, "x") is None
    assert not loc.exists()


def test_dataset_tables_point_into_the_layout(lake) -> None:  # type: ignore[no-untyped-def]
    ds = lake.create_dataset("tables")
    assert ds.statements_table.uri.endswith("tables/entities/statements")
    assert ds.translog_table.uri.endswith("tables/entities/translog")
    assert ds.statements_table.table() is None  # nothing flushed yet
    if lake.settings.is_s3:
        assert ds.statements_table.storage_options["AWS_ALLOW_HTTP"] == "true"


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from([f"id-{i}" for i in range(40)]), min_size=1, max_size=6),
    st.lists(st.integers(0, 5), min_size=1, max_size=3),
    st.sets(st.sampled_from(["a", "b", "c"]), max_size=2),
)
def test_point_lookup_equals_a_filtered_scan(
    ids: list[str], buckets: list[int], origins: set[str]
) -> None:
    """Both point-read paths return the rows a pyarrow scan with the same filter
    does, partition values from the log, and NULL for a column an older file
    lacks: row groups picked by their min/max and read with pyarrow (files sorted
    by the key, string_view columns as delta-rs writes them), and DuckDB's
    bloom-filtered read (where min/max does not narrow)."""
    import tempfile

    import pyarrow.compute as pc

    from lakehouse_assets.tables.lookups import _duckdb_lookup, _row_group_lookup, point_lookup
    from lakehouse_assets.tables.snapshot import DataFile

    schema = pa.schema(
        [
            ("id", pa.string()),
            ("bucket", pa.int32()),
            ("writer", pa.string()),
            ("origin", pa.string()),
        ]
    )
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for n, origin in enumerate(("a", "b", "a")):
            rows = sorted((i % 6, f"id-{i}") for i in range(n * 10, n * 10 + 20))
            table = pa.table(
                {
                    "id": pa.array([r[1] for r in rows], pa.string_view() if n == 2 else None),
                    "bucket": pa.array([r[0] for r in rows], pa.int32()),
                }
            )
            if n:  # the first file was written before "writer" existed
                table = table.append_column("writer", pa.array([f"w{n}"] * len(rows)))
            path = f"{tmp}/part-{n}.parquet"
            pq.write_table(table, path, row_group_size=3)
            files.append(DataFile(path, f"part-{n}.parquet", 0, {"origin": origin}, 0, 5))
        where: dict[str, list[str] | list[int]] = {"id": ids, "bucket": buckets}
        expression = pc.field("id").isin(ids) & pc.field("bucket").isin(buckets)
        if origins:
            where["origin"] = sorted(origins)
            expression = expression & pc.field("origin").isin(sorted(origins))
        whole = []
        for f in files:  # the reference: each file read whole, then filtered
            table = pq.read_table(f.uri)
            if "writer" not in table.column_names:
                table = table.append_column("writer", pa.nulls(table.num_rows, pa.string()))
            table = table.append_column(
                "origin", pa.array([f.partition_values["origin"]] * table.num_rows)
            )
            whole.append(table.select(schema.names).cast(schema))
        want = pa.concat_tables(whole).filter(expression)
        names = schema.names
        by_row_groups = _row_group_lookup(files, schema, {}, where, names, "origin")
        assert by_row_groups is not None  # 20-row files: min/max leaves few row groups

        def key(t: pa.Table) -> list[tuple[object, ...]]:
            return sorted(tuple(str(v) for v in r.values()) for r in t.to_pylist())

        for got in (point_lookup(files, schema, {}, where, partition="origin"), by_row_groups):
            assert got.schema == schema
            assert key(got) == key(want)
            assert all(r["writer"] is None for r in got.to_pylist() if r["id"] < "id-10")
        if not origins:  # DuckDB's path takes the partition from the log, unfiltered
            assert key(_duckdb_lookup(files, schema, where, names, "origin")) == key(want)
