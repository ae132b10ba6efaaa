"""``lakehouse datasets`` (list, create, delete) and ``lakehouse tags``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from lakehouse_assets import conventions as cv
from lakehouse_assets.cli.context import Context, pass_ctx
from lakehouse_assets.cli.output import _echo_json
from lakehouse_assets.cli.root import cli

if TYPE_CHECKING:
    from lakehouse_assets.overview import DatasetLine


@cli.group()
def datasets() -> None:
    """List, create and delete datasets."""


@datasets.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per dataset (JSON lines).")
@click.option("--names", is_flag=True, help="Names only, one per line (the default on a pipe).")
@pass_ctx
def datasets_list(obj: Context, as_json: bool, names: bool) -> None:
    """The datasets of the lake: on a terminal a table (name, title, published
    version, journal rows waiting, stale exports); on a pipe one name per line.

    \b
    Example:
      lakehouse --lake ./lake datasets list
      lakehouse --lake ./lake datasets list --json | jq -r 'select(.pending > 0) | .name'
    """
    if names or not (as_json or sys.stdout.isatty()):
        for name in obj.lake.datasets():
            click.echo(name)
        return
    lines = _dataset_lines(obj)
    if as_json:
        for line in lines:
            _echo_json(line.as_dict())
        return
    _print_lines(lines, obj.lake.store.uri)


def _dataset_lines(obj: Context) -> list[DatasetLine]:
    from lakehouse_assets.overview import dataset_lines

    lake = obj.lake
    return list(dataset_lines(lake.store, lake.dataset, lake.journal.counts()))


def _print_lines(lines: list[DatasetLine], uri: str) -> None:
    """The catalog as a table for a person."""
    if not lines:
        click.echo(f"no datasets in {uri}: create one with `lakehouse datasets create NAME`")
        return
    width = max(len(line.name) for line in lines)
    titles = min(max(len(line.title) for line in lines), 40)
    click.echo(f"{'dataset':<{width}}  {'version':>7}  {'waiting':>9}  {'title':<{titles}}  stale")
    for line in lines:
        version = "-" if line.version is None else str(line.version)
        title = line.title if len(line.title) <= titles else line.title[: titles - 1] + "…"
        click.echo(
            f"{line.name:<{width}}  {version:>7}  {line.pending:>9,}  {title:<{titles}}  "
            f"{_stale(line.stale)}"
        )


def _stale(kinds: list[str]) -> str:
    """The stale files, shortest: ``-`` (none), ``all exports`` (+ the graph), or their names."""
    exports = {"statements", "entities", "statistics", "index"}
    if not kinds:
        return "-"
    if exports <= set(kinds):
        rest = sorted(set(kinds) - exports)
        return ", ".join(["all exports", *rest])
    return ", ".join(kinds)


@datasets.command("create")
@click.argument("name")
@click.option("--title", help="Human-readable title.")
@click.option("--summary", help="One-paragraph summary.")
@click.option(
    "--children",
    help="Make a collection of these datasets (comma-separated names; a child may be "
    "a collection itself).",
)
@pass_ctx
def datasets_create(
    obj: Context, name: str, title: str | None, summary: str | None, children: str | None
) -> None:
    """Create a dataset (idempotent); with --children, a collection: its exports
    merge its leaves' entities by the judgements of `lakehouse resolver`.

    \b
    Examples:
      lakehouse --lake ./lake datasets create my_dataset --title "My dataset"
      lakehouse --lake ./lake datasets create everything --children sanctions,peps
    """
    fields: dict[str, object] = {}
    kids = (
        []
        if children is None
        else sorted({cv.dataset_name(c.strip()) for c in children.split(",")})
    )
    if kids:
        fields["children"] = kids
    lake = obj.open_lake(create=True)
    for child in kids:
        lake.dataset(child)  # a child that does not exist: said before anything is written
    ds = lake.create_dataset(name, title=title, summary=summary, **fields)
    if children is not None:
        from lakehouse_assets.collections.leaves import leaves

        found = leaves(lake.store, ds.name)  # a missing child or a cycle: said now
        click.echo(f"created collection {ds.name} of {', '.join(found)}", err=True)
        return
    click.echo(f"created {ds.name} in {obj.lake.store.uri}", err=True)


@datasets.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (scripts).")
@click.option(
    "--force",
    is_flag=True,
    help="Delete even while a lock is held or journal rows wait for a flush (they are lost).",
)
@pass_ctx
def datasets_delete(obj: Context, name: str, yes: bool, force: bool) -> None:
    """Delete a dataset: every file of its folder (tables, archive, exports,
    versions, queue), its journal rows and its Dagster partition.

    Refused while a lock is held or journal rows wait for a flush, unless
    --force. The partition is deleted in the Dagster instance of DAGSTER_HOME
    when it is set (else the new_datasets sensor deletes it on its next tick).

    \b
    Example:
      lakehouse --lake ./lake datasets delete old_dataset --yes
    """
    lake = obj.lake
    dataset = cv.dataset_name(name)
    lake.dataset(dataset)  # exists?
    if not yes:
        click.confirm(
            f"Delete dataset {dataset} and all its files from {lake.store.uri}?", abort=True
        )
    deleted = lake.delete_dataset(dataset, force=force)
    partition = _delete_partition(dataset)
    lost = f", {deleted.journal_rows:,} journal rows not flushed" if deleted.journal_rows else ""
    click.echo(f"deleted {dataset}: {deleted.files:,} files{lost}{partition}", err=True)


def _delete_partition(name: str) -> str:
    """Delete the dataset's partition in the Dagster instance of ``DAGSTER_HOME``
    (if set), saying what became of it; without an instance here the
    ``new_datasets`` sensor deletes it on its next tick."""
    import os

    if not os.environ.get("DAGSTER_HOME"):
        return ""
    import dagster as dg

    with dg.DagsterInstance.get() as instance:
        if not instance.has_dynamic_partition(cv.DAGSTER_PARTITIONS, name):
            return ""
        instance.delete_dynamic_partition(cv.DAGSTER_PARTITIONS, name)
    return "; its Dagster partition deleted"


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
