"""``lakehouse config``: the lake's catalog config.yml and the settings it fills."""

from __future__ import annotations

import json
import sys

import click

from lakehouse_assets import conventions as cv
from lakehouse_assets.cli.context import JSON_OPTION, Context, pass_ctx
from lakehouse_assets.cli.output import _echo_document
from lakehouse_assets.cli.root import cli


def _hide_password(url: str | None) -> str | None:
    if not url:
        return url
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


@cli.group("config")
def config_group() -> None:
    """The lake's catalog config.yml."""


@config_group.command("show")
@JSON_OPTION
@pass_ctx
def config_show(obj: Context, as_json: bool) -> None:
    """Print the catalog config.yml and the settings it fills, with where each
    value comes from: argument > environment > config.yml > default.

    An invalid config.yml is an error naming the file and the problem.

    \b
    Example:
      lakehouse --lake ./lake config show
    """
    from lakehouse_assets.catalog import CatalogConfig

    lake = obj.lake
    config = lake.catalog_config or CatalogConfig()
    shown = config.model_dump(mode="json")
    shown["journal_url"] = _hide_password(shown["journal_url"])
    effective = {
        "journal_url": _hide_password(lake.settings.resolved_journal_url()),
        "vacuum_retention_hours": lake.settings.vacuum_retention_hours,
    }
    sources = {
        name: {"value": value, "source": lake.setting_sources.get(name, "default")}
        for name, value in effective.items()
    }
    report = {
        "path": lake.store.full_uri(cv.CATALOG_CONFIG),
        "exists": lake.catalog_config is not None,
        "config": shown,
        "effective": sources,
    }
    if as_json or not sys.stdout.isatty():
        _echo_document(report)
        return
    click.echo(f"catalog config  {report['path']}" + ("" if report["exists"] else " (none yet)"))
    click.echo(f"  name          {config.name}")
    click.echo(f"  title         {config.title or '-'}")
    for name, value in sorted(config.dataset_defaults.items()):
        click.echo(f"  dataset default {name}: {json.dumps(value, default=str)}")
    for name, info in sources.items():
        click.echo(f"  {name:<24} {info['value']}  ({info['source']})")
