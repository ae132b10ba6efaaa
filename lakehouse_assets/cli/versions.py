"""Published versions: ``lakehouse versions``, ``diff``, ``trace`` and ``verify``."""

from __future__ import annotations

import sys

import click

from lakehouse_assets.cli.context import Context, pass_ctx
from lakehouse_assets.cli.output import _echo_document, _echo_json, print_versions
from lakehouse_assets.cli.root import cli


@cli.command("versions")
@click.option("--json", "as_json", is_flag=True, help="JSON lines instead of a table.")
@pass_ctx
def versions_cmd(obj: Context, as_json: bool) -> None:
    """The published versions of a dataset, oldest first: time, counts, logical
    hash, what changed (entities added / modified / deleted).

    \b
    Example:
      lakehouse -d my_dataset versions
    """
    if obj.remote:
        ds_remote = obj.remote_dataset()
        print_versions(ds_remote.name, ds_remote.versions(), as_json)
        return
    ds = obj.dataset()
    print_versions(ds.name, [version.summary() for version in ds.versions()], as_json)


@cli.command("diff")
@click.argument("args", nargs=-1, required=True, metavar="[DATASET] V1 V2")
@pass_ctx
def diff_cmd(obj: Context, args: tuple[str, ...]) -> None:
    """The entities that changed from version V1 to V2: one JSON line each,
    ``{"op": "ADD"|"MOD"|"DEL", "entity": {...}}`` (yente's delta format).

    V1 and V2 are sequence numbers, snapshot ids, version ids (index.json's
    ``version``) or times; V2 must be the newer. The dataset is -d or the
    first argument. Built from the diffs the versions published (checked
    against their manifests), so it reads no table unless one is missing.

    \b
    Examples:
      lakehouse diff my_dataset 3 5
      lakehouse -d my_dataset diff 1 20261122101112-123456
    """
    from lakehouse_assets.versions import changes_between, resolve

    if len(args) == 3:
        obj.dataset_name = args[0]
    elif len(args) != 2:
        raise click.UsageError("diff takes [DATASET] V1 V2")
    ds = obj.dataset()
    old, new = (resolve(ds, v) for v in args[-2:])  # an unknown one: an error naming it
    for change in changes_between(ds, old, new):
        _echo_json(change)


@cli.command("trace")
@click.argument("key")
@pass_ctx
def trace_cmd(obj: Context, key: str) -> None:
    """Where statements came from: an entity id (all its statements) or a statement id
    (exit 1 if there is none).

    One JSON line per statement: its values, origin and what the origin names
    (the archived file, the mapping, the crawl runs), first_seen / last_seen /
    deleted_at, the tenant and journal write that first wrote it and that last
    wrote or deleted it, and the versions that published and removed it.

    \b
    Example:
      lakehouse -d my_dataset trace 5f1c…   (an entity or statement id)
    """
    ds = obj.dataset()
    found = ds.trace(key)
    if not found:  # a typo must not look like success to a script: exit 1
        raise click.ClickException(f"no statements for id {key!r} in dataset {ds.name!r}")
    for item in found:
        _echo_json(item)


@cli.command("verify")
@click.option(
    "--deep", is_flag=True, help="Also recompute the head's logical hash from the tables."
)
@click.option(
    "--head",
    "trusted_head",
    default=None,
    help="A head hash you trust (say, one published elsewhere): the chain must end in it.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
@pass_ctx
def verify_cmd(obj: Context, deep: bool, trusted_head: str | None, as_json: bool) -> None:
    """Check the version chain and re-hash what it references; exit 1 on any problem.

    Replays the chain (sequence, parent hashes, times, latest.json), checks
    the Delta commits that carry each version's hash (the newest must be the
    head: a rolled-back version is caught) and the log entries it hashed,
    re-hashes data files, the published index.json and diffs of every version,
    the head's exports, the graph index and the catalog entry. Every file the
    tables read now must be covered by the head or added by a lakehouse commit
    after it (a note until make); a commit no lakehouse operation made is a
    problem. --deep recomputes the logical hash from the tables.

    \b
    Examples:
      lakehouse -d my_dataset verify
      lakehouse -d my_dataset verify --deep --head f1220…
    """
    report = obj.dataset().verify(deep=deep, trusted_head=trusted_head)
    if as_json:
        _echo_document(report.as_dict())
    else:
        for note in report.notes:
            click.echo(f"note: {note}", err=True)
        for problem in report.problems:
            click.echo(f"FAILED {report.dataset}: {problem}", err=True)
        if report.ok:
            mb = report.bytes_hashed / 1e6
            click.echo(
                f"ok: {report.dataset}: {_count(report.versions, 'version')}, head "
                f"{report.head}, {_count(report.files_hashed, 'file')} ({mb:.1f} MB) hashed"
                + (", logical hash recomputed" if deep else "")
            )
    if not report.ok:
        sys.exit(1)


def _count(n: int, noun: str) -> str:
    """``1 version``, ``2 versions``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
