"""A flush batch's journal rows read, reduced and staged, a range of buckets each.

The unit of a flush's read (step 2-3 of :mod:`lakehouse_assets.flush`): open the
journal, read one bucket range's claimed rows straight into Arrow, reduce them
to one row per statement (:func:`.reduce.reduce_events`), write them as one
Parquet file in the run's staging area of the lake, and answer only what was
staged. A statement's events share its bucket, so ranges need nothing of
each other.

Two kinds of process run it: Spark's Python workers (the journal as a Spark
data source, :mod:`.spark.journal_source`, for a batch that Spark then joins
with stored rows), and worker processes this module spawns
(:func:`stage_batch`), for a batch into buckets neither table holds a file of
(a first build): every statement of such a batch is new, the driver writes
them as they are, and no Spark job follows, so a JVM started only to read
the journal cost its start (about 5 s) and Python workers for nothing.

A SQLite journal is read by DuckDB's SQLite reader, several times faster than
Python's rows. It must run in a process that holds no other SQLite connection
to the journal (two SQLite libraries in one process drop each other's file
locks): both kinds of worker are such processes; the driver, which holds the
claim's connection, is not. The workers are spawned, not forked: delta-rs
(and DuckDB) must not run in a forked child.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lakehouse_assets.journal_duckdb import read_sqlite_natively, sqlite_path
from lakehouse_assets.reduce import reduce_events
from lakehouse_assets.tables.spark_io import stage_table

if TYPE_CHECKING:
    from lakehouse_assets.journal import Claim, Journal

_journals: dict[str, Journal] = {}


def _journal(url: str) -> Journal:
    """One journal (engine) per worker process and URL."""
    from lakehouse_assets.journal import Journal

    if url not in _journals:
        _journals[url] = Journal(url)
    return _journals[url]


def stage_range(
    url: str,
    claim: Claim,
    low: int,
    high: int,
    staging_uri: str,
    storage: dict[str, str],
) -> dict[str, Any] | None:
    """Read, reduce and stage the claimed rows of buckets ``low..high``: the staged
    file's ``uri``, ``path``, ``size``, its ``rows``, how many are tombstones
    (``deleted``) and the CPU seconds it took (``cpu``); None when the range
    holds no claimed row. Run it only in a
    process that holds no other connection to a SQLite journal (module docstring)."""
    import time

    cpu = time.process_time()
    path = sqlite_path(url)
    if path is not None:
        events = read_sqlite_natively(path, claim, low, high)
    else:
        events = _journal(url).read_claimed(claim, [low, high])
    if events.num_rows == 0:
        return None
    reduced = reduce_events(events)
    del events
    staged = stage_table(reduced, staging_uri, storage, "reduced")
    rows = reduced.num_rows
    deleted = rows - reduced.column("deleted_at").null_count
    del reduced
    # a worker lives on for the next range, and Arrow's allocator (and C's,
    # under DuckDB's result) would keep this one's peak: hundreds of MB
    release_memory()
    return {
        "uri": staged.uri,
        "path": staged.path,
        "size": staged.size,
        "rows": rows,
        "deleted": deleted,
        "cpu": time.process_time() - cpu,
    }


def release_memory() -> None:
    """Hand freed memory back to the system: Arrow's pool and glibc's heap."""
    import contextlib
    import ctypes
    import ctypes.util

    pa.default_memory_pool().release_unused()
    name = ctypes.util.find_library("c")
    if name:
        with contextlib.suppress(OSError, AttributeError):  # not glibc
            ctypes.CDLL(name).malloc_trim(0)


def _stage_in_worker(
    url: str,
    claim: dict[str, Any],
    low: int,
    high: int,
    staging_uri: str,
    storage: dict[str, str],
) -> dict[str, Any] | None:
    from lakehouse_assets.journal import Claim

    return stage_range(url, Claim(**claim), low, high, staging_uri, storage)


@contextmanager
def workers(count: int | None = None) -> Iterator[Executor]:
    """Worker processes for :func:`stage_batch` (one per core unless ``count``),
    spawned on first use and stopped on exit."""
    size = max(1, count or os.cpu_count() or 1)
    pool = ProcessPoolExecutor(max_workers=size, mp_context=multiprocessing.get_context("spawn"))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def stage_batch(
    pool: Executor,
    url: str,
    claim: Claim,
    ranges: Sequence[Sequence[int]],
    staging_uri: str,
    storage: dict[str, str],
) -> list[dict[str, Any]]:
    """:func:`stage_range` of each bucket range in ``pool``'s processes; what was
    staged, in the ranges' order (so in bucket order), ranges without rows left out."""
    futures = [
        pool.submit(
            _stage_in_worker, url, asdict(claim), int(low), int(high), staging_uri, dict(storage)
        )
        for low, high in ranges
    ]
    staged = [f.result() for f in futures]
    return [s for s in staged if s is not None]
