"""The incremental export's state: what the last export of the three files holds.

The full export (:mod:`.exports`) writes ``statements.csv`` and
``entities.ftm.json`` sorted by ``canonical_id`` and leaves this state next to
them (``exports/_state``, :class:`ExportState`): the translog version it was
built from, the files' sizes and checksums, one row per entity with the bytes
of its lines in each file and its contribution to the statistics, and the
statistics as mergeable aggregates (:class:`Aggregates`: counts, with the
dates as multisets, so a deleted entity's contribution can be taken off). The
incremental pass (:mod:`.incremental`) splices and subtracts from it.

A version covers the state it relies on (:func:`state_digests`, in the
manifest's ``caches``); the next incremental export trusts it only as that
version recorded it (:class:`Trusted`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lakehouse_assets import conventions as cv
from lakehouse_assets import staging
from lakehouse_assets.spark import ftm_sql
from lakehouse_assets.tables.snapshot import DatasetSnapshot

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext
    from lakehouse_assets.storage import Store

log = logging.getLogger(__name__)

#: Chunk of a sequential read.
CHUNK = 8 * 1024 * 1024

#: Bumped when the state's layout changes: an older state is ignored (full path).
STATE_FORMAT = 1


#: One row per exported entity, in ``canonical_id`` order.
INDEX_SCHEMA = pa.schema(
    [
        ("canonical_id", pa.string()),
        ("csv_bytes", pa.int64()),
        ("json_bytes", pa.int64()),
        ("schema", pa.string()),
        ("countries", pa.list_(pa.string())),
        ("start", pa.string()),
        ("end", pa.string()),
        ("statements", pa.int64()),
        ("pick", pa.int64()),
    ]
)
#: The index's columns worth a dictionary (few distinct values; not the ids).
DICTIONARY = ["schema", "countries", "start", "end"]
#: The columns of an entity's contribution that Spark computes (the index without json_bytes).
SPARK_INDEX_COLUMNS = [n for n in INDEX_SCHEMA.names if n != "json_bytes"]


# --- the statistics as mergeable aggregates ----------------------------------------


@dataclass
class Aggregates:
    """ftm_sql's statistics rows as counts that can be added and taken off.

    ``schemas``: schema → [entities, statements, picks]; ``countries``:
    schema → country → entities; ``starts``/``ends``: schema → date → entities
    (a multiset, so the min/max survives removing an entity)."""

    schemas: dict[str, list[int]] = field(default_factory=dict)
    countries: dict[str, dict[str, int]] = field(default_factory=dict)
    starts: dict[str, dict[str, int]] = field(default_factory=dict)
    ends: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, index: pa.Table, sign: int = 1) -> None:
        """Add (``sign`` 1) or take off (-1) the contributions of index rows."""
        if index.num_rows == 0:
            return
        per_schema = index.group_by("schema").aggregate(
            [([], "count_all"), ("statements", "sum"), ("pick", "sum")]
        )
        for schema, n, stmts, picks in zip(
            *(per_schema.column(c).to_pylist() for c in ("schema", "count_all")),
            per_schema.column("statements_sum").to_pylist(),
            per_schema.column("pick_sum").to_pylist(),
            strict=True,
        ):
            total = self.schemas.setdefault(schema, [0, 0, 0])
            total[0] += sign * n
            total[1] += sign * (stmts or 0)
            total[2] += sign * (picks or 0)
        countries = index.column("countries").combine_chunks()
        flat = pc.list_flatten(countries)
        if len(flat):
            owners = pc.take(index.column("schema"), pc.list_parent_indices(countries))
            pairs = pa.table({"schema": owners, "value": flat})
            self._count(self.countries, pairs, sign)
        for column, target in (("start", self.starts), ("end", self.ends)):
            dated = index.select(["schema", column]).rename_columns(["schema", "value"])
            self._count(target, dated.filter(pc.is_valid(dated.column("value"))), sign)

    @staticmethod
    def _count(target: dict[str, dict[str, int]], pairs: pa.Table, sign: int) -> None:
        if pairs.num_rows == 0:
            return
        counted = pairs.group_by(["schema", "value"]).aggregate([([], "count_all")])
        for schema, value, n in zip(
            *(counted.column(c).to_pylist() for c in ("schema", "value", "count_all")),
            strict=True,
        ):
            inner = target.setdefault(schema, {})
            inner[value] = inner.get(value, 0) + sign * n
            if inner[value] == 0:
                del inner[value]
            if not inner:
                del target[schema]

    def statistics(self) -> ftm_sql.Statistics:
        """The rows :func:`.spark.ftm_sql.statistics` collects, from the counts."""
        from followthemoney import model

        rows: list[dict[str, Any]] = []
        for name, (n, stmts, picks) in self.schemas.items():
            if n == 0:
                continue
            schema = model.get(name)
            thing = bool(schema and schema.is_a("Thing"))
            interval = bool(schema and schema.is_a("Interval"))
            starts, ends = self.starts.get(name) or {}, self.ends.get(name) or {}
            base = {"schema": name, "thing": thing, "interval": interval}
            rows.append(
                {
                    **base,
                    "country": None,
                    "n": n,
                    "start": min(starts) if starts else None,
                    "end": max(ends) if ends else None,
                    "statements": stmts,
                    "picks": picks,
                }
            )
            for country, count in (self.countries.get(name) or {}).items():
                rows.append(
                    {
                        **base,
                        "country": country,
                        "n": count,
                        "start": None,
                        "end": None,
                        "statements": None,
                        "picks": None,
                    }
                )
        return ftm_sql.Statistics(tuple(rows))

    def prune(self) -> None:
        self.schemas = {k: v for k, v in self.schemas.items() if v[0] != 0}


# --- the state --------------------------------------------------------------------------


@dataclass
class ExportState:
    """What the last export of the three files was built from and what they hold."""

    #: (statements, translog) versions of the snapshot
    snapshot: tuple[int | None, int | None]
    #: the per-entity index's file name under ``exports/_state``
    index_file: str
    #: kind → {"path", "size", "sha256"} of the files the state describes
    files: dict[str, dict[str, Any]]
    aggregates: Aggregates
    format: int = STATE_FORMAT

    @staticmethod
    def path(ds: DatasetContext, name: str = "state.json") -> str:
        return cv.dataset_path(ds.name, cv.EXPORT_STATE, name)

    @classmethod
    def load(cls, ds: DatasetContext) -> ExportState | None:
        path = cls.path(ds)
        if not ds.store.exists(path):
            return None
        try:
            data = json.loads(ds.store.read_text(path))
            if data.get("format") != STATE_FORMAT:
                return None
            return cls(
                snapshot=(data["snapshot"][0], data["snapshot"][1]),
                index_file=data["index_file"],
                files=data["files"],
                aggregates=Aggregates(**data["aggregates"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("%s: unreadable export state (%s); exports take their full path", ds, exc)
            return None

    def index(self, ds: DatasetContext) -> pa.Table:
        data = ds.store.read_bytes(self.path(ds, self.index_file))
        return pq.read_table(pa.BufferReader(data)).cast(INDEX_SCHEMA)

    def save(self, ds: DatasetContext, index: pa.Table) -> None:
        """The index under a new name, then the state naming it (the commit
        point), then the previous index removed."""
        previous = ExportState.load(ds)
        name = f"entities-{uuid.uuid4().hex}.parquet"
        # through a local file: an in-memory buffer and its bytes were two more
        # copies of the index in this process
        with tempfile.TemporaryDirectory(
            dir=staging.scratch_dir(ds.settings), prefix="state-"
        ) as tmp:
            local = Path(tmp) / name
            # no dictionary for the ids (each unique): half the write and read time
            # of the default (at 1M statements 0.15 -> 0.08 s, 0.10 -> 0.04 s)
            pq.write_table(
                index.cast(INDEX_SCHEMA), local, compression="zstd", use_dictionary=DICTIONARY
            )
            ds.store.put_file(self.path(ds, name), local)
        self.index_file = name
        data = {**asdict(self), "snapshot": list(self.snapshot)}
        ds.store.write_text(self.path(ds), json.dumps(data, sort_keys=True))
        if previous is not None and previous.index_file != name:
            ds.store.delete(self.path(ds, previous.index_file))


def state_digests(ds: DatasetContext) -> dict[str, Any] | None:
    """What a version records of the export state (None without one): the SHA-256
    of ``state.json`` and of the index it names. The next incremental export
    trusts the state only if these match its head's record (:func:`attempt`);
    ``verify`` holds the state to the head the same way."""
    path = ExportState.path(ds)
    if not ds.store.exists(path):
        return None
    raw = ds.store.read_bytes(path)
    try:
        index_file = str(json.loads(raw)["index_file"])
    except (ValueError, KeyError, TypeError):
        index_file = ""
    index_path = ExportState.path(ds, index_file) if index_file else ""
    index_sha = None
    if index_file and "/" not in index_file and ds.store.exists(index_path):
        digest = hashlib.sha256()
        with ds.store.open_read(index_path) as fh:
            while chunk := fh.read(CHUNK):
                digest.update(chunk)
        index_sha = digest.hexdigest()
    return {
        "path": cv.EXPORT_STATE + "/state.json",
        "sha256": hashlib.sha256(raw).hexdigest(),
        "index_file": index_file,
        "index_sha256": index_sha,
    }


def write_statistics(store: Store, dataset: str, stats: Any) -> dict[str, Any]:
    """Write ``statistics.json`` (and its dated copy) from ftmq's ``DatasetStats``;
    what the export records of it (rows, size, hashes, the statistics). One
    writer for the full pass and the incremental one, so their files agree."""
    text = ftm_sql.stats_json(stats)
    store.write_text(cv.dataset_path(dataset, cv.STATISTICS_JSON), text)
    store.write_text(cv.dataset_version(dataset, "statistics.json", cv.utcnow()), text)
    data = text.encode("utf-8")
    return {
        "rows": stats.entity_count,
        "path": cv.STATISTICS_JSON,
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "sha1": hashlib.sha1(data, usedforsecurity=False).hexdigest(),
        "stats": json.loads(text),
    }


def drop_state(ds: DatasetContext) -> None:
    """Forget the state (the files it describes are being replaced by other means)."""
    if ds.store.exists(ExportState.path(ds)):
        ds.store.delete(ExportState.path(ds))


def full_state(
    ds: DatasetContext,
    snapshot: DatasetSnapshot,
    spark_index: pa.Table,
    json_lengths: np.ndarray[Any, Any],
    files: dict[str, dict[str, Any]],
) -> None:
    """After a full pass: the state its files and entities give (see the module docstring).

    ``spark_index`` holds :data:`SPARK_INDEX_COLUMNS` per entity (any order);
    ``json_lengths`` the byte length of each line of entities.ftm.json, in order.
    """
    index = spark_index if _sorted_ids(spark_index) else spark_index.sort_by("canonical_id")
    if index.num_rows != len(json_lengths):
        log.warning(
            "%s: %d entities but %d entity lines; no incremental state",
            ds,
            index.num_rows,
            len(json_lengths),
        )
        drop_state(ds)
        return
    index = index.append_column("json_bytes", pa.array(json_lengths, pa.int64()))
    index = index.select(INDEX_SCHEMA.names).cast(INDEX_SCHEMA)
    aggregates = Aggregates()
    aggregates.add(index)
    aggregates.prune()
    if _same_state(ds, snapshot.versions, files, aggregates, index):
        log.info("%s: the export state describes these files already: kept", ds.name)
        return
    ExportState(snapshot.versions, "", files, aggregates).save(ds, index)


def _same_state(
    ds: DatasetContext,
    versions: tuple[int | None, int | None],
    files: dict[str, dict[str, Any]],
    aggregates: Aggregates,
    index: pa.Table,
) -> bool:
    """Whether the state on the lake says what a full pass just computed: the same
    files, aggregates and per-entity index, from a snapshot no later than this
    one (an earlier start only widens the next change window). A forced full
    pass of unchanged content then leaves the state the head covers as it is,
    and ``make --force`` publishes no version for nothing."""
    previous = ExportState.load(ds)
    if (
        previous is None
        or previous.files != files
        or asdict(previous.aggregates) != asdict(aggregates)
    ):
        return False
    for before, now in zip(previous.snapshot, versions, strict=True):
        if before is None or now is None or before > now:
            return False
    try:
        return bool(previous.index(ds).equals(index))
    except (OSError, ValueError, pa.ArrowInvalid):
        return False


def _sorted_ids(index: pa.Table) -> bool:
    """Whether ``index``'s canonical ids ascend (as Spark's export pass collects them)."""
    ids = index.column("canonical_id")
    if index.num_rows < 2:
        return True
    ascending = pc.less_equal(ids.slice(0, index.num_rows - 1), ids.slice(1))
    return bool(pc.all(ascending).as_py())


class Trusted(NamedTuple):
    """The head version's record of the export state (``record`` None: it has none)."""

    sequence: int
    record: dict[str, Any] | None


def _untrusted(ds: DatasetContext, trusted: Trusted) -> str | None:
    """Why the export state on the lake is not the one the head recorded (None: it is)."""
    if trusted.record is None:
        return (
            f"version {trusted.sequence} records no export state (published before "
            "states were covered by versions)"
        )
    found = state_digests(ds) or {}
    if any(found.get(k) != trusted.record.get(k) for k in ("sha256", "index_file", "index_sha256")):
        return (
            f"the export state is not the one version {trusted.sequence} recorded "
            "(altered, or written by an export no version published)"
        )
    return None
