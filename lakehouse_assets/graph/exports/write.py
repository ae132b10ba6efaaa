"""Writing a dataset's graph exports: ``export_graph`` (all three formats from
the entities export, unless fresh) and ``write_cypher`` (batched, or exactly
what ``ftm export-cypher`` writes)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

from followthemoney import model
from followthemoney.export.neo4j import CypherGraphExporter
from followthemoney.proxy import EntityProxy

from lakehouse_assets import conventions as cv
from lakehouse_assets.freshness import graph_exports_fresh
from lakehouse_assets.graph.exports.graph_sql import GraphSQL, write_batched_cypher
from lakehouse_assets.storage import LocalStore

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext


CYPHER: Final = cv.GRAPH_CYPHER
GRAPHML: Final = cv.GRAPH_GRAPHML
NEO4J: Final = cv.GRAPH_NEO4J


def _entities(ds: DatasetContext) -> Iterator[EntityProxy]:
    from lakehouse_assets.query import stream_entities

    for data in stream_entities(ds):
        yield model.get_proxy(data)


@contextmanager
def _local_entities(ds: DatasetContext) -> Iterator[Path]:
    """The entities export as a local file (downloaded from object storage)."""
    from lakehouse_assets.query import entities_export

    path = entities_export(ds)
    if isinstance(ds.store, LocalStore):
        yield ds.store.local_path(path)
        return
    with tempfile.TemporaryDirectory(prefix="lakehouse-graph-") as tmp:
        local = Path(tmp) / "entities.ftm.json"
        with ds.store.open_read(path) as src, local.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        yield local


def write_cypher(
    ds: DatasetContext, out: TextIO, *, ftm_compatible: bool = False
) -> dict[str, int]:
    """The Cypher script of the dataset's entities export (see the module
    docstring): batched, or exactly what ``ftm export-cypher`` writes."""
    if not ftm_compatible:
        with _local_entities(ds) as entities:
            return write_batched_cypher(entities, out)
    exporter = CypherGraphExporter(out)
    count = 0
    for proxy in _entities(ds):
        exporter.write(proxy)
        count += 1
    exporter.finalize()
    return {"entities": count}


def export_graph(ds: DatasetContext, *, force: bool = False) -> dict[str, Any]:
    """Write ``graph.cypher``, ``graph.graphml`` and the Neo4j bulk CSVs from the
    entities export, unless they are fresh. Each file is written beside the lake
    and then moved (or uploaded) whole, so a crash leaves the previous one;
    Neo4j files of schemata no longer present are removed after."""
    if not force and graph_exports_fresh(ds):
        return {"skipped": "fresh"}
    read = ds.core_tags.get(cv.EXPORTS_ENTITIES)
    written: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="lakehouse-graph-") as tmp,
        _local_entities(ds) as entities,
        GraphSQL(entities) as db,
    ):
        folder = Path(tmp)
        with (folder / "graph.cypher").open("w", encoding="utf-8") as fh:
            written["cypher"] = db.cypher(fh)
        ds.store.put_file(cv.dataset_path(ds.name, CYPHER), folder / "graph.cypher")
        with (folder / "graph.graphml").open("w", encoding="utf-8") as fh:
            written["graphml"] = db.graphml(fh)
        ds.store.put_file(cv.dataset_path(ds.name, GRAPHML), folder / "graph.graphml")
        names = db.neo4j(folder / "neo4j")
        for name in names:
            ds.store.put_file(
                cv.dataset_path(ds.name, NEO4J, cv.file_id(name)), folder / "neo4j" / name
            )
        prefix = cv.dataset_path(ds.name, NEO4J)
        for stale in sorted(set(ds.store.list(prefix + "/")) - {f"{prefix}/{n}" for n in names}):
            ds.store.delete(stale)
        written["neo4j"] = {"files": names}
    # stamped with what it read (the entities export's tag), not the clock at its end
    if read is not None:
        ds.core_tags.set(cv.EXPORTS_GRAPH, read + timedelta(microseconds=1))
    return written
