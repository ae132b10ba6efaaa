"""Collections checked against nomenklatura's own resolver and merge of the same inputs.

Three leaves with overlapping entities (one under a nested collection), and
judgements made with nomenklatura's ``Resolver`` in a real SQLite database: a
chain of three ids merged (two ``decide`` calls, so an ``NK-`` canonical), a
cluster named by a Wikidata QID, a negative, an unsure, a merge of a
``LegalEntity`` with a ``Company`` (common schema ``Company``) and of two
companies that an ownership refers to (entity-typed values rewritten). The
lake loads nomenklatura's table, builds the collection with Spark and
publishes it; its ``entities.ftm.json`` is compared entity by entity with
nomenklatura's ``Linker.apply_statement`` over each leaf's live statements,
aggregated by followthemoney's ``StatementEntity`` (what zavod's exporters
run). The differences that remain are zavod's and are listed in
docs/collections.md.
"""

from __future__ import annotations

import csv
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

from lakehouse_assets import conventions as cv
from lakehouse_assets.collections import judgements
from lakehouse_assets.collections.build import build
from lakehouse_assets.collections.leaves import leaves
from lakehouse_assets.collections.make import make, stale_reason
from lakehouse_assets.collections.resolver import clusters, pair
from lakehouse_assets.errors import CollectionError, InvalidInputError
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.query import ftm_dataset, live_statements
from lakehouse_assets_tests.helpers.data import normal

if TYPE_CHECKING:
    from nomenklatura.resolver import Resolver
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow

#: the data-plane comparisons (``make test`` runs them again in process and on a
#: cluster); the CLI, PostgreSQL and yente paths run once, in the main pass
data_plane = pytest.mark.spark_modes


def person(eid: str, name: str, **props: list[str]) -> dict[str, Any]:
    return {"id": eid, "schema": "Person", "properties": {"name": [name], **props}}


def entity(eid: str, schema: str, **props: list[str]) -> dict[str, Any]:
    return {"id": eid, "schema": schema, "properties": props}


LEAVES: dict[str, tuple[str, list[dict[str, Any]]]] = {
    "leaf_a": (
        "crawl",
        [
            person("a-ann", "Ann Smith", birthDate=["1970"], nationality=["de"]),
            person("a-bob", "Bob Jones"),
            entity("a-acme", "Company", name=["ACME Ltd"], jurisdiction=["gb"]),
            entity("a-own", "Ownership", owner=["a-bob"], asset=["a-acme"]),
            entity("a-zed", "LegalEntity", name=["Zed"]),
            person("a-vlad", "Vladimir Example"),
        ],
    ),
    "leaf_b": (
        "import",
        [
            person("b-ann", "Anne Smith", birthDate=["1970-01-01"], nationality=["de"]),
            person("b-bob", "Robert Jones"),
            entity("b-acme", "Company", name=["ACME Limited"], jurisdiction=["gb"]),
            entity("b-dir", "Directorship", director=["b-ann"], organization=["a-acme"]),
            entity("b-zed", "Company", name=["Zed Corp"], jurisdiction=["fr"]),
            person("b-vlad", "Vladimir Example", nationality=["ru"]),
        ],
    ),
    "leaf_c": (
        "crawl",
        [
            person("c-ann", "A. Smith", nationality=["at"]),
            entity("c-ship", "Vessel", name=["Sea Ann"]),
            person("c-solo", "Solo Person"),
            # two values naming one cluster: one statement once resolved
            entity("c-dir", "Directorship", director=["a-ann", "b-ann"], organization=["b-acme"]),
        ],
    ),
}


def judge(resolver: Resolver[Any]) -> None:
    """The judgements, made with nomenklatura's own ``decide``."""
    from nomenklatura.judgement import Judgement

    resolver.decide("a-ann", "b-ann", Judgement.POSITIVE, user="test")
    resolver.decide("b-ann", "c-ann", Judgement.POSITIVE, user="test")  # a chain of three
    resolver.decide("a-acme", "b-acme", Judgement.POSITIVE, user="test")
    resolver.decide("a-zed", "b-zed", Judgement.POSITIVE, user="test")
    resolver.decide("a-vlad", "Q7747", Judgement.POSITIVE, user="test")  # a QID canonical
    resolver.decide("b-vlad", "Q7747", Judgement.POSITIVE, user="test")
    resolver.decide("a-bob", "b-bob", Judgement.NEGATIVE, user="test")
    resolver.decide("a-ann", "a-bob", Judgement.UNSURE, user="test")


