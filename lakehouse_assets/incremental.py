"""Incremental exports: statements.csv, entities.ftm.json and statistics.json of a
new snapshot from those of the last export plus the change feed.

The full export (:mod:`.exports`) writes both files sorted by ``canonical_id``
and leaves a state next to them (``exports/_state``, :class:`ExportState`):
the translog version it was built from, the files' sizes and checksums, one
row per entity with the bytes of its lines in each file and its contribution
to the statistics, and the statistics as mergeable aggregates (counts, with
the dates as multisets, so a deleted entity's contribution can be taken off).

A later export asks the change feed (:mod:`.tables.feed`) which entities
changed since that version. With an answer (no gap), only those entities'
live statements are read (point reads by canonical id, :func:`.query.live_statements`)
and turned into CSV lines, entity lines and statistics contributions by the
same Spark SQL as the full pass (:mod:`.spark.ftm_sql`). The new files are
the old ones with those entities' byte ranges replaced, deleted or inserted
in ``canonical_id`` order: the unchanged bytes are copied in one sequential
read of the old file (which is hashed on the way and must match the state,
or the export falls back to its full path). Statistics are the aggregates
minus the old contributions of the changed entities plus their new ones.
Nothing of an unchanged entity is re-sorted or re-aggregated.

The result is byte for byte what the full pass writes for the same snapshot
(the property test ``test_properties_incremental.py`` checks it after random
sequences of writes, deletes, flushes, compactions and optimizes).

Crash safety: the new files are built in the run's staging area and each
replaces its target atomically; the state is written last. A crash in
between leaves files that no longer match the state's checksums, so the
next export takes the full path.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import queue
import stat
import sys
import tempfile
import threading
from bisect import bisect_left
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lakehouse_assets import conventions as cv
from lakehouse_assets import export_duckdb, faults, progress, staging
from lakehouse_assets.entity_lines import entity_rows
from lakehouse_assets.errors import ExportMemoryError
from lakehouse_assets.export_state import (
    INDEX_SCHEMA,
    SPARK_INDEX_COLUMNS,
    ExportState,
    Trusted,
    _untrusted,
    write_statistics,
)
from lakehouse_assets.freshness import ENTITIES as ENTITIES_KIND
from lakehouse_assets.freshness import STATEMENTS as STATEMENTS_KIND
from lakehouse_assets.freshness import STATISTICS as STATISTICS_KIND
from lakehouse_assets.preload import preload
from lakehouse_assets.query import SORT, csv_header, live_statements
from lakehouse_assets.spark import ftm_sql
from lakehouse_assets.storage import LocalStore
from lakehouse_assets.tables.feed import Changes, changes_between
from lakehouse_assets.tables.schemas import STATEMENTS_PARTITION
from lakehouse_assets.tables.snapshot import DatasetSnapshot

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from lakehouse_assets.context import DatasetContext

log = logging.getLogger(__name__)

#: Above this share of the entities changed, the full pass is the cheaper one
#: (for datasets of at least :data:`SHARE_FROM` entities: below, both are quick).
MAX_CHANGED_SHARE = 0.3
SHARE_FROM = 10_000
#: Chunk of a sequential copy.
CHUNK = 8 * 1024 * 1024

#: the kinds an incremental pass writes, always together
ALL_THREE = frozenset({STATEMENTS_KIND, ENTITIES_KIND, STATISTICS_KIND})


class StateMismatch(Exception):
    """An export file is not the one the state describes (full path instead)."""


class LineLengths:
    """The byte length (``\n`` included) of each line of a file fed chunk by chunk
    (8 bytes a line kept, not the file)."""

    def __init__(self) -> None:
        self._ends: list[np.ndarray[Any, Any]] = []
        self._offset = 0

    def feed(self, chunk: bytes) -> None:
        found = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10)
        self._ends.append(found.astype(np.int64) + self._offset + 1)
        self._offset += len(chunk)

    def lengths(self) -> np.ndarray[Any, Any]:
        stops = np.concatenate(self._ends) if self._ends else np.zeros(0, np.int64)
        return np.diff(np.concatenate([np.zeros(1, np.int64), stops])).astype(np.int64)


# --- the incremental pass -----------------------------------------------------------------


@dataclass
class Refreshed:
    """What an incremental pass wrote, per kind, and what it touched."""

    written: dict[str, dict[str, Any]]
    entities_touched: int
    bytes_carried: int
    #: the changed entities' entities.ftm.json lines before and after (None: too many)
    lines: ChangedLines | None = None


#: An incremental export keeps the old entities.ftm.json lines of at most this
#: many changed entities for the version's diff (a larger change: the diff reads
#: the tables, as after a full pass).
DIFF_LINES = 100_000


class ChangedLines(NamedTuple):
    """The entities.ftm.json lines (without line ends) of the entities a change
    touched, in the export of ``since`` and of ``until`` (snapshot versions):
    the version's diff between the two, with nothing built again."""

    since: tuple[int | None, int | None]
    until: tuple[int | None, int | None]
    #: canonical id → its line before (absent: the entity was not live)
    before: dict[str, bytes]
    #: canonical id → its line after (absent: the entity is not live any more)
    after: dict[str, bytes]
    #: the canonical ids the change touched
    entities: tuple[str, ...] = ()


