"""Benchmark: bulk journal writes with full followthemoney validation.

Scales ../shared/data/kek.ftm.json to N statements (default 1M), writes it
through the tenant API (the same path as ``lakehouse entities write``) into a
fresh lake with a SQLite journal (or --journal-url), and prints statements/s
and peak memory.

    python -m benchmarks.journal_write --statements 1000000
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.data import write
from lakehouse_assets import Lakehouse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--statements", type=int, default=1_000_000)
    parser.add_argument("--journal-url", default=None)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakehouse-bench-"))
    data = write(Path(tempfile.gettempdir()) / f"kek-{args.statements}.ftm.json", args.statements)
    lake = Lakehouse(work / "lake", journal_url=args.journal_url)
    ds = lake.create_dataset(f"bench_{os.getpid()}")
    try:
        start = time.perf_counter()
        with data.open("rb") as fh:
            bulk = ds.write_entities(fh, origin="bench", source=str(data), workers=args.workers)
        elapsed = time.perf_counter() - start
    finally:
        lake.journal.clear(ds.name)  # a shared (PostgreSQL) journal keeps nothing
        shutil.rmtree(work, ignore_errors=True)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(
        f"journal write: {bulk.entities:,} entities, {bulk.count:,} statements "
        f"in {elapsed:.2f} s = {bulk.count / elapsed:,.0f} statements/s "
        f"(journal {lake.journal.engine.dialect.name}); "
        f"peak RSS main {peak:.0f} MB, largest worker {children:.0f} MB"
    )


if __name__ == "__main__":
    main()
