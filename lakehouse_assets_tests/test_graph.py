"""The graph index: both directions, incremental with tombstones, crash repair, lookups."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from lakehouse_assets import conventions as cv
from lakehouse_assets import faults, graph
from lakehouse_assets.errors import InvalidNameError
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.versions import version_snapshot
from lakehouse_assets_tests.conftest import PROFILE, cli_args, lakehouse_env, sample_entities
from lakehouse_assets_tests.helpers.data import input_entities

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def expected_edges(ds: Dataset) -> set[tuple[str, str, str, str]]:
    """(prop, source, target, statement id) of every live entity-typed statement,
    from the tables' own reads (the independent way: the query path)."""
    out = set()
    for entity in ds.query(flush=False):
        for stmt in entity.statements:
            if stmt.prop_type == "entity":
                out.add((stmt.prop, str(stmt.canonical_id), stmt.value, str(stmt.id)))
    return out


def indexed(ds: Dataset) -> set[tuple[str, str, str, str]]:
    edges = graph.all_edges(ds)
    rows = zip(
        *(edges.column(c).to_pylist() for c in ("prop", "source", "target", "edge_id")),
        strict=True,
    )
    found = list(rows)
    return set(found)


def assert_current(ds: Dataset) -> None:
    assert indexed(ds) == expected_edges(ds)
    # both directions agree, each edge once
    by_target = set()
    for source in {e[1] for e in expected_edges(ds)}:
        for edge in graph.refs(ds, source, direction="out"):
            by_target.add((edge["prop"], edge["source"], edge["target"], edge["edge_id"]))
    assert by_target == expected_edges(ds)
    assert graph.status(ds)["current"]


def test_index_follows_writes_deletes_and_compact(spark: SparkSession, lake: Lakehouse) -> None:
    ds = lake.create_dataset("graphs")
    entities = sample_entities()
    for e in entities:
        ds.add_entity(e)
    ds.flush()
    built = graph.update(ds)  # the first update builds
    assert built.mode == "rebuild" and built.edges == len(expected_edges(ds)) > 0
    assert_current(ds)
    state = graph.status(ds)
    assert sum(state["by_prop"].values()) == state["edges"]

    # an ownership deleted, a new one pointing at an entity outside the dataset
    ownership = next(e for e in entities if e["schema"] == "Ownership")
    ds.delete_entity(str(ownership["id"]))
    ds.add_entity(
        {
            "id": "own-new",
            "schema": "Ownership",
            "properties": {"owner": [ownership["properties"]["owner"][0]], "asset": ["elsewhere"]},
        }
    )
    ds.flush()
    step = graph.update(ds)
    assert step.mode == "update" and step.added == 2 and step.tombstoned == 2
    assert_current(ds)
    dangling = graph.refs(ds, "own-new", direction="out", props=["asset"])
    assert [(e["other_id"], e["other_schema"], e["other_caption"]) for e in dangling] == [
        ("elsewhere", None, None)
    ]
    # the deleted ownership comes back: its edges are visible again despite the tombstones
    ds.add_entity(ownership)
    ds.flush()
    assert graph.update(ds).added == 2
    assert_current(ds)
    # compact rewrites the tables: nothing changes in the index
    ds.compact()
    assert graph.update(ds).added == 0
    assert_current(ds)
    # a rebuild folds the tombstones in and gives the same edges
    rebuilt = graph.rebuild(ds)
    assert rebuilt.dangling == 1 and graph.status(ds)["tombstones"] == 0
    assert_current(ds)
    # optimize --vacuum removes the files rebuilds and updates replaced in the graph
    # tables too; lookups go on reading the files the index lists
    stored = {t: parquet_files(ds, t) for t in (cv.GRAPH_BY_SOURCE, cv.GRAPH_BY_TARGET)}
    assert all(files > listed_files(ds, t) for t, files in stored.items())
    assert ds.optimize(vacuum=True, retention_hours=0).vacuumed > 0
    for table in (cv.GRAPH_BY_SOURCE, cv.GRAPH_BY_TARGET, cv.GRAPH_TOMBSTONES):
        assert parquet_files(ds, table) == listed_files(ds, table)
    assert graph.update(ds).added == 0  # optimize moved rows, changed none
    assert_current(ds)


def listed_files(ds: Dataset, table: str) -> set[str]:
    """The data files a graph table's Delta log lists."""
    import pyarrow as pa
    from deltalake import DeltaTable

    uri = ds.store.full_uri(cv.dataset_path(ds.name, table))
    dt = DeltaTable(uri, storage_options=ds.store.storage_options())
    return set(pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist())


