"""Exports checked against followthemoney's and ftmq's own code on the same statements."""

from __future__ import annotations

import hashlib
import io
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import pytest
from followthemoney.statement import Statement
from followthemoney.statement.entity import StatementEntity
from followthemoney.statement.serialize import CSVStatementWriter, read_csv_statements
from ftmq.model.stats import Collector

from lakehouse_assets import conventions as cv
from lakehouse_assets.exports import is_fresh
from lakehouse_assets.journal import COLUMNS, row_statement
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.query import ftm_dataset
from lakehouse_assets_tests.conftest import (
    lakehouse_env,
    run_python,
    sample_entities,
)
from lakehouse_assets_tests.helpers.data import input_entities, normal

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: the data-plane group: ``make test`` runs it with Spark Connect and in process
pytestmark = pytest.mark.spark_modes

SORT = ("canonical_id", "prop", "value", "origin", "id")
EXPORT_FILES = (cv.STATEMENTS_CSV, cv.ENTITIES_JSON, cv.STATISTICS_JSON)


def acknowledged(ds: Dataset) -> list[Statement]:
    """What the journal acknowledged, before flush: the independent expectation."""
    deleted = COLUMNS.index("deleted_at")
    return [row_statement(r) for r in ds.journal.rows(ds.name) if r[deleted] is None]


def expected_entities(name: str, statements: list[Statement]) -> list[StatementEntity]:
    """followthemoney's own aggregation of the live statements."""
    by_entity: dict[str, list[Statement]] = defaultdict(list)
    for stmt in sorted(statements, key=lambda s: tuple(getattr(s, k) or "" for k in SORT)):
        by_entity[stmt.canonical_id].append(stmt)
    meta = ftm_dataset(name)
    return [StatementEntity.from_statements(meta, by_entity[k]) for k in sorted(by_entity)]


def normal_stats(stats: dict[str, Any]) -> dict[str, Any]:
    """statistics.json with list order removed (ftmq lists them in the order it met them)."""
    out = json.loads(json.dumps(stats))
    for part in ("things", "intervals"):
        for key in ("schemata", "countries"):
            out[part][key] = sorted(out[part][key], key=lambda x: x.get("name") or x["code"])
    out["countries"] = sorted(out["countries"])
    return out


def lines(ds: Dataset, path: str) -> Iterator[bytes]:
    yield from ds.store.read_bytes(cv.dataset_path(ds.name, path)).splitlines()


@pytest.fixture
def exported(spark: SparkSession, lake: Lakehouse) -> tuple[Dataset, list[Statement]]:
    ds = lake.create_dataset("exporting", title="Exporting test")
    entities = input_entities()
    with ds.bulk(origin="crawl") as bulk:
        for e in entities:
            bulk.add_entity(e)
    doomed = str(entities[1]["id"])
    statements = [s for s in acknowledged(ds) if s.canonical_id != doomed]
    ds.flush()
    ds.delete_entity(doomed)
    result = ds.make()
    assert result.flushed is not None and result.flushed["tombstones"] > 0
    assert set(result.written) == {"statements", "entities", "statistics", "index"}
    return ds, statements


def test_statements_csv_is_followthemoneys_format(
    exported: tuple[Dataset, list[Statement]],
) -> None:
    ds, statements = exported
    data = ds.store.read_bytes(cv.dataset_path(ds.name, cv.STATEMENTS_CSV))
    # byte-identical to followthemoney's own writer over the sorted live statements
    buf = io.StringIO(newline="")
    writer = CSVStatementWriter(buf)
    for stmt in sorted(statements, key=lambda s: tuple(getattr(s, k) or "" for k in SORT)):
        writer.write(stmt)
    writer.close()
    assert data.decode("utf-8") == buf.getvalue()
    # and followthemoney's reader gives the same statements back
    back = list(read_csv_statements(io.BytesIO(data)))
    assert {s.id: s.to_dict() for s in back} == {s.id: s.to_dict() for s in statements}


def test_entities_json_equals_followthemoney_aggregation(
    exported: tuple[Dataset, list[Statement]],
) -> None:
    ds, statements = exported
    got = [orjson.loads(line) for line in lines(ds, cv.ENTITIES_JSON)]
    want = [e.to_dict() for e in expected_entities(ds.name, statements)]
    assert [g["id"] for g in got] == sorted(g["id"] for g in got)  # sorted by id
    assert [normal(g) for g in got] == [normal(w) for w in want]
    assert all(g["datasets"] == [ds.name] and g["first_seen"] for g in got)
    # stream reads the export back without Spark
    assert [e["id"] for e in ds.stream_entities()] == [g["id"] for g in got]