@pytest.fixture(scope="module")
def nk_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """nomenklatura's resolver table in a real SQLite file, and its dump."""
    from nomenklatura.db import Session, close_db, get_engine
    from nomenklatura.resolver import Resolver

    folder = tmp_path_factory.mktemp("nomenklatura")
    url = f"sqlite:///{folder / 'resolver.db'}"
    with Session(get_engine(url)) as session:
        resolver: Resolver[Any] = Resolver(session, create=True)
        judge(resolver)
        session.commit()
        resolver.dump(folder / "resolver.json")
    close_db(url)
    yield url, folder / "resolver.json"


@pytest.fixture(scope="module")
def built(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, nk_db: tuple[str, Path]
) -> tuple[Lakehouse, Dataset]:
    """One lake for the module: three leaves, a nested collection, judgements, a make."""
    lake = Lakehouse(tmp_path_factory.mktemp("lake") / "lake")
    for name, (origin, entities) in LEAVES.items():
        ds = lake.create_dataset(name, title=name)
        ds.write_entities([orjson.dumps(e) for e in entities], origin=origin)
        ds.flush()
    lake.create_dataset("sub", children=["leaf_c", "leaf_b"])
    coll = lake.create_dataset("coll", title="Collection", children=["sub", "leaf_a"])
    judgements.load_sql(coll, nk_db[0])
    make(coll)
    return lake, coll


def linker(url: str) -> Any:
    """nomenklatura's own linker of the SQL table (what zavod applies)."""
    from nomenklatura.db import Session, close_db, get_engine
    from nomenklatura.resolver import Resolver

    with Session(get_engine(url)) as session:
        result = Resolver(session).get_linker()
    close_db(url)
    return result


def reference_statements(lake: Lakehouse, url: str) -> list[Statement]:
    """Each leaf's live statements with nomenklatura's ``apply_statement``."""
    link = linker(url)
    out = []
    for name in LEAVES:
        for row in live_statements(lake.dataset(name)).to_pylist():
            stmt = Statement.from_dict({k: v for k, v in row.items() if k != "bucket"})
            out.append(link.apply_statement(stmt))
    return out


def reference_entities(statements: list[Statement]) -> dict[str, dict[str, Any]]:
    """followthemoney's aggregation of the resolved statements, by canonical id."""
    by_entity: dict[str, list[Statement]] = defaultdict(list)
    for stmt in statements:
        by_entity[stmt.canonical_id].append(stmt)
    meta = ftm_dataset("coll")
    return {
        k: normal(StatementEntity.from_statements(meta, v).to_dict()) for k, v in by_entity.items()
    }


def exported(ds: Dataset, path: str) -> bytes:
    return ds.store.read_bytes(cv.dataset_path(ds.name, path))


def test_leaves_resolve_nested_collections(built: tuple[Lakehouse, Dataset]) -> None:
    lake, coll = built
    assert leaves(lake.store, "coll") == ["leaf_a", "leaf_b", "leaf_c"]
    assert leaves(lake.store, "sub") == ["leaf_b", "leaf_c"]
    with pytest.raises(CollectionError, match="not a collection"):
        leaves(lake.store, "leaf_a")


@data_plane
def test_canonical_ids_are_nomenklaturas(
    built: tuple[Lakehouse, Dataset], nk_db: tuple[str, Path]
) -> None:
    """Every id's canonical id is the one nomenklatura's linker gives."""
    _, coll = built
    link = linker(nk_db[0])
    ours = judgements.canonical_rows(coll).to_pylist()
    theirs = sorted((k, v) for k, v in link.mappings() if k != v)
    assert sorted((r["entity_id"], r["canonical_id"]) for r in ours) == theirs
    canon = dict(theirs)
    assert canon["a-vlad"] == canon["b-vlad"] == "Q7747"
    assert canon["a-ann"] == canon["b-ann"] == canon["c-ann"]
    assert canon["a-ann"].startswith("NK-")
    assert "a-bob" not in canon and "b-bob" not in canon


