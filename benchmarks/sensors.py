"""Benchmark: every sensor's tick on a lake with many datasets or many archived files.

``--datasets N`` (default 2000): N datasets, each with a journal tag (as after a
tenant's write) and one archived file in every hundredth, on a local lake and
(``--s3``) on a loopback ``moto_server`` it starts and stops itself. Times the
real sensor functions on a real Dagster instance, with the cursor each tick
leaves, as the daemon runs them:

- first: the first tick (every dataset is new to the sensor);
- quiet: median of ``--ticks`` ticks with nothing new;
- changed: a tick after 10 datasets were written to (a journal tag and a queue
  item pushed each; one of them a new file).

``--sensors a,b`` times only those sensors (e.g. ``--sensors queue_items``);
``--graphql`` also times the ``statements`` asset's partitions page (what the
UI asks Dagster's GraphQL for: the partition keys and their statuses) with a
materialization reported for each of the N datasets.

``--files N`` instead archives N files into one dataset of 21 (the older
benchmark: the archive sensor's listing of one big archive).

    python -m benchmarks.sensors --datasets 2000 --s3
    python -m benchmarks.sensors --files 5000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3Resource

from benchmarks.s3 import moto_server, new_bucket
from lakehouse_assets import Lakehouse
from lakehouse_assets import conventions as cv
from lakehouse_assets.defs.freshness import freshness_checks
from lakehouse_assets.defs.ingest import mapping_changes
from lakehouse_assets.defs.partitions import DATASETS
from lakehouse_assets.defs.queue import queue_items
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.defs.sensors import archive_files, journal_writes, new_datasets
from lakehouse_assets.tags import Tags

SENSORS = [
    new_datasets,
    archive_files,
    journal_writes,
    mapping_changes,
    freshness_checks,
    queue_items,
]

#: How many datasets the "changed" tick finds written to.
CHANGED = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--datasets", type=int, default=2000)
    parser.add_argument("--files", type=int, default=0, help="the one-big-archive benchmark")
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--s3", action="store_true", help="also on a loopback moto_server")
    parser.add_argument("--local", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--graphql", action="store_true", help="time the partitions page")
    parser.add_argument(
        "--sensors",
        default="",
        help="comma-separated sensor names to time (default: all of them)",
    )
    args = parser.parse_args()
    if args.sensors:
        chosen = set(args.sensors.split(","))
        unknown = chosen - {s.name for s in SENSORS}
        if unknown:
            parser.error(f"unknown sensor(s) {sorted(unknown)}")
        SENSORS[:] = [s for s in SENSORS if s.name in chosen]
    work = Path(tempfile.mkdtemp(prefix="lakehouse-bench-sensors-"))
    (work / "src").mkdir()
    # the archived files are read from here (the file-access policy's roots)
    os.environ["LAKEHOUSE_SOURCE_ROOTS"] = str(work / "src")
    try:
        if args.files:
            many_files(work, args.files, args.ticks)
            return
        lakes: list[tuple[str, Callable[[], contextlib.AbstractContextManager[Lakehouse]]]] = []
        if args.local:
            lakes.append(("local", lambda: contextlib.nullcontext(local_lake(work))))
        if args.s3:
            lakes.append(("s3", lambda: s3_lake(work)))
        print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
        print("| lake | sensor | first tick | quiet tick (median) | tick after 10 writes |")
        print("|---|---|---|---|---|")
        for where, open_lake in lakes:
            with open_lake() as lake:
                start = time.perf_counter()
                names = fill(lake, args.datasets)
                print(
                    f"<!-- {where}: {args.datasets} datasets written in "
                    f"{time.perf_counter() - start:.0f} s -->",
                    flush=True,
                )
                for name, first, quiet, changed in ticks(lake, names, args.ticks):
                    print(f"| {where} | `{name}` | {first} | {quiet} | {changed} |", flush=True)
        if args.graphql:
            print(partitions_page(args.datasets, args.ticks), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def local_lake(work: Path) -> Lakehouse:
    return Lakehouse(work / "lake", journal_url=f"sqlite:///{work / 'journal.sqlite'}")


@contextlib.contextmanager
def s3_lake(work: Path) -> Iterator[Lakehouse]:
    """A lake in a bucket of a moto_server started here."""
    with moto_server() as settings:
        yield Lakehouse(
            f"s3://{new_bucket(settings)}/lake",
            settings=settings,
            journal_url=f"sqlite:///{work / 'journal-s3.sqlite'}",
        )


def fill(lake: Lakehouse, count: int) -> list[str]:
    """``count`` datasets, each with its config and a journal tag; a file in every 100th.

    The configs are written directly (``create_dataset`` rewrites the catalog
    each time: quadratic), then the catalog once.
    """
    names = [f"ds_{i:05d}" for i in range(count)]
    for name in names:
        lake.store.write_text(cv.dataset_path(name, cv.CONFIG), f"name: {name}\ntitle: {name}\n")
        Tags(lake.store, name).touch(cv.JOURNAL_LAST_UPDATED)
    lake.write_catalog()
    for name in names[::100]:
        lake.dataset(name).add_file(str(_source(lake, f"{name} memo")))
    return names


def _source(lake: Lakehouse, text: str) -> Path:
    """A small file to archive, in the benchmark's folder (an allowed source root)."""
    path = Path(os.environ["LAKEHOUSE_SOURCE_ROOTS"]) / f"{uuid.uuid4().hex}.txt"
    path.write_text(text)
    return path