def test_statistics_are_ftmqs_dataset_stats(exported: tuple[Dataset, list[Statement]]) -> None:
    ds, statements = exported
    got = json.loads(ds.store.read_text(cv.dataset_path(ds.name, cv.STATISTICS_JSON)))
    want = Collector().collect_many(expected_entities(ds.name, statements)).model_dump(mode="json")  # type: ignore[no-untyped-call]
    assert normal_stats(got) == normal_stats(want)
    assert got["entity_count"] == len({s.canonical_id for s in statements})


def test_index_json_links_every_export(exported: tuple[Dataset, list[Statement]]) -> None:
    ds, _ = exported
    index = json.loads(ds.store.read_text(cv.dataset_path(ds.name, cv.INDEX)))
    assert index["name"] == ds.name and index["title"] == "Exporting test"
    assert index["entity_count"] == index["statistics"]["entity_count"] > 0
    by_name = {r["name"]: r for r in index["resources"]}
    assert set(by_name) == {"statements.csv", "entities.ftm.json", "statistics.json"}
    for resource in by_name.values():
        content = ds.store.read_bytes(cv.dataset_path(ds.name, resource["path"]))
        # followthemoney's checksum is the SHA-1 yente compares; the SHA-256 beside it
        assert resource["checksum"] == hashlib.sha1(content).hexdigest()  # noqa: S324
        assert resource["sha256"] == hashlib.sha256(content).hexdigest()
        assert resource["size"] == len(content)
        assert resource["mime_type"] and resource["timestamp"]
    versions = [
        p for p in ds.store.list(cv.dataset_path(ds.name, cv.VERSIONS)) if p.endswith("/index.json")
    ]
    assert len(versions) == 1
    assert json.loads(ds.store.read_text(versions[0])) == index


@pytest.mark.on_cluster
def test_exports_skip_when_fresh_and_follow_new_writes(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    ds = local_lake.create_dataset("freshness")
    entities = sample_entities()
    for e in entities[:5]:
        ds.add_entity(e)
    ds.make()
    assert all(is_fresh(ds, k) for k in ("statements", "entities", "statistics", "index"))
    again = ds.make()
    assert again.written == {} and again.flushed is None
    ds.optimize()  # same content: exports stay fresh
    assert ds.make().written == {}
    ds.add_entity(entities[6])
    assert not is_fresh(ds, "entities")
    only_stats = ds.export(["statistics"])
    assert set(only_stats.written) == {"statistics"} and only_stats.flushed is not None
    assert not is_fresh(ds, "entities")  # the other exports are still stale
    last = ds.make()
    # statistics.json was written but not published: it differs from the head's
    # manifest, so make writes it again (no tag makes such a file fresh)
    assert set(last.written) == {"statements", "entities", "statistics", "index"}
    assert ds.make().written == {}
    assert len(list(lines(ds, cv.ENTITIES_JSON))) == 6


def test_empty_dataset_exports_empty_files(spark: SparkSession, local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("empty")
    result = ds.make()
    assert result.written["entities"]["rows"] == 0
    assert list(lines(ds, cv.ENTITIES_JSON)) == []
    header = list(lines(ds, cv.STATEMENTS_CSV))
    assert len(header) == 1 and header[0].startswith(b'"canonical_id"')


def test_cli_flush_make_get_query_stream(spark: SparkSession, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from lakehouse_assets.cli import cli

    runner = CliRunner()
    lake = str(tmp_path / "lake")
    base = ["--lake", lake, "-d", "clitest"]
    assert runner.invoke(cli, ["--lake", lake, "datasets", "create", "clitest"]).exit_code == 0
    sample = Path(__file__).parents[1] / "lakehouse_assets" / "sample" / "entities.ftm.json"
    assert runner.invoke(cli, [*base, "entities", "write", "-i", str(sample)]).exit_code == 0
    flushed = runner.invoke(cli, [*base, "flush"])
    assert flushed.exit_code == 0, flushed.output
    assert json.loads(flushed.stdout)["new"] == 57
    made = runner.invoke(cli, [*base, "make"])
    assert json.loads(made.stdout)["written"]["entities"]["rows"] == 13
    got = runner.invoke(cli, [*base, "get", "acme-trading"])
    assert json.loads(got.stdout)["properties"]["name"] == ["ACME Trading GmbH"]
    missing = runner.invoke(cli, [*base, "get", "nobody"])
    assert missing.exit_code == 1 and "nobody" in missing.output
    people = runner.invoke(cli, [*base, "query", "-s", "Person"])
    assert {json.loads(x)["schema"] for x in people.stdout.splitlines()} == {"Person"}
    de = runner.invoke(cli, [*base, "query", "-s", "Company", "-p", "jurisdiction=de"])
    assert [json.loads(x)["id"] for x in de.stdout.splitlines()] == ["acme-trading"]
    bad = runner.invoke(cli, [*base, "query", "-p", "nonsense"])
    assert bad.exit_code == 2 and "PROPERTY=VALUE" in bad.output
    streamed = runner.invoke(cli, [*base, "stream"])
    assert len(streamed.stdout.splitlines()) == 13
    compacted = runner.invoke(cli, [*base, "compact"])
    assert json.loads(compacted.stdout)["live"] == 57
    optimized = runner.invoke(cli, [*base, "optimize", "--vacuum", "--retention-hours", "0"])
    assert optimized.exit_code == 0, optimized.output
    assert json.loads(optimized.stdout)["vacuumed"] > 0


def awkward_entities(rng: Any, count: int) -> list[dict[str, Any]]:
    """Entities whose values carry what CSV quoting must get right: quotes, commas,
    line breaks (\\n, \\r\\n, a lone \\r), backslashes, tabs, non-ASCII, emoji."""
    pieces = ['"', '""', ",", "\n", "\r\n", "\r", "\\", "\t", "ß", "Ж", "中", "🙂", " ", "a", "Z"]
    out = []
    for i in range(count):
        name = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12))).strip() or "x"
        out.append(
            {
                "id": f"awk-{i:03d}",
                "schema": "Person",
                "properties": {"name": [f"{name} {i}"], "notes": [name * 2]},
            }
        )
    return out