def test_dump_is_nomenklaturas(built: tuple[Lakehouse, Dataset], nk_db: tuple[str, Path]) -> None:
    """The lake's dump of the loaded table is nomenklatura's dump, byte for byte;
    loading that dump into another collection gives the same canonical ids."""
    lake, coll = built
    ours = "".join(judgements.dump_lines(judgements.rows(coll)))
    assert ours == nk_db[1].read_text()
    other = lake.create_dataset("coll_dump", children=["leaf_a", "leaf_b"])
    judgements.load_dump(other, nk_db[1].read_text().splitlines(), source=str(nk_db[1]))
    assert (
        judgements.canonical_rows(other).to_pylist() == judgements.canonical_rows(coll).to_pylist()
    )


@data_plane
def test_entities_match_nomenklaturas_merge(
    built: tuple[Lakehouse, Dataset], nk_db: tuple[str, Path]
) -> None:
    """entities.ftm.json, entity by entity, equals followthemoney's aggregation of
    the statements nomenklatura's linker resolved."""
    lake, coll = built
    expected = reference_entities(reference_statements(lake, nk_db[0]))
    ours = {}
    for line in exported(coll, cv.ENTITIES_JSON).splitlines():
        data = orjson.loads(line)
        ours[data["id"]] = normal(data)
    assert sorted(ours) == sorted(expected)
    for key, entity_ in expected.items():
        assert ours[key] == entity_, key
    canon = dict(linker(nk_db[0]).mappings())
    ann = ours[canon["a-ann"]]
    assert ann["schema"] == "Person"
    assert ann["referents"] == ["a-ann", "b-ann", "c-ann"]
    assert ann["datasets"] == ["leaf_a", "leaf_b", "leaf_c"]
    assert ours[canon["a-zed"]]["schema"] == "Company"  # LegalEntity + Company
    assert ours["Q7747"]["referents"] == ["a-vlad", "b-vlad"]
    # an entity-typed value names the canonical id of what it refers to
    assert ours["b-dir"]["properties"]["organization"] == [canon["a-acme"]]
    assert ours["b-dir"]["properties"]["director"] == [canon["b-ann"]]
    assert ours["c-dir"]["properties"]["director"] == [canon["b-ann"]]
    assert {"a-bob", "b-bob", "c-solo"} <= set(ours)  # the negative kept them apart


@data_plane
def test_statements_csv_is_resolved(
    built: tuple[Lakehouse, Dataset], nk_db: tuple[str, Path]
) -> None:
    """statements.csv holds every leaf statement once, with nomenklatura's canonical
    id, rewritten value and original value, and its leaf as dataset."""
    lake, coll = built
    rows = list(csv.DictReader(io.StringIO(exported(coll, cv.STATEMENTS_CSV).decode())))
    # followthemoney's entity keeps one statement per id: so does the collection
    # (the first by original value where a rewrite made two values one)
    once: dict[str, Statement] = {}
    for stmt in sorted(
        reference_statements(lake, nk_db[0]), key=lambda s: (s.original_value or "", s.first_seen)
    ):
        once.setdefault(stmt.id or "", stmt)
    expected = list(once.values())
    assert len(rows) == len(expected)

    def key(r: dict[str, Any]) -> tuple[str, ...]:
        return tuple(
            str(r.get(k) or "")
            for k in ("id", "canonical_id", "value", "original_value", "dataset")
        )

    assert sorted(map(key, rows)) == sorted(key(s.to_dict()) for s in expected)


def export_edges(ds: Dataset) -> set[tuple[str, str, str]]:
    """(property, source, target) of every entity-typed value of the entities export."""
    from followthemoney import model

    edges = set()
    for line in exported(ds, cv.ENTITIES_JSON).splitlines():
        data = orjson.loads(line)
        schema = model.get(data["schema"])
        assert schema is not None
        for prop, values in data["properties"].items():
            if schema.properties[prop].type.name == "entity":
                edges.update((prop, data["id"], v) for v in values)
    return edges


def graph_edges(ds: Dataset) -> set[tuple[str, str, str]]:
    from lakehouse_assets.graph.lookups import all_edges

    rows = all_edges(ds).select(["prop", "source", "target"]).to_pylist()
    return {(r["prop"], r["source"], r["target"]) for r in rows}


