"""The same work in each of Spark's modes, as a user runs it: wall time and the
peak memory of every process involved.

    python -m benchmarks.spark_modes --statements 1000000
    python -m benchmarks.spark_modes --sizes 10000000 --modes cluster-connect --steps each

For each size (``kek``: the kek file as it is; a number: kek scaled to about
that many statements, ``benchmarks/data.py``) and each mode, a fresh lake in
a bucket of a loopback ``moto_server`` and a fresh PostgreSQL journal
database (what a cluster needs, and the same for every mode), the dataset
created (``lakehouse datasets create``) and the data written with
``lakehouse entities write``, then the timed step(s), each a
fresh ``lakehouse`` process as a user types it:

- ``inprocess``: no ``LAKEHOUSE_SPARK_*`` variable, Spark in the CLI's own JVM;
- ``connect``: ``lakehouse spark start`` (a local-mode Spark Connect server),
  the CLI with ``LAKEHOUSE_SPARK_REMOTE``;
- ``cluster``: docs/cluster.md's recipe verbatim: ``lakehouse spark cluster
  start --workers 2 --executor-python PY`` (PY: a Python with the project's
  dependencies and without the project), ``LAKEHOUSE_SPARK_MASTER=spark://…``,
  ``LAKEHOUSE_JOURNAL_URL=postgresql://…``, ``lakehouse --lake s3://… -d DS
  make``: the CLI is the driver, its tasks run on the cluster's executors;
- ``cluster-connect``: the same cluster with a Connect server whose driver
  uses it (docs/cluster.md, "Dagster on a cluster"), the CLI with only
  ``LAKEHOUSE_SPARK_REMOTE``: no JVM on the client.

``--steps make`` (default) times ``make`` (flush, every export, the version
and the graph index); ``--steps each`` times ``flush``, ``export all``,
``optimize`` and ``graph rebuild`` one by one (the version is published by
the export); ``--steps graph`` only ``flush`` and ``graph rebuild`` (the
rebuild runs in the client in every mode: pyarrow and DuckDB, no Spark).
For every step: wall time, the peak resident memory of the
client's process tree (the CLI, and its driver JVM where it has one) and of
everything (the client plus the Connect server's and the cluster's daemons,
executors and Python workers, summed at the same instants; sampled every
100 ms, ``benchmarks/dataplane.py``'s ``tree_rss``). Server and cluster
starts are timed too and not counted in the steps. Numbers only; a step that
fails stops the run with its log's tail.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from benchmarks.data import KEK
from benchmarks.data import write as write_data
from benchmarks.peer import (
    Run,
    clean_env,
    free_port,
    git_version,
    kill_session,
    lakehouse_cli,
    on_signal,
    run,
    say,
    session_members,
)
from benchmarks.s3 import moto_server, new_bucket
from lakehouse_assets.settings import Settings

POSTGRES = os.environ.get(
    "LAKEHOUSE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
DATA_DIR = Path(__file__).parent / ".data"
MODES = ("inprocess", "connect", "cluster", "cluster-connect")
STEPS = {
    "make": [["make"]],
    "each": [["flush"], ["export", "all"], ["optimize"], ["graph", "rebuild"]],
    "graph": [["flush"], ["graph", "rebuild"]],
}


@dataclass
class Figure:
    size: str
    mode: str
    step: str
    seconds: float
    client: int
    everything: int


def _postgres_database() -> str:
    """A fresh database on the PostgreSQL server: its URL."""
    import sqlalchemy as sa

    name = f"bench_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(
        POSTGRES.replace("postgresql://", "postgresql+psycopg2://"), isolation_level="AUTOCOMMIT"
    )
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return POSTGRES.rsplit("/", 1)[0] + f"/{name}"


def _drop_database(url: str) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(
        POSTGRES.replace("postgresql://", "postgresql+psycopg2://"), isolation_level="AUTOCOMMIT"
    )
    with engine.connect() as conn:
        conn.execute(sa.text(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)"))
    engine.dispose()


def _s3_env(settings: Settings) -> dict[str, str]:
    """The loopback S3 server's settings as a child's environment."""
    return {
        "LAKEHOUSE_S3_ENDPOINT_URL": str(settings.s3_endpoint_url),
        "LAKEHOUSE_S3_ACCESS_KEY_ID": str(settings.s3_access_key_id),
        "LAKEHOUSE_S3_SECRET_ACCESS_KEY": str(settings.s3_secret_access_key),
        "LAKEHOUSE_S3_REGION": str(settings.s3_region),
    }


def _deps_python(folder: Path) -> Path:
    """A Python with this environment's packages and without the project, as a
    cluster's executors have (the test suite's own recipe)."""
    from lakehouse_assets_tests.helpers.cluster import executor_python

    return executor_python(folder)


class Daemons:
    """The long-running processes of a mode (Connect servers, the cluster's
    master and workers): started with the CLI, stopped with it (and by PID)."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work = work
        self.env = env
        self.pids: list[int] = []
        self.stops: list[list[str]] = []

    def cli(self, *args: str, env: dict[str, str] | None = None, name: str) -> Run:
        done = run(
            [lakehouse_cli(), *args],
            env=env or self.env,
            cwd=self.work,
            logs=self.work / "logs",
            name=name,
            timeout=900,
        )
        if not done.ok:
            sys.exit(f"`lakehouse {' '.join(args)}` failed:\n{done.stderr_tail()}")
        return done

    def cluster(self, workers: int, python: Path) -> str:
        port = free_port()
        done = self.cli(
            "spark",
            "cluster",
            "start",
            "--workers",
            str(workers),
            "--executor-python",
            str(python),
            "--port",
            str(port),
            name="cluster-start",
        )
        say(f"cluster of {workers} workers up in {done.seconds:.1f} s")
        state = json.loads(
            (Path(self.env["LAKEHOUSE_CACHE_DIR"]) / "spark-cluster" / "cluster.json").read_text()
        )
        self.pids += [int(d["pid"]) for d in state["daemons"]]
        self.stops.append(["spark", "cluster", "stop"])
        return str(state["master_url"])

    def connect(self, env: dict[str, str]) -> str:
        port = free_port()
        done = self.cli("spark", "start", "--port", str(port), env=env, name=f"connect-{port}")
        say(f"Connect server up in {done.seconds:.1f} s")
        record = Path(env["LAKEHOUSE_CACHE_DIR"]) / "spark-connect" / str(port) / "server.json"
        self.pids.append(int(json.loads(record.read_text())["pid"]))
        self.stops.append(["spark", "stop", "--port", str(port)])
        return f"sc://127.0.0.1:{port}"

    def stop(self) -> None:
        for command in reversed(self.stops):
            with contextlib.suppress(SystemExit):
                self.cli(*command, name="stop")
        for pid in self.pids:
            if session_members(pid):
                say(f"process {pid} outlived its stop command: killing its session")
                kill_session(pid)


