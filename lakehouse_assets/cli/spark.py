"""``lakehouse spark``: the local Spark Connect server and the JVM's class archive."""

from __future__ import annotations

import sys
from typing import Any

import click

from lakehouse_assets.cli.context import Context, pass_ctx
from lakehouse_assets.cli.root import cli


@cli.group("spark")
def spark_group() -> None:
    """The local Spark Connect server: one warm Spark for every command.

    \b
    Example:
      lakehouse spark start
      export LAKEHOUSE_SPARK_REMOTE=sc://127.0.0.1:15002
      lakehouse -d my_dataset make      # no JVM start: runs on the server
      lakehouse spark stop
    """


PORT_OPTION = click.option(
    "--port",
    type=click.IntRange(1024, 65535),
    default=None,
    help="Port on 127.0.0.1 (default LAKEHOUSE_SPARK_CONNECT_PORT, 15002).",
)


def _server_line(info: Any) -> str:
    if not info.running:
        return f"Spark Connect server on port {info.port}: not running" + (
            f" ({info.note})" if info.note else ""
        )
    if info.stale_code:
        return f"Spark Connect server running at {info.url} (pid {info.pid}), {info.note}"
    return (
        f"Spark Connect server running at {info.url} (pid {info.pid}, log {info.log}); "
        f"use it: export LAKEHOUSE_SPARK_REMOTE={info.url}"
    )


@spark_group.command("start")
@PORT_OPTION
@pass_ctx
def spark_start(obj: Context, port: int | None) -> None:
    """Start the local server (bound to 127.0.0.1) and wait until it answers.

    Does nothing if it is already running. Its PID file, log and token live
    under LAKEHOUSE_CACHE_DIR/spark-connect/PORT/: the server admits only
    clients with its token (a file only its user can read); the lakehouse's
    clients of the same user and LAKEHOUSE_CACHE_DIR find it themselves.

    \b
    Example:
      lakehouse spark start --port 15002
    """
    from lakehouse_assets.lake import warm_up
    from lakehouse_assets.spark import connect

    click.echo(_server_line(connect.start(obj.settings, port, warm_up=warm_up)))


@spark_group.command("prepare")
@click.option("--force", is_flag=True, help="Build it again even if it exists.")
@pass_ctx
def spark_prepare(obj: Context, force: bool) -> None:
    """Build the JVM's class archive of Spark, once per install: every Spark
    start after it (in-process, or the local server) loads its classes from
    the archive, about 3 s faster. The Makefile's java step (make demo, test,
    ui) runs it; it takes one to four minutes (printing its stages as it
    goes) and about 190 MB under LAKEHOUSE_CACHE_DIR/jvm/.

    \b
    Example:
      lakehouse spark prepare
    """
    from lakehouse_assets.spark import cds

    done = cds.prepare(obj.settings, force=force)
    verb = "built and checked" if done.built else "already there"
    click.echo(
        f"class archive {verb}: {done.path} ({done.size / 1e6:.0f} MB, {done.seconds:.1f} s)"
    )


@spark_group.command("stop")
@PORT_OPTION
@pass_ctx
def spark_stop(obj: Context, port: int | None) -> None:
    """Stop the local server by its PID (SIGTERM, then SIGKILL after 30 s).

    \b
    Example:
      lakehouse spark stop
    """
    from lakehouse_assets.spark import connect

    info = connect.stop(obj.settings, port)
    click.echo(f"Spark Connect server on port {info.port}: {info.note}")


@spark_group.command("status")
@PORT_OPTION
@pass_ctx
def spark_status(obj: Context, port: int | None) -> None:
    """Say whether the local server runs (exit 1 if not); a stale PID file is removed.

    \b
    Example:
      lakehouse spark status
    """
    from lakehouse_assets.spark import connect

    info = connect.status(obj.settings, port)
    click.echo(_server_line(info))
    if not info.running:
        sys.exit(1)


@spark_group.group("cluster")
def cluster_group() -> None:
    """A local Spark standalone cluster (a master and workers on 127.0.0.1).

    The same shape as a real cluster: executors in their own working folders
    with their own Python (LAKEHOUSE_SPARK_EXECUTOR_PYTHON), the lakehouse's
    code shipped to them by each session. See docs/cluster.md.

    \b
    Example:
      lakehouse spark cluster start --workers 2
      export LAKEHOUSE_SPARK_MASTER=spark://127.0.0.1:7077
      lakehouse -d my_dataset make
      lakehouse spark cluster stop
    """


def _cluster_lines(info: Any) -> list[str]:
    head = (
        f"Spark cluster at {info.master_url}: "
        + ("running" if info.running else "not running")
        + (f" ({info.note})" if info.note else "")
    )
    lines = [head]
    for daemon in info.daemons:
        state = "running" if daemon.alive else "gone"
        where = f", work {daemon.work_dir}" if daemon.work_dir else ""
        lines.append(
            f"  {daemon.role}: pid {daemon.pid} {state}, port {daemon.port}, "
            f"web http://127.0.0.1:{daemon.web_port}, log {daemon.log}{where}"
        )
    if info.running:
        lines.append(
            f"  executors' Python: {info.executor_python}; "
            f"use it: export LAKEHOUSE_SPARK_MASTER={info.master_url}"
        )
    return lines


CLUSTER_PORT = click.option(
    "--port",
    type=click.IntRange(1024, 65535),
    default=None,
    help="The master's port on 127.0.0.1 (default LAKEHOUSE_SPARK_CLUSTER_PORT, 7077).",
)


@cluster_group.command("start")
@CLUSTER_PORT
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=None,
    help="How many workers (default LAKEHOUSE_SPARK_CLUSTER_WORKERS, 2).",
)
@click.option(
    "--executor-python",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="The executors' Python (default LAKEHOUSE_SPARK_EXECUTOR_PYTHON, else this one).",
)
@pass_ctx
def cluster_start(
    obj: Context, port: int | None, workers: int | None, executor_python: str | None
) -> None:
    """Start the master and its workers (bound to 127.0.0.1) and wait until every
    worker registered; nothing if it runs already. State, logs and work folders:
    LAKEHOUSE_CACHE_DIR/spark-cluster/.

    \b
    Example:
      lakehouse spark cluster start --workers 2
    """
    from lakehouse_assets.spark import cluster

    updates: dict[str, object] = {}
    if port is not None:
        updates["spark_cluster_port"] = port
    if workers is not None:
        updates["spark_cluster_workers"] = workers
    if executor_python is not None:
        updates["spark_executor_python"] = executor_python
    click.echo("\n".join(_cluster_lines(cluster.start(obj.settings.model_copy(update=updates)))))


@cluster_group.command("stop")
@pass_ctx
def cluster_stop(obj: Context) -> None:
    """Stop every process the cluster started (workers with their executors, then
    the master); nothing if none runs.

    \b
    Example:
      lakehouse spark cluster stop
    """
    from lakehouse_assets.spark import cluster

    click.echo(_cluster_lines(cluster.stop(obj.settings))[0])


@cluster_group.command("status")
@pass_ctx
def cluster_status(obj: Context) -> None:
    """Say what runs of the cluster (exit 1 if it does not run); the state of a
    cluster whose processes are gone is removed.

    \b
    Example:
      lakehouse spark cluster status
    """
    from lakehouse_assets.spark import cluster

    info = cluster.status(obj.settings)
    click.echo("\n".join(_cluster_lines(info)))
    if not info.running:
        sys.exit(1)
