"""Benchmark: sensor ticks on a lake with thousands of archived files.

Archives N small files (default 5000) into one dataset of a fresh lake (plus
20 more, empty, datasets), then times the real sensor functions on a real
Dagster instance: a tick after the change (lists the archive once), and
ticks with nothing new (reads one tag per dataset, no listing).

    python -m benchmarks.sensors --files 5000
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import dagster as dg

from lakehouse_assets import Lakehouse
from lakehouse_assets.defs.partitions import DATASETS
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.defs.sensors import archive_files, journal_writes, new_datasets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--ticks", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakehouse-bench-sensors-"))
    try:
        lake = Lakehouse(work / "lake")
        ds = lake.create_dataset("many_files")
        for i in range(20):
            lake.create_dataset(f"other_{i:02d}")
        src = work / "src"
        src.mkdir()
        for i in range(args.files):
            (src / f"f{i:06d}.txt").write_text(f"file {i}\n")
        start = time.perf_counter()
        ds.crawl(str(src))
        print(f"crawl of {args.files:,} files: {time.perf_counter() - start:.1f} s")
        resources = {"lakehouse": LakehouseResource(lake_uri=str(work / "lake"))}
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions(DATASETS, lake.datasets())
            for sensor in (new_datasets, archive_files, journal_writes):
                ctx = dg.build_sensor_context(instance=instance, resources=resources)
                start = time.perf_counter()
                result = sensor(ctx)
                first = time.perf_counter() - start
                cursor = getattr(result, "cursor", None)
                times = []
                for _ in range(args.ticks):
                    ctx = dg.build_sensor_context(
                        instance=instance, cursor=cursor, resources=resources
                    )
                    start = time.perf_counter()
                    skip = sensor(ctx)
                    times.append(time.perf_counter() - start)
                    assert isinstance(skip, dg.SkipReason), skip
                print(
                    f"{sensor.name:<14} tick with changes {first * 1000:7.0f} ms; "
                    f"nothing new: median {statistics.median(times) * 1000:5.0f} ms "
                    f"({len(lake.datasets())} datasets, {args.files:,} files)"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
