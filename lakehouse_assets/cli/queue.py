"""``lakehouse queue``: the tenants' queued actions (push, ls, consume)."""

from __future__ import annotations

import json
import sys

import click

from lakehouse_assets.cli.context import JSON_OPTION, Context, pass_ctx
from lakehouse_assets.cli.errors import one_line
from lakehouse_assets.cli.output import _echo_document, _echo_json
from lakehouse_assets.cli.root import cli
from lakehouse_assets.errors import InvalidInputError


@cli.group("queue")
def queue_group() -> None:
    """Queued actions of tenants on entities and files: push, ls, consume."""


@queue_group.command("push")
@click.argument("action", type=click.Choice(["UPSERT", "DELETE"], case_sensitive=False))
@click.argument("resource", type=click.Choice(["entity", "file"], case_sensitive=False))
@click.argument("payload", default="-", required=False, metavar="[PAYLOAD_JSON|-]")
@pass_ctx
def queue_push(obj: Context, action: str, resource: str, payload: str) -> None:
    """Queue an action as the tenant of --tenant; print the item as JSON.

    \b
    Payloads (JSON; - reads stdin):
      UPSERT entity  an FtM entity, or {"entity": {...}, "origin": "..."}
      DELETE entity  {"entity_id": "...", "origin": "..."}   (origin optional)
      UPSERT file    {"uri": "path|s3://|https://", "checksum"?, "key"?, "document"?: true}
      DELETE file    {"file_id": "...", "checksum"?: "..."}

    \b
    Example:
      lakehouse --tenant my_app -d my_dataset queue push UPSERT entity \\
        '{"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}}'
      echo '{"uri": "s3://bucket/a.pdf"}' | lakehouse -d my_dataset queue push UPSERT file -
    """
    name = obj.dataset_name or ""
    if not obj.remote:
        name = obj.dataset().name
    source = "<stdin>" if payload == "-" else None
    text = payload
    if payload == "-":
        try:
            text = sys.stdin.buffer.read().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(
                f"payload is not UTF-8 ({exc.reason} at byte {exc.start})",
                dataset=name,
                source=source,
            ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(
            f"payload is not JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}",
            dataset=name,
            source=source,
        ) from None
    if obj.remote:
        from lakehouse_assets.cli import remote

        remote.queue_push(obj.remote_dataset(), action, resource, data)
        return
    item = obj.dataset().queue.push(action, resource, data)
    click.echo(item.model_dump_json())
    click.echo(
        f"queued {item.action} {item.resource} {item.summary()} as {item.tenant}/{item.id}",
        err=True,
    )


@queue_group.command("ls")
@click.option("--tenant", "tenant", default=None, help="Only this tenant's items (default: all).")
@click.option(
    "--all", "show_all", is_flag=True, help="Also the items done and those set aside as failed."
)
@JSON_OPTION
@pass_ctx
def queue_ls(obj: Context, tenant: str | None, show_all: bool, as_json: bool) -> None:
    """The queue's pending items in the order they will be applied (UUID7: time).

    \b
    Example:
      lakehouse -d my_dataset queue ls
      lakehouse -d my_dataset queue ls --tenant my_app --all --json | jq .error
    """
    ds = obj.dataset()
    entries = ds.queue.list(tenant, state="all" if show_all else "pending")
    if as_json or not sys.stdout.isatty():
        for entry in entries:
            _echo_json(entry.as_dict())
        return
    if not entries:
        click.echo(
            f"the queue of {ds.name} is empty" + (" (pending)" if not show_all else ""), err=True
        )
        return
    click.echo(f"{'id':<36}  {'tenant':<14} {'state':<8} {'action':<7} {'resource':<8} subject")
    for entry in entries:
        info = entry.as_dict()
        subject = info["subject"] or ""
        if entry.error:
            subject = f"{subject}  ({one_line(entry.error)[:80]})".strip()
        click.echo(
            f"{entry.id:<36}  {entry.tenant:<14} {entry.state:<8} {info['action'] or '?':<7} "
            f"{info['resource'] or '?':<8} {subject}"
        )


@queue_group.command("consume")
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Apply at most this many items."
)
@click.option(
    "--wait",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds to wait for another consumer of this dataset to finish.",
)
@JSON_OPTION
@pass_ctx
def queue_consume(obj: Context, limit: int | None, wait: float, as_json: bool) -> None:
    """Apply the pending items of every tenant now, in UUID7 order, each exactly once.

    Bad items are set aside (queue/_failed/) and reported; an error that may
    pass (an unreachable source) stops before its item, which stays pending
    (exit 1).

    \b
    Example:
      lakehouse -d my_dataset queue consume
    """
    result = obj.dataset().queue.consume(limit=limit, wait=wait)
    data = result.as_dict()
    if as_json or not sys.stdout.isatty():
        _echo_document(data)
    else:
        click.echo(
            f"applied {result.applied}, recovered {result.recovered}, "
            f"failed {len(result.failed)}, pending {result.remaining} ({result.seconds:.1f} s)"
        )
    for failed in result.failed:
        click.echo(f"failed {failed['tenant']}/{failed['id']}: {failed['error']}", err=True)
    for invalid in result.invalid:
        click.echo(f"invalid {invalid['folder']}: {invalid['error']}", err=True)
    if result.stopped:
        raise click.ClickException(
            f"the queue stopped at {result.stopped}; the item stays pending: consume again later"
        )
