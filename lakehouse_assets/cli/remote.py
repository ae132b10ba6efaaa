"""The commands of a tenant over HTTP: ``lakehouse --lake http(s)://host …``.

A tenant switches from a local lake to a server by the URL, not by another
tool: with ``--lake`` (or ``LAKEHOUSE_LAKE_URI``) an ``http(s)://`` URL and
``LAKEHOUSE_TOKEN`` a token of the server's (``lakehouse tokens issue``), the
tenant's commands (writes, deletes, reads, the archive, the queue push,
versions, status and the operations) go through the remote client
(:mod:`lakehouse_assets.server.client`) and print what the local command
prints. The lake's own commands (``verify``, ``unlock``, ``spark``,
``datasets create``, ``graph rebuild``, …) touch storage no tenant holds; over
HTTP they stop with one line saying so and what runs remotely.

The functions here are called by the commands of the other modules when
:attr:`Context.remote` is set; each takes the :class:`RemoteDataset`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any

import click

from lakehouse_assets.cli.output import _echo_document
from lakehouse_assets.errors import InvalidInputError

if TYPE_CHECKING:
    from lakehouse_assets.archive import FileMeta
    from lakehouse_assets.server.client import RemoteDataset

#: the commands that run over HTTP (their command path after ``lakehouse``)
REMOTE_COMMANDS = (
    "entities write",
    "entities delete",
    "statements write",
    "get",
    "query",
    "stream",
    "archive add",
    "archive get",
    "archive cat",
    "archive ls",
    "archive delete",
    "queue push",
    "versions",
    "status",
    "flush",
    "compact",
    "optimize",
    "export",
    "make",
)


def not_remote(command: str, url: str) -> click.UsageError:
    """The error of a lake command given an HTTP lake."""
    return click.UsageError(
        f"`{command}` works on the lake's storage itself, not over HTTP ({url}): run it where "
        f"the lake is. Over HTTP: {', '.join(REMOTE_COMMANDS)}"
    )


def write_summary(done: Any, name: str, url: str) -> None:
    """The line a bulk write ends with (as the local command's, plus the server)."""
    entities = f"{done.entities} entities, " if getattr(done, "entities", 0) else ""
    click.echo(
        f"wrote {entities}{done.count} statements to {name} at {url} "
        f"(write {done.write_id} by tenant {done.tenant})",
        err=True,
    )


def entities_write(ds: RemoteDataset, fh: IO[bytes]) -> None:
    done = ds.write_entities(fh, origin=_origin())
    write_summary(done, ds.name, ds.lake.url)


def statements_write(ds: RemoteDataset, rows: Iterable[Any], origin: str) -> None:
    done = ds.write_statements(rows, origin=origin)
    write_summary(done, ds.name, ds.lake.url)


def _origin() -> str:
    origin: str = click.get_current_context().params["origin"]
    return origin


def resolve(ds: RemoteDataset, checksum: str) -> FileMeta:
    """The newest entry of the blob a checksum or a unique prefix of one names
    (a prefix is looked up in the archive's listing, as the local command does)."""
    from lakehouse_assets.errors import SourceNotFoundError

    text = checksum.strip().lower()
    if len(text) == 64:
        return ds.get_file(text)
    if not 4 <= len(text) < 64 or any(c not in "0123456789abcdef" for c in text):
        raise InvalidInputError(
            f"{checksum!r} is neither a SHA-256 checksum nor a prefix of 4-63 hex digits",
            dataset=ds.name,
        )
    found = {m.checksum for m in ds.list_files() if m.checksum.startswith(text)}
    if not found:
        raise SourceNotFoundError(f"[dataset {ds.name!r}] no archived file matches {checksum!r}")
    if len(found) > 1:
        raise InvalidInputError(
            f"checksum prefix {checksum!r} matches {len(found)} files: give more digits",
            dataset=ds.name,
        )
    return ds.get_file(found.pop())


def archive_add(
    ds: RemoteDataset,
    uris: tuple[str, ...],
    *,
    checksum: str | None,
    file_id: str | None,
    document: bool,
) -> None:
    from lakehouse_assets.access import local_path

    for uri in uris:
        path = local_path(uri)
        if path is None:
            raise click.UsageError(
                f"over HTTP `archive add` uploads local files, and {uri!r} is a URL: "
                "queue it with `queue push UPSERT file` (the server fetches it) instead"
            )
        meta = ds.add_file(path, checksum=checksum, file_id=file_id, create_document=document)
        click.echo(meta.model_dump_json())


def archive_cat(ds: RemoteDataset, checksum: str) -> None:
    out = sys.stdout.buffer
    for chunk in ds.open_file(resolve(ds, checksum).checksum):
        out.write(chunk)
    out.flush()


def archive_delete(ds: RemoteDataset, file_id: str, checksum: str | None) -> None:
    from lakehouse_assets import conventions as cv
    from lakehouse_assets.errors import SourceNotFoundError

    if checksum is not None:
        blob = resolve(ds, checksum).checksum
    else:
        entries = [m for m in ds.list_files() if m.file_id == cv.file_id(file_id)]
        if not entries:
            raise SourceNotFoundError(f"[dataset {ds.name!r}] no archived file {file_id!r}")
        blob = max(entries, key=lambda m: m.updated_at).checksum
    ds.delete_file(file_id, blob)
    click.echo(f"deleted {file_id} (blob {blob[:12]}… stays)", err=True)


def queue_push(ds: RemoteDataset, action: str, resource: str, data: Any) -> None:
    if not isinstance(data, dict):
        raise InvalidInputError("payload is not a JSON object", dataset=ds.name)
    item = ds.push(action.upper(), resource.lower(), data)
    click.echo(json.dumps(item))
    click.echo(
        f"queued {item.get('action')} {item.get('resource')} as "
        f"{item.get('tenant')}/{item.get('id')} at {ds.lake.url}",
        err=True,
    )


def operation(ds: RemoteDataset, name: str, as_json: bool, **options: Any) -> None:
    """Submit an operation as a job of the server and wait for it; its result."""
    job = ds.submit(name, **options)
    run = f" (Dagster run {job['dagster_run_id']})" if job.get("dagster_run_id") else ""
    click.echo(f"{name}: job {job['id']} submitted to {ds.lake.url}{run}", err=True)
    state = ds.wait(job)
    result = state.get("result")
    if as_json or not sys.stdout.isatty():
        _echo_document(result)
        return
    click.echo(f"{name}: job {job['id']} {state['state']}")
    for key, value in (result or {}).items():
        click.echo(f"  {key}: {json.dumps(value, default=str)}")


def status(ds: RemoteDataset) -> None:
    _echo_document(ds.status())


__all__ = ["REMOTE_COMMANDS", "not_remote"]
