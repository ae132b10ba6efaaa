"""The graph index: ``lakehouse refs``, ``neighbours`` and the ``graph`` group."""

from __future__ import annotations

import sys
from typing import TextIO

import click

from lakehouse_assets.cli.context import AS_OF_HELP, Context, pass_ctx
from lakehouse_assets.cli.output import _echo_document, _echo_json
from lakehouse_assets.cli.root import cli


@cli.command("refs")
@click.argument("entity_id")
@click.option(
    "--in", "direction", flag_value="in", default=True, help="Who points at it (default)."
)
@click.option("--out", "direction", flag_value="out", help="What it points at.")
@click.option("--both", "direction", flag_value="both", help="Both directions.")
@click.option("--prop", "props", multiple=True, help="Only this property (repeatable).")
@click.option(
    "--schema", "-s", "schemata", multiple=True, help="Only other entities of this schema."
)
@click.option("--json", "as_json", is_flag=True, help="JSON lines even on a terminal.")
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP + " Scans that version.")
@pass_ctx
def refs_cmd(
    obj: Context,
    entity_id: str,
    direction: str,
    props: tuple[str, ...],
    schemata: tuple[str, ...],
    as_json: bool,
    as_of: str | None,
) -> None:
    """The edges at an entity, from the graph index (no Spark): its id, schema and
    caption for the entity at the other end.

    \b
    Examples:
      lakehouse -d my_dataset refs acme-trading            (who points at it)
      lakehouse -d my_dataset refs anna-schmidt --out --prop owner
    """
    from lakehouse_assets import graph
    from lakehouse_assets.versions import version_snapshot

    ds = obj.dataset()
    edges = graph.refs(
        ds,
        entity_id,
        direction=direction,
        props=list(props) or None,
        schemata=list(schemata) or None,
        snapshot=None if as_of is None else version_snapshot(ds, as_of),
    )
    if not edges:
        click.echo(f"no edges at {entity_id!r} in dataset {ds.name!r}", err=True)
        return
    if as_json or not sys.stdout.isatty():
        for edge in edges:
            _echo_json(edge)
        return
    for edge in edges:
        arrow = "←" if edge["direction"] == "in" else "→"
        caption = edge["other_caption"] or "(not in this dataset)"
        click.echo(
            f"{arrow} {edge['prop']:<14} {edge['other_id']:<42} "
            f"{edge['other_schema'] or '-':<14} {caption}"
        )


@cli.command("neighbours")
@click.argument("entity_id")
@click.option(
    "--depth", type=click.IntRange(min=0, max=5), default=1, show_default=True, help="Hops."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="At most this many entities.",
)
@pass_ctx
def neighbours_cmd(obj: Context, entity_id: str, depth: int, limit: int) -> None:
    """The network around an entity (itself first), breadth first over edges in both
    directions, as FtM JSON lines.

    \b
    Example:
      lakehouse -d my_dataset neighbours acme-trading --depth 2 --limit 50
    """
    from lakehouse_assets import graph

    for data in graph.neighbours(obj.dataset(), entity_id, depth=depth, limit=limit):
        _echo_json(data)


@cli.group("graph")
def graph_group() -> None:
    """The graph index: edges of entity-typed statements, both ways."""


@graph_group.command("update")
@pass_ctx
def graph_update(obj: Context) -> None:
    """Bring the index up to the tables (builds it the first time).

    \b
    Example:
      lakehouse -d my_dataset graph update
    """
    from lakehouse_assets import graph

    _echo_document(graph.update(obj.dataset()).as_dict())


@graph_group.command("rebuild")
@pass_ctx
def graph_rebuild(obj: Context) -> None:
    """Build the index from scratch (folds tombstones in).

    \b
    Example:
      lakehouse -d my_dataset graph rebuild
    """
    from lakehouse_assets import graph

    _echo_document(graph.rebuild(obj.dataset()).as_dict())


@graph_group.command("export")
@click.option("--force", is_flag=True, help="Write even when the graph exports are fresh.")
@click.option(
    "--ftm-cypher",
    type=click.File("w"),
    default=None,
    help="Instead: write exactly what `ftm export-cypher` writes to this file ('-': stdout).",
)
@pass_ctx
def graph_export(obj: Context, force: bool, ftm_cypher: TextIO | None) -> None:
    """graph.cypher (batched), graph.graphml and Neo4j bulk CSVs of the entities export.

    \b
    Examples:
      lakehouse -d my_dataset graph export
      lakehouse -d my_dataset graph export --ftm-cypher graph-ftm.cypher
    """
    from lakehouse_assets.graph import exports as graph_exports

    ds = obj.dataset()
    if ftm_cypher is not None:
        graph_exports.write_cypher(ds, ftm_cypher, ftm_compatible=True)
        return
    _echo_document(graph_exports.export_graph(ds, force=force))


@graph_group.command("status")
@pass_ctx
def graph_status(obj: Context) -> None:
    """What the index reflects and whether that is current; edge counts.

    \b
    Example:
      lakehouse -d my_dataset graph status
    """
    from lakehouse_assets import graph

    _echo_document(graph.status(obj.dataset()))
