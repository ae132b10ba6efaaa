"""The phases of a small flush into a larger table, and what it touches.

    python -m benchmarks.flush_phases --statements 150000 [--base DIR]

Builds (or re-uses with ``--base``, a folder this script left with ``--keep``)
a base of N statements of scaled kek data, written and flushed, then applies
the change of issue 34 (``benchmarks/update.py``: 0.5% new entities, 0.3%
written again with one more value, 0.2% deleted) and flushes it with ``-v``,
each its own process. Prints the flush's step timings (its own log lines)
and how many files each table's flush commits added and removed, against
the files the tables hold: a flush in proportion to its input adds and
removes files in proportion to the change, not to the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.data import KEK_STATEMENTS
from benchmarks.data import write as write_data
from benchmarks.update import DATASET, ORIGIN, change, lakehouse

STEP = re.compile(
    r"flush \S+: (?P<what>.+) \((?P<seconds>[0-9.]+) s(?:, CPU (?P<cpu>[0-9.]+) s)?\)$"
)


def commit_counts(table: Path) -> tuple[int, int, int]:
    """(files added, files removed) by the table's last commit, and its live files."""
    log = sorted((table / "_delta_log").glob("*.json"))
    adds = removes = 0
    for line in log[-1].read_text().splitlines():
        action = json.loads(line)
        adds += "add" in action
        removes += "remove" in action
    live: set[str] = set()
    for entry in log:
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live.add(action["add"]["path"])
            if "remove" in action:
                live.discard(action["remove"]["path"])
    return adds, removes, len(live)


def url_of(root: Path) -> str:
    """The SQLite journal URL of a base or run folder."""
    return f"sqlite:///{root / 'journal.sqlite'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=KEK_STATEMENTS)
    parser.add_argument("--base", type=Path, default=None, help="a kept base folder")
    parser.add_argument("--keep", action="store_true", help="keep the base folder")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="the change's size against issue 34's 1%% (0.1: 0.1%% of the entities)",
    )
    args = parser.parse_args()
    data = write_data(
        Path(__file__).resolve().parent / ".data" / f"kek-{args.statements}.ftm.json",
        args.statements,
    )
    base = args.base or Path(tempfile.mkdtemp(prefix="flush-phases-"))
    if args.base is None:
        cli = [lakehouse(), "--lake", str(base / "lake"), "--journal-url", url_of(base)]
        subprocess.run([*cli, "datasets", "create", DATASET], check=True)
        write = [*cli, "-d", DATASET, "entities", "write", "-i", str(data), "-o", ORIGIN]
        subprocess.run(write, check=True)
        subprocess.run([*cli, "-d", DATASET, "flush"], check=True)
    run = Path(tempfile.mkdtemp(prefix="flush-phases-run-"))
    try:
        shutil.copytree(base / "lake", run / "lake")
        shutil.copy(base / "journal.sqlite", run / "journal.sqlite")
        lake = run / "lake"
        env = {**os.environ, "LAKEHOUSE_LAKE_URI": str(lake), "LAKEHOUSE_JOURNAL_URL": url_of(run)}
        on = [lakehouse(), "--lake", str(lake), "--journal-url", url_of(run), "-d", DATASET]
        changed = run / "change.ftm.json"
        deleted, new, again = change(data, changed, seed=args.seed, scale=args.scale)
        subprocess.run([*on, "entities", "write", "-i", str(changed), "-o", ORIGIN], check=True)
        subprocess.run([*on, "entities", "delete", *deleted], check=True, env=env)
        start = time.monotonic()
        done = subprocess.run(
            [*on, "-v", "flush", "--json"], env=env, check=True, capture_output=True, text=True
        )
        stats = json.loads(done.stdout.strip().splitlines()[-1])
        seconds = time.monotonic() - start
        print(f"\n{args.statements:,} statements; {new} new, {again} again, {len(deleted)} deleted")
        print(f"load: {os.getloadavg()[0]:.1f}\n\n| flush step | seconds |\n|---|---|")
        for line in done.stderr.splitlines():
            found = STEP.search(line)
            if found:
                print(f"| {found['what']} | {float(found['seconds']):.2f} |")
        print(f"| **flush (process)** | **{seconds:.1f}** |\n")
        probed = (stats.get(k) for k in ("row_groups_read", "row_groups_total"))
        print("row groups probed (read of total): {} of {}".format(*probed))
        print(f"translog files rewritten: {stats.get('translog_files_rewritten')}\n")
        print("| table | files added | removed | live files |\n|---|---|---|---|")
        for table in ("statements", "translog"):
            adds, removes, live = commit_counts(lake / DATASET / "entities" / table)
            print(f"| {table} | {adds} | {removes} | {live} |")
    finally:
        shutil.rmtree(run, ignore_errors=True)
        if not args.keep and args.base is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
