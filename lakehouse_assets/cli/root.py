"""The root ``lakehouse`` group (its global options build the :class:`Context`)
and ``main``, which ends the process without the interpreter's teardown.

The command groups register on :data:`cli` from their own modules, which the
package imports.
"""

from __future__ import annotations

import sys

import click

from lakehouse_assets.cli.context import Context
from lakehouse_assets.cli.errors import LakehouseGroup
from lakehouse_assets.settings import Settings


@click.group(cls=LakehouseGroup)
@click.option(
    "--lake",
    "lake_uri",
    envvar="LAKEHOUSE_LAKE_URI",
    help="Lake URI: folder or s3://bucket/prefix.",
)
@click.option("--journal-url", envvar="LAKEHOUSE_JOURNAL_URL", help="Journal SQLAlchemy URL.")
@click.option(
    "--tenant", envvar="LAKEHOUSE_TENANT", help="Tenant name (namespaces tags and locks)."
)
@click.option("--dataset", "-d", "dataset", help="Dataset name.")
@click.option("--debug", is_flag=True, help="Show the full traceback of an error.")
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="-v: the lakehouse's own log (step timings) and Spark's JVM output on stderr; "
    "-vv: debug logs. Progress lines are shown either way.",
)
@click.version_option(package_name="lakehouse_assets", prog_name="lakehouse")
@click.pass_context
def cli(
    ctx: click.Context,
    lake_uri: str | None,
    journal_url: str | None,
    tenant: str | None,
    dataset: str | None,
    debug: bool,
    verbose: int,
) -> None:
    """An FtM data lakehouse: archive, journal, Delta statements, exports."""
    if lake_uri is not None and not lake_uri.strip():
        raise click.BadParameter(
            "an empty lake URI: give a folder or s3://bucket/prefix", param_hint="--lake"
        )
    from lakehouse_assets import progress

    progress.configure(verbose)
    settings = Settings()
    if verbose:
        settings = settings.model_copy(update={"spark_console": True})
    if lake_uri is not None:
        settings = settings.model_copy(update={"lake_uri": lake_uri})
        settings.model_fields_set.add("lake_uri")
    ctx.obj = Context(settings, dataset, journal_url=journal_url, tenant=tenant)


def main() -> None:
    try:
        cli(prog_name="lakehouse")
    except SystemExit as done:
        exit_without_teardown(done.code)
        raise


def exit_without_teardown(code: object) -> None:
    """End the process as ``sys.exit(code)`` would, but skip the interpreter's teardown.

    After a command CPython clears every module and collects what they held:
    about 0.45 s of a warm kek export's 3 s, CPU time after the last exit
    handler (followthemoney's model, pandas, pyarrow, gRPC; seen with strace).
    The exit handlers still run (logging's flush, temporary folders, the
    in-process Spark's stop, multiprocessing's), and the standard streams are
    flushed; only the teardown is skipped. While another non-daemon thread
    runs this returns, and the caller exits the usual way, which waits for it.
    """
    import atexit
    import os
    import threading

    first = threading.main_thread()
    if any(t is not first and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:  # sys.exit("message"): printed, exit 1
        print(code, file=sys.stderr)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: 120, as CPython's own exit
            if stream is sys.stdout and status == 0:
                status = 120
    os._exit(status)
