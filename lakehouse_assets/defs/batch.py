"""Runs that cover several datasets: one Spark start for N partitions.

Every computed asset has ``BackfillPolicy.single_run()``: a backfill of many
datasets (or the nightly maintenance, or the scheduled refresh) is one run
whose steps loop over the run's partitions, so they share one Spark session
instead of starting a JVM per dataset. Automation and sensors still ask for
one dataset per run.

Dagster records one materialization per asset and step, copied onto every
partition of the run. A one-dataset run therefore reports that dataset's own
metadata and data version; a run over several reports what all of them did
(sums, and a per-dataset table) and no data version, since one version cannot
be right for every dataset.

A dataset that fails does not stop the others (their work is done and
idempotent); the step then fails naming every dataset that failed, so none of
them is recorded as materialized and a retry only redoes cheap checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import dagster as dg

from lakehouse_assets.defs.metadata import markdown_table

T = TypeVar("T")

#: Metadata that only makes sense for one dataset: dropped from a combined report.
_PER_DATASET = ("dagster/uri", "dagster/column_schema", "path", "mime_type")

#: How many per-dataset rows a combined report's table shows.
_TABLE_ROWS = 200

#: Single-run backfills (the policy of every computed asset).
SINGLE_RUN = dg.BackfillPolicy.single_run()


@dataclass
class Report:
    """What one dataset's step reports for one asset."""

    metadata: dict[str, Any] = field(default_factory=dict)
    data_version: dg.DataVersion | None = None


def for_each_dataset(
    context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext | dg.OpExecutionContext,
    work: Callable[[str], T],
) -> dict[str, T]:
    """``work(dataset)`` for every partition of the run, in order; failures raised at the end."""
    names = list(context.partition_keys)
    if len(names) == 1:
        return {names[0]: work(names[0])}
    context.log.info("one run for %d datasets: %s", len(names), ", ".join(names))
    done: dict[str, T] = {}
    failed: dict[str, str] = {}
    for name in names:
        try:
            done[name] = work(name)
        except Exception as exc:  # the others still run: see the module docstring
            context.log.error("dataset %s failed: %s", name, exc)
            failed[name] = f"{type(exc).__name__}: {exc}"
    if failed:
        raise dg.Failure(
            description=f"{len(failed)} of {len(names)} datasets failed: {', '.join(failed)}",
            metadata={"failed": dg.MetadataValue.json(failed), "succeeded": sorted(done)},
        )
    return done


def materializations(
    reports: Mapping[str, Mapping[str, Report]],
) -> Iterator[dg.MaterializeResult[None]]:
    """One ``MaterializeResult`` per asset key from {dataset: {asset key: report}}."""
    keys: list[str] = []
    for by_key in reports.values():
        keys += [k for k in by_key if k not in keys]
    for key in keys:
        mine = {ds: by_key[key] for ds, by_key in reports.items() if key in by_key}
        if len(mine) == 1:
            (report,) = mine.values()
            yield dg.MaterializeResult(
                asset_key=key, metadata=report.metadata, data_version=report.data_version
            )
        else:
            yield dg.MaterializeResult(
                asset_key=key, metadata=combined({ds: r.metadata for ds, r in mine.items()})
            )


def combined(by_dataset: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Several datasets' metadata as one: counts summed, and a table of each dataset's."""
    columns: list[str] = []
    sums: dict[str, float] = {}
    for meta in by_dataset.values():
        for k, v in meta.items():
            if k in _PER_DATASET or isinstance(v, dg.MetadataValue | bool):
                continue
            if isinstance(v, int | float | str):
                if k not in columns:
                    columns.append(k)
                if isinstance(v, int | float):
                    sums[k] = sums.get(k, 0) + v
    rows = [
        [ds, *(meta.get(c, "") for c in columns)]
        for ds, meta in sorted(by_dataset.items())[:_TABLE_ROWS]
    ]
    out: dict[str, Any] = {
        "datasets": len(by_dataset),
        "by_dataset": dg.MetadataValue.md(markdown_table(["dataset", *columns], rows)),
    }
    for k, total in sums.items():
        if k.startswith("delta_") or k.startswith("reflects_") or k.startswith("built_from_"):
            continue  # versions do not add up
        out[k] = round(total, 3) if isinstance(total, float) else total
    return out


def check_results(
    results: Mapping[str, list[dg.AssetCheckResult]],
) -> Iterator[dg.AssetCheckResult]:
    """One result per check from {dataset: results}: passed only if every dataset passed."""
    if len(results) == 1:
        yield from next(iter(results.values()))
        return
    by_check: dict[str | None, dict[str, dg.AssetCheckResult]] = {}
    for ds, found in results.items():
        for result in found:
            by_check.setdefault(result.check_name, {})[ds] = result
    for name, per_ds in by_check.items():
        failing = sorted(ds for ds, r in per_ds.items() if not r.passed)
        first = next(iter(per_ds.values()))
        meta = combined(
            {
                ds: {
                    "passed": "yes" if r.passed else "no",
                    **{k: v.value for k, v in r.metadata.items() if _scalar(v.value)},
                }
                for ds, r in per_ds.items()
            }
        )
        meta["failing_datasets"] = dg.MetadataValue.json(failing)
        yield dg.AssetCheckResult(
            check_name=name,
            asset_key=first.asset_key,
            passed=not failing,
            severity=first.severity,
            metadata=meta,
        )


def _scalar(value: Any) -> bool:
    return isinstance(value, int | float | str) and not isinstance(value, bool)