def measure(
    size: str, data: Path, mode: str, steps: str, args: argparse.Namespace, s3: Settings
) -> list[Figure]:
    work = Path(tempfile.mkdtemp(prefix=f"spark-modes-{mode}-", dir=args.workdir))
    base = {
        **clean_env(),
        **_s3_env(s3),
        "LAKEHOUSE_CACHE_DIR": str(work / "cache"),
        "LAKEHOUSE_SPARK_CLUSTER_WORKER_MEMORY": args.worker_memory,
        "LAKEHOUSE_SPARK_EXECUTOR_MEMORY": args.executor_memory,
    }
    journal = _postgres_database()
    daemons = Daemons(work, base)
    figures = []
    try:
        client = {**base, "LAKEHOUSE_JOURNAL_URL": journal}
        if mode == "connect":
            client["LAKEHOUSE_SPARK_REMOTE"] = daemons.connect(base)
        elif mode in ("cluster", "cluster-connect"):
            master = daemons.cluster(args.workers, args.executor_python)
            if mode == "cluster":
                client["LAKEHOUSE_SPARK_MASTER"] = master
            else:
                server = {
                    **base,
                    "LAKEHOUSE_SPARK_MASTER": master,
                    "LAKEHOUSE_SPARK_EXECUTOR_PYTHON": str(args.executor_python),
                }
                client["LAKEHOUSE_SPARK_REMOTE"] = daemons.connect(server)
        uri = f"s3://{new_bucket(s3)}/lake"
        daemons.cli("--lake", uri, "datasets", "create", "bench", env=client, name="create")
        lake = ["--lake", uri, "-d", "bench"]
        written = daemons.cli(
            *lake,
            "entities",
            "write",
            "-i",
            str(data),
            "--origin",
            "bench",
            env=client,
            name="write",
        )
        say(f"{size} {mode}: journal written in {written.seconds:.1f} s")
        for step in STEPS[steps]:
            done = run(
                [lakehouse_cli(), *lake, *step],
                env=client,
                cwd=work,
                logs=work / "logs",
                name="-".join(step),
                watch=daemons.pids,
                timeout=args.step_timeout,
            )
            if not done.ok:
                sys.exit(f"{size} {mode}: `{' '.join(step)}` failed:\n{done.stderr_tail()}")
            figures.append(
                Figure(
                    size,
                    mode,
                    " ".join(step),
                    done.seconds,
                    done.peak_rss,
                    done.peak_rss_with_others,
                )
            )
            say(
                f"{size} {mode}: {' '.join(step)} {done.seconds:.1f} s, client "
                f"{done.peak_rss / 2**20:,.0f} MiB, everything "
                f"{done.peak_rss_with_others / 2**20:,.0f} MiB"
            )
    finally:
        daemons.stop()
        with contextlib.suppress(Exception):
            _drop_database(journal)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="kek,1000000", help="kek and/or statement counts")
    parser.add_argument("--statements", type=int, help="shorthand for --sizes kek,N")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", choices=sorted(STEPS), default="make")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--executor-python", type=Path, help="default: built here")
    parser.add_argument("--worker-memory", default="1g", help="each cluster worker's")
    parser.add_argument("--executor-memory", default="512m", help="each executor's (cluster)")
    parser.add_argument("--kek", type=Path, default=KEK)
    parser.add_argument("--step-timeout", type=float, default=3600)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep each mode's folder")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, on_signal)
    sizes = ["kek", str(args.statements)] if args.statements else args.sizes.split(",")
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes {sorted(unknown)}: choose from {', '.join(MODES)}")
    if not args.kek.exists():
        sys.exit(f"needs {args.kek} (the shared/ folder beside the checkout)")
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    if args.executor_python is None and any(m.startswith("cluster") for m in modes):
        args.executor_python = _deps_python(
            Path(tempfile.mkdtemp(prefix="executor-python-", dir=args.workdir))
        )
    started, load = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg()
    figures: list[Figure] = []
    with moto_server() as s3:
        for size in sizes:
            data = args.kek if size == "kek" else DATA_DIR / f"kek-{int(size)}.ftm.json"
            if size != "kek":
                write_data(data, int(size))
            for mode in modes:
                figures += measure(size, data, mode, args.steps, args, s3)
    print(
        f"\n{started}, load {load[0]:.1f} → {os.getloadavg()[0]:.1f}, commit {git_version()}, "
        f"{args.workers} workers of {args.worker_memory}, executors of {args.executor_memory}\n"
    )
    print("| size | mode | step | wall | client peak | everything peak |")
    print("|---|---|---|---|---|---|")
    for f in figures:
        print(
            f"| {f.size} | {f.mode} | {f.step} | {f.seconds:.1f} s | "
            f"{f.client / 2**20:,.0f} MiB | {f.everything / 2**20:,.0f} MiB |"
        )


if __name__ == "__main__":
    main()