def test_sql_rendering_is_followthemoneys_csv_writer(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """``statement_csv_buffers`` (the logical hash, as-of exports) gives the bytes of
    followthemoney's CSVStatementWriter, and of the Spark export, for awkward values,
    a statement written by two origins, original values, languages and externals."""
    import random

    from lakehouse_assets.query import statement_csv_buffers

    ds = local_lake.create_dataset("awkward")
    entities = awkward_entities(random.Random(11), 60)
    with ds.bulk(origin="crawl") as bulk:
        for e in entities:
            bulk.add_entity(e)
    with ds.bulk(origin="another") as bulk:  # the same statements from a second origin
        for e in entities[:10]:
            bulk.add_entity(e)
        bulk.add_statement(
            Statement(
                entity_id="awk-001",
                prop="name",
                schema="Person",
                value='Ann "the, first"',
                dataset=ds.name,
                lang="eng",
                original_value="Ann\n(original)",
                external=True,
            )
        )
    statements = acknowledged(ds)
    ds.make()
    rendered = b"".join(bytes(buffer) for buffer, _ in statement_csv_buffers(ds, ds.snapshot()))
    # followthemoney's writer over the sorted statements, each id once per entity
    buf = io.StringIO(newline="")
    writer = CSVStatementWriter(buf)
    seen: set[tuple[str | None, str | None]] = set()
    for stmt in sorted(statements, key=lambda s: tuple(getattr(s, k) or "" for k in SORT)):
        if (stmt.canonical_id, stmt.id) not in seen:
            seen.add((stmt.canonical_id, stmt.id))
            writer.write(stmt)
    writer.close()
    assert rendered.decode("utf-8") == buf.getvalue()
    assert rendered == ds.store.read_bytes(cv.dataset_path(ds.name, cv.STATEMENTS_CSV))
    assert sum(n for _, n in statement_csv_buffers(ds, ds.snapshot())) == len(seen)


@pytest.mark.driver
def test_statistics_in_a_fresh_process_import_ftmq_while_spark_aggregates(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """A fresh process (a CLI command, a Dagster step) has not imported ftmq when
    the statistics aggregation starts: the import runs on a thread while Spark
    aggregates (``preload``), and the main thread's import then waits for it.
    The statistics come out as those of a process that had ftmq already."""
    ds = local_lake.create_dataset("preloading")
    for entity in sample_entities():
        ds.add_entity(entity, origin="crawl")
    ds.make()
    path = cv.dataset_path(ds.name, cv.STATISTICS_JSON)
    want = ds.store.read_bytes(path)
    ds.store.delete(path)
    probe = (
        "import sys\n"
        "import lakehouse_assets.preload as preload\n"
        "from lakehouse_assets.lake import Lakehouse\n"
        "calls = []\n"
        "real = preload.preload\n"
        "preload.preload = lambda name: (calls.append(name), real(name))[1]\n"
        "before = 'ftmq' in sys.modules\n"
        f"Lakehouse().dataset({ds.name!r}).export(['statistics'], force=True)\n"
        "print(before, ','.join(calls))\n"
    )
    done = run_python(probe, env=lakehouse_env(local_lake), check=False, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "ftmq.model.stats"]
    assert ds.store.read_bytes(path) == want  # the same bytes in another process


@pytest.mark.spark_free
def test_statistics_json_is_the_same_bytes_under_every_hash_seed() -> None:
    """ftmq keeps a dataset's countries as a set; written in the set's order, the
    file changed with each process's string hash seed. It is ftmq's JSON with
    the countries sorted."""
    import os

    probe = (
        "from followthemoney import model\n"
        "from ftmq.model.stats import Collector\n"
        "from lakehouse_assets.spark.ftm_sql import stats_json\n"
        "from lakehouse_assets_tests.conftest import sample_entities\n"
        "stats = Collector().collect_many(model.get_proxy(e) for e in sample_entities())\n"
        "print(stats.model_dump_json(indent=2))\n"
        "print('---')\n"
        "print(stats_json(stats))\n"
    )
    outputs = []
    for seed in ("0", "1", "2", "3"):
        done = run_python(probe, env={**os.environ, "PYTHONHASHSEED": seed})
        ftmq_json, ours = done.stdout.split("\n---\n")
        assert json.loads(ours) == {
            **json.loads(ftmq_json),
            "countries": sorted(json.loads(ftmq_json)["countries"]),
        }
        outputs.append((ftmq_json, ours))
    assert len({ours for _, ours in outputs}) == 1
    assert len(json.loads(outputs[0][1])["countries"]) > 1
    assert len({ftmq_json for ftmq_json, _ in outputs}) > 1  # what this is about


@pytest.mark.spark_free
def test_preloading_a_module_that_fails_leaves_the_error_to_the_importer() -> None:
    """Both threads importing ftmq at once get one finished module; a module that
    cannot be imported only ends the thread (the caller's import raises)."""
    probe = (
        "from lakehouse_assets.preload import preload\n"
        "preload('ftmq.model.stats')\n"
        "from ftmq.model.stats import Collector\n"  # at once, on the main thread
        "print(Collector().export().entity_count)\n"
        "missing = preload('lakehouse_assets_no_such_module')\n"
        "missing.join(30)\n"
        "print(missing.is_alive())\n"
        "try:\n"
        "    import lakehouse_assets_no_such_module\n"
        "except ModuleNotFoundError:\n"
        "    print('raised')\n"
    )
    done = run_python(probe)
    assert done.stdout.split() == ["0", "False", "raised"]
    assert done.stderr == ""


def add_awkward_entities(ds: Dataset) -> None:
    """Entities where followthemoney's rules branch (see the test below): two
    origins, one schema merged from two, a caption picked among several names
    in several languages, merged entities, an ``id`` checksum statement."""
    with ds.bulk(origin="crawl") as bulk:
        bulk.add_entity(
            {
                "id": "ann",
                "schema": "LegalEntity",
                "properties": {"name": ["Ann Smith"], "country": ["de"]},
            }
        )
        bulk.add_entity({"id": "firm", "schema": "Company", "properties": {"name": ["Firm"]}})
        bulk.add_entity(
            {
                "id": "evt",
                "schema": "Event",
                "properties": {
                    "name": ["Meeting"],
                    "date": ["2019-05-01", "2018"],
                    "country": ["fr", "de"],
                },
            }
        )
        bulk.add_entity(
            {
                "id": "own",
                "schema": "Ownership",
                "properties": {"owner": ["ann"], "asset": ["firm"], "startDate": ["2001-02-03"]},
            }
        )
        bulk.add_entity({"id": "addr", "schema": "Address", "properties": {"country": ["gb"]}})
    with ds.bulk(origin="registry") as bulk:
        bulk.add_entity(
            {
                "id": "ann",
                "schema": "Person",
                "properties": {"name": ["Anna Smith", "Ann Smith"], "birthDate": ["1970"]},
            }
        )
        for value, lang in (("Анна Смит", "rus"), ("Ann Smith", "eng"), ("Anne Smith", "fra")):
            bulk.add_statement(
                Statement(
                    entity_id="ann",
                    prop="alias",
                    schema="Person",
                    value=value,
                    dataset=ds.name,
                    lang=lang,
                )
            )
        for member in ("firm-a", "firm-b"):
            bulk.add_statement(
                Statement(
                    entity_id=member,
                    canonical_id="firm-merged",
                    prop="name",
                    schema="Company",
                    value=f"Firm {member[-1].upper()}",
                    dataset=ds.name,
                )
            )
        bulk.add_statement(
            Statement(
                entity_id="firm",
                prop="id",
                schema="Company",
                value="0" * 40,
                dataset=ds.name,
                first_seen="2020-01-01T00:00:00",
            )
        )


def test_sql_entities_and_statistics_on_awkward_entities(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """The Spark SQL aggregation (``spark.ftm_sql``) against followthemoney and ftmq
    where their rules branch: schemata merged across origins, captions picked
    among several names in several languages (rigour's ``pick_lang_name``, the
    one Python UDF), a single name, no caption property at all (the schema's
    label), merged entities (referents), the ``id`` checksum statement
    (``last_change``), countries and dates of Things and Intervals."""
    ds = local_lake.create_dataset("awkward_entities")
    add_awkward_entities(ds)
    statements = acknowledged(ds)
    ds.make()
    got = [orjson.loads(line) for line in lines(ds, cv.ENTITIES_JSON)]
    want = [e.to_dict() for e in expected_entities(ds.name, statements)]
    assert [normal(g) for g in got] == [normal(w) for w in want]
    by_id = {g["id"]: g for g in got}
    assert by_id["ann"]["schema"] == "Person"  # LegalEntity + Person
    assert by_id["addr"]["caption"] == "Address"  # no caption property: the label
    assert by_id["firm-merged"]["referents"] == ["firm-a", "firm-b"]
    assert by_id["firm"]["last_change"] >= "2020-01-01T00:00:00"
    # the export is byte-stable: property values are sorted
    assert by_id["ann"]["properties"]["name"] == ["Ann Smith", "Anna Smith"]
    stats = json.loads(ds.store.read_text(cv.dataset_path(ds.name, cv.STATISTICS_JSON)))
    expected = Collector().collect_many(expected_entities(ds.name, statements))  # type: ignore[no-untyped-call]
    assert normal_stats(stats) == normal_stats(json.loads(expected.model_dump_json()))
    assert (stats["start"], stats["end"]) == ("2001-02-03", "2019-05-01")


@pytest.mark.on_cluster
def test_the_export_is_the_same_bytes_on_one_partition_and_on_several(
    spark: SparkSession,
    local_lake: Lakehouse,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A small dataset's pass runs in one partition without a shuffle; a large
    one is range-partitioned by entity. Both give the same bytes, with copies of
    a statement in two origins, merged entities and a caption pick among them."""
    from lakehouse_assets import export_pass
    from lakehouse_assets.spark import session

    monkeypatch.setattr(local_lake.settings, "export_engine", "spark")  # its plan's partitions
    ds = local_lake.create_dataset("partitioned")
    add_awkward_entities(ds)
    for origin in ("crawl", "registry"):  # every statement in two origins
        with ds.bulk(origin=origin) as bulk:
            for e in input_entities()[:120]:
                bulk.add_entity(e)
    paths = [cv.dataset_path(ds.name, p) for p in EXPORT_FILES]
    planned: list[int] = []
    real = export_pass.partitions_for

    def spy(*args: Any) -> int:
        planned.append(real(*args))
        return planned[-1]

    monkeypatch.setattr(export_pass, "partitions_for", spy)
    statements = acknowledged(ds)
    ds.make()
    one = [ds.store.read_bytes(p) for p in paths]
    monkeypatch.setattr(session, "PARTITION_BYTES", 1024)
    ds.make(force=True)
    several = [ds.store.read_bytes(p) for p in paths]
    assert planned[0] == 1 and planned[1] > 1, planned
    assert several == one
    want = [e.to_dict() for e in expected_entities(ds.name, statements)]
    got = [orjson.loads(line) for line in one[1].splitlines()]
    assert [normal(g) for g in got] == [normal(w) for w in want]


@pytest.mark.driver
def test_a_first_build_skips_the_join_with_the_same_bytes(
    spark: SparkSession, local_lake: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 49: where the translog changes no stored row (a first build) the pass
    reads the main table as the live statements, without the join: the same
    bytes as with it, and as followthemoney's; once a row's seen range widens,
    the join is back and gives the widened range."""
    from lakehouse_assets.tables import spark_io

    monkeypatch.setattr(local_lake.settings, "export_engine", "spark")  # its plan's join
    ds = local_lake.create_dataset("first_build")
    add_awkward_entities(ds)
    for origin in ("crawl", "registry"):
        with ds.bulk(origin=origin) as bulk:
            for e in input_entities()[:60]:
                bulk.add_entity(e)
    statements = acknowledged(ds)
    paths = [cv.dataset_path(ds.name, p) for p in EXPORT_FILES]
    joined: list[bool] = []
    real = spark_io.main_is_live

    def spy(*args: Any) -> bool:
        joined.append(not real(*args))
        return not joined[-1]

    monkeypatch.setattr(spark_io, "main_is_live", spy)
    ds.make()
    skipped = [ds.store.read_bytes(p) for p in paths]
    assert joined and not any(joined)
    monkeypatch.setattr(spark_io, "main_is_live", lambda *args: False)
    ds.make(force=True)
    assert [ds.store.read_bytes(p) for p in paths] == skipped
    want = [e.to_dict() for e in expected_entities(ds.name, statements)]
    got = [orjson.loads(line) for line in skipped[1].splitlines()]
    assert [normal(g) for g in got] == [normal(w) for w in want]

    monkeypatch.setattr(spark_io, "main_is_live", spy)
    entity = input_entities()[0]
    ds.add_entity(entity, origin="crawl")  # written again: a later last_seen
    ds.make(force=True)
    assert joined[-1] is True
    lines = ds.store.read_bytes(paths[1]).splitlines()
    again = next(orjson.loads(x) for x in lines if orjson.loads(x)["id"] == entity["id"])
    before = next(
        orjson.loads(x) for x in skipped[1].splitlines() if orjson.loads(x)["id"] == entity["id"]
    )
    assert again["last_seen"] > before["last_seen"]


@pytest.mark.parametrize("flusher", ["driver", "spark"])
def test_a_statement_another_writer_deleted_and_written_again_keeps_its_first_seen(
    spark: SparkSession, local_lake: Lakehouse, flusher: str
) -> None:
    """Found by the versions property: a delta-rs ``delete()`` of an entity's rows
    from the statements table leaves their translog rows; written again, they are
    new main rows (first_seen now) whose translog rows keep the first flush's
    first_seen. That flush must not say the translog changes no main row: the
    exports' join is then no identity, and the export, the version's record and
    a rendering as of the version must agree on the translog's first_seen."""
    import io
    import time

    from deltalake import DeltaTable

    if flusher == "spark":
        local_lake.settings.flush_driver_rows = 0
    ds = local_lake.create_dataset(f"foreign_{flusher}")
    entity = sample_entities()[0]
    ds.add_entity(entity, origin="crawl")
    ds.add_entity(sample_entities()[1], origin="crawl")
    ds.make()
    first = next(
        orjson.loads(x)
        for x in ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON)).splitlines()
        if orjson.loads(x)["id"] == entity["id"]
    )
    DeltaTable(ds.statements_table.uri).delete(f"canonical_id = '{entity['id']}'")
    time.sleep(1.1)  # seen times have one-second resolution
    ds.add_entity(entity, origin="crawl")
    ds.make()
    raw = ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON))
    exported = {orjson.loads(x)["id"]: orjson.loads(x) for x in raw.splitlines()}
    as_of = io.BytesIO()
    ds.export_as_of(ds.versions()[-1].sequence, "entities", as_of)
    rendered = {orjson.loads(x)["id"]: orjson.loads(x) for x in as_of.getvalue().splitlines()}
    assert exported == rendered
    again = exported[entity["id"]]
    assert again["first_seen"] == first["first_seen"] < again["last_seen"]