def _entity_lines(
    index: pa.Table,
    dropped: Sequence[int],
    old_bytes: bytes,
    rows: pa.Table,
    state: ExportState,
    snapshot: DatasetSnapshot,
) -> ChangedLines:
    """Cut the dropped entities' old bytes into their lines; the new lines from ``rows``."""
    ids = index.column("canonical_id")
    lengths = index.column("json_bytes")
    before: dict[str, bytes] = {}
    at = 0
    for row in dropped:
        size = lengths[row].as_py()
        before[ids[row].as_py()] = old_bytes[at : at + size].rstrip(b"\n")
        at += size
    if at != len(old_bytes):
        raise StateMismatch("the replaced entities' lines are not the bytes the state says")
    after = {
        cid: line.encode("utf-8").rstrip(b"\n")
        for cid, line in zip(
            rows.column("canonical_id").to_pylist(), rows.column("json").to_pylist(), strict=True
        )
    }
    since, until = state.snapshot, snapshot.versions
    return ChangedLines((since[0], since[1]), (until[0], until[1]), before, after)


def _changed_rows(
    ds: DatasetContext, snapshot: DatasetSnapshot, entity_ids: Sequence[str], staging_uri: str
) -> pa.Table:
    """Lines and contributions of the changed entities that are still live
    (:data:`INDEX_SCHEMA` plus ``csv`` and ``json`` text), sorted by canonical id:
    made in Python for a change of at most ``export_driver_statements`` live
    statements (:mod:`.entity_lines`), by DuckDB otherwise (:mod:`.export_duckdb`),
    or by Spark where ``export_engine`` says so."""

    if not entity_ids:  # (no ids would make live_statements read every entity)
        return _empty_rows()
    live = live_statements(ds, entity_ids=list(entity_ids), snapshot=snapshot)
    if live.num_rows == 0:
        return _empty_rows()
    origins = {f.partition_values.get(STATEMENTS_PARTITION) for f in snapshot.statements.files}
    if live.num_rows <= ds.settings.export_driver_statements:
        rows = entity_rows(live, origins=len(origins), columns=SPARK_INDEX_COLUMNS)
    else:
        rows = None
        if ds.settings.export_engine != "spark":
            # the changed statements are in this process already: DuckDB, not a Spark job
            try:
                rows = export_duckdb.entity_rows(
                    live, origins=len(origins), settings=ds.settings, dataset=ds.name
                )
            except ExportMemoryError as exc:
                if ds.settings.export_engine != "auto":
                    raise
                log.warning("%s; the changed entities' lines go to Spark", exc)
        if rows is None:
            rows = _changed_rows_spark(ds, live, len(origins), staging_uri)
    json_bytes = pc.binary_length(pc.cast(rows.column("json"), pa.binary()))
    rows = rows.append_column("json_bytes", pc.cast(json_bytes, pa.int64()))
    return rows.select(ROWS_SCHEMA.names).cast(ROWS_SCHEMA)


