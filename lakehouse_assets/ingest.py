"""Bulk ingestion of FtM JSON lines into the journal, validated in parallel.

FollowTheMoney's value cleaning is the expensive part of a bulk write (about
two thirds of the time). Chunks of lines are validated and turned into
journal rows by a pool of spawned worker processes while the main process
inserts the previous chunk, so both cores work; for PostgreSQL the workers
also encode their rows as ``COPY`` input, so the writer only sends bytes.
Order is kept, a few chunks are in flight at a time (memory does not grow
with the input), and the first bad line aborts the bulk: its transaction
rolls back, nothing from that input is committed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, islice
from multiprocessing.pool import AsyncResult
from typing import IO

from lakehouse_assets.entities import InputNotes, entity_statements, parse_line
from lakehouse_assets.journal import Row, Write, bucket_of, statement_row, statements_copy_csv

#: Lines per chunk sent to a worker: big enough to amortise pickling,
#: small enough to keep memory flat and the progress bar moving.
CHUNK_LINES = 2_000
#: Chunks per worker sent ahead of the one the writer takes: enough to keep the
#: workers busy while the writer inserts, few enough that memory stays flat
#: (a chunk and its rows are a few MB) whatever the input's size.
IN_FLIGHT = 3
#: Inputs shorter than this are validated in-process (spawning costs ~1 s).
PARALLEL_AFTER_LINES = 20_000


@dataclass(slots=True)
class Chunk:
    dataset: str
    origin: str
    source: str | None
    seen: str
    first_line: int
    lines: list[bytes]
    #: set when the journal takes ``COPY`` input: the chunk comes back encoded,
    #: its rows stamped with this write
    copy_for: Write | None = None


@dataclass(slots=True)
class ChunkResult:
    #: journal rows (empty when ``copy`` holds them)
    rows: list[Row]
    entities: int
    lines: int
    #: statements in the chunk
    count: int
    #: the rows as :func:`~lakehouse_assets.journal.statements_copy_csv` input
    copy: bytes | None = None
    #: values followthemoney's cleaning dropped, entity fields not kept
    notes: InputNotes | None = None


def convert_chunk(chunk: Chunk) -> ChunkResult:
    """Validate a chunk of lines and build its journal rows (runs in workers)."""
    grouped = []
    notes = InputNotes()
    for offset, raw in enumerate(chunk.lines):
        proxy = parse_line(
            raw,
            dataset=chunk.dataset,
            source=chunk.source,
            lineno=chunk.first_line + offset,
            notes=notes,
        )
        if proxy is None:
            continue
        stmts = entity_statements(
            proxy, dataset=chunk.dataset, origin=chunk.origin, seen=chunk.seen, notes=notes
        )
        grouped.append((bucket_of(stmts[0].canonical_id), stmts))
    count = sum(len(stmts) for _, stmts in grouped)
    if chunk.copy_for is not None:
        data = statements_copy_csv(
            grouped, dataset=chunk.dataset, origin=chunk.origin, write=chunk.copy_for
        )
        return ChunkResult([], len(grouped), len(chunk.lines), count, data, notes)
    rows = [
        statement_row(s, chunk.dataset, chunk.origin, bucket=bucket)
        for bucket, stmts in grouped
        for s in stmts
    ]
    return ChunkResult(rows, len(grouped), len(chunk.lines), count, notes=notes)


def _chunks(
    fh: IO[bytes] | Iterable[bytes], make: Callable[[int, list[bytes]], Chunk]
) -> Iterator[Chunk]:
    it = iter(fh)
    line = 1
    while batch := list(islice(it, CHUNK_LINES)):
        yield make(line, batch)
        line += len(batch)


def convert_lines(
    fh: IO[bytes] | Iterable[bytes],
    *,
    dataset: str,
    origin: str,
    source: str | None,
    seen: str,
    workers: int | None = None,
    copy_for: Write | None = None,
) -> Iterator[ChunkResult]:
    """Journal rows for FtM JSON lines, chunk by chunk, in input order
    (encoded as ``COPY`` input, stamped with ``copy_for``, when it is given)."""

    def make(first: int, lines: list[bytes]) -> Chunk:
        return Chunk(dataset, origin, source, seen, first, lines, copy_for)

    chunks = _chunks(fh, make)
    head = list(islice(chunks, PARALLEL_AFTER_LINES // CHUNK_LINES))
    workers = workers if workers is not None else min(os.cpu_count() or 1, 4)
    if len(head) < PARALLEL_AFTER_LINES // CHUNK_LINES or workers <= 1:
        for chunk in head:
            yield convert_chunk(chunk)
        for chunk in chunks:
            yield convert_chunk(chunk)
        return
    # spawn, not fork: delta-rs and threads in the parent must not be forked.
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        # At most IN_FLIGHT chunks sent and not yet taken, in order. (Pool.imap
        # reads its whole input ahead on a thread: a 10M-statement file was
        # held in memory, 2.2 GB.)
        pending: deque[AsyncResult[ChunkResult]] = deque()
        for chunk in chain(head, chunks):
            pending.append(pool.apply_async(convert_chunk, (chunk,)))
            if len(pending) >= IN_FLIGHT * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()