def test_ranged_coalesces_only_a_small_input_wanted_in_one_partition(
    spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``ranged`` (flush, compact, optimize, exports): one partition from a small
    input is a coalesce, without an exchange; one partition from a large input
    keeps the range exchange (its read stays parallel); several partitions hold
    ordered, disjoint ranges."""
    from pyspark.sql import functions as F

    from lakehouse_assets.spark.session import PARTITION_BYTES, ranged

    frame = spark.range(0, 1000, numPartitions=4).select((999 - F.col("id")).alias("k"))

    def plan(df: Any) -> str:
        """The physical plan as Spark explains it (printed, in both modes)."""
        capsys.readouterr()
        df.explain()
        return capsys.readouterr().out.lower()

    def placed(df: Any) -> list[tuple[int, int, int]]:
        rows = (
            df.groupBy(F.spark_partition_id().alias("p"))
            .agg(F.min("k").alias("lo"), F.max("k").alias("hi"))
            .orderBy("p")
            .collect()
        )
        return [(r["p"], r["lo"], r["hi"]) for r in rows]

    small = ranged(frame, 1, "k", input_bytes=PARTITION_BYTES - 1)
    large = ranged(frame, 1, "k", input_bytes=PARTITION_BYTES)
    several = ranged(frame, 3, "k", input_bytes=0)
    assert placed(small) == [(0, 0, 999)] == placed(large)
    parts = placed(several)
    assert [p for p, _, _ in parts] == [0, 1, 2]
    assert all(a[2] < b[1] for a, b in zip(parts, parts[1:], strict=False))
    assert parts[0][1] == 0 and parts[-1][2] == 999
    assert "coalesce" in plan(small) and "exchange" not in plan(small)
    assert "exchange" in plan(large)  # Spark's range exchange into a single partition


def test_the_spark_driver_runs_with_the_configured_java_options(spark: SparkSession) -> None:
    """The driver JVM, in process or the Connect server the fixture started,
    gets ``spark_driver_java_options`` (G1, named, by default) after the
    lakehouse's own options."""
    options = spark.conf.get("spark.driver.extraJavaOptions") or ""
    from lakehouse_assets.settings import Settings

    wanted = Settings().spark_driver_java_options
    assert wanted == "-XX:+UseG1GC"
    assert options.endswith(wanted) and "-XX:-UsePerfData" in options, options


@pytest.mark.driver
def test_the_caption_udf_is_planned_only_when_an_entity_needs_a_pick(
    spark: SparkSession,
    local_lake: Lakehouse,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rigour's pick among several names is the export's one Python UDF, and it
    costs a Python worker for every row even when the row has nothing to pick.
    It is left out of the plan when no entity has several names in its caption
    property; the captions are followthemoney's either way."""
    from lakehouse_assets.spark import ftm_sql

    built: list[object] = []
    real = ftm_sql._pick_name_udf

    def spy() -> Any:
        built.append(object())
        return real()

    monkeypatch.setattr(ftm_sql, "_pick_name_udf", spy)
    # the second make is incremental: have Spark make its lines, not the driver
    # (Python's lines or DuckDB's)
    monkeypatch.setattr(local_lake.settings, "export_driver_statements", 0)
    monkeypatch.setattr(local_lake.settings, "export_engine", "spark")
    ds = local_lake.create_dataset("picks")
    ds.add_entity({"id": "a", "schema": "Person", "properties": {"name": ["Ann Smith"]}})
    ds.add_entity({"id": "o", "schema": "Address", "properties": {"country": ["gb"]}})
    statements = acknowledged(ds)
    ds.make()
    assert built == []
    ds.add_entity(
        {"id": "b", "schema": "Person", "properties": {"name": ["Bob Stone", "Robert Stone"]}}
    )
    name = Statement(
        entity_id="b", prop="name", schema="Person", value="Боб Стоун", dataset=ds.name, lang="rus"
    )
    ds.add_statements([name])
    statements += acknowledged(ds)
    ds.make()
    assert len(built) == 1
    want = {e.id: e.caption for e in expected_entities(ds.name, statements)}
    got = {e["id"]: e["caption"] for e in map(orjson.loads, lines(ds, cv.ENTITIES_JSON))}
    assert got == want
    assert got["a"] == "Ann Smith" and got["o"] == "Address"


def test_entities_with_no_common_schema_fail_the_export_by_name(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """Statements that make one entity a Person and a Company: the export fails
    naming the entity and both schemata, as followthemoney's aggregation does,
    and the exports written before stay as they were."""
    ds = local_lake.create_dataset("clash")
    ds.add_entity({"id": "x", "schema": "Person", "properties": {"name": ["X"]}})
    ds.make()
    before = ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON))
    ds.add_entity({"id": "x", "schema": "Company", "properties": {"name": ["X Ltd"]}}, "other")
    with pytest.raises(Exception, match=r"entity x: no common schema of Company, Person"):
        ds.make()
    assert ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON)) == before
    assert not is_fresh(ds, "entities")