def parquet_files(ds: Dataset, table: str) -> set[str]:
    """Data files stored under a graph table's folder (relative to it), listed or not."""
    prefix = cv.dataset_path(ds.name, table) + "/"
    return {
        p.removeprefix(prefix)
        for p in ds.store.list(prefix)
        if p.endswith(".parquet") and "/_delta_log/" not in p
    }


def test_refs_lookups(spark: SparkSession, local_lake: Lakehouse) -> None:
    ds = local_lake.create_dataset("lookups")
    entities = sample_entities()
    for e in entities:
        ds.add_entity(e)
    ds.make()
    graph.rebuild(ds)
    ownership = next(e for e in entities if e["schema"] == "Ownership")
    owner = ownership["properties"]["owner"][0]
    asset = ownership["properties"]["asset"][0]
    who = graph.refs(ds, asset)  # who points at the asset
    assert any(e["other_id"] == ownership["id"] and e["prop"] == "asset" for e in who)
    assert all(e["direction"] == "in" and e["target"] == asset for e in who)
    out = graph.refs(ds, str(ownership["id"]), direction="out")
    assert {(e["prop"], e["other_id"]) for e in out} == {("owner", owner), ("asset", asset)}
    assert {e["other_schema"] for e in out if e["prop"] == "asset"} == {
        next(e["schema"] for e in entities if e["id"] == asset)
    }
    both = graph.refs(ds, owner, direction="both", schemata=["Ownership"])
    assert both and all(e["other_schema"] == "Ownership" for e in both)
    only = graph.refs(ds, asset, props=["asset"])
    assert only and all(e["prop"] == "asset" for e in only)
    # unknown: empty; malformed: a clear error
    assert graph.refs(ds, "no-such-entity") == []
    for bad in ("", "a b", "x" * 2000, "tab\there"):
        with pytest.raises(InvalidNameError, match="not an entity id"):
            graph.refs(ds, bad)
    network = list(graph.neighbours(ds, owner, depth=2, limit=10))
    assert network[0]["id"] == owner and 1 < len(network) <= 10
    # make keeps the index current once it exists
    ds.add_entity(
        {"id": "own-2", "schema": "Ownership", "properties": {"owner": [owner], "asset": [asset]}}
    )
    assert ds.make().graph is not None
    now = graph.refs(ds, asset)
    assert any(e["other_id"] == "own-2" for e in now)
    # as of a published version: a scan of that version, the same answer shape
    assert graph.refs(ds, asset, snapshot=version_snapshot(ds, 2)) == now
    assert all(
        e["other_id"] != "own-2" for e in graph.refs(ds, asset, snapshot=version_snapshot(ds, 1))
    )
    assert graph.refs(ds, asset, snapshot=version_snapshot(ds, 1)) == who

    from lakehouse_assets.cli import cli

    base = cli_args(ds)
    result = CliRunner().invoke(cli, [*base, "refs", asset])
    assert result.exit_code == 0, result.output
    assert {json.loads(line)["other_id"] for line in result.output.splitlines()} >= {"own-2"}
    result = CliRunner().invoke(cli, [*base, "refs", "nobody"])
    assert result.exit_code == 0 and "no edges at 'nobody'" in result.output
    result = CliRunner().invoke(cli, [*base, "refs", "a b"])
    assert result.exit_code == 1 and "not an entity id" in result.output
    result = CliRunner().invoke(cli, [*base, "graph", "status"])
    assert json.loads(result.output)["current"] is True

    # a deleted entity leaves tombstones in the index; a `get` and a `refs`
    # process read them without importing pandas (0.2-0.3 s of a point read
    # that uses none of it: pyarrow imports it for Acero, pyarrow.dataset and
    # arrays of Python lists)
    ds.delete_entity("own-2")
    ds.make()
    assert graph.status(ds)["tombstones"] > 0
    for command in (["get", owner], ["refs", asset]):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "lakehouse_assets.cli", *base, *command],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        imported = {
            line.rpartition("|")[2].strip()
            for line in proc.stderr.splitlines()
            if line.startswith("import time:")
        }
        assert "lakehouse_assets.query" in imported and "pandas" not in imported, command
        if command[0] == "refs":
            edges = [json.loads(line) for line in proc.stdout.splitlines()]
            assert edges == graph.refs(ds, asset) and edges
            assert all(e["other_id"] != "own-2" for e in edges)
        else:
            entity = ds.get_entity(owner)
            assert entity is not None and json.loads(proc.stdout) == entity.to_dict()


UPDATE = """
import sys
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets import graph
graph.update(Lakehouse(sys.argv[1], journal_url=sys.argv[2]).dataset(sys.argv[3]))
"""


