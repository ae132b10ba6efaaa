"""``lakehouse datasets`` (list, create) and ``lakehouse tags``."""

from __future__ import annotations

import click

from lakehouse_assets import conventions as cv
from lakehouse_assets.cli.context import Context, pass_ctx
from lakehouse_assets.cli.root import cli


@cli.group()
def datasets() -> None:
    """List and create datasets."""


@datasets.command("list")
@pass_ctx
def datasets_list(obj: Context) -> None:
    """Print the datasets of the lake, one per line.

    \b
    Example:
      lakehouse --lake ./lake datasets list
    """
    for name in obj.lake.datasets():
        click.echo(name)


@datasets.command("create")
@click.argument("name")
@click.option("--title", help="Human-readable title.")
@click.option("--summary", help="One-paragraph summary.")
@pass_ctx
def datasets_create(obj: Context, name: str, title: str | None, summary: str | None) -> None:
    """Create a dataset (idempotent).

    \b
    Example:
      lakehouse --lake ./lake datasets create my_dataset --title "My dataset"
    """
    ds = obj.open_lake(create=True).create_dataset(name, title=title, summary=summary)
    click.echo(f"created {ds.name} in {obj.lake.store.uri}", err=True)


@cli.group()
def tags() -> None:
    """Freshness tags."""


@tags.command("ls")
@click.option(
    "--tenant",
    default=cv.LAKEHOUSE_TENANT,
    show_default=True,
    help="Whose tags (the lakehouse's own: the core freshness tags).",
)
@pass_ctx
def tags_ls(obj: Context, tenant: str) -> None:
    """Print a tenant's tags as ``key<TAB>timestamp``.

    \b
    Example:
      lakehouse -d my_dataset tags ls --tenant my_app
    """
    for key, ts in obj.dataset().tags(tenant).items():
        click.echo(f"{key}\t{ts.isoformat()}")
