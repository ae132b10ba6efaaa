"""A change of a few entities on a large dataset, made fresh by one ``make``.

    python -m benchmarks.small_change --base DIR --statements N [--entities 100] [--warm] [--rounds 2]

``DIR`` is a folder ``benchmarks.update --keep`` left (its lake written,
flushed and exported). First, not timed, one ``make`` brings everything fresh
(the graph index built if the lake has none). Then each round changes
``--entities`` entities in the proportions of issue 34's daily change (half
new, 30% written again with one more value, 20% deleted; a seed per round,
so no two rounds change the same ones), through the CLI, and times one
``make``: flush, graph index update, all exports, index.json and the version
it publishes, the whole of what a refresh does. Prints each round's wall time
and peak RSS (the process tree, plus the Spark Connect server's with
``--warm``) and ``make``'s own parts, and whether its exports were
incremental. The target of issue 34: 100 entities on 10M statements, warm,
at most 15 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.data import write as write_data
from benchmarks.peer import MiB, SparkServer, git_version, run
from benchmarks.update import DATA_DIR, DATASET, ORIGIN, change, lakehouse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="a kept update.py folder")
    parser.add_argument("--statements", type=int, required=True, help="the base's N")
    parser.add_argument("--entities", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--warm", action="store_true", help="on a Spark Connect server")
    parser.add_argument(
        "--seed-offset", type=int, default=0, help="another run on the same base: other entities"
    )
    args = parser.parse_args()
    n = args.statements
    data = write_data(DATA_DIR / f"kek-{n}.ftm.json", n)
    entities = sum(1 for _ in data.open("rb"))
    lake = args.base / "lake"
    url = f"sqlite:///{args.base / 'journal.sqlite'}"
    env = {**os.environ, "LAKEHOUSE_LAKE_URI": str(lake), "LAKEHOUSE_JOURNAL_URL": url}
    on = [lakehouse(), "--lake", str(lake), "--journal-url", url, "-d", DATASET]
    logs = Path(tempfile.mkdtemp(prefix="small-change-"))
    server = None
    watch: list[int] = []
    try:
        if args.warm:
            server = SparkServer(logs / "cache", logs / "spark", timeout=600)
            server.start()
            env["LAKEHOUSE_SPARK_REMOTE"] = server.url
            watch = [server.pid] if server.pid is not None else []
        ready = run([*on, "make"], env=env, cwd=logs, logs=logs, name="ready")
        if not ready.ok:
            sys.exit(f"the first make failed:\n{ready.stderr_tail()}")
        print(f"first make (not timed: graph index built, all fresh): {ready.seconds:.1f} s")
        load = os.getloadavg()[0]
        print(
            f"\n{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {git_version()}, {n:,} "
            f"statements ({entities:,} entities), {'warm' if args.warm else 'cold'}, "
            f"load {load:.1f}\n"
        )
        print("| round | changed (new / again / deleted) | make | peak RSS | parts | exports |")
        print("|---|---|---|---|---|---|")
        for number in range(1, args.rounds + 1):
            changed = logs / f"change-{number}.ftm.json"
            scale = args.entities * 100 / entities
            deleted, new, again = change(
                data, changed, seed=1000 + number + args.seed_offset, scale=scale
            )
            write = [*on, "entities", "write", "-i", str(changed), "-o", ORIGIN]
            subprocess.run(write, env=env, check=True, capture_output=True)
            subprocess.run(
                [*on, "entities", "delete", *deleted], env=env, check=True, capture_output=True
            )
            done = run(
                [*on, "-v", "make", "--json"],
                env=env,
                cwd=logs,
                logs=logs,
                name=f"make-{number}",
                watch=watch,
            )
            if not done.ok:
                sys.exit(f"make failed:\n{done.stderr_tail()}")
            result = json.loads(done.stdout.read_text().strip().splitlines()[-1])
            parts = ", ".join(f"{k} {v:.1f}" for k, v in (result.get("parts") or {}).items())
            memory = done.peak_rss_with_others if args.warm else done.peak_rss
            print(
                f"| {number} | {new} / {again} / {len(deleted)} | {done.seconds:.1f} s | "
                f"{memory / MiB:,.0f} MiB | {parts} | {result.get('mode')} |"
            )
        print(f"\nload at the end {os.getloadavg()[0]:.1f}; logs in {logs}")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