@pytest.mark.driver
def test_an_export_whose_spark_went_away_raises_its_own_error_and_cleans_up(
    spark: SparkSession, local_lake: Lakehouse
) -> None:
    """Spark gone mid-export (a driver that ran out of heap stops its SparkContext):
    the pass's clean-up cannot unpersist its cached frames, but it must neither
    replace the error that ended the pass with its own nor leave the staging
    area behind; the exports written before stay, and a rerun writes them anew.
    Run in a fresh process, whose Spark it stops."""
    ds = local_lake.create_dataset("driver_gone")
    for e in sample_entities()[:6]:
        ds.add_entity(e)
    ds.make()
    before = ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON))
    probe = (
        "from lakehouse_assets import conventions as cv, faults\n"
        "from lakehouse_assets.lake import Lakehouse\n"
        "from lakehouse_assets.spark.session import stop_spark\n"
        f"ds = Lakehouse().dataset({ds.name!r})\n"
        "KINDS = ['statements', 'entities', 'statistics']\n"
        "def driver_gone():\n"
        "    stop_spark()\n"
        "    raise RuntimeError('the driver is gone')\n"
        "try:\n"
        "    with faults.on('export.after_parts', driver_gone):\n"
        "        ds.export(KINDS, force=True)\n"
        "except RuntimeError as exc:\n"
        "    print('raised:', exc)\n"
        "staged = ds.store.list_dirs(cv.dataset_path(ds.name, cv.STAGING))\n"
        "print('staged:', len(staged))\n"
        "print('rerun:', ','.join(sorted(ds.export(KINDS, force=True).written)))\n"
    )
    done = run_python(probe, env=lakehouse_env(local_lake), check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "raised: the driver is gone",
        "staged: 0",
        "rerun: entities,statements,statistics",
    ], done.stdout
    assert ds.store.read_bytes(cv.dataset_path(ds.name, cv.ENTITIES_JSON)) == before


