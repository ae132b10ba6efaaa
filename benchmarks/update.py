"""A daily update of a dataset: a 1% change after a full export, flushed and exported.

    python -m benchmarks.update --statements 1000000

Builds a base of N statements of scaled kek data (``benchmarks/data.py``) in a
fresh lake: write, flush, export (the full pass, which leaves the state an
incremental export starts from). Then the change of issue 34, by entities of
the base: 0.5% new entities (copies of base entities under new ids), 0.3%
written again with one more value, 0.2% deleted, each through the CLI (the
user's API). Then, timed, each its own process (cold: every step starts its
own Spark JVM, unless ``LAKEHOUSE_SPARK_REMOTE`` points at a warm server):

1. write + delete of the change;
2. flush (the change feed recorded with it);
3. all exports: incremental, from the last export and the change feed;
4. all exports again with ``--force``: the full pass over the same snapshot,
   what every export cost before incremental exports (the reference the
   byte-identity tests compare with; its files are compared here too).

Prints the figures as a Markdown table. Numbers only; nothing is asserted
but the byte identity of step 3's and step 4's files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.data import KEK_STATEMENTS
from benchmarks.data import write as write_data

DATASET = "update_bench"
ORIGIN = "bench"
FILES = ("exports/statements.csv", "entities.ftm.json", "exports/statistics.json")


def lakehouse() -> str:
    beside = Path(sys.executable).with_name("lakehouse")
    return str(beside) if beside.exists() else "lakehouse"


def timed(args: list[str], env: dict[str, str], log: Path) -> float:
    start = time.monotonic()
    with log.open("ab") as out:
        done = subprocess.run(args, env=env, stdout=out, stderr=out, check=False)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(args[:6])} ... failed (exit {done.returncode}); see {log}")
    return seconds


def digests(lake: Path) -> dict[str, str]:
    return {f: hashlib.sha256((lake / DATASET / f).read_bytes()).hexdigest() for f in FILES}


def change(base: Path, out: Path, seed: int, scale: float = 1.0) -> tuple[list[str], int, int]:
    """The change file (new and re-written entities) and the ids to delete: 0.5%
    new, 0.3% re-written with one more value, 0.2% deleted, ``scale`` times that."""
    entities = [json.loads(line) for line in base.open("rb")]
    rng = random.Random(seed)
    rng.shuffle(entities)
    n = len(entities)
    new, again, gone = (max(1, int(n * share * scale / 1000)) for share in (5, 3, 2))
    with out.open("w") as fh:
        for e in entities[:new]:
            fh.write(json.dumps({**e, "id": f"{e['id']}-new"}) + "\n")
        for e in entities[new : new + again]:
            props = {k: list(v) for k, v in e.get("properties", {}).items()}
            props.setdefault("summary", []).append("updated today")
            fh.write(json.dumps({**e, "properties": props}) + "\n")
    return [str(e["id"]) for e in entities[new + again : new + again + gone]], new, again


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=KEK_STATEMENTS)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument(
        "--base", type=Path, default=None, help="a kept run's folder: its lake is the base"
    )
    parser.add_argument("--seed", type=int, default=42, help="which entities the change picks")
    args = parser.parse_args()
    data = write_data(
        Path(__file__).resolve().parent / ".data" / f"kek-{args.statements}.ftm.json",
        args.statements,
    )
    root = args.base or Path(tempfile.mkdtemp(prefix="update-bench-", dir=args.workdir))
    lake, log = root / "lake", root / "steps.log"
    url = f"sqlite:///{root / 'journal.sqlite'}"
    env = {**os.environ, "LAKEHOUSE_LAKE_URI": str(lake), "LAKEHOUSE_JOURNAL_URL": url}
    cli = [lakehouse(), "--lake", str(lake), "--journal-url", url]
    on = [*cli, "-d", DATASET]
    figures: dict[str, float] = {}
    try:
        if args.base is None:
            timed([*cli, "datasets", "create", DATASET], env, log)
            load = [*on, "entities", "write", "-i", str(data), "-o", ORIGIN]
            figures["base write"] = timed(load, env, log)
            figures["base flush"] = timed([*on, "flush"], env, log)
            figures["base exports (full)"] = timed([*on, "export"], env, log)
        changed = root / f"change-{args.seed}.ftm.json"
        deleted, new, again = change(data, changed, seed=args.seed)
        write = timed([*on, "entities", "write", "-i", str(changed), "-o", ORIGIN], env, log)
        figures["apply the change (write + delete)"] = write + timed(
            [*on, "entities", "delete", *deleted], env, log
        )
        figures["flush"] = timed([*on, "flush"], env, log)
        figures["all exports (incremental)"] = timed([*on, "export"], env, log)
        incremental = digests(lake)
        figures["all exports (full rebuild, --force)"] = timed([*on, "export", "--force"], env, log)
        same = incremental == digests(lake)
    finally:
        if not args.keep and args.base is None:
            shutil.rmtree(root, ignore_errors=True)
    print(
        f"\n{args.statements:,} statements; change: {new} new, {again} written again, "
        f"{len(deleted)} deleted entities; incremental files identical to the full "
        f"rebuild: {same}\n"
    )
    print("| step | seconds |\n|---|---|")
    for step, seconds in figures.items():
        print(f"| {step} | {seconds:.1f} |")
    total = figures["flush"] + figures["all exports (incremental)"]
    print(f"| **flush + exports (incremental)** | **{total:.1f}** |")
    print(
        f"| flush + exports (full rebuild) | "
        f"{figures['flush'] + figures['all exports (full rebuild, --force)']:.1f} |"
    )


if __name__ == "__main__":
    main()
