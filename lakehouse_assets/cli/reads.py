"""Reading entities: ``lakehouse get``, ``query`` and ``stream``."""

from __future__ import annotations

import click

from lakehouse_assets.cli.context import AS_OF_HELP, Context, pass_ctx
from lakehouse_assets.cli.output import _echo_json
from lakehouse_assets.cli.root import cli


@cli.command("get")
@click.argument("entity_id")
@click.option("--origin", "-o", default=None, help="Only statements of this origin.")
@click.option(
    "--flush/--no-flush",
    default=False,
    show_default=True,
    help="Flush the journal first, so unflushed writes are seen.",
)
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP)
@pass_ctx
def get_cmd(
    obj: Context, entity_id: str, origin: str | None, flush: bool, as_of: str | None
) -> None:
    """Print one entity as FtM JSON (exit 1 if it does not exist).

    \b
    Example:
      lakehouse -d my_dataset get acme-holding
      lakehouse -d my_dataset get acme-holding --as-of 1
    """
    ds = obj.remote_dataset() if obj.remote else obj.dataset()
    entity = ds.get_entity(entity_id, origin=origin, flush=flush, as_of=as_of)
    if entity is None:
        raise click.ClickException(f"no entity {entity_id!r} in dataset {ds.name!r}")
    _echo_json(entity.to_dict())


@cli.command("query")
@click.option("--id", "entity_ids", multiple=True, help="Entity id (repeatable).")
@click.option("--origin", "-o", default=None, help="Only statements of this origin.")
@click.option("--schema", "-s", "schemata", multiple=True, help="FtM schema (repeatable).")
@click.option(
    "--prop",
    "-p",
    "props",
    multiple=True,
    help="PROPERTY=VALUE filter (repeatable, all must match).",
)
@click.option(
    "--flush/--no-flush",
    default=True,
    show_default=True,
    help="Flush the journal first (waits at most LAKEHOUSE_READ_WAIT_SECONDS for a writer).",
)
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP + " Never flushes.")
@pass_ctx
def query_cmd(
    obj: Context,
    entity_ids: tuple[str, ...],
    origin: str | None,
    schemata: tuple[str, ...],
    props: tuple[str, ...],
    flush: bool,
    as_of: str | None,
) -> None:
    """Print matching entities as FtM JSON lines (filters are ftmq queries).

    \b
    Example:
      lakehouse -d my_dataset query -s Company -p country=de
      lakehouse -d my_dataset query --id acme-holding --no-flush
    """
    from ftmq.query import P, Query

    q: Query | None = None
    if props:
        q = Query()
        for item in props:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise click.BadParameter(
                    f"expected PROPERTY=VALUE, got {item!r}", param_hint="--prop"
                )
            q = q.where(P(**{key: value}))
    ds = obj.remote_dataset() if obj.remote else obj.dataset()
    for entity in ds.query(
        q,
        entity_ids=list(entity_ids) or None,
        origin=origin,
        schemata=list(schemata) or None,
        flush=flush,
        as_of=as_of,
    ):
        _echo_json(entity.to_dict())


@cli.command("stream")
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP)
@pass_ctx
def stream_cmd(obj: Context, as_of: str | None) -> None:
    """Print the entities of the last entities.ftm.json export (or of a version).

    \b
    Example:
      lakehouse -d my_dataset stream | jq -r .caption
    """
    ds = obj.remote_dataset() if obj.remote else obj.dataset()
    for data in ds.stream_entities(as_of=as_of):
        _echo_json(data)