def _changed_rows_spark(
    ds: DatasetContext, live: pa.Table, origins: int, staging_uri: str
) -> pa.Table:
    """:func:`.entity_lines.entity_rows` by the full pass's Spark SQL, for a change
    too large for the driver."""
    from pyspark.sql import functions as F

    from lakehouse_assets.spark.session import get_spark
    from lakehouse_assets.tables.spark_io import arrow_frame

    spark = get_spark(ds.settings)
    options = dict(ds.statements_table.storage_options)
    frame = arrow_frame(spark, live, staging_uri, options).coalesce(1)
    ordered = ftm_sql.dedupe(frame, origins=origins).persist()
    cached: list[DataFrame] = [ordered]
    try:
        # an entity's lines in export order: (prop, value, origin, id) within it
        line = F.struct(*[F.col(c) for c in SORT[1:]], ftm_sql.csv_line())
        csv = (
            ordered.select("canonical_id", line.alias("s"))
            .groupBy("canonical_id")
            .agg(F.array_sort(F.collect_list("s")).alias("lines"))
            .select(
                "canonical_id",
                F.concat(
                    F.array_join(F.expr("transform(lines, x -> x.line)"), "\n"), F.lit("\n")
                ).alias("csv"),
            )
            .toArrow()
        )
        entities = (
            ftm_sql.entity_frame(ordered, csv_bytes=True)
            .withColumn("pick", F.col("_pick_names").isNotNull().cast("long"))
            .persist()
        )
        cached.append(entities)
        picks = entities.where(F.col("pick") == 1).count()
        captioned = ftm_sql.with_caption(entities, picks=picks)
        rows = captioned.select(
            *SPARK_INDEX_COLUMNS, F.concat(ftm_sql.entity_json(), F.lit("\n")).alias("json")
        ).toArrow()
    finally:
        for frame_ in reversed(cached):
            frame_.unpersist()
    # both one row per entity of the same statements: side by side once sorted
    rows, csv = rows.sort_by("canonical_id"), csv.sort_by("canonical_id")
    if rows.column("canonical_id") != csv.column("canonical_id"):
        raise AssertionError("the entities and their CSV lines differ in their entities")
    return rows.append_column("csv", csv.column("csv"))


#: The changed entities' rows: the index's columns and their lines.
ROWS_SCHEMA = pa.schema(
    [*INDEX_SCHEMA, pa.field("csv", pa.string()), pa.field("json", pa.string())]
)


def _empty_rows() -> pa.Table:
    return ROWS_SCHEMA.empty_table()


@dataclass
class _Plan:
    """The new files as a sequence of old entity ranges and new entities."""

    #: ("old", first, stop) over the old index's rows, or ("new", row, 0) of the new rows
    steps: list[tuple[str, int, int]]
    #: old index rows replaced or deleted
    dropped: list[int]


def _plan(old_ids: Sequence[str], changed: Sequence[str], new_ids: Sequence[str]) -> _Plan:
    """Walk the changed ids in order against the old index (binary search each)."""
    new_at = {cid: row for row, cid in enumerate(new_ids)}
    steps: list[tuple[str, int, int]] = []
    dropped: list[int] = []
    position = 0
    for cid in changed:
        at = bisect_left(old_ids, cid, lo=position)
        if at > position:
            steps.append(("old", position, at))
        if at < len(old_ids) and old_ids[at] == cid:
            dropped.append(at)
            at += 1
        if cid in new_at:
            steps.append(("new", new_at[cid], 0))
        position = at
    if position < len(old_ids):
        steps.append(("old", position, len(old_ids)))
    return _Plan(steps, dropped)


