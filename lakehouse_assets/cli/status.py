"""A dataset's state and its locks: ``lakehouse status`` and ``jobs`` (they only read:
no flush, no Spark) and ``unlock`` (clears a lock whose holder is gone).
"""

from __future__ import annotations

import json
from typing import Any

import click

from lakehouse_assets import conventions as cv
from lakehouse_assets.cli.context import Context, pass_ctx
from lakehouse_assets.cli.errors import one_line
from lakehouse_assets.cli.output import _echo_document, _echo_json
from lakehouse_assets.cli.root import cli
from lakehouse_assets.errors import LakehouseError


@cli.command("unlock")
@click.option(
    "--operation",
    default=None,
    help="Clear the tenant's operation lock locks/{tenant}/OPERATION instead of the "
    "dataset's .LOCK (the lock of every table writer).",
)
@pass_ctx
def unlock_cmd(obj: Context, operation: str | None) -> None:
    """Clear a lock whose holder is gone.

    Refuses while the holder is alive on this host. The lock's generation
    moves on, so a holder still running elsewhere can no longer commit.

    \b
    Example:
      lakehouse -d my_dataset unlock                  (the dataset's .LOCK)
      lakehouse -d my_dataset unlock --operation export
    """
    ds = obj.dataset()
    # `--operation ''` is an (invalid) operation name, not "no operation": it must
    # never fall through to the dataset's .LOCK
    lock = ds.operation_lock(operation) if operation is not None else ds.lock()
    click.echo(lock.force_release())


