"""Benchmark: wall time of the commands that never start Spark.

Builds a small lake once (the sample entities, flushed and exported, with its
graph index: the one run that starts Spark), then times each command as a user
runs it: a fresh ``lakehouse`` process from start to exit, ``--rounds`` times,
in turn. Prints the median and the slowest per command, and the machine's
load average before and after (read the figures against it: the target is
<= 1.0 s on an idle 2-core machine).

``--baseline CHECKOUT`` compares: each command runs with this checkout's code
and with ``CHECKOUT``'s (``PYTHONPATH``), alternating, on the same lake; the
table then shows both medians, their ratio and the CPU time (user + system)
of each, which a loaded machine inflates less than the wall time.

    python -m benchmarks.cli_latency --rounds 5
    python -m benchmarks.cli_latency --rounds 5 --baseline /path/to/old/checkout
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lakehouse_assets import Lakehouse, graph

SAMPLE = Path(__file__).resolve().parent.parent / "lakehouse_assets" / "sample"

#: (label, arguments after ``--lake LAKE``): every command that must not start Spark
COMMANDS: list[tuple[str, list[str]]] = [
    ("--version", ["--version"]),
    ("--help", ["--help"]),
    ("datasets list", ["datasets", "list"]),
    ("status", ["-d", "bench", "status"]),
    ("get", ["-d", "bench", "get", "{entity}"]),
    ("refs", ["-d", "bench", "refs", "{entity}"]),
    ("versions", ["-d", "bench", "versions"]),
    ("verify", ["-d", "bench", "verify"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", default=None, help="a checkout to compare with (A/B)")
    parser.add_argument(
        "--only", default="", help="comma-separated command labels (default: all of them)"
    )
    args = parser.parse_args()
    commands = [c for c in COMMANDS if not args.only or c[0] in args.only.split(",")]
    here = str(Path(__file__).resolve().parent.parent)
    trees = {"this": here, **({"baseline": args.baseline} if args.baseline else {})}
    work = Path(tempfile.mkdtemp(prefix="lakehouse-bench-cli-"))
    try:
        lake = Lakehouse(work / "lake", journal_url=f"sqlite:///{work / 'journal.sqlite'}")
        ds = lake.create_dataset("bench")
        with (SAMPLE / "entities.ftm.json").open("rb") as fh:
            ds.write_entities(fh, origin="bench")
        ds.make()
        graph.rebuild(ds)
        entity = next(iter(ds.stream_entities()))["id"]
        exe = str(Path(sys.executable).parent / "lakehouse")
        env = {
            **os.environ,
            "LAKEHOUSE_LAKE_URI": str(work / "lake"),
            "LAKEHOUSE_JOURNAL_URL": f"sqlite:///{work / 'journal.sqlite'}",
        }
        load_before = os.getloadavg()
        walls: dict[tuple[str, str], list[float]] = {}
        cpus: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for label, argv in commands:
                command = [exe, *(a.replace("{entity}", entity) for a in argv)]
                for tree, path in trees.items():
                    wall, cpu = run(command, {**env, "PYTHONPATH": path}, work, label)
                    walls.setdefault((label, tree), []).append(wall)
                    cpus.setdefault((label, tree), []).append(cpu)
        load_after = os.getloadavg()
        print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
        if args.baseline is None:
            print(f"{'command':<16} {'median s':>9} {'max s':>7} {'cpu s':>6}")
            for label, _ in commands:
                values = walls[(label, "this")]
                cpu = statistics.median(cpus[(label, "this")])
                print(
                    f"{label:<16} {statistics.median(values):>9.2f} {max(values):>7.2f} {cpu:>6.2f}"
                )
            return
        print(
            f"{'command':<16} {'baseline s':>10} {'this s':>7} {'ratio':>6} {'cpu base':>9} {'cpu this':>9}"
        )
        for label, _ in commands:
            old, new = (statistics.median(walls[(label, t)]) for t in ("baseline", "this"))
            cpu_old, cpu_new = (statistics.median(cpus[(label, t)]) for t in ("baseline", "this"))
            print(
                f"{label:<16} {old:>10.2f} {new:>7.2f} {new / old:>6.2f} "
                f"{cpu_old:>9.2f} {cpu_new:>9.2f}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(command: list[str], env: dict[str, str], cwd: Path, label: str) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one command, as a fresh process."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed: {err.decode()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