@pytest.mark.parametrize("point", faults.GRAPH_POINTS)
@pytest.mark.parametrize("mode", ["rebuild", "update"])
def test_a_killed_index_update_is_repaired(
    spark: SparkSession, lake: Lakehouse, point: str, mode: str
) -> None:
    ds = lake.create_dataset("killed_graph")
    entities = sample_entities()
    for e in entities[:8]:
        ds.add_entity(e)
    ds.flush()
    if mode == "update":
        graph.update(ds)
        ownership = next(e for e in entities[:8] if e["schema"] == "Ownership")
        ds.delete_entity(str(ownership["id"]))
        for e in entities[8:]:
            ds.add_entity(e)
        ds.flush()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            UPDATE,
            lake.store.uri,
            lake.settings.resolved_journal_url(),
            ds.name,
        ],
        env=lakehouse_env(lake, LAKEHOUSE_CRASH_AT=point),
        capture_output=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    graph.update(ds)  # repairs
    assert_current(ds)


# --- graph exports -------------------------------------------------------------------


def test_graph_exports_match_followthemoney(
    spark: SparkSession, lake: Lakehouse, tmp_path: Path
) -> None:
    """The three graph exports of a dataset, on a local lake and on S3: each
    equals followthemoney's own export of the same entities file; a re-export
    removes Neo4j files of schemata no longer present."""
    import io

    import networkx as nx
    from followthemoney import model
    from followthemoney.export.neo4j import CypherGraphExporter

    from lakehouse_assets.graph import exports as graph_exports
    from lakehouse_assets_tests.helpers.graph import (
        _csv_files,
        _elements,
        _graph_of,
        followthemoney_neo4j,
        followthemoney_networkx,
    )

    ds = lake.create_dataset("cypher")
    with ds.bulk() as bulk:
        for e in input_entities():
            bulk.add_entity(e)
    ds.make()
    stale = cv.dataset_path(ds.name, graph_exports.NEO4J, "Vessel.csv")
    ds.store.write_bytes(stale, b"left from an earlier export\n")
    written = graph_exports.export_graph(ds)
    ours = ds.store.read_text(cv.dataset_path(ds.name, graph_exports.CYPHER))
    assert ours.startswith("CREATE CONSTRAINT entity_id IF NOT EXISTS")
    # followthemoney's own exports of the same entities (the exported entities file)
    lines = list(ds.stream_entities())
    theirs = io.StringIO()
    exporter = CypherGraphExporter(theirs)
    for data in lines:
        exporter.write(model.get_proxy(data))
    exporter.finalize()
    nodes, rels = _graph_of(ours)
    want_nodes, want_rels = _graph_of(theirs.getvalue())
    assert nodes == want_nodes and rels == want_rels
    assert len(rels) == written["cypher"]["relationships"] > 0
    # the ftm-compatible mode writes exactly what followthemoney writes
    same = io.StringIO()
    graph_exports.write_cypher(ds, same, ftm_compatible=True)
    assert same.getvalue() == theirs.getvalue()
    # GraphML: networkx reads back followthemoney's graph, node for node
    graphml = ds.store.read_text(cv.dataset_path(ds.name, graph_exports.GRAPHML))
    back = nx.parse_graphml(graphml, force_multigraph=True, edge_key_type=str)
    want = followthemoney_networkx(lines)
    assert _elements(back) == _elements(want)
    assert back.number_of_nodes() == len(want_nodes)
    assert back.number_of_edges() == len(want_rels) == written["graphml"]["edges"]
    # the Neo4j files as followthemoney writes them; the stale one is gone
    assert not ds.store.exists(stale)
    folder = tmp_path / "ours"
    folder.mkdir()
    for name in written["neo4j"]["files"]:
        path = cv.dataset_path(ds.name, graph_exports.NEO4J, name)
        (folder / name).write_bytes(ds.store.read_bytes(path))
    assert "neo4j_import.sh" in written["neo4j"]["files"]
    assert _csv_files(folder) == _csv_files(followthemoney_neo4j(tmp_path / "ftm", lines))
    assert graph_exports.export_graph(ds) == {"skipped": "fresh"}
    # all of them listed in index.json (written with the next published version)
    ds.add_entity({"id": "late-1", "schema": "Person", "properties": {"name": ["Late"]}})
    ds.make()
    index = json.loads(ds.store.read_text(cv.dataset_path(ds.name, cv.INDEX)))
    listed = {r["name"]: r for r in index["resources"]}
    graph_files = {"graph.cypher", "graph.graphml"} | {
        f"neo4j/{name}" for name in written["neo4j"]["files"]
    }
    assert graph_files <= listed.keys()
    assert all(listed[name]["checksum"] for name in graph_files)
    assert listed["neo4j/_links.csv"]["path"] == "exports/neo4j/_links.csv"