@cli.command("jobs")
@click.argument("job_type", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON lines (the whole records).")
@pass_ctx
def jobs_ls(obj: Context, job_type: str | None, as_json: bool) -> None:
    """Without JOB_TYPE: the job types with recorded runs and their counts.
    With it: its recorded runs, oldest first: state, start, duration, counts.

    \b
    Example:
      lakehouse -d my_dataset jobs          # flush  12 runs, last 2026-11-24T01:02:03Z ...
      lakehouse -d my_dataset jobs flush
      lakehouse -d my_dataset jobs optimize --json | jq .stats
    """
    from lakehouse_assets.jobs import list_runs

    ds = obj.dataset()
    if job_type is None:
        base = cv.dataset_path(ds.name, "jobs", "runs")
        types = obj.lake.store.list_dirs(base)
        if not types:
            click.echo(f"no job runs recorded in dataset {ds.name!r} yet", err=True)
        for name in sorted(types):
            runs = list_runs(obj.lake.store, ds.name, name)
            last = max((r.started_at.isoformat(timespec="seconds") for r in runs), default="-")
            if as_json:
                _echo_json({"job_type": name, "runs": len(runs), "last_started": last})
            else:
                click.echo(f"{name:<12} {len(runs):>5} runs  last {last}")
        return
    runs = list_runs(obj.lake.store, ds.name, job_type)
    if not runs:
        click.echo(f"no {job_type!r} runs recorded in dataset {ds.name!r}", err=True)
    elif not as_json:
        click.echo(f"{'state':<10} {'started (UTC)':<20} {'seconds':>8}  {'tenant':<12} counts")
    for run in runs:
        if as_json:
            click.echo(json.dumps(run.model_dump(mode="json")))
            continue
        seconds = (
            f"{(run.finished_at - run.started_at).total_seconds():.1f}"
            if run.finished_at is not None
            else "-"
        )
        counts = ", ".join(
            f"{k} {v}"
            for k, v in run.stats.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and v and k != "seconds"
        )
        state = run.status if run.error is None else f"{run.status}: {one_line(run.error)[:60]}"
        click.echo(
            f"{run.status:<10} {run.started_at.strftime('%Y-%m-%d %H:%M:%S'):<20} "
            f"{seconds:>8}  {run.tenant:<12} {counts or '-'}"
            + (f"  ({state})" if run.error else "")
        )


@cli.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of text.")
@pass_ctx
def status_cmd(obj: Context, as_json: bool) -> None:
    """What a dataset holds and what is stale: journal rows waiting, table
    versions, each export's freshness (and why), the last job runs, the lock.
    Without -d: every dataset of the lake, one line each.

    Reads only (no flush, no Spark).

    \b
    Example:
      lakehouse -d my_dataset status
      lakehouse status --json | jq '.datasets[] | select(.stale != [])'
    """
    if obj.remote:
        from lakehouse_assets.cli import remote

        remote.status(obj.remote_dataset())
        return
    from lakehouse_assets.freshness import freshness
    from lakehouse_assets.jobs import list_runs

    if not obj.dataset_name:
        from lakehouse_assets.cli.datasets import _dataset_lines, _print_lines

        lines = _dataset_lines(obj)
        if as_json:
            _echo_document(
                {"lake": obj.lake.store.uri, "datasets": [line.as_dict() for line in lines]}
            )
        else:
            _print_lines(lines, obj.lake.store.uri)
        return
    ds = obj.dataset()
    pending = ds.journal.count(ds.name)
    snapshot = ds.snapshot()
    main = ds.statements_table.table()
    exports = {kind: state.as_dict() for kind, state in freshness(ds, pending).items()}
    jobs: dict[str, dict[str, Any]] = {}
    for name in sorted(ds.store.list_dirs(cv.dataset_path(ds.name, "jobs", "runs"))):
        runs = list_runs(ds.store, ds.name, name)
        if runs:
            last = max(runs, key=lambda r: r.started_at)
            jobs[name] = {
                "runs": len(runs),
                "last": last.started_at.isoformat(timespec="seconds"),
                "status": last.status,
            }
    state = ds.lock().state()
    lock = f"held: {state.describe()}" if state.held else state.problem or "free"
    # the tenants' operation locks (locks/{tenant}/{operation}): those held now
    operations = {}
    for path in ds.store.list(cv.dataset_path(ds.name, cv.LOCKS) + "/"):
        tenant, operation = path.split("/")[-2:]
        try:
            held = ds.operation_lock(operation, tenant=tenant).state()
        except LakehouseError:  # not a lock file (a name no lock would have)
            continue
        if held.held:
            operations[f"{tenant}/{operation}"] = held.describe()
    head = ds.version()
    latest = main.version() if main is not None else None
    queue_invalid = ds.queue.invalid()
    report = {
        "dataset": ds.name,
        "journal_pending": pending,
        "queue_pending": ds.queue.pending_count(),
        "queue_invalid": queue_invalid,
        "statements_version": {"published": snapshot.statements.version, "latest": latest},
        "translog_version": snapshot.translog.version,
        "version": None if head is None else {"sequence": head.sequence, "hash": head.hash},
        "exports": exports,
        "jobs": jobs,
        "lock": lock,
        "operation_locks": operations,
    }
    if as_json:
        _echo_document(report)
        return
    click.echo(f"dataset {ds.name}")
    click.echo(f"  journal: {pending} rows waiting for a flush")
    click.echo(f"  queue: {report['queue_pending']} actions waiting")
    for invalid in queue_invalid:
        click.echo(f"  queue: never consumed: {invalid['folder']} ({invalid['error']})")
    click.echo(f"  {_tables_line(snapshot.statements.version, latest, snapshot.translog.version)}")
    if head is not None:
        click.echo(f"  published: version {head.sequence} ({head.hash[:21]}…)")
    for kind, info in exports.items():
        mark = "fresh" if info["fresh"] else "stale" if info["built"] else "not built"
        click.echo(f"  {kind:<11} {mark:<6} {info['why']}")
    for name, info in jobs.items():
        click.echo(
            f"  job {name:<10} {info['runs']:>4} runs, last {info['last']} ({info['status']})"
        )
    click.echo(f"  lock: {lock}")
    for name, holder in operations.items():
        click.echo(f"  lock {name}: held: {holder}")


def _tables_line(published: int | None, latest: int | None, translog: int | None) -> str:
    """The tables' versions, or that there are none yet (no flush has made them)."""
    if published is None and latest is None:
        return "statements table: none yet (no flush has run)"
    shown = "none" if published is None else f"v{published}"
    ahead = "" if latest == published else f" (latest v{latest}, not published yet)"
    return f"statements table: {shown} published{ahead}; translog v{translog}"
