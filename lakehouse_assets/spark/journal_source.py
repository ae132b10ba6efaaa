"""The journal as a Spark data source: Spark's tasks read and reduce it in parallel.

A flush batch is a range of buckets with known row counts. This source cuts
it into ranges of about equal size, one input partition each; every task
opens the journal itself (SQLite file or PostgreSQL), reads its claimed rows
straight into Arrow, reduces them to one row per statement and writes them as
a Parquet file into the run's staging area in the lake, answering only (path,
rows) (:func:`.journal_stage.stage_range`, which a first build's flush runs
in worker processes of its own, without Spark). The
rows never pass through the driver, every core reads, and Spark then scans
the staged files with its own reader (cheaper than caching rows that came
from Python). A statement's events all share its bucket, so no reduce needs
rows of another task.

It needs tasks that reach the journal: the local Spark (in process or the
local Connect server) always does; a cluster needs a PostgreSQL journal it
can reach (:func:`reachable`). Otherwise (a SQLite journal on a cluster)
flush reads the claimed rows on the driver, reduces them and hands them to
the executors as Parquet in the lake's staging area.

The journal URL travels as a data source option named ``journal_url``:
Spark redacts options whose name matches ``url`` in plans and logs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from lakehouse_assets.journal import Claim
    from lakehouse_assets.settings import Settings
    from lakehouse_assets.tables.snapshot import DataFile

SOURCE_NAME = "lakehouse_journal"


class _Range(InputPartition):
    def __init__(self, low: int, high: int) -> None:
        super().__init__((low, high))
        self.low = low
        self.high = high


class JournalReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.url = options["journal_url"]
        self.claim = json.loads(options["claim"])
        self.ranges: list[list[int]] = json.loads(options["ranges"])
        self.staging = options["staging"]
        self.storage: dict[str, str] = json.loads(options.get("storage", "{}"))

    def partitions(self) -> Sequence[InputPartition]:
        return [_Range(low, high) for low, high in self.ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from lakehouse_assets.journal import Claim
        from lakehouse_assets.journal_stage import stage_range

        assert isinstance(partition, _Range)
        # a Python worker of Spark's holds no other connection to a SQLite journal
        staged = stage_range(
            self.url,
            Claim(**self.claim),
            partition.low,
            partition.high,
            self.staging,
            self.storage,
        )
        if staged is not None:
            yield pa.RecordBatch.from_pydict({k: [staged[k]] for k in STAGED_COLUMNS})


class JournalSource(DataSource):
    """``spark.read.format("lakehouse_journal")``: stage the reduced claimed rows of a
    batch; one row (uri, path, size, rows, deleted) per staged file."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:  # pragma: no cover - always given explicitly
        raise ValueError("lakehouse_journal needs an explicit schema")

    def reader(self, schema: StructType) -> DataSourceReader:
        return JournalReader(dict(self.options))


_registered: set[int] = set()


def balanced_ranges(buckets: Sequence[tuple[int, int]], parts: int) -> list[list[int]]:
    """Cut (bucket, rows) into at most ``parts`` consecutive bucket ranges of similar rows."""
    total = sum(rows for _, rows in buckets)
    target = max(1, -(-total // max(1, parts)))
    ranges: list[list[int]] = []
    size = 0
    for bucket, rows in buckets:
        if not ranges or (size >= target and len(ranges) < parts):
            ranges.append([bucket, bucket])
            size = 0
        ranges[-1][1] = bucket
        size += rows
    return ranges


def reachable(journal_url: str, spark: SparkSession, settings: Settings) -> bool:
    """Whether Spark's tasks can open this journal themselves: a PostgreSQL journal
    always (by its network address), a SQLite file only when the tasks run on this
    machine (:func:`~lakehouse_assets.spark.session.runs_elsewhere`)."""
    from lakehouse_assets.spark.session import runs_elsewhere

    return not journal_url.startswith("sqlite") or not runs_elsewhere(spark, settings)


#: What the source answers: one row per staged file (``deleted``: its tombstones).
STAGED_SCHEMA = "uri string, path string, size long, rows long, deleted long"
STAGED_COLUMNS = ("uri", "path", "size", "rows", "deleted")


def journal_frame(
    spark: SparkSession,
    journal_url: str,
    claim: Claim,
    buckets: Sequence[tuple[int, int]],
    parts: int,
    *,
    staging_uri: str,
    storage_options: dict[str, str],
) -> tuple[DataFrame, int, int, list[DataFile]]:
    """The reduced claimed rows of ``buckets`` (bucket, rows) as a DataFrame over
    Parquet files staged by Spark's tasks, how many rows they hold, how many
    of those are tombstones, and the staged files (the driver reads a batch's
    keys from them without a Spark job)."""
    from dataclasses import asdict

    from lakehouse_assets.reduce import REDUCED_SCHEMA
    from lakehouse_assets.tables.snapshot import DataFile
    from lakehouse_assets.tables.spark_io import read_snapshot

    key = id(spark)
    if key not in _registered:
        spark.dataSource.register(JournalSource)
        _registered.add(key)
    options: dict[str, Any] = {
        "journal_url": journal_url,
        "claim": json.dumps(asdict(claim)),
        "ranges": json.dumps(balanced_ranges(buckets, parts)),
        "staging": staging_uri,
        "storage": json.dumps(storage_options),
    }
    staged = (
        spark.read.format(SOURCE_NAME).schema(STAGED_SCHEMA).options(**options).load().collect()
    )
    files = [DataFile(r["uri"], r["path"], int(r["size"]), {}, None, None) for r in staged]
    frame = read_snapshot(spark, files, REDUCED_SCHEMA, storage_options)
    rows, deleted = sum(int(r["rows"]) for r in staged), sum(int(r["deleted"]) for r in staged)
    return frame, rows, deleted, files
