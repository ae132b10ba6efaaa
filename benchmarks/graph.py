"""Time the graph index on N statements of scaled kek data.

    python -m benchmarks.graph --statements 1000000 [--lake DIR]

With ``--lake`` naming a lake that already holds dataset ``bench`` (say, the
one ``benchmarks.versions`` leaves), the data is not written again. Prints:
the rebuild of both directions; "who points at X" for 200 random targets
(median, p95) before and after ``optimize``-style folding (a rebuild); the
same question answered by a full scan of the statements table (pyarrow, the
way a reader without the index must); an incremental update after a flush
of 1% new entities, against the rebuild; graph.cypher against followthemoney's
``ftm export-cypher`` on the same entities; graph.graphml and the Neo4j CSVs
against ``ftm export-neo4j-bulk``; the whole graph export. Numbers only;
nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow.compute as pc

from benchmarks.data import write as write_data


def summary(samples: list[float]) -> str:
    samples = sorted(samples)
    return (
        f"median {statistics.median(samples) * 1000:.1f} ms, "
        f"p95 {samples[int(len(samples) * 0.95)] * 1000:.1f} ms"
    )


def lookup_times(ds: Any, targets: list[str]) -> str:
    """``graph.edges_at`` (state.json, pruned files, tombstones) for each target."""
    from lakehouse_assets import graph

    times = []
    for target in targets:
        clock = time.monotonic()
        graph.edges_at(ds, target)
        times.append(time.monotonic() - clock)
    return summary(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--statements", type=int, default=1_000_000)
    parser.add_argument("--lake", type=Path, default=None)
    parser.add_argument(
        "--no-cypher",
        action="store_true",
        help="skip graph.cypher vs ftm export-cypher (minutes at 10M)",
    )
    args = parser.parse_args()

    from lakehouse_assets import graph
    from lakehouse_assets.lake import Lakehouse
    from lakehouse_assets.tables.schemas import STATEMENTS_PARTITION, STATEMENTS_SCHEMA
    from lakehouse_assets.tables.snapshot import arrow_dataset

    data = write_data(
        Path(__file__).parent / ".data" / f"kek-{args.statements}.ftm.json", args.statements
    )
    lines = data.read_bytes().splitlines()
    if args.lake is not None and (args.lake / "bench").exists():
        lake = Lakehouse(args.lake)
        ds = lake.dataset("bench")
    else:
        lake = Lakehouse(args.lake or Path(tempfile.mkdtemp(prefix="lakehouse-graph-")))
        ds = lake.create_dataset("bench")
        with data.open("rb") as fh:
            ds.write_entities(fh, origin="bench")
        ds.flush()

    clock = time.monotonic()
    built = graph.rebuild(ds)
    print(
        f"rebuild both directions: {time.monotonic() - clock:.2f} s ({built.edges:,} edges, "
        f"{built.dangling} dangling)",
        flush=True,
    )

    edges = graph.all_edges(ds)
    rng = random.Random(3)
    targets = [edges.column("target")[rng.randrange(edges.num_rows)].as_py() for _ in range(200)]
    lookups = []
    for target in targets:
        clock = time.monotonic()
        graph.refs(ds, target)
        lookups.append(time.monotonic() - clock)
    print(f"who points at X (refs --in, with captions): {summary(lookups)}", flush=True)
    print(f"who points at X (index lookup only): {lookup_times(ds, targets)}", flush=True)

    snapshot = ds.snapshot()
    scans = []
    for target in targets[:5]:
        clock = time.monotonic()
        table = arrow_dataset(
            snapshot.statements.files,
            STATEMENTS_SCHEMA,
            ds.statements_table.storage_options,
            partition=STATEMENTS_PARTITION,
        ).to_table(
            columns=["canonical_id", "prop", "value"],
            filter=(pc.field("prop_type") == "entity") & (pc.field("value") == target),
        )
        scans.append(time.monotonic() - clock)
        del table
    print(f"who points at X (full scan of the statements table): {summary(scans)}", flush=True)

    new = []
    for line in lines[: len(lines) // 100]:
        entity = orjson.loads(line)
        entity["id"] = f"new{int(time.time())}-{entity['id']}"
        new.append(entity)
    with ds.bulk(origin="bench") as bulk:
        for entity in new:
            bulk.add_entity(entity)
    ds.flush()
    clock = time.monotonic()
    step = graph.update(ds)
    print(
        f"incremental update after a 1% flush: {time.monotonic() - clock:.2f} s "
        f"({step.added:,} edges added)",
        flush=True,
    )
    print(
        f"who points at X after the update (before a rebuild): {lookup_times(ds, targets)}",
        flush=True,
    )
    if not args.no_cypher:
        cypher_times(ds)
    print(f"lake: {lake.store.uri}")


def timed_ftm(command: str, source: Path, out: str) -> float:
    """Seconds followthemoney's CLI takes for one export of ``source``."""
    import subprocess
    import sys

    ftm = str(Path(sys.executable).parent / "ftm")
    clock = time.monotonic()
    subprocess.run([ftm, command, "-i", str(source), "-o", out], check=True)
    return time.monotonic() - clock


def cypher_times(ds: Any) -> None:
    """The graph exports against followthemoney's CLI on the same entities.ftm.json,
    each written to a file, one run each: graph.cypher against ``ftm
    export-cypher``; the Neo4j CSVs (reading the file included, as ftm's does)
    against ``ftm export-neo4j-bulk``; graph.graphml; the whole asset."""
    import os

    from lakehouse_assets import conventions as cv
    from lakehouse_assets.graph.exports import GraphSQL, export_graph, write_cypher

    ds.export(["entities"])
    source = Path(ds.store.full_uri(cv.dataset_path(ds.name, cv.ENTITIES_JSON)))
    with tempfile.TemporaryDirectory() as tmp:
        clock = time.monotonic()
        with open(os.path.join(tmp, "ours.cypher"), "w") as out:
            counts = write_cypher(ds, out)
        ours = time.monotonic() - clock
        theirs = timed_ftm("export-cypher", source, os.path.join(tmp, "ftm.cypher"))
    print(
        f"graph.cypher of {counts['entities']:,} entities: {ours:.1f} s; "
        f"ftm export-cypher: {theirs:.1f} s ({theirs / ours:.1f}x)",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        clock = time.monotonic()
        with GraphSQL(source) as db:
            loaded = time.monotonic() - clock
            clock = time.monotonic()
            db.neo4j(Path(tmp) / "neo4j")
            neo4j = loaded + time.monotonic() - clock
            clock = time.monotonic()
            with open(os.path.join(tmp, "graph.graphml"), "w") as out:
                sizes = db.graphml(out)
            graphml = loaded + time.monotonic() - clock
        theirs = timed_ftm("export-neo4j-bulk", source, os.path.join(tmp, "ftm-neo4j"))
    print(
        f"reading the entities into DuckDB: {loaded:.1f} s; with it, the Neo4j CSVs: "
        f"{neo4j:.1f} s, ftm export-neo4j-bulk: {theirs:.1f} s ({theirs / neo4j:.1f}x); "
        f"graph.graphml ({sizes['nodes']:,} nodes, {sizes['edges']:,} edges): {graphml:.1f} s",
        flush=True,
    )
    clock = time.monotonic()
    export_graph(ds, force=True)
    print(f"export_graph (all three, the graph_cypher asset): {time.monotonic() - clock:.1f} s")


if __name__ == "__main__":
    main()
