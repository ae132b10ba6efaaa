"""Time the Spark data plane on N statements of scaled kek data.

    python -m benchmarks.dataplane --statements 1000000

Steps, each printed with its time and statements/s: journal write; flush plus
all four exports in one ``make`` (Spark start-up included, as a user running
``lakehouse make`` pays it); each export alone (warm Spark, ``force``);
optimize; get entity (median and p95 of 200 random ids, after optimize);
compact. Peak memory is the highest resident set of this process and all its
children (the Spark JVM and its Python workers) sampled every 100 ms.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.data import write as write_data

PAGE = os.sysconf("SC_PAGE_SIZE")


def tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (from /proc).

    A JVM starting a process (Spark's Python daemon, a shell command of
    Hadoop's local file system) clones itself first: until the clone execs, it
    shows the JVM's command line and the JVM's whole resident set, which is
    the same memory (seen: a second 1,483 MB "JVM" at a 10M flush's peak, a
    third of that peak). Such a clone, a child with its parent JVM's command
    line, is not counted.
    """
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    cmdline: dict[int, bytes] = {}
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/statm") as fh:
                rss[pid] = int(fh.read().split()[1]) * PAGE
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline[pid] = fh.read()
        except OSError:
            continue
        parent[pid] = int(fields[1])
        children.setdefault(parent[pid], []).append(pid)
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        if pid != root and _jvm_clone(cmdline.get(pid), cmdline.get(parent.get(pid, -1))):
            continue
        total += rss.get(pid, 0)
    return total


def _jvm_clone(command: bytes | None, parents: bytes | None) -> bool:
    """A JVM's child that has not exec'd yet (see :func:`tree_rss`)."""
    if not command or command != parents:
        return False
    return os.path.basename(command.split(b"\0", 1)[0]) == b"java"


class PeakMemory(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak = 0
        self.running = True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, tree_rss(os.getpid()))
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--statements", type=int, default=1_000_000)
    parser.add_argument("--lake", type=Path, default=None, help="default: a temp folder")
    parser.add_argument("--skip-single-exports", action="store_true")
    args = parser.parse_args()

    from lakehouse_assets.lake import Lakehouse

    data_dir = Path(__file__).parent / ".data"
    data_dir.mkdir(exist_ok=True)
    data = write_data(data_dir / f"kek-{args.statements}.ftm.json", args.statements)
    root = args.lake or Path(tempfile.mkdtemp(prefix="lakehouse-bench-"))
    shutil.rmtree(root, ignore_errors=True)
    peak = PeakMemory()
    peak.start()
    lake = Lakehouse(root)
    ds = lake.create_dataset("bench")
    results: list[tuple[str, float, int | None]] = []

    def report(step: str, seconds: float, count: int | None = None) -> None:
        rate = f"{count / seconds:>12,.0f} statements/s" if count else ""
        print(f"{step:<38} {seconds:>9.3f} s {rate}", flush=True)
        results.append((step, seconds, count))

    clock = time.monotonic()
    with data.open("rb") as fh:
        bulk = ds.write_entities(fh, origin="bench")
    n = bulk.count
    report("journal write", time.monotonic() - clock, n)

    clock = time.monotonic()
    made = ds.make()
    total = time.monotonic() - clock
    flush_s = made.flushed["seconds"] if made.flushed else 0.0
    report("flush (incl. Spark start)", flush_s, n)
    report("4 exports in one pass", total - flush_s, n)
    report("make = flush + 4 exports", total, n)

    if not args.skip_single_exports:
        for kind in ("statements", "entities", "statistics", "index"):
            clock = time.monotonic()
            ds.export([kind], force=True)
            report(f"export {kind} alone (warm Spark)", time.monotonic() - clock, n)

    clock = time.monotonic()
    optimized = ds.optimize()
    report(
        f"optimize ({optimized.files_removed}→{optimized.files_added} files)",
        time.monotonic() - clock,
        n,
    )

    rng = random.Random(42)
    ids = [line.split(b'"id":"', 1)[1].split(b'"', 1)[0].decode() for line in _sample(data, rng)]
    times = []
    found = 0
    for entity_id in ids:
        clock = time.monotonic()
        found += ds.get_entity(entity_id) is not None
        times.append(time.monotonic() - clock)
    times.sort()
    print(
        f"get entity: median {statistics.median(times) * 1000:.1f} ms, "
        f"p95 {times[int(len(times) * 0.95)] * 1000:.1f} ms ({found}/{len(ids)} found)",
        flush=True,
    )

    clock = time.monotonic()
    compacted = ds.compact()
    report(f"compact ({compacted.live} live)", time.monotonic() - clock, n)

    peak.running = False
    peak.join()
    print(f"peak memory (process tree): {peak.peak / 2**30:.2f} GiB")
    print(f"statements: {n:,}; lake: {root}")


def _sample(path: Path, rng: random.Random, count: int = 200) -> list[bytes]:
    lines = path.read_bytes().splitlines()
    return [lines[rng.randrange(len(lines))] for _ in range(count)]


if __name__ == "__main__":
    main()