def lakehouse_resource(lake: Lakehouse) -> LakehouseResource:
    """The Dagster ``lakehouse`` resource of this lake (with its S3 server, if on S3)."""
    s = lake.settings
    if not lake.store.uri.startswith("s3://"):
        return LakehouseResource(lake_uri=lake.store.uri, journal_url=s.resolved_journal_url())
    return LakehouseResource(
        lake_uri=lake.store.uri,
        journal_url=s.resolved_journal_url(),
        s3=S3Resource(
            endpoint_url=s.s3_endpoint_url,
            aws_access_key_id=s.s3_access_key_id,
            aws_secret_access_key=s.s3_secret_access_key,
            region_name=s.s3_region,
        ),
    )


def ticks(lake: Lakehouse, names: list[str], quiet_ticks: int) -> Iterator[tuple[str, ...]]:
    """(sensor, first, quiet, changed) tick times, each sensor on the same lake."""
    resource = lakehouse_resource(lake)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(DATASETS, names)
        cursors: dict[str, str | None] = {}
        firsts: dict[str, float] = {}
        quiets: dict[str, list[float]] = {}
        for sensor in SENSORS:
            firsts[sensor.name], cursors[sensor.name] = tick(instance, resource, sensor, None)
            quiets[sensor.name] = []
            for _ in range(quiet_ticks):
                took, cursors[sensor.name] = tick(instance, resource, sensor, cursors[sensor.name])
                quiets[sensor.name].append(took)
        step = max(1, len(names) // CHANGED)
        for name in names[::step][:CHANGED]:
            Tags(lake.store, name).touch(cv.JOURNAL_LAST_UPDATED)
            lake.dataset(name).queue.push("DELETE", "entity", {"entity_id": "p1"})
        lake.dataset(names[-1]).add_file(str(_source(lake, "a new memo")))
        for sensor in SENSORS:
            changed, _ = tick(instance, resource, sensor, cursors[sensor.name])
            yield (
                sensor.name,
                _ms(firsts[sensor.name]),
                _ms(statistics.median(quiets[sensor.name])),
                _ms(changed),
            )


#: What the UI's partitions page of an asset asks for (keys and their statuses).
PARTITIONS_PAGE = """
query PartitionsPage($key: AssetKeyInput!) {
  assetNodeOrError(assetKey: $key) {
    ... on AssetNode {
      partitionKeysByDimension { name partitionKeys }
      assetPartitionStatuses {
        ... on DefaultPartitionStatuses {
          materializedPartitions failedPartitions unmaterializedPartitions materializingPartitions
        }
      }
    }
  }
}
"""


def partitions_page(count: int, rounds: int) -> str:
    """The ``statements`` asset's partitions page through Dagster's GraphQL, in
    process against a code server of the definitions: ``count`` partitions,
    each with a reported materialization. Median of ``rounds`` loads."""
    from dagster_graphql.test.utils import define_out_of_process_context, execute_dagster_graphql

    import lakehouse_assets.definitions as definitions

    names = [f"ds_{i:05d}" for i in range(count)]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(DATASETS, names)
        for name in names:
            instance.report_runless_asset_event(
                dg.AssetMaterialization(asset_key="statements", partition=name)
            )
        with define_out_of_process_context(str(definitions.__file__), "defs", instance) as ctx:
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                result = execute_dagster_graphql(
                    ctx, PARTITIONS_PAGE, {"key": {"path": ["statements"]}}
                )
                times.append(time.perf_counter() - start)
            node = result.data["assetNodeOrError"]
            (dimension,) = node["partitionKeysByDimension"]
            shown = len(node["assetPartitionStatuses"]["materializedPartitions"])
            assert len(dimension["partitionKeys"]) == count and shown == count, (count, shown)
    return (
        f"partitions page of `statements` ({count:,} partitions, each materialized): "
        f"median {_ms(statistics.median(times))}, first {_ms(times[0])} "
        f"(load average {os.getloadavg()[0]:.2f})"
    )


def tick(
    instance: dg.DagsterInstance,
    resource: LakehouseResource,
    sensor: dg.SensorDefinition,
    cursor: str | None,
) -> tuple[float, str | None]:
    """One timed tick; the cursor it leaves (the one given when it leaves none)."""
    with dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"lakehouse": resource}
    ) as ctx:
        start = time.perf_counter()
        result: Any = sensor(ctx)
        took = time.perf_counter() - start
    return took, getattr(result, "cursor", None) or cursor


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def many_files(work: Path, files: int, quiet_ticks: int) -> None:
    """N archived files in one dataset of 21: the archive listing's cost."""
    lake = Lakehouse(work / "lake")
    ds = lake.create_dataset("many_files")
    for i in range(20):
        lake.create_dataset(f"other_{i:02d}")
    src = work / "src"
    for i in range(files):
        (src / f"f{i:06d}.txt").write_text(f"file {i}\n")
    start = time.perf_counter()
    ds.crawl(str(src))
    print(f"crawl of {files:,} files: {time.perf_counter() - start:.1f} s")
    resource = LakehouseResource(lake_uri=str(work / "lake"))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(DATASETS, lake.datasets())
        for sensor in (new_datasets, archive_files, journal_writes):
            first, cursor = tick(instance, resource, sensor, None)
            times = []
            for _ in range(quiet_ticks):
                took, cursor = tick(instance, resource, sensor, cursor)
                times.append(took)
            print(
                f"{sensor.name:<14} tick with changes {_ms(first)}; "
                f"nothing new: median {_ms(statistics.median(times))} "
                f"({len(lake.datasets())} datasets, {files:,} files)"
            )


if __name__ == "__main__":
    main()