def test_make_indexes_the_merged_graph(built: tuple[Lakehouse, Dataset]) -> None:
    """``make`` of a collection builds its graph index as a dataset's does: its
    edges are those of the merged entities (canonical ids at both ends), and
    ``refs`` of a merged company finds the ownership of one leaf and the
    directorships of the others pointing at it."""
    from lakehouse_assets.graph.lookups import refs

    _, coll = built
    edges = graph_edges(coll)
    assert edges and edges == export_edges(coll)
    merged = [orjson.loads(x) for x in exported(coll, cv.ENTITIES_JSON).splitlines()]
    (acme,) = [e["id"] for e in merged if "a-acme" in e.get("referents", [])]
    pointing = {
        (r["prop"], r["other_id"], r["other_schema"]) for r in refs(coll, acme, direction="in")
    }
    assert pointing == {
        ("asset", "a-own", "Ownership"),
        ("organization", "b-dir", "Directorship"),
        ("organization", "c-dir", "Directorship"),
    }


def test_index_lists_children_and_statistics(built: tuple[Lakehouse, Dataset]) -> None:
    _, coll = built
    index = json.loads(exported(coll, cv.INDEX))
    assert sorted(index["children"]) == ["leaf_a", "sub"]
    stats = json.loads(exported(coll, cv.STATISTICS_JSON))
    entities = exported(coll, cv.ENTITIES_JSON).splitlines()
    assert stats["entity_count"] == len(entities) == index["entity_count"]
    assert coll.versions()[-1].sequence == 1
    assert stale_reason(coll) is None


@data_plane
def test_judgement_change_rebuilds_byte_identical_to_full(
    built: tuple[Lakehouse, Dataset], tmp_path: Path
) -> None:
    """A judgement decided in the lake (a merge of the two Bobs, undoing nothing
    else) makes the collection stale; make rebuilds and publishes version 2,
    whose files equal a forced full rebuild's, byte for byte, with a delta."""
    lake, coll = built
    canonical = judgements.decide(coll, "a-solo-missing", "c-solo", "negative", user="t")
    assert canonical == pair("c-solo", "a-solo-missing")[0]
    judgements.decide(coll, "a-acme", "c-ship", "unsure", user="t")
    merged = judgements.decide(coll, "a-bob", "c-solo", "positive", user="t")
    assert merged.startswith("NK-")
    assert stale_reason(coll) == "the judgements changed"
    result = make(coll)
    assert result.built is not None and result.exported.written
    # where the whole make's time went: the build and the graph index among them
    assert {"collection", "graph", "exports"} <= set(result.exported.parts)
    assert sum(result.exported.parts.values()) <= result.exported.seconds
    files = {
        p: exported(coll, p) for p in (cv.STATEMENTS_CSV, cv.ENTITIES_JSON, cv.STATISTICS_JSON)
    }
    ours = {orjson.loads(x)["id"]: orjson.loads(x) for x in files[cv.ENTITIES_JSON].splitlines()}
    assert ours[merged]["referents"] == ["a-bob", "c-solo"]
    assert ours[merged]["datasets"] == ["leaf_a", "leaf_c"]
    versions = coll.versions()
    assert [v.sequence for v in versions][-1] == 2
    assert graph_edges(coll) == export_edges(coll)  # the index followed the rebuild
    make(coll, force=True)
    for path, data in files.items():
        assert exported(coll, path) == data, path


