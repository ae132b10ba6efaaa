"""``lakehouse resolver``: a collection's judgements (nomenklatura's formats).

``load`` reads nomenklatura's JSON-lines dump (a file or ``-``) or its SQL
table (``--sql URL``, the ``NOMENKLATURA_DB_URL`` of a SQLite file or a
PostgreSQL server); ``dump`` writes the live judgements as nomenklatura's
dump; ``decide`` records one judgement as nomenklatura's ``decide`` does.
Each change makes the collection stale: the next ``lakehouse -d NAME make``
rebuilds it and publishes a version.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from lakehouse_assets.cli.context import Context, pass_ctx
from lakehouse_assets.cli.output import _echo_json
from lakehouse_assets.cli.root import cli

if TYPE_CHECKING:
    from lakehouse_assets.lake import Dataset


@cli.group()
def resolver() -> None:
    """A collection's judgements: load, dump, decide (nomenklatura's formats)."""


def _collection(obj: Context) -> Dataset:
    """The -d dataset, which must be a collection."""
    from lakehouse_assets.collections.leaves import leaves

    ds = obj.dataset()
    leaves(ds.store, ds.name)  # not a collection: said before anything is read
    return ds


@resolver.command("load")
@click.argument("dump", required=False, type=click.File("rb"))
@click.option("--sql", "sql_url", help="nomenklatura's database URL (SQLite or PostgreSQL).")
@click.option("--table", default="resolver", show_default=True, help="Its resolver table.")
@pass_ctx
def resolver_load(obj: Context, dump: object, sql_url: str | None, table: str) -> None:
    """Load judgements: a dump (each line supersedes its pair's judgement) or,
    with --sql, nomenklatura's whole table (which replaces the collection's).

    \b
    Examples:
      lakehouse -d everything resolver load resolver.json
      lakehouse -d everything resolver load --sql sqlite:///nomenklatura.db
    """
    from lakehouse_assets.collections import judgements

    if (dump is None) == (sql_url is None):
        raise click.UsageError("give a dump file (or -) or --sql URL, not both")
    ds = _collection(obj)
    if sql_url is not None:
        result = judgements.load_sql(ds, sql_url, table=table)
    else:
        name = getattr(dump, "name", "-")
        result = judgements.load_dump(ds, dump, source=str(name))  # type: ignore[arg-type]
    _echo_json(
        {
            "collection": ds.name,
            "merged_ids": sum(1 for k, v in result.canonical.items() if k != v),
            "clusters": len(set(result.canonical.values())),
            "conflicts": [list(c) for c in result.conflicts],
        }
    )


@resolver.command("dump")
@pass_ctx
def resolver_dump(obj: Context) -> None:
    """Print the live judgements as nomenklatura's dump (JSON lines).

    \b
    Example:
      lakehouse -d everything resolver dump > resolver.json
    """
    from lakehouse_assets.collections import judgements

    ds = _collection(obj)
    sys.stdout.writelines(judgements.dump_lines(judgements.rows(ds)))


@resolver.command("decide")
@click.argument("left")
@click.argument("right")
@click.argument("judgement", type=click.Choice(["positive", "negative", "unsure", "no_judgement"]))
@click.option("--user", help="Who decided (default: the tenant).")
@pass_ctx
def resolver_decide(obj: Context, left: str, right: str, judgement: str, user: str | None) -> None:
    """Record one judgement between two entity ids; prints the id they resolve to.

    \b
    Example:
      lakehouse -d everything resolver decide ofac-123 eu-456 positive
    """
    from lakehouse_assets.collections import judgements

    ds = _collection(obj)
    click.echo(judgements.decide(ds, left, right, judgement, user=user))