class _Hashing:
    """A digest computed in a thread of its own, fed the chunks in order.

    hashlib lets go of the GIL while it hashes, so a splice's three digests
    (the old file's SHA-256, the new file's SHA-256 and SHA-1) run side by side
    rather than one after another in the splice's thread: at 10M statements
    the 2.7 GB statements.csv's thread hashed 8 GB alone while the other
    file's was long done. A few chunks wait at most (memory)."""

    def __init__(self, name: str) -> None:
        self._digest = hashlib.new(name, usedforsecurity=False)
        self._error: BaseException | None = None
        self._chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=3)
        self._thread = threading.Thread(target=self._run, name=f"hash-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._chunks.get()) is not None:
            if self._error is None:
                try:
                    self._digest.update(chunk)
                except BaseException as exc:  # kept taking chunks: the feeder never blocks
                    self._error = exc

    def update(self, data: bytes) -> None:
        self._chunks.put(data)

    def close(self) -> None:
        """Wait for the chunks given so far (idempotent)."""
        if self._thread.is_alive():
            self._chunks.put(None)
            self._thread.join()

    def hexdigest(self) -> str:
        self.close()
        if self._error is not None:
            raise self._error
        return self._digest.hexdigest()


class _Both:
    """SHA-256 and SHA-1 of the bytes written (the new file's two checksums)."""

    def __init__(self) -> None:
        self.sha256 = _Hashing("sha256")
        self.sha1 = _Hashing("sha1")

    def update(self, data: bytes) -> None:
        self.sha256.update(data)
        self.sha1.update(data)

    def close(self) -> None:
        self.sha256.close()
        self.sha1.close()

    def hexdigest(self) -> str:
        return self.sha256.hexdigest()


class _NewFile:
    """The new file of a splice: new lines written, the old file's carried bytes
    copied by the kernel (``copy_file_range``) where the old file is a local file.

    The carried bytes are read anyway, to hash them, and reads from the page
    cache are fast; a write of them from Python was not: at 10M statements the
    2.7 GB statements.csv took 8-10 s to write from Python against about 1 s
    by ``copy_file_range`` on the same disk (benchmarks/small_change.py)."""

    def __init__(self, out: IO[bytes], src: IO[bytes]) -> None:
        self.out = out
        self.src_fd: int | None = None
        if isinstance(src, io.BufferedReader) and hasattr(os, "copy_file_range"):
            with contextlib.suppress(OSError, ValueError):
                if stat.S_ISREG(os.fstat(src.fileno()).st_mode):
                    self.src_fd = src.fileno()

    def write(self, data: bytes) -> None:
        self.out.write(data)

    def carry(self, chunk: bytes, at: int) -> None:
        """Append ``chunk``, the old file's bytes from offset ``at``."""
        if self.src_fd is not None:
            self.out.flush()
            end = self.out.tell()
            try:
                done = 0
                while done < len(chunk):
                    moved = os.copy_file_range(
                        self.src_fd, self.out.fileno(), len(chunk) - done, at + done, end + done
                    )
                    if moved <= 0:
                        raise OSError("copy_file_range copied nothing")
                    done += moved
            except OSError:  # (another file system, an old kernel): written from here on
                self.src_fd = None
                self.out.seek(end)
            else:
                self.out.seek(end + len(chunk))
                return
        self.out.write(chunk)


def _pump(
    src: IO[bytes],
    length: int,
    old: Any,
    out: _NewFile | None = None,
    new: Any = None,
    *,
    at: int = 0,
    keep: list[bytes] | None = None,
) -> None:
    """Move ``length`` bytes on in ``src`` from its offset ``at`` (hashing them as
    the old file's), carrying them to ``out`` (hashing them as the new file's)
    when given, or keeping them in ``keep``."""
    while length > 0:
        chunk = src.read(min(CHUNK, length))
        if not chunk:
            raise StateMismatch("the file is shorter than its state says")
        old.update(chunk)
        if out is not None:
            out.carry(chunk, at)
            new.update(chunk)
        if keep is not None:
            keep.append(chunk)
        length -= len(chunk)
        at += len(chunk)


def _splice(
    ds: DatasetContext,
    path: str,
    described: dict[str, Any],
    head: int,
    lengths: np.ndarray[Any, Any],
    plan: _Plan,
    texts: Sequence[str],
    tmp: Path,
    dropped: list[bytes] | None = None,
) -> tuple[int, str, int, str]:
    """Write the new file to ``tmp`` from the old one at ``path`` and the new lines;
    return its size, SHA-256, the bytes carried over from the old file and its
    SHA-1 (index.json's resource checksum, what yente compares). With
    ``dropped``, the old file's bytes of the replaced and deleted entities are
    kept there, in file order.

    The old file is read once, front to back, and must hash to ``described``."""
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]) + head
    carried = 0
    with (
        _digests() as (old_digest, new_digest),
        ds.store.open_read(cv.dataset_path(ds.name, path)) as src,
        open(tmp, "wb") as file,
    ):
        out = _NewFile(file, src)
        position = 0
        if head:
            _pump(src, head, old_digest, out, new_digest)
            position = head
            carried += head
        for kind, first, stop in plan.steps:
            if kind == "new":
                data = texts[first].encode("utf-8")
                out.write(data)
                new_digest.update(data)
                continue
            start, end = int(offsets[first]), int(offsets[stop])
            _pump(src, start - position, old_digest, keep=dropped)  # replaced or deleted
            _pump(src, end - start, old_digest, out, new_digest, at=start)
            carried += end - start
            position = end
        while chunk := src.read(CHUNK):  # (entities replaced or deleted at the end)
            old_digest.update(chunk)
            position += len(chunk)
            if dropped is not None:
                dropped.append(chunk)
        file.flush()
        size = file.tell()
        old_sha256, new_sha256, new_sha1 = (
            old_digest.hexdigest(),
            new_digest.hexdigest(),
            new_digest.sha1.hexdigest(),
        )
    if position != described["size"] or old_sha256 != described["sha256"]:
        raise StateMismatch(f"{path} is not the file the export state describes")
    return size, new_sha256, carried, new_sha1


