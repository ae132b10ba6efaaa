"""Sources into the journal: ``lakehouse crawl`` and ``lakehouse mapping``."""

from __future__ import annotations

import json
import sys

import click
from tqdm import tqdm

from lakehouse_assets.cli.context import Context, pass_ctx
from lakehouse_assets.cli.output import _echo_document
from lakehouse_assets.cli.root import cli


@cli.command("crawl")
@click.argument("uri")
@click.option("--prefix", default=None, help="Only files under this path of the source.")
@click.option("--glob", default=None, help="Only files matching this pattern (e.g. '*.pdf').")
@click.option("--exclude", default=None, help="Leave out files matching this pattern.")
@click.option(
    "--skip-existing/--no-skip-existing",
    default=True,
    show_default=True,
    help="Skip files archived by an earlier crawl of the same source.",
)
@click.option(
    "--follow-symlinks",
    is_flag=True,
    help="Also archive files that symlinks in the source point at outside it "
    "(skipped and listed by default).",
)
@pass_ctx
def crawl_cmd(
    obj: Context,
    uri: str,
    prefix: str | None,
    glob: str | None,
    exclude: str | None,
    skip_existing: bool,
    follow_symlinks: bool,
) -> None:
    """Archive every matching file under URI (folder, file:// or s3://), one Document each.

    Prints the crawl's statistics as JSON; files that failed are listed with
    their reason (and in the job record) and do not stop the crawl.

    \b
    Example:
      lakehouse -d my_dataset crawl ./documents --glob '*.pdf'
      lakehouse -d my_dataset crawl s3://bucket/leak/ --prefix 2024/
    """
    from lakehouse_assets.crawl import crawl

    ds = obj.dataset()
    with tqdm(unit=" files", desc=f"crawl {ds.name}", file=sys.stderr, disable=None) as bar:
        result = crawl(
            ds,
            uri,
            prefix=prefix,
            glob=glob,
            exclude=exclude,
            skip_existing=skip_existing,
            follow_symlinks=follow_symlinks,
            progress=bar.update,
        )
    _echo_document({**result.as_dict(), "errors": result.errors})


@cli.group()
def mapping() -> None:
    """Mappings of archived CSVs to FtM entities."""


@mapping.command("add")
@click.argument("csv_checksum")
@click.argument("mapping_yaml", type=click.Path(exists=True, dir_okay=False))
@pass_ctx
def mapping_add(obj: Context, csv_checksum: str, mapping_yaml: str) -> None:
    """Validate and store MAPPING_YAML for the archived CSV with CSV_CHECKSUM.

    \b
    Example:
      lakehouse -d my_dataset mapping add 7dd93923 mapping.yml   (the archived CSV's checksum)
    """
    from pathlib import Path

    ds = obj.dataset()
    checksum = ds.archive.resolve(csv_checksum)  # a unique prefix will do
    stored = ds.add_mapping(checksum, Path(mapping_yaml).read_text("utf-8"))
    state = "stored" if stored.changed else "unchanged"
    click.echo(f"{state}: {stored.path} ({stored.queries} queries)", err=True)


@mapping.command("ls")
@pass_ctx
def mapping_ls(obj: Context) -> None:
    """The stored mappings as JSON lines.

    \b
    Example:
      lakehouse -d my_dataset mapping ls
    """
    for item in obj.dataset().mappings():
        click.echo(json.dumps(item))


@mapping.command("process")
@click.argument("csv_checksum")
@click.option("--force", is_flag=True, help="Map again even if the result is fresh.")
@click.option(
    "--engine",
    type=click.Choice(["auto", "spark", "local"]),
    default="auto",
    show_default=True,
    help="Spark for big CSVs (auto), or force one.",
)
@pass_ctx
def mapping_process(obj: Context, csv_checksum: str, force: bool, engine: str) -> None:
    """Map the archived CSV into the journal (origin mapping:CSV_CHECKSUM).

    \b
    Example:
      lakehouse -d my_dataset mapping process 7dd93923 --force
    """
    spark = None if engine == "auto" else engine == "spark"
    ds = obj.dataset()
    checksum = ds.archive.resolve(csv_checksum)  # a unique prefix will do
    _echo_document(ds.process_mapping(checksum, force=force, spark=spark).as_dict())
