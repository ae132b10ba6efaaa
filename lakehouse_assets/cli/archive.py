"""``lakehouse archive``: archived source files and their extracted text."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import click

from lakehouse_assets import conventions as cv
from lakehouse_assets.cli.context import JSON_OPTION, Context, pass_ctx
from lakehouse_assets.cli.output import _echo_json, _size
from lakehouse_assets.cli.root import cli
from lakehouse_assets.errors import InvalidInputError


@cli.group()
def archive() -> None:
    """Source files: add, get, cat, ls, delete, and their extracted text."""


@archive.command("add")
@click.argument("uris", nargs=-1, required=True)
@click.option("--checksum", help="Expected SHA-256 (verified; mismatch stores nothing).")
@click.option("--file-id", help="Explicit metadata id (single file only).")
@click.option(
    "--document/--no-document", default=False, help="Also write a Document entity to the journal."
)
@click.option(
    "--follow-symlinks", is_flag=True, help="Archive the target of a local path that is a symlink."
)
@pass_ctx
def archive_add(
    obj: Context,
    uris: tuple[str, ...],
    checksum: str | None,
    file_id: str | None,
    document: bool,
    follow_symlinks: bool,
) -> None:
    """Archive files from paths or file://, s3://, http(s):// URIs.

    \b
    Example:
      lakehouse -d my_dataset archive add report.pdf --document
      lakehouse -d my_dataset archive add s3://bucket/leak/ https://example.org/a.csv
    """
    if (checksum or file_id) and len(uris) > 1:
        raise click.UsageError("--checksum and --file-id apply to a single file")
    if obj.remote:
        from lakehouse_assets.cli import remote

        remote.archive_add(
            obj.remote_dataset(), uris, checksum=checksum, file_id=file_id, document=document
        )
        return
    ds = obj.dataset()
    for uri in uris:
        meta = ds.add_file(
            uri,
            checksum=checksum,
            file_id=file_id,
            create_document=document,
            follow_symlinks=follow_symlinks,
        )
        click.echo(meta.model_dump_json())


@archive.command("get")
@click.argument("checksum")
@pass_ctx
def archive_get(obj: Context, checksum: str) -> None:
    """Print a file's metadata as JSON (CHECKSUM: the SHA-256 or a unique prefix).

    \b
    Example:
      lakehouse -d my_dataset archive get 3f2a9c01b7d4
    """
    if obj.remote:
        from lakehouse_assets.cli import remote

        click.echo(remote.resolve(obj.remote_dataset(), checksum).model_dump_json(indent=2))
        return
    archive = obj.dataset().archive
    click.echo(archive.get(archive.resolve(checksum)).model_dump_json(indent=2))


@archive.command("cat")
@click.argument("checksum")
@pass_ctx
def archive_cat(obj: Context, checksum: str) -> None:
    """Stream a file's content to stdout (CHECKSUM: the SHA-256 or a unique prefix).

    \b
    Example:
      lakehouse -d my_dataset archive cat 5f1c0a2b9e3d > report.pdf   (a unique prefix will do)
    """
    if obj.remote:
        from lakehouse_assets.cli import remote

        remote.archive_cat(obj.remote_dataset(), checksum)
        return
    archive = obj.dataset().archive
    with archive.open(archive.resolve(checksum)) as fh:
        shutil.copyfileobj(fh, sys.stdout.buffer, 1024 * 1024)


@archive.command("ls")
@pass_ctx
def archive_ls(obj: Context) -> None:
    """List file metadata as JSON lines.

    \b
    Example:
      lakehouse -d my_dataset archive ls
    """
    files = obj.remote_dataset().list_files() if obj.remote else obj.dataset().archive.list()
    for meta in files:
        click.echo(meta.model_dump_json())


@archive.command("delete")
@click.argument("file_id")
@click.option("--checksum", help="The blob's checksum (faster lookup).")
@pass_ctx
def archive_delete(obj: Context, file_id: str, checksum: str | None) -> None:
    """Delete one metadata entry (the blob stays).

    \b
    Example:
      lakehouse -d my_dataset archive delete report.pdf
    """
    if obj.remote:
        from lakehouse_assets.cli import remote

        remote.archive_delete(obj.remote_dataset(), file_id, checksum)
        return
    archive = obj.dataset().archive
    meta = archive.delete(file_id, checksum=archive.resolve(checksum) if checksum else None)
    click.echo(f"deleted {meta.file_id} ({meta.key})", err=True)


# --- extracted text -----------------------------------------------------------


@archive.group("text")
def archive_text() -> None:
    """Text extracted from archived files, one per engine: put, get, ls."""


def _read_utf8(path: str, dataset: str) -> str:
    """A text file (or stdin for -) as a string; InvalidInputError if it is not UTF-8."""
    if path == "-":
        data, source = sys.stdin.buffer.read(), "<stdin>"
    else:
        p = Path(path)
        if not p.is_file():
            raise click.BadParameter(f"no such file: {path}", param_hint="FILE")
        data, source = p.read_bytes(), str(p)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"not UTF-8 ({exc.reason} at byte {exc.start}): extracted text must be UTF-8",
            dataset=dataset,
            source=source,
        ) from None


ENGINE_OPTION = click.option(
    "--engine",
    "-e",
    required=True,
    help="The extraction engine (tika, ocr, pdftotext...): the text is stored as {ENGINE}.txt.",
)


@archive_text.command("put")
@click.argument("checksum")
@click.argument("path", default="-", required=False, metavar="[FILE|-]")
@ENGINE_OPTION
@pass_ctx
def archive_text_put(obj: Context, checksum: str, path: str, engine: str) -> None:
    """Store the text ENGINE extracted from an archived file (UTF-8, from FILE or stdin).

    CHECKSUM is the file's SHA-256 or a unique prefix; the engine's earlier
    text is replaced.

    \b
    Example:
      lakehouse -d my_dataset archive text put 3f2a9c01b7d4 --engine tika report.txt
      pdftotext report.pdf - | lakehouse -d my_dataset archive text put 3f2a9c01b7d4 -e pdftotext
    """
    ds = obj.dataset()
    text = _read_utf8(path, ds.name)
    full = ds.archive.put_text(checksum, engine, text)
    click.echo(f"stored {len(text):,} characters of {engine} text for {full}", err=True)


@archive_text.command("get")
@click.argument("checksum")
@ENGINE_OPTION
@pass_ctx
def archive_text_get(obj: Context, checksum: str, engine: str) -> None:
    """Print the text ENGINE extracted from an archived file.

    \b
    Example:
      lakehouse -d my_dataset archive text get 3f2a9c01b7d4 --engine tika > report.txt
    """
    click.echo(obj.dataset().archive.get_text(checksum, engine), nl=False)


@archive_text.command("ls")
@click.argument("checksum")
@JSON_OPTION
@pass_ctx
def archive_text_ls(obj: Context, checksum: str, as_json: bool) -> None:
    """The engines that have text for an archived file, with its size.

    \b
    Example:
      lakehouse -d my_dataset archive text ls 3f2a9c01b7d4
    """
    ds = obj.dataset()
    full = ds.archive.resolve(checksum)
    rows: list[dict[str, Any]] = [
        {
            "checksum": full,
            "engine": engine,
            "bytes": ds.store.size(cv.archive_text(ds.name, full, engine)),
        }
        for engine in ds.archive.texts(full)
    ]
    if as_json or not sys.stdout.isatty():
        for row in rows:
            _echo_json(row)
        return
    if not rows:
        click.echo(f"no extracted text for {full}", err=True)
        return
    click.echo(f"{'engine':<24} {'size':>10}")
    for row in rows:
        click.echo(f"{row['engine']:<24} {_size(row['bytes']):>10}")