@contextlib.contextmanager
def _digests() -> Iterator[tuple[_Hashing, _Both]]:
    """A splice's digests: the old file's SHA-256, the new file's two; their
    threads end with the block, whatever happened in it."""
    old, new = _Hashing("sha256"), _Both()
    try:
        yield old, new
    finally:
        old.close()
        new.close()


def refresh(
    ds: DatasetContext, snapshot: DatasetSnapshot, state: ExportState, changes: Changes
) -> Refreshed:
    """The three exports of ``snapshot`` from the state's and the change (module docstring).

    Raises :class:`StateMismatch` when a file is not the one the state
    describes; nothing is replaced then."""
    step = progress.Steps(log, f"export {ds.name} (incremental)")
    for kind in (STATEMENTS_KIND, ENTITIES_KIND):
        described = state.files.get(kind) or {}
        full = cv.dataset_path(ds.name, described.get("path", ""))
        if not described.get("path") or not ds.store.exists(full):
            raise StateMismatch(f"{kind}: no file as the export state describes")
        if ds.store.size(full) != described.get("size"):
            raise StateMismatch(f"{described['path']} has another size than its state says")
    staging_rel = staging.new_area(ds, "export")
    staging_uri = ds.store.full_uri(staging_rel)
    try:
        index = state.index(ds)
        rows = _changed_rows(ds, snapshot, changes.entities, staging_uri)
        step("%d changed entities, %d still live: lines made", len(changes.entities), rows.num_rows)
        if "ftmq.model.stats" not in sys.modules:  # the statistics need it after the splice,
            preload("ftmq.model.stats")  # whose reads and hashes leave the GIL free
        faults.point("export.after_parts")  # as in the full pass: lines made, nothing replaced
        old_ids = index.column("canonical_id").to_pylist()
        new_ids = rows.column("canonical_id").to_pylist()
        plan = _plan(old_ids, changes.entities, new_ids)
        store = ds.store
        tmp_dir = (
            store.local_path(staging_rel)
            if isinstance(store, LocalStore)
            else staging.scratch_dir(ds.settings)
        )
        tmp_dir.mkdir(parents=True, exist_ok=True)
        header = csv_header()
        made: dict[str, tuple[Path, int, str, int, str]] = {}
        carried = 0
        # the changed entities' old lines, for the version's diff (a small change)
        old_lines: list[bytes] | None = [] if len(plan.dropped) <= DIFF_LINES else None
        # both files at once: a splice is reads, hashes and writes, which leave
        # the GIL free (at 1M statements 0.8 s one after the other)
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix="splice") as pool:
            spliced = {}
            for kind, column, text, head in (
                (STATEMENTS_KIND, "csv_bytes", "csv", len(header)),
                (ENTITIES_KIND, "json_bytes", "json", 0),
            ):
                lengths = index.column(column).to_numpy(zero_copy_only=False)
                tmp = Path(tempfile.mkstemp(prefix=f"splice-{kind}-", dir=tmp_dir)[1])
                spliced[kind] = (
                    tmp,
                    pool.submit(
                        _splice,
                        ds,
                        state.files[kind]["path"],
                        state.files[kind],
                        head,
                        lengths,
                        plan,
                        rows.column(text).to_pylist(),
                        tmp,
                        old_lines if kind == ENTITIES_KIND else None,
                    ),
                )
            for kind, (tmp, future) in spliced.items():
                size, sha, moved, sha1 = future.result()
                made[kind] = (tmp, size, sha, moved, sha1)
                carried += moved
        step("files spliced (%s bytes carried over)", f"{carried:,}")
        # the new index: old ranges and new rows in plan order, as slices (no
        # copy of the old index's rows, 2.18M at 10M statements)
        new_rows = rows.select(INDEX_SCHEMA.names)
        new_index = pa.concat_tables(
            [
                index.slice(first, stop - first) if kind == "old" else new_rows.slice(first, 1)
                for kind, first, stop in plan.steps
            ]
            or [index.slice(0, 0)]
        )
        aggregates = state.aggregates
        aggregates.add(index.take(pa.array(plan.dropped, pa.int64())), -1)
        aggregates.add(rows.select(INDEX_SCHEMA.names))
        aggregates.prune()
        counted = aggregates.statistics()
        faults.point("export.after_splice")
        written: dict[str, dict[str, Any]] = {}
        common = {"mode": "incremental", "entities_touched": len(changes.entities)}
        for kind, rows_count in (
            (STATEMENTS_KIND, counted.statements),
            (ENTITIES_KIND, counted.entities),
        ):
            tmp, size, sha, moved, sha1 = made[kind]
            path = state.files[kind]["path"]
            store.put_file(cv.dataset_path(ds.name, path), tmp)
            written[kind] = {
                "rows": rows_count,
                "path": path,
                "size": size,
                "sha256": sha,
                "sha1": sha1,
                "bytes_carried": moved,
                **common,
            }
        written[STATISTICS_KIND] = {
            **write_statistics(store, ds.name, counted.dataset_stats()),
            **common,
        }
        faults.point("export.before_state")
        files = {k: {x: written[k][x] for x in ("path", "size", "sha256")} for k in made}
        ExportState(snapshot.versions, "", files, aggregates).save(ds, new_index)
        step("state saved")
        lines = None
        if old_lines is not None:
            lines = _entity_lines(index, plan.dropped, b"".join(old_lines), rows, state, snapshot)
            lines = lines._replace(entities=tuple(changes.entities))
        return Refreshed(written, len(changes.entities), carried, lines)
    finally:
        staging.remove(ds, staging_rel)


