"""Freshness per dataset: the specification's rule as a partitioned asset check.

No ``dg.FreshnessPolicy``: Dagster's time-window policy judges an asset by
its last materialization of any partition, and the daily refresh
materializes only the datasets it finds stale, so on a lake where nothing
changed for a day the policy would mark every export failing although every
dataset is fresh. The check below says what is true per dataset.

- ``fresh``: an asset check **per partition** (dataset) that applies the
  specification's rule (:mod:`lakehouse_assets.freshness`: the export's tag
  is newer than its dependencies' and the journal is empty). It runs after
  each materialization, and the ``freshness_checks`` sensor re-judges every
  few minutes, from the tags alone (no Spark), the datasets whose change
  marker moved and a few others in turn. When a dataset's
  state changed, the sensor asks for one ``freshness_job`` run per tick, which
  records the evaluations of every changed dataset, so a journal write shows
  up as a stale export of that dataset, and a flush as a fresh one again.

Why a run and not the sensor's own ``asset_events``: Dagster stores a
run-less check evaluation with the run id ``""``, and its unique index on
``asset_check_executions`` (asset key, check, run id, partition) then admits
one evaluation per check and partition, ever; the second report of a dataset
failed with an ``IntegrityError`` (SQLite and PostgreSQL alike) and the check
never turned again. Evaluations logged inside a run carry that run's id: any
number of them, one run per tick whatever the number of datasets.
"""

import hashlib
import json
from collections.abc import Iterator
from typing import Any

import dagster as dg

from lakehouse_assets.defs.batch import check_results, for_each_dataset
from lakehouse_assets.defs.partitions import (
    Watch,
    changed_partitions,
    datasets,
    existing_datasets,
)
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

#: Datasets with no announced change re-judged anyway per tick, in turn: every
#: writer the rule reads moves the change marker (tags, the graph index's
#: state), so this only catches hand edits (an export deleted); judging one
#: costs ~15 reads, hence few.
SWEEP = 5

#: asset key → the kind :func:`lakehouse_assets.freshness.freshness` reports it as.
KINDS = {
    "statements_csv": STATEMENTS,
    "entities_ftm_json": ENTITIES,
    "statistics": STATISTICS,
    "index": INDEX,
    "graph": GRAPH,
    "graph_cypher": GRAPH_CYPHER,
}


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


def judged(ds: Dataset) -> dict[str, Freshness | None]:
    """Asset key → the dataset's state under the rule (the graph's only once it was built)."""
    states = freshness(ds)
    return {
        key: states.get(kind)
        for key, kind in KINDS.items()
        if states.get(kind) is not None or kind not in (GRAPH, GRAPH_CYPHER)
    }


def _mark(state: Freshness | None) -> str:
    """What the sensor's cursor keeps of a state: a change of it is reported."""
    return "missing" if state is None else f"{state.fresh}:{state.why}"


class FreshnessReportConfig(dg.Config):
    """The datasets whose freshness changed (named by the ``freshness_checks`` sensor)."""

    datasets: list[str]


@dg.op(
    out={},
    description="Record the `fresh` check of every export, the index and the graph index "
    "of the given datasets, judged now from the lake's tags.",
)
def report_freshness(
    context: dg.OpExecutionContext, config: FreshnessReportConfig, lakehouse: LakehouseResource
) -> Iterator[dg.AssetCheckEvaluation]:
    reported = 0
    for ds in existing_datasets(lakehouse.lake(), config.datasets):
        for key, state in judged(ds).items():
            yield evaluation(ds, key, state)
            reported += 1
    context.log.info("%d evaluations of %d datasets", reported, len(config.datasets))


@dg.job(
    description="Records the `fresh` check of the datasets whose freshness changed "
    "(requested by the `freshness_checks` sensor; reads tags only, no Spark)."
)
def freshness_job() -> None:
    report_freshness()


@dg.sensor(
    name="freshness_checks",
    job=freshness_job,
    minimum_interval_seconds=Settings().freshness_check_interval_seconds,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Judges the exports, index and graph index of each dataset whose change "
    "marker moved (and of a few others in turn) by the specification's freshness rule "
    "(tags only, no Spark) and, when some dataset's state changed, asks for one "
    "`freshness_job` run that records their `fresh` checks.",
)
def freshness_checks(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    lake = lakehouse.lake()
    data = _load_json(context.cursor)
    # an older cursor (dataset/key → state) keeps its states and judges every dataset once
    states = data.get("states") if "watch" in data else data
    seen = {str(k): str(v) for k, v in states.items()} if isinstance(states, dict) else {}
    watch = Watch.load(data.get("watch"))
    before = _cursor(seen, watch)
    changed: list[str] = []
    for ds in list(changed_partitions(context.instance, lake, watch, sweep=SWEEP)):
        marks = {f"{ds.name}/{key}": _mark(state) for key, state in judged(ds).items()}
        if any(seen.get(k) != v for k, v in marks.items()):
            changed.append(ds.name)
            seen.update(marks)
    cursor = _cursor(seen, watch)
    if not changed:
        if cursor == before:
            return dg.SkipReason("no dataset's freshness changed")
        return dg.SensorResult(skip_reason="no dataset's freshness changed", cursor=cursor)
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                # the same states never ask twice (a tick repeated after a crash)
                run_key=hashlib.sha256(cursor.encode()).hexdigest()[:24],
                run_config=dg.RunConfig(
                    ops={"report_freshness": FreshnessReportConfig(datasets=changed)}
                ),
                tags={"lakehouse/datasets": str(len(changed))},
            )
        ],
        cursor=cursor,
    )


def _load_json(raw: str | None) -> dict[str, Any]:
    try:
        data = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def _cursor(states: dict[str, str], watch: Watch) -> str:
    return json.dumps({"states": states, "watch": watch.dump()}, sort_keys=True)


CHECKS = [exports_fresh]
JOBS = [freshness_job]
SENSORS = [freshness_checks]
