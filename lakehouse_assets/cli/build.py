"""Building the tables and exports: ``lakehouse flush``, ``compact``, ``optimize``,
``export`` and ``make``.
"""

from __future__ import annotations

from typing import IO, Any

import click

from lakehouse_assets.cli.context import AS_OF_HELP, JSON_OPTION, Context, pass_ctx
from lakehouse_assets.cli.output import _report, _wall_time, process_seconds
from lakehouse_assets.cli.root import cli
from lakehouse_assets.settings import MAX_RETENTION_HOURS


@cli.command("flush")
@click.option(
    "--batch-rows",
    type=click.IntRange(min=1000),
    default=None,
    help="Journal rows per batch (at least 1000; default LAKEHOUSE_FLUSH_BATCH_ROWS).",
)
@JSON_OPTION
@pass_ctx
def flush_cmd(obj: Context, batch_rows: int | None, as_json: bool) -> None:
    """Move the journal into the Delta tables; prints what was done (JSON for scripts).

    \b
    Example:
      lakehouse -d my_dataset flush
    """
    if obj.remote:
        from lakehouse_assets.cli import remote

        remote.operation(obj.remote_dataset(), "flush", as_json)
        return
    _report(obj.dataset().flush(batch_rows=batch_rows), as_json)


@cli.command("compact")
@JSON_OPTION
@pass_ctx
def compact_cmd(obj: Context, as_json: bool) -> None:
    """Apply the translog to the main table (drop deleted rows).

    \b
    Example:
      lakehouse -d my_dataset compact
    """
    if obj.remote:
        from lakehouse_assets.cli import remote

        remote.operation(obj.remote_dataset(), "compact", as_json)
        return
    _report(obj.dataset().compact(), as_json)


@cli.command("optimize")
@click.option("--vacuum", is_flag=True, help="Also delete files no version needs any more.")
@click.option(
    "--retention-hours",
    type=click.IntRange(min=0, max=MAX_RETENTION_HOURS),
    default=None,
    help="vacuum retention (default LAKEHOUSE_VACUUM_RETENTION_HOURS, 168).",
)
@JSON_OPTION
@pass_ctx
def optimize_cmd(obj: Context, vacuum: bool, retention_hours: int | None, as_json: bool) -> None:
    """Merge small Parquet files (and optionally vacuum).

    \b
    Example:
      lakehouse -d my_dataset optimize --vacuum --retention-hours 168
    """
    if obj.remote:
        from lakehouse_assets.cli import remote

        remote.operation(obj.remote_dataset(), "optimize", as_json, vacuum=vacuum)
        return
    _report(obj.dataset().optimize(vacuum=vacuum, retention_hours=retention_hours), as_json)


EXPORT_KINDS = ("statements", "entities", "statistics", "index")


@cli.command("export")
@click.argument("kinds", nargs=-1, type=click.Choice([*EXPORT_KINDS, "all"]))
@click.option("--force", is_flag=True, help="Export even when the export is fresh.")
@click.option("--as-of", "as_of", default=None, help=AS_OF_HELP + " Writes one export to -o.")
@click.option(
    "--output",
    "-o",
    type=click.File("wb"),
    default="-",
    help="With --as-of: where to write the export (default: stdout).",
)
@JSON_OPTION
@pass_ctx
def export_cmd(
    obj: Context,
    kinds: tuple[str, ...],
    force: bool,
    as_of: str | None,
    output: IO[bytes],
    as_json: bool,
) -> None:
    """Write exports (default: all) unless they are fresh.

    With --as-of, re-make one export (statements, entities or statistics) of an
    earlier published version from the tables as they were then.

    \b
    Examples:
      lakehouse -d my_dataset export statements entities
      lakehouse -d my_dataset export statements --as-of 3 -o statements-v3.csv
    """
    if as_of is not None:
        if len(kinds) != 1 or kinds[0] not in ("statements", "entities", "statistics"):
            raise click.UsageError("--as-of writes one export: statements, entities or statistics")
        if obj.remote:
            names = {"statements": "statements.csv", "entities": "entities.ftm.json"}
            for chunk in obj.remote_dataset().export_file(
                names.get(kinds[0], "statistics.json"), as_of
            ):
                output.write(chunk)
            return
        obj.dataset().export_as_of(as_of, kinds[0], output)
        return
    chosen = list(EXPORT_KINDS) if not kinds or "all" in kinds else list(kinds)
    if obj.remote:
        from lakehouse_assets.cli import remote

        remote.operation(obj.remote_dataset(), "export", as_json, kinds=chosen, force=force)
        return
    _report(obj.dataset().export(chosen, force=force), as_json)


@cli.command("make")
@click.option("--force", is_flag=True, help="Re-export even fresh exports.")
@JSON_OPTION
@pass_ctx
def make_cmd(obj: Context, force: bool, as_json: bool) -> None:
    """Flush if needed, then every export that is not fresh.

    Ends with the command's wall time and its parts (startup, Spark start,
    flush, graph, exports, index, other).

    \b
    Example:
      lakehouse -d my_dataset make
    """
    if obj.remote:
        from lakehouse_assets.cli import remote

        remote.operation(obj.remote_dataset(), "make", as_json, force=force)
        return
    started = process_seconds()
    before = _spark_sessions()
    result = obj.dataset().make(force=force)
    if not before:  # a Spark this command started (not one its caller holds)
        _stop_spark(result)
    _wall_time(result, started)
    _report(result, as_json)


def _spark_session_module() -> Any:
    """``lakehouse_assets.spark.session`` if this process imported it (else None:
    Spark was never started here, and importing it now would cost seconds)."""
    import sys

    return sys.modules.get("lakehouse_assets.spark.session")


def _spark_sessions() -> int:
    """How many Spark sessions this process holds (0 when Spark was never imported):
    ``make`` run inside another program (a test, a notebook) leaves theirs open."""
    session = _spark_session_module()
    return 0 if session is None else session.open_sessions()


def _stop_spark(result: Any) -> None:
    """Stop an in-process Spark now, as a part of its own, rather than in the exit
    handlers after the summary (whose total would then leave it out). A Connect
    server keeps running; no Spark started, nothing imported."""
    session = _spark_session_module()
    if session is None:
        return
    from lakehouse_assets import progress

    with progress.collect() as stopping, progress.part("spark stop"):
        session.stop_in_process_spark()
    if stopping.seconds.get("spark stop", 0.0) >= 0.05:
        result.parts.update(stopping.rounded())