@progress.part("exports")
def attempt(
    ds: DatasetContext,
    kinds: frozenset[str],
    snapshot: DatasetSnapshot,
    *,
    force: bool = False,
    trusted: Trusted | None = None,
) -> tuple[Refreshed | None, str | None]:
    """The three exports of ``snapshot`` from the last ones and the change feed
    (:func:`refresh`), or None and why the full pass must run instead (logged).

    ``trusted``: what the head version recorded of the export state
    (:func:`state_digests`): a state that is not what the head covers (altered,
    or written by an export no version published) is not used. None: there is
    no version to hold it to (the dataset's first)."""
    reason = None
    state = ExportState.load(ds)
    if force:
        reason = "forced"
    elif kinds != ALL_THREE:
        reason = "incremental exports write all three of " + ", ".join(sorted(ALL_THREE))
    elif state is None:
        reason = "no export state (a first export, or one older than incremental exports)"
    elif trusted is not None and (why := _untrusted(ds, trusted)) is not None:
        reason = why
    else:
        changes = changes_between(
            ds.changes_table,
            ds.translog_table,
            state.snapshot[1],
            snapshot.versions[1],
            statements=ds.statements_table,
            statements_since=state.snapshot[0],
            statements_until=snapshot.versions[0],
        )
        entities = sum(v[0] for v in state.aggregates.schemas.values())
        if changes.gap is not None:
            reason = f"change feed: {changes.gap}"
        elif entities >= SHARE_FROM and len(changes.entities) > MAX_CHANGED_SHARE * entities:
            reason = (
                f"{len(changes.entities)} of {entities} entities changed: a full pass is cheaper"
            )
        else:
            try:
                refreshed = refresh(ds, snapshot, state, changes)
            except StateMismatch as exc:
                reason = str(exc)
            else:
                progress.stage(
                    "export %s: incremental, %d entities touched, %s bytes carried over",
                    ds.name,
                    refreshed.entities_touched,
                    f"{refreshed.bytes_carried:,}",
                )
                return refreshed, None
    log.info("%s: full export: %s", ds.name, reason)
    progress.stage("export %s: full pass (%s)", ds.name, reason)
    return None, reason