@pytest.mark.driver
def test_index_takes_the_checksums_the_export_pass_computed(
    spark: SparkSession,
    local_lake: Lakehouse,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The export pass hashes each export while writing it; index.json and the
    version manifest take those hashes, so statements.csv (the largest export)
    is not read back at all. Run alone, the index reads each export once for both
    (and for both its checksums, SHA-1 and SHA-256)."""
    from lakehouse_assets.exports import export_index
    from lakehouse_assets.storage import LocalStore

    reads: list[str] = []
    real = LocalStore.open_read

    def counting(self: LocalStore, path: str) -> Any:
        reads.append(path)
        return real(self, path)

    monkeypatch.setattr(LocalStore, "open_read", counting)
    ds = local_lake.create_dataset("hashed")
    for e in sample_entities()[:6]:
        ds.add_entity(e)
    ds.make()
    csv_path = cv.dataset_path(ds.name, cv.STATEMENTS_CSV)
    assert csv_path not in reads
    index = json.loads(ds.store.read_text(cv.dataset_path(ds.name, cv.INDEX)))
    for resource in index["resources"]:
        content = ds.store.read_bytes(cv.dataset_path(ds.name, resource["path"]))
        assert resource["checksum"] == hashlib.sha1(content).hexdigest()  # noqa: S324
        assert resource["sha256"] == hashlib.sha256(content).hexdigest()

    ds.add_entity(sample_entities()[6])
    ds.export(["statements"])  # a new statements.csv; the index runs on its own
    reads.clear()
    alone = export_index(ds)
    assert reads.count(csv_path) == 1
    index = json.loads(ds.store.read_text(cv.dataset_path(ds.name, cv.INDEX)))
    by_path = {r["path"]: r for r in index["resources"]}
    csv = ds.store.read_bytes(csv_path)
    assert by_path[cv.STATEMENTS_CSV]["checksum"] == hashlib.sha1(csv).hexdigest()  # noqa: S324
    assert by_path[cv.STATEMENTS_CSV]["sha256"] == hashlib.sha256(csv).hexdigest()
    manifest = ds.version().manifest  # type: ignore[union-attr]
    assert alone["version"]["sequence"] == 2
    assert {e["path"]: e["sha256"] for e in manifest["exports"]}[cv.STATEMENTS_CSV] == (
        by_path[cv.STATEMENTS_CSV]["sha256"]
    )
