"""Freshness, twice: Dagster's per asset, the specification's per dataset.

- ``POLICY`` (``dg.FreshnessPolicy.time_window``) on the exports, the index and
  the graph index: the UI marks an asset failing when it was not materialized
  for ``LAKEHOUSE_FRESHNESS_HOURS`` (26 h: the daily refresh materializes every
  dataset each day, fresh exports included). Dagster judges this per asset,
  not per dataset.
- ``exports_fresh``: an asset check **per partition** (dataset) that applies the
  specification's rule (:mod:`lakehouse_assets.freshness`: the export's tag
  is newer than its dependencies' and the journal is empty). It runs after
  each materialization, and the ``freshness_checks`` sensor re-judges every
  dataset every few minutes from the tags alone (no run, no Spark), reporting
  an evaluation only when a dataset's state changed, so a journal write shows
  up as a stale export of that dataset at once.
"""

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import dagster as dg

from lakehouse_assets.defs.batch import check_results, for_each_dataset
from lakehouse_assets.defs.partitions import datasets, partition_datasets
from lakehouse_assets.defs.resources import LakehouseResource
from lakehouse_assets.freshness import (
    ENTITIES,
    GRAPH,
    GRAPH_CYPHER,
    INDEX,
    STATEMENTS,
    STATISTICS,
    Freshness,
    freshness,
)
from lakehouse_assets.lake import Dataset
from lakehouse_assets.settings import Settings

CHECK = "fresh"

#: asset key → the kind :func:`lakehouse_assets.freshness.freshness` reports it as.
KINDS = {
    "statements_csv": STATEMENTS,
    "entities_ftm_json": ENTITIES,
    "statistics": STATISTICS,
    "index": INDEX,
    "graph": GRAPH,
    "graph_cypher": GRAPH_CYPHER,
}


def policy(settings: Settings | None = None) -> dg.FreshnessPolicy:
    hours = (settings or Settings()).freshness_hours
    return dg.FreshnessPolicy.time_window(
        fail_window=timedelta(hours=hours), warn_window=timedelta(hours=hours * 0.75)
    )


POLICY = policy()


def evaluation(ds: Dataset, key: str, state: Freshness | None) -> dg.AssetCheckEvaluation:
    """The check's evaluation for one dataset and asset (WARN when stale: work is due)."""
    return dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(key),
        check_name=CHECK,
        passed=state is not None and state.fresh,
        partition=ds.name,
        severity=dg.AssetCheckSeverity.WARN,
        metadata=_metadata(state),
        description=None if state is None else state.why,
    )


def _metadata(state: Freshness | None) -> dict[str, Any]:
    if state is None:
        return {"why": "not built yet"}
    meta: dict[str, Any] = {"why": state.why, "path": state.path}
    if state.stamp is not None:
        meta["stamp"] = dg.MetadataValue.timestamp(state.stamp)
    return meta


@dg.multi_asset_check(
    specs=[
        dg.AssetCheckSpec(
            CHECK,
            asset=key,
            partitions_def=datasets,
            description="The specification's freshness rule for this dataset: the file is "
            "newer than everything it depends on and the journal holds no unflushed row "
            "(re-judged every few minutes by the `freshness_checks` sensor).",
        )
        for key in KINDS
    ],
    can_subset=True,
)
def exports_fresh(
    context: dg.AssetCheckExecutionContext, lakehouse: LakehouseResource
) -> Iterator[dg.AssetCheckResult]:
    selected = {k.asset_key.to_user_string() for k in context.selected_asset_check_keys}

    def one(name: str) -> list[dg.AssetCheckResult]:
        ds = lakehouse.dataset(name)
        states = freshness(ds)
        return [
            dg.AssetCheckResult(
                asset_key=key,
                check_name=CHECK,
                passed=(state := states.get(kind)) is not None and state.fresh,
                severity=dg.AssetCheckSeverity.WARN,
                metadata=_metadata(state),
            )
            for key, kind in KINDS.items()
            if key in selected
        ]

    yield from check_results(for_each_dataset(context, one))


@dg.sensor(
    name="freshness_checks",
    minimum_interval_seconds=Settings().freshness_check_interval_seconds,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Judges every dataset's exports, index and graph index by the "
    "specification's freshness rule and reports the `fresh` check per dataset when it "
    "changed (tags only: no run, no Spark).",
)
def freshness_checks(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    lake = lakehouse.lake()
    try:
        seen: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    except json.JSONDecodeError:
        seen = {}
    events: list[dg.AssetCheckEvaluation] = []
    for ds in partition_datasets(context.instance, lake):
        name = ds.name
        states = freshness(ds)
        for key, kind in KINDS.items():
            state = states.get(kind)
            if state is None and kind in (GRAPH, GRAPH_CYPHER):
                continue  # no graph index yet: nothing to judge
            mark = "missing" if state is None else f"{state.fresh}:{state.why}"
            if seen.get(f"{name}/{key}") != mark:
                seen[f"{name}/{key}"] = mark
                events.append(evaluation(ds, key, state))
    if not events:
        return dg.SkipReason("no dataset's freshness changed")
    return dg.SensorResult(asset_events=events, cursor=json.dumps(seen, sort_keys=True))


CHECKS = [exports_fresh]
SENSORS = [freshness_checks]
