"""``lakehouse entities`` and ``lakehouse statements``: bulk writes into the journal."""

from __future__ import annotations

import sys

import click
from tqdm import tqdm

from lakehouse_assets.cli.context import Context, _input, bulk_input_options, pass_ctx
from lakehouse_assets.cli.root import cli


@cli.group()
def entities() -> None:
    """Write and delete entities."""


@entities.command("write")
@bulk_input_options("FtM JSON lines file or - for stdin.")
@pass_ctx
def entities_write(obj: Context, path: str, origin: str) -> None:
    """Validate and write FtM entities (one JSON object per line); all or nothing.

    \b
    Example:
      lakehouse -d my_dataset entities write -i entities.ftm.json --origin crawl
      cat entities.ftm.json | lakehouse -d my_dataset entities write -i -
    """
    if obj.remote:
        from lakehouse_assets.cli import remote

        with _input(path) as (fh, _source):
            remote.entities_write(obj.remote_dataset(), fh)
        return
    ds = obj.dataset()
    with (
        _input(path) as (fh, source),
        tqdm(unit=" lines", desc=f"{ds.name}", file=sys.stderr, disable=None) as bar,
    ):
        bulk = ds.write_entities(fh, origin=origin, source=source, progress=bar.update)
    click.echo(
        f"wrote {bulk.entities} entities, {bulk.count} statements to {ds.name} "
        f"(write {bulk.write.write_id} by tenant {bulk.write.tenant})",
        err=True,
    )
    if bulk.notes:
        click.echo(f"  {bulk.notes.describe()}", err=True)


@entities.command("delete")
@click.argument("entity_ids", nargs=-1, required=True)
@click.option("--origin", "-o", default=None, help="Only statements of this origin.")
@pass_ctx
def entities_delete(obj: Context, entity_ids: tuple[str, ...], origin: str | None) -> None:
    """Tombstone all statements of entities.

    \b
    Example:
      lakehouse -d my_dataset entities delete own-omar-acme --origin crawl
    """
    if obj.remote:
        remote_ds = obj.remote_dataset()
        for entity_id in entity_ids:
            n = remote_ds.delete_entity(entity_id, origin=origin)
            click.echo(f"{entity_id}: {n} statements tombstoned", err=True)
        return
    ds = obj.dataset()
    for entity_id, n in ds.delete_entities(entity_ids, origin=origin).items():
        click.echo(f"{entity_id}: {n} statements tombstoned", err=True)


@cli.group()
def statements() -> None:
    """Write statements in followthemoney's CSV format."""


@statements.command("write")
@bulk_input_options("Statement CSV file or - for stdin.")
@pass_ctx
def statements_write(obj: Context, path: str, origin: str) -> None:
    """Validate and write statements (followthemoney CSV); all or nothing.

    \b
    Example:
      lakehouse -d my_dataset statements write -i statements.csv
    """
    from lakehouse_assets.entities import read_statements_csv

    if obj.remote:
        from lakehouse_assets.cli import remote

        remote_ds = obj.remote_dataset()
        with _input(path) as (fh, source):
            rows = read_statements_csv(fh, dataset=remote_ds.name, origin=origin, source=source)
            remote.statements_write(remote_ds, rows, origin)
        return
    ds = obj.dataset()
    with (
        _input(path) as (fh, source),
        ds.bulk(origin) as bulk,
        tqdm(unit=" statements", desc=ds.name, file=sys.stderr, disable=None) as bar,
    ):
        for stmt in read_statements_csv(fh, dataset=ds.name, origin=bulk.origin, source=source):
            bulk.add_statement(stmt)
            bar.update()
    click.echo(
        f"wrote {bulk.count} statements to {ds.name} "
        f"(write {bulk.write.write_id} by tenant {bulk.write.tenant})",
        err=True,
    )
