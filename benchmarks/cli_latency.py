"""Benchmark: wall time of the commands that never start Spark.

Builds a small lake once (the sample entities, flushed and exported, with its
graph index: the one run that starts Spark), then times each command as a user
runs it: a fresh ``lakehouse`` process from start to exit, ``--rounds`` times,
in turn. Prints the median and the slowest per command, and the machine's
load average before and after (read the figures against it: the target is
<= 1.0 s on an idle 2-core machine).

    python -m benchmarks.cli_latency --rounds 5
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
    args = parser.parse_args()
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
        samples: dict[str, list[float]] = {label: [] for label, _ in COMMANDS}
        for _ in range(args.rounds):
            for label, argv in COMMANDS:
                command = [exe, *(a.replace("{entity}", entity) for a in argv)]
                start = time.perf_counter()
                done = subprocess.run(command, capture_output=True, env=env, cwd=work)
                samples[label].append(time.perf_counter() - start)
                if done.returncode != 0:
                    raise SystemExit(f"{label} failed: {done.stderr.decode()[-500:]}")
        load_after = os.getloadavg()
        print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
        print(f"{'command':<16} {'median s':>9} {'max s':>7}")
        for label, values in samples.items():
            print(f"{label:<16} {statistics.median(values):>9.2f} {max(values):>7.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