@data_plane
@pytest.mark.on_cluster
def test_duckdb_and_spark_build_the_same_collection(
    built: tuple[Lakehouse, Dataset], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collection's rows made on the driver by DuckDB and by Spark's plan
    (``export_engine``): the same exports, byte for byte."""
    lake, coll = built
    files = {}
    for engine in ("spark", "duckdb"):
        monkeypatch.setattr(coll.settings, "export_engine", engine)
        result = make(coll, force=True)
        assert result.built is not None and result.built.engine == engine
        files[engine] = {
            p: exported(coll, p) for p in (cv.STATEMENTS_CSV, cv.ENTITIES_JSON, cv.STATISTICS_JSON)
        }
    assert files["spark"] == files["duckdb"]


@data_plane
@pytest.mark.parametrize("engine", ["duckdb", "spark"])
def test_incompatible_cluster_is_reported(
    built: tuple[Lakehouse, Dataset], engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Person merged with a Vessel stops the build naming the cluster, on either
    engine; nothing is published and the previous files stay."""
    lake, _ = built
    bad = lake.create_dataset(f"coll_bad_{engine}", children=["leaf_a", "leaf_c"])
    monkeypatch.setattr(bad.settings, "export_engine", engine)
    judgements.decide(bad, "a-ann", "c-ship", "positive", user="t")
    with pytest.raises(CollectionError, match=r"no common schema.*Person, Vessel.*a-ann, c-ship"):
        build(bad)
    assert not bad.store.exists(cv.dataset_path(bad.name, cv.ENTITIES_JSON))


def test_a_collection_refuses_writes_to_its_own_journal(
    built: tuple[Lakehouse, Dataset],
) -> None:
    """Its tables are built from its leaves: a row flushed into them would be lost to
    the next build, so a write (entities, statements, deletes, a crawl's documents) is
    refused naming the collection and its children, and nothing reaches the journal."""
    lake, coll = built
    ds = lake.dataset(coll.name)
    before = ds.journal.count(ds.name)
    person = {"id": "direct", "schema": "Person", "properties": {"name": ["Direct"]}}
    with pytest.raises(CollectionError, match=rf"{coll.name!r}\] is a collection of leaf_a, sub"):
        ds.add_entity(person)
    with pytest.raises(CollectionError, match="write to one of them"):
        ds.write_entities([orjson.dumps(person) + b"\n"])
    with pytest.raises(CollectionError, match="is a collection"):
        ds.delete_statement(Statement("a-ann", "name", "Person", "Ann", coll.name))
    assert ds.journal.count(ds.name) == before


def test_bad_dump_names_file_and_line(built: tuple[Lakehouse, Dataset]) -> None:
    lake, _ = built
    other = lake.create_dataset("coll_input", children=["leaf_a"])
    good = json.dumps(["b", "a", "positive", None, "u", "2026-01-01T00:00:00"])
    for line, message in [
        ("[1, 2]", "expected a JSON list"),
        ('["a", "a", "positive", null, "u", null]', "target and source are the same id"),
        ('["a", "b", "maybe", null, "u", null]', "judgement must be one of"),
        ("{not json", "not JSON"),
    ]:
        with pytest.raises(InvalidInputError, match=rf"file 'dump.json', line 2\] {message}"):
            judgements.load_dump(other, [good, line], source="dump.json")
    assert judgements.rows(other) == []  # all or nothing


def test_cycle_and_missing_child(built: tuple[Lakehouse, Dataset]) -> None:
    lake, _ = built
    lake.create_dataset("loop_a", children=["loop_b"])
    lake.create_dataset("loop_b", children=["loop_a"])
    with pytest.raises(CollectionError, match="cycle: loop_a -> loop_b -> loop_a"):
        leaves(lake.store, "loop_a")
    lake.create_dataset("orphan", children=["nowhere"])
    with pytest.raises(CollectionError, match="child dataset 'nowhere' does not exist"):
        leaves(lake.store, "orphan")


@pytest.mark.spark_free
def test_clusters_follow_identifier_order() -> None:
    """Union-find roots are nomenklatura's canonical: QID > NK- > other, then id order."""
    got = clusters([("b", "a"), ("NK-x", "b"), ("Q2", "c"), ("c", "a"), ("Q10", "d")])
    assert got.get("a") == got.get("NK-x") == got.get("Q2") == "Q2"
    assert got.get("d") == "Q10" and got.get("zzz") == "zzz"
    blocked = clusters([("b", "a")], [("b", "a", "negative")])
    assert blocked.conflicts == [("b", "a", "negative")]


def test_cli(built: tuple[Lakehouse, Dataset], nk_db: tuple[str, Path]) -> None:
    """``datasets create --children``, ``resolver load|dump|decide`` and ``make`` of a
    collection from the command line."""
    from click.testing import CliRunner

    from lakehouse_assets.cli import cli

    lake, _ = built

    def run(*args: str) -> Any:
        return CliRunner().invoke(cli, ["--lake", str(lake.settings.lake_uri), *args])

    missing = run("datasets", "create", "coll_cli", "--children", "leaf_a,nowhere")
    assert missing.exit_code == 1 and "nowhere" in missing.output
    assert "coll_cli" not in lake.datasets()
    assert run("datasets", "create", "coll_cli", "--children", "leaf_a,leaf_b").exit_code == 0
    loaded = run("-d", "coll_cli", "resolver", "load", str(nk_db[1]))
    assert loaded.exit_code == 0, loaded.output
    assert json.loads(loaded.output)["conflicts"] == []
    dumped = run("-d", "coll_cli", "resolver", "dump")
    assert dumped.output == nk_db[1].read_text()
    decided = run("-d", "coll_cli", "resolver", "decide", "a-bob", "b-bob", "positive")
    assert decided.exit_code == 0 and decided.output.startswith("NK-")
    not_one = run("-d", "leaf_a", "resolver", "dump")
    assert not_one.exit_code == 1 and "not a collection" in not_one.output
    made = run("-d", "coll_cli", "make")
    assert made.exit_code == 0, made.output
    coll = lake.dataset("coll_cli")
    ours = {
        orjson.loads(x)["id"]: orjson.loads(x)
        for x in exported(coll, cv.ENTITIES_JSON).splitlines()
    }
    assert ours[decided.output.strip()]["referents"] == ["a-bob", "b-bob"]
    assert ours[decided.output.strip()]["datasets"] == ["leaf_a", "leaf_b"]


@pytest.mark.postgres
def test_load_from_postgresql(built: tuple[Lakehouse, Dataset], postgres_database: str) -> None:
    """nomenklatura's table on PostgreSQL loads as from SQLite: the canonical ids
    are its linker's."""
    from nomenklatura.db import Session, close_db, get_engine
    from nomenklatura.resolver import Resolver

    url = postgres_database.replace("postgresql://", "postgresql+psycopg2://", 1)
    with Session(get_engine(url)) as session:
        resolver: Resolver[Any] = Resolver(session, create=True)
        judge(resolver)
        session.commit()
    close_db(url)
    lake, _ = built
    other = lake.create_dataset("coll_pg", children=["leaf_a", "leaf_b"])
    judgements.load_sql(other, url)
    ours = [
        (r["entity_id"], r["canonical_id"]) for r in judgements.canonical_rows(other).to_pylist()
    ]
    assert ours == sorted((k, v) for k, v in linker(url).mappings() if k != v)
    assert len(judgements.rows(other)) == 11  # every row of nomenklatura's table


def test_yente_loads_a_collection_and_its_delta(
    spark: SparkSession, tmp_path: Path, nk_db: tuple[str, Path]
) -> None:
    """yente's own updater, on the catalog of a lake served over HTTP, loads the
    collection (its children beside it in the catalog) fully, then, after a
    judgement merged two entities, applies the delta and ends at the head."""
    import threading
    from http.server import ThreadingHTTPServer

    from lakehouse_assets.settings import Settings
    from lakehouse_assets_tests.test_feed import _quiet_handler, run_yente, yente_python

    python = yente_python()
    root = tmp_path / "lake"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _quiet_handler(str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        lake = Lakehouse(
            root,
            settings=Settings(public_url=url),
            journal_url=f"sqlite:///{tmp_path / 'j.sqlite'}",
        )
        for name in ("leaf_a", "leaf_b"):
            origin, batch = LEAVES[name]
            ds = lake.create_dataset(name, title=name)
            ds.write_entities([orjson.dumps(e) for e in batch], origin=origin)
            ds.make()
        coll = lake.create_dataset("coll", title="Collection", children=["leaf_a", "leaf_b"])
        judgements.load_sql(coll, nk_db[0])
        coll.make()
        catalog_url = f"{url}/{cv.CATALOG_INDEX}"
        state = tmp_path / "yente-state.json"

        def head() -> dict[str, dict[str, Any]]:
            return {
                (e := orjson.loads(x))["id"]: normal(e)
                for x in (root / "coll" / cv.ENTITIES_JSON).read_bytes().splitlines()
            }

        loaded = run_yente(python, catalog_url, "coll", state, "--scope", "coll")
        assert loaded["incremental"] is False and loaded["refused"] == 0
        assert {k: normal(v) for k, v in loaded["entities"].items()} == head()
        merged = judgements.decide(coll, "a-bob", "b-bob", "positive", user="t")
        coll.make()
        version = coll.version()
        assert version is not None and version.sequence == 2
        result = run_yente(python, catalog_url, "coll", state, "--scope", "coll")
        assert result["incremental"] is True, result
        assert result["version"] == version.version_id
        assert result["ops"]["DEL"] == 2 and result["ops"]["ADD"] == 1
        assert result["ops"]["MOD"] >= 1  # the ownership whose owner is now the merged id
        assert {k: normal(v) for k, v in result["entities"].items()} == head()
        assert sorted(result["entities"][merged]["referents"]) == ["a-bob", "b-bob"]
    finally:
        server.shutdown()
        server.server_close()
