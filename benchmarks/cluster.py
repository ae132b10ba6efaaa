"""Flush and exports of N statements on a local standalone cluster: wall time and
the client's peak memory.

    python -m benchmarks.cluster --statements 1000000

Starts a cluster (``lakehouse spark cluster``: a master and ``--workers``
workers on 127.0.0.1, in a temporary cache folder), writes scaled kek data
into a fresh PostgreSQL journal database (what a cluster needs), then runs
``lakehouse flush`` and ``lakehouse export`` as child processes with
``LAKEHOUSE_SPARK_MASTER`` on the cluster, as a user would. For each it prints
the wall time, the peak resident memory of the client's process tree (the
CLI and its in-process Spark driver JVM) and that of the cluster's processes
(master, workers, executors and their Python workers), sampled every 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from benchmarks.data import KEK, scaled_entities
from benchmarks.dataplane import tree_rss

POSTGRES = os.environ.get(
    "LAKEHOUSE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)


class Peaks(threading.Thread):
    """The peak resident memory of the trees of ``roots()`` (summed), sampled."""

    def __init__(self, roots: list[int]) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.peak = 0
        self.running = True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, sum(tree_rss(r) for r in self.roots))
            time.sleep(0.1)


def _database() -> str:
    import sqlalchemy as sa

    name = f"bench_{uuid.uuid4().hex[:10]}"
    engine = sa.create_engine(
        POSTGRES.replace("postgresql://", "postgresql+psycopg2://"), isolation_level="AUTOCOMMIT"
    )
    with engine.connect() as conn:
        conn.execute(sa.text(f"CREATE DATABASE {name}"))
    engine.dispose()
    return POSTGRES.rsplit("/", 1)[0] + f"/{name}"


def _timed(
    command: list[str], env: dict[str, str], cluster_pids: list[int]
) -> tuple[float, int, int]:
    """Run ``command``: seconds, client tree peak bytes, cluster peak bytes."""
    clock = time.monotonic()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL)
    client, cluster = Peaks([proc.pid]), Peaks(cluster_pids)
    client.start()
    cluster.start()
    code = proc.wait()
    seconds = time.monotonic() - clock
    client.running = cluster.running = False
    client.join()
    cluster.join()
    if code != 0:
        sys.exit(f"{' '.join(command[3:])} failed with exit code {code}")
    return seconds, client.peak, cluster.peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--statements", type=int, default=200_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--executor-python", default=None)
    parser.add_argument("--kek", type=Path, default=KEK, help="the kek FtM file to scale")
    args = parser.parse_args()

    from lakehouse_assets.lake import Lakehouse
    from lakehouse_assets.settings import Settings
    from lakehouse_assets.spark import cluster

    data_dir = Path(__file__).parent / ".data"
    data_dir.mkdir(exist_ok=True)
    data = data_dir / f"kek-{args.statements}.ftm.json"
    if not data.exists():
        with data.open("wb") as fh:
            fh.writelines(scaled_entities(args.statements, args.kek))
    work = Path(tempfile.mkdtemp(prefix="lakehouse-cluster-bench-"))
    settings = Settings(
        cache_dir=str(work / "cache"),
        spark_cluster_port=int(os.environ.get("LAKEHOUSE_SPARK_CLUSTER_PORT", "17077")),
        spark_cluster_workers=args.workers,
        **({"spark_executor_python": args.executor_python} if args.executor_python else {}),
    )
    clock = time.monotonic()
    info = cluster.start(settings)
    print(
        f"cluster start ({args.workers} workers)    {time.monotonic() - clock:9.1f} s", flush=True
    )
    try:
        journal = _database()
        lake = Lakehouse(work / "lake", journal_url=journal)
        ds = lake.create_dataset("bench")
        clock = time.monotonic()
        with data.open("rb") as fh:
            n = ds.write_entities(fh, origin="bench").count
        print(
            f"journal write (PostgreSQL)      {time.monotonic() - clock:9.1f} s  {n:,} statements"
        )
        env = {
            **os.environ,
            "LAKEHOUSE_SPARK_MASTER": info.master_url,
            "LAKEHOUSE_CACHE_DIR": settings.cache_dir,
            "LAKEHOUSE_SPARK_CONFIG": json.dumps(cluster.client_conf(settings)),
        }
        env.pop("LAKEHOUSE_SPARK_REMOTE", None)
        base = [
            sys.executable,
            "-m",
            "lakehouse_assets.cli",
            "--lake",
            str(work / "lake"),
            "--journal-url",
            journal,
            "-d",
            "bench",
        ]
        pids = [d.pid for d in info.daemons]
        for step, extra in (("flush", ["flush"]), ("export all", ["export", "all", "--force"])):
            seconds, client, nodes = _timed([*base, *extra], env, pids)
            print(
                f"{step:<32}{seconds:9.1f} s  client peak {client / 2**20:6.0f} MiB, "
                f"cluster peak {nodes / 2**20:6.0f} MiB",
                flush=True,
            )
    finally:
        cluster.stop(settings)


if __name__ == "__main__":
    main()
