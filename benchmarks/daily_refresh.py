"""Benchmark: what a ``daily_refresh`` costs when nothing changed, with many datasets.

``--datasets N`` datasets, each with two entities written to the journal,
made fresh by the product's own job: one ``refresh_dataset`` run over all N
(the single-run backfill the schedules ask for: one Spark session flushes,
exports and indexes every dataset in turn; its time per dataset is printed).
Then, on the same Dagster instance (a temporary one, runs in this process),
the ``daily_refresh`` schedule evaluated as the daemon does (its time, what
it asks for) and the runs it asks for, executed:

- with no change, the same day (every dataset's change marker moved in the
  last two days: each is judged by the freshness rule);
- one run over every dataset with no change: what the schedule asked for
  every day before it judged freshness;
- after 10 datasets got a new entity each, the same day;
- with no change, three days later (no marker moved since: nothing judged).

Prints a Markdown table with the load average. Building the N fresh datasets
dominates (seconds per dataset on a shared machine): run a few hundred and
read the per-dataset columns to scale to 2,000. ``--s3`` does the same on a
loopback ``moto_server`` (started and stopped here).

    nice -n 19 python -m benchmarks.daily_refresh --datasets 200
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg

from lakehouse_assets import Lakehouse
from lakehouse_assets.defs.maintenance import RANGE_END, RANGE_START
from lakehouse_assets.defs.partitions import DATASETS
from lakehouse_assets.defs.resources import SparkResource

#: How many datasets the "after writes" tick finds written to.
CHANGED = 10


def entities(name: str, round_: int = 0) -> list[dict[str, Any]]:
    """A company and its owner (an edge for the graph index), ids per dataset."""
    name = name.replace("_", "-")  # followthemoney's entity ids have no "_"
    return [
        {"id": f"{name}-p{round_}", "schema": "Person", "properties": {"name": [f"P {name}"]}},
        {
            "id": f"{name}-o{round_}",
            "schema": "Ownership",
            "properties": {"owner": [f"{name}-p{round_}"], "asset": [f"{name}-c"]},
        },
        {"id": f"{name}-c", "schema": "Company", "properties": {"name": [f"C {name}"]}},
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=200)
    parser.add_argument("--s3", action="store_true", help="on a loopback moto_server")
    parser.add_argument(
        "--ticks-only",
        action="store_true",
        help="only the schedule's ticks, on datasets never flushed (no Spark): what a tick "
        "costs at many datasets",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lakehouse-bench-daily-"))
    (work / "src").mkdir()
    os.environ["LAKEHOUSE_SOURCE_ROOTS"] = str(work / "src")  # benchmarks.sensors.fill's files
    try:
        with lake_of(work, args.s3) as lake:
            rows = (
                ticks_only(lake, args.datasets) if args.ticks_only else measure(lake, args.datasets)
            )
        print(f"\n{args.datasets} datasets, {'s3' if args.s3 else 'local'} lake")
        print("| step | wall | per dataset | asks for |")
        print("|---|---|---|---|")
        for step, seconds, asked in rows:
            per = f"{seconds / args.datasets * 1000:,.1f} ms" if seconds is not None else ""
            wall = f"{seconds:,.2f} s" if seconds is not None else "-"
            print(f"| {step} | {wall} | {per} | {asked} |")
        print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores")
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def lake_of(work: Path, s3: bool) -> Iterator[Lakehouse]:
    if not s3:
        yield Lakehouse(work / "lake", journal_url=f"sqlite:///{work / 'journal.sqlite'}")
        return
    from benchmarks.sensors import s3_lake

    with s3_lake(work) as lake:
        yield lake


def resources(lake: Lakehouse) -> dict[str, Any]:
    from benchmarks.sensors import lakehouse_resource

    return {"lakehouse": lakehouse_resource(lake), "spark": SparkResource()}


def measure(lake: Lakehouse, count: int) -> list[tuple[str, float | None, str]]:
    from lakehouse_assets.definitions import defs

    names = [f"ds_{i:05d}" for i in range(count)]
    rows: list[tuple[str, float | None, str]] = []
    clock = time.perf_counter()
    for name in names:
        ds = lake.create_dataset(name)
        for entity in entities(name):
            ds.add_entity(entity)
    rows.append(("datasets created, 3 entities each in the journal", _since(clock), ""))
    job = defs.resolve_job_def("refresh_dataset")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(DATASETS, names)
        clock = time.perf_counter()
        first = job.execute_in_process(
            instance=instance,
            tags={RANGE_START: names[0], RANGE_END: names[-1]},
            resources=resources(lake),
            raise_on_error=False,
        )
        assert first.success, "the first refresh failed"
        rows.append(("first refresh: one run makes all fresh (Spark)", _since(clock), ""))
        now = datetime.now(UTC)

        def tick_and_runs(label: str, when: datetime) -> None:
            took, requests, why = _tick(instance, lake, when)
            rows.append((f"{label}: schedule tick", took, _asked(requests, names) + why))
            if not requests:
                return
            clock = time.perf_counter()
            for request in requests:
                done = job.execute_in_process(
                    instance=instance,
                    partition_key=request.partition_key,
                    tags=request.tags,
                    resources=resources(lake),
                    raise_on_error=False,
                )
                assert done.success, f"a run of {label} failed"
            rows.append((f"{label}: its runs", _since(clock), ""))

        tick_and_runs("no change, the same day", now)
        clock = time.perf_counter()
        every = job.execute_in_process(
            instance=instance,
            tags={RANGE_START: names[0], RANGE_END: names[-1]},
            resources=resources(lake),
            raise_on_error=False,
        )
        assert every.success, "the run over every dataset failed"
        rows.append(("no change: one run over every dataset", _since(clock), "(all datasets)"))
        step = max(1, count // CHANGED)
        for name in names[::step][:CHANGED]:
            for entity in entities(name, 1):
                lake.dataset(name).add_entity(entity)
        tick_and_runs(f"after {min(CHANGED, count)} writes, the same day", now)
        tick_and_runs("no change, three days later", now + timedelta(days=3))
    return rows


def ticks_only(lake: Lakehouse, count: int) -> list[tuple[str, float | None, str]]:
    """The schedule's ticks on ``count`` datasets written to (a journal tag each, as
    :func:`benchmarks.sensors.fill` writes them) but never flushed: every one is
    stale, so a tick that judges them asks for runs (not executed here)."""
    from benchmarks.sensors import fill

    clock = time.perf_counter()
    names = fill(lake, count)
    rows: list[tuple[str, float | None, str]] = [
        ("datasets written (a journal tag each, never flushed)", _since(clock), "")
    ]
    now = datetime.now(UTC)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(DATASETS, names)
        for label, when in (
            ("every marker moved in the last two days: schedule tick", now),
            ("no marker moved since: schedule tick, three days later", now + timedelta(days=3)),
        ):
            took, requests, why = _tick(instance, lake, when)
            rows.append((label, took, _asked(requests, names) + why))
    return rows


def _tick(
    instance: dg.DagsterInstance, lake: Lakehouse, when: datetime
) -> tuple[float, list[dg.RunRequest], str]:
    """One tick of ``daily_refresh`` at ``when``: its seconds, the runs it asks
    for, and its skip message (if any)."""
    from lakehouse_assets.definitions import defs

    schedule = defs.resolve_schedule_def("daily_refresh")
    with dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=when,
        repository_def=defs.get_repository_def(),
        resources=resources(lake),
    ) as ctx:
        clock = time.perf_counter()
        data = schedule.evaluate_tick(ctx)
        took = _since(clock)
    why = f" ({data.skip_message})" if data.skip_message else ""
    return took, list(data.run_requests or []), why


def _asked(requests: list[dg.RunRequest], names: list[str]) -> str:
    """How many runs a tick asks for, and over how many datasets."""
    if not requests:
        return "no run"
    covered = 0
    for request in requests:
        if request.partition_key is not None:
            covered += 1
        else:
            low, high = request.tags[RANGE_START], request.tags[RANGE_END]
            covered += sum(1 for n in names if low <= n <= high)
    return f"{len(requests)} run(s), {covered} dataset(s)"


def _since(clock: float) -> float:
    return time.perf_counter() - clock


if __name__ == "__main__":
    main()