# --- the incremental update as a property ----------------------------------------------


_POOL_SIZE = 6


def _pool() -> list[dict[str, Any]]:
    """Entities the draws pick from: people, companies and ownerships among them
    (some pointing at ids outside the pool)."""
    people = [
        {"id": f"p{i}", "schema": "Person", "properties": {"name": [f"Person {i}"]}}
        for i in range(3)
    ]
    companies = [
        {"id": f"c{i}", "schema": "Company", "properties": {"name": [f"Company {i}"]}}
        for i in range(2)
    ]
    owns = [
        {
            "id": f"o{i}",
            "schema": "Ownership",
            "properties": {"owner": [f"p{i % 3}"], "asset": [f"c{i % 2}", f"x{i}"]},
        }
        for i in range(_POOL_SIZE)
    ]
    return people + companies + owns


_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "delete", "compact", "optimize"]),
        st.integers(0, len(_pool()) - 1),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=25 if PROFILE == "thorough" else 4)
@given(rounds=st.lists(_STEPS, min_size=1, max_size=3))
def test_updates_equal_a_rebuild(
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
    rounds: list[list[tuple[str, int]]],
) -> None:
    """After any mix of writes, deletes, re-adds, compact and optimize, each
    followed by a flush and an incremental update, the index holds exactly the
    live entity-typed statements (what a rebuild would hold)."""
    tmp = tmp_path_factory.mktemp("graph-prop")
    lake = Lakehouse(tmp / "lake", journal_url=f"sqlite:///{tmp / 'journal.sqlite'}")
    ds = lake.create_dataset("prop")
    pool = _pool()
    graph.update(ds)
    for steps in rounds:
        for action, index in steps:
            if action == "add":
                ds.add_entity(pool[index])
            elif action == "delete":
                ds.delete_entity(str(pool[index]["id"]))
            elif action == "compact":
                ds.flush()
                ds.compact()
            else:
                ds.flush()
                ds.optimize()
        ds.flush()
        graph.update(ds)
        assert indexed(ds) == expected_edges(ds)
        assert graph.status(ds)["current"]


def test_make_builds_the_index_so_refs_answers(spark: SparkSession, local_lake: Lakehouse) -> None:
    """A first ``lakehouse make`` builds the index (``refs`` said "run graph update"
    after it), names its time in the summary; the graph exports it does not make
    are "not built" in ``status``, not stale."""
    from lakehouse_assets.cli import cli
    from lakehouse_assets.cli.output import _human

    ds = local_lake.create_dataset("made_graph")
    ds.write_entities([json.dumps(e).encode() for e in sample_entities()])
    ownership = next(e for e in sample_entities() if e["schema"] == "Ownership")
    asset = ownership["properties"]["asset"][0]
    base = cli_args(ds)
    status = json.loads(CliRunner().invoke(cli, [*base, "status", "--json"]).stdout)
    assert "graph" not in status["exports"] and "graph_cypher" not in status["exports"]
    made = CliRunner().invoke(cli, [*base, "make", "--json"])
    assert made.exit_code == 0, made.output
    summary = json.loads(made.stdout)
    assert summary["graph"]["mode"] == "rebuild" and "seconds" in summary["graph"]
    assert summary["graph"]["edges"] == len(expected_edges(ds)) > 0
    line = f"graph      index built: {summary['graph']['edges']:,} edges"
    assert any(text.startswith(line) for text in _human(summary))
    refs = CliRunner().invoke(cli, [*base, "refs", asset])
    assert refs.exit_code == 0, refs.output
    assert "graph update" not in refs.output
    assert ownership["id"] in {json.loads(x)["other_id"] for x in refs.stdout.splitlines()}
    status = json.loads(CliRunner().invoke(cli, [*base, "status", "--json"]).stdout)
    assert status["exports"]["graph"]["fresh"] is True
    cypher = status["exports"]["graph_cypher"]
    assert (cypher["fresh"], cypher["built"]) == (False, False)
    text = CliRunner().invoke(cli, [*base, "status"]).stdout
    assert "graph_cypher not built" in text and "stale" not in text
    catalog = json.loads(CliRunner().invoke(cli, [*base[:4], "status", "--json"]).stdout)
    assert [d["stale"] for d in catalog["datasets"]] == [[]]
    # a second make updates it (nothing changed: nothing added)
    again = ds.make().graph
    assert again is not None and (again["mode"], again["added"]) == ("update", 0)
