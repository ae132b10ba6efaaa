"""Materialize a dataset's whole asset graph through Dagster and print a summary.

What ``make demo`` runs after the tenants' writes: the dataset becomes a
partition, the tenants' archive and journal writes are reported the way the
sensors report them, and the ``refresh_dataset`` job runs in this process on
the persistent instance of ``DAGSTER_HOME`` (so ``make ui`` shows the runs).

    python -m lakehouse_assets.defs.demo DATASET
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import dagster as dg

from lakehouse_assets import conventions as cv
from lakehouse_assets.defs.ingest import mappings_event
from lakehouse_assets.defs.partitions import DATASETS
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.defs.sensors import archive_event, journal_event


def report_sources(instance: dg.DagsterInstance, lakehouse: LakehouseResource, name: str) -> None:
    """Add the partition and report archive, mappings and journal as the sensors would."""
    lake = lakehouse.lake()
    ds = lake.dataset(name)
    if not instance.has_dynamic_partition(DATASETS, name):
        instance.add_dynamic_partitions(DATASETS, [name])
    archived = ds.core_tags.get(cv.ARCHIVE_LAST_UPDATED)
    if archived is not None:
        files = list(ds.archive.list())
        instance.report_runless_asset_event(archive_event(ds, archived, files, len(files)))
    mapped = ds.core_tags.get(cv.MAPPINGS_LAST_UPDATED)
    if mapped is not None:
        instance.report_runless_asset_event(mappings_event(ds, mapped, ds.mappings()))
    written = ds.core_tags.get(cv.JOURNAL_LAST_UPDATED)
    if written is not None:
        instance.report_runless_asset_event(journal_event(lake, ds, written))


def refresh(instance: dg.DagsterInstance, name: str) -> dg.ExecuteInProcessResult:
    from lakehouse_assets.definitions import defs

    job = defs.resolve_job_def("refresh_dataset")
    return job.execute_in_process(partition_key=name, instance=instance, raise_on_error=False)


def summary(result: dg.ExecuteInProcessResult) -> list[str]:
    lines = [f"run {result.run_id}: {'success' if result.success else 'FAILED'}"]
    for event in result.get_asset_materialization_events():
        mat = event.materialization
        assert mat is not None
        meta: dict[str, Any] = {k: v.value for k, v in mat.metadata.items()}
        key = mat.asset_key.to_user_string()
        parts = []
        for label, field in (
            ("rows", "dagster/partition_row_count"),
            ("new", "new_statements"),
            ("duplicates", "duplicate_statements"),
            ("tombstones", "tombstoned_statements"),
            ("superseded in the batch", "superseded_events"),
            ("deletes of unstored", "ignored_tombstones"),
            ("of journal rows", "journal_rows_flushed"),
            ("delta version", "delta_version"),
            ("bytes", "size_bytes"),
            ("edges", "edges"),
            ("added", "edges_added"),
            ("tombstoned", "edges_tombstoned"),
            ("nodes", "nodes"),
            ("relationships", "relationships"),
        ):
            if field in meta:
                parts.append(f"{label} {meta[field]}")
        if meta.get("rewritten") is False:
            parts.append("unchanged (kept)")
        uri = meta.get("dagster/uri", "")
        lines.append(f"  {key:<18} {', '.join(parts)}")
        if uri:
            lines.append(f"  {'':<18} {uri}")
    for check in result.get_asset_check_evaluations():
        state = "passed" if check.passed else f"FAILED ({check.severity.value})"
        lines.append(f"  check {check.asset_key.to_user_string()}.{check.check_name}: {state}")
    return lines


def show_progress() -> None:
    """The run's stages on stdout as they happen (flush batches, exports, the graph,
    Spark's tasks), while Dagster's own log goes to stderr (``make demo`` keeps that
    in a file): the demo is not silent while the run works."""
    import logging

    from lakehouse_assets import progress

    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(progress.Formatter())
    progress.log.addHandler(handler)
    progress.log.setLevel(logging.INFO)
    progress.log.propagate = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset")
    args = parser.parse_args(argv)
    show_progress()
    instance = dg.DagsterInstance.get()
    report_sources(instance, LakehouseResource(), args.dataset)
    result = refresh(instance, args.dataset)
    print("\n".join(summary(result)))
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main())
