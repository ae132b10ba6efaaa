"""Mappings: followthemoney mapping configs for CSVs in the archive.

A mapping is keyed by the content hash of its CSV (so it can never be applied
to other data by accident) and stored as YAML at
``mappings/{content_hash}/mapping.yml``, with a snapshot under ``versions/``
each time it changes. It is validated before anything is stored: unknown
schemata or properties (followthemoney's own mapping parser) and columns the
CSV does not have are errors that name the dataset, the CSV and the query.

Processing maps the archived CSV with followthemoney's mapping engine and
writes the entities (signed by the dataset's namespace, as ``ftm map`` does)
to the journal with origin ``mapping:{content_hash}``, in one transaction.
Re-processing a changed mapping first tombstones what the previous version
produced, so entities the new version no longer makes disappear. Large CSVs
are mapped on Spark: the driver splits the rows into Parquet, the executors
run followthemoney's mapping on their partitions, the driver writes the
journal. Small ones are mapped in this process (no JVM start for 300 rows).
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from banal import keys_values
from followthemoney import model
from followthemoney.exc import InvalidMapping
from followthemoney.mapping.query import QueryMapping
from followthemoney.namespace import Namespace
from followthemoney.util import sanitize_text

from lakehouse_assets import conventions as cv
from lakehouse_assets.bulk import BulkWriter
from lakehouse_assets.entities import entity_statements
from lakehouse_assets.errors import InvalidInputError, SourceNotFoundError
from lakehouse_assets.journal import COLUMNS, EVENTS_SCHEMA, Row, iso, statement_row

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext

#: The job type of mapping runs (``jobs/runs/mapping/``).
MAPPING_JOB = "mapping"
#: Rows per Parquet chunk handed to Spark, and per in-process batch.
CHUNK_ROWS = 50_000
#: Journal row schema (without ``seq``).
ROW_SCHEMA = pa.schema([EVENTS_SCHEMA.field(name) for name in COLUMNS])
#: Where the CSV is, as far as followthemoney's parser is concerned.
PLACEHOLDER_URL = "archive.csv"


def mapping_origin(content_hash: str) -> str:
    return f"mapping:{cv.checksum(content_hash)}"


# --- config -----------------------------------------------------------------


def parse_queries(config: str | Mapping[str, Any], *, where: str) -> list[dict[str, Any]]:
    """The queries of a mapping config.

    Accepts followthemoney's mapping file (``{dataset: {queries: [...]}}``,
    one dataset), a bare ``{queries: [...]}`` / ``{query: {...}}``, or a stored
    ``mapping.yml`` (``{content_hash, queries}``).
    """
    from lakehouse_assets.bounded import MAX_MAPPING_BYTES, BoundedParseError, load_yaml

    data: Any = config
    if isinstance(config, str):
        # bounded: size, depth (a 5,000-deep mapping was a RecursionError),
        # alias expansion; duplicate keys refused; errors never quote the text
        try:
            data = load_yaml(config, max_bytes=MAX_MAPPING_BYTES)
        except BoundedParseError as exc:
            raise InvalidInputError(f"{where}: {exc}") from None
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"{where}: a mapping config must be a YAML object")
    if "queries" not in data and "query" not in data:
        blocks = [v for v in data.values() if isinstance(v, Mapping)]
        if len(blocks) != 1:
            raise InvalidInputError(
                f"{where}: expected `queries:` or one dataset block holding them, "
                f"found keys {sorted(map(str, data))}"
            )
        data = blocks[0]
    queries = [dict(q) for q in keys_values(data, "queries", "query") if isinstance(q, Mapping)]
    if not queries:
        raise InvalidInputError(f"{where}: the mapping has no queries")
    return queries


def _bind(query: Mapping[str, Any]) -> dict[str, Any]:
    """The query with its CSV source replaced by the archived file."""
    bound = {k: v for k, v in query.items() if k not in ("csv_url", "csv_urls", "database")}
    bound["csv_url"] = PLACEHOLDER_URL
    return bound


def compile_queries(dataset: str, queries: Sequence[Mapping[str, Any]]) -> list[QueryMapping]:
    return [model.make_mapping(_bind(q), key_prefix=dataset, dataset=dataset) for q in queries]


def _header(ds: DatasetContext, content_hash: str) -> list[str]:
    with ds.archive.open(content_hash) as fh:
        text = io.TextIOWrapper(fh, encoding="utf-8", errors="strict")
        try:
            return next(csv.reader(text, skipinitialspace=True), [])
        except UnicodeDecodeError as exc:
            raise InvalidInputError(
                f"[dataset {ds.name!r}, csv {content_hash}] the CSV is not UTF-8: {exc}"
            ) from exc


def validate(ds: DatasetContext, content_hash: str, queries: Sequence[Mapping[str, Any]]) -> None:
    """Raise ``InvalidInputError`` naming what is wrong; nothing else happens."""
    where = f"[dataset {ds.name!r}, mapping for csv {content_hash}]"
    columns = set(_header(ds, content_hash))
    for number, query in enumerate(queries, 1):
        try:
            (compiled,) = compile_queries(ds.name, [query])
        except InvalidMapping as exc:
            raise InvalidInputError(f"{where} query {number}: {exc}") from exc
        source = compiled.source
        refs = set(compiled.refs)
        for attr in ("filters_set", "filters_not_set"):
            refs.update(k for k, _ in getattr(source, attr, []))
        missing = sorted(refs - columns)
        if missing:
            raise InvalidInputError(
                f"{where} query {number}: column(s) {missing} not in the CSV "
                f"(it has {sorted(columns)})"
            )


@dataclass
class StoredMapping:
    content_hash: str
    queries: int
    changed: bool
    path: str


def store_mapping(
    ds: DatasetContext, content_hash: str, config: str | Mapping[str, Any]
) -> StoredMapping:
    """Validate and store a mapping for an archived CSV (a version per change)."""
    content_hash = cv.checksum(content_hash)
    where = f"[dataset {ds.name!r}, mapping for csv {content_hash}]"
    if not ds.archive.exists(content_hash):
        raise SourceNotFoundError(f"{where} no archived file has this checksum")
    queries = parse_queries(config, where=where)
    validate(ds, content_hash, queries)
    text = yaml.safe_dump(
        {"content_hash": content_hash, "queries": queries}, sort_keys=False, allow_unicode=True
    )
    path = cv.mapping_config(ds.name, content_hash)
    if ds.store.exists(path) and ds.store.read_text(path) == text:
        return StoredMapping(content_hash, len(queries), False, path)
    now = cv.utcnow()
    ds.store.write_text(cv.mapping_version(ds.name, content_hash, now), text)
    ds.store.write_text(path, text)
    ds.core_tags.touch(cv.mapping_updated_tag(content_hash))
    ds.core_tags.touch(cv.MAPPINGS_LAST_UPDATED)
    return StoredMapping(content_hash, len(queries), True, path)


def load_mapping(ds: DatasetContext, content_hash: str) -> list[dict[str, Any]]:
    path = cv.mapping_config(ds.name, content_hash)
    if not ds.store.exists(path):
        raise SourceNotFoundError(
            f"[dataset {ds.name!r}] no mapping stored for csv {content_hash}; "
            f"add one with `lakehouse -d {ds.name} mapping add {content_hash} MAPPING.yml`"
        )
    return parse_queries(ds.store.read_text(path), where=path)


def list_mappings(ds: DatasetContext) -> list[dict[str, Any]]:
    """Every stored mapping with its versions and freshness."""
    prefix = cv.mappings_prefix(ds.name)
    out = []
    for path in ds.store.list(prefix):
        if not path.endswith("/mapping.yml"):
            continue
        content_hash = path[len(prefix) :].split("/", 1)[0]
        updated = ds.core_tags.get(cv.mapping_updated_tag(content_hash))
        processed = ds.core_tags.get(cv.mapping_processed_tag(content_hash))
        versions = [p for p in ds.store.list(f"{prefix}{content_hash}/versions/")]
        out.append(
            {
                "content_hash": content_hash,
                "queries": len(load_mapping(ds, content_hash)),
                "versions": len(versions),
                "last_updated": updated.isoformat() if updated else None,
                "last_processed": processed.isoformat() if processed else None,
                "fresh": is_fresh(ds, content_hash),
            }
        )
    return out


def is_fresh(ds: DatasetContext, content_hash: str) -> bool:
    """Processed after the mapping last changed (the CSV cannot change: it is its hash)."""
    return ds.core_tags.is_latest(
        cv.mapping_processed_tag(content_hash), [cv.mapping_updated_tag(content_hash)]
    )


# --- mapping rows -------------------------------------------------------------


def csv_rows(fh: io.TextIOBase | Iterable[str]) -> Iterator[list[str]]:
    """Raw CSV rows as followthemoney's ``CSVSource`` reads them (no blank rows)."""
    for row in csv.reader(fh, skipinitialspace=True):
        if row:
            yield row


def record(header: Sequence[str], row: Sequence[str | None]) -> dict[Any, Any]:
    """The record ``CSVSource.read_csv`` makes of a row (``DictReader`` + sanitize)."""
    raw: dict[Any, Any] = dict(zip(header, row, strict=False))
    if len(row) > len(header):
        raw[None] = list(row[len(header) :])
    data: dict[Any, Any] = {}
    for ref, value in raw.items():
        clean = sanitize_text(value)
        if clean is not None:
            data[ref] = clean
    return data


class Mapper:
    """followthemoney's mapping of records to journal rows, for one dataset and CSV."""

    def __init__(
        self, dataset: str, content_hash: str, queries: Sequence[Mapping[str, Any]], seen: str
    ) -> None:
        self.dataset = dataset
        self.origin = mapping_origin(content_hash)
        self.queries = compile_queries(dataset, queries)
        self.namespace = Namespace(dataset)
        self.seen = seen

    def rows(
        self, header: Sequence[str], raw_rows: Iterable[Sequence[str | None]]
    ) -> Iterator[Row]:
        for raw in raw_rows:
            data = record(header, raw)
            for query in self.queries:
                if not query.source.check_filters(data):  # type: ignore[attr-defined]
                    continue
                for entity in query.map(data).values():
                    signed = self.namespace.apply(entity)
                    for stmt in entity_statements(
                        signed, dataset=self.dataset, origin=self.origin, seen=self.seen
                    ):
                        yield statement_row(stmt, self.dataset, self.origin)


def _spark_task(
    dataset: str,
    content_hash: str,
    queries: list[dict[str, Any]],
    header: list[str],
    seen: str,
    staging_uri: str,
    storage: dict[str, str],
) -> Any:
    """The function each Spark task runs: map its row groups of the staged CSV
    rows into journal rows, staged as Parquet beside them; answers (uri, rows).

    Tasks reach the staging area through the lake's own storage (pyarrow's
    local or S3 filesystem), never the driver's disk: the same code runs on an
    executor of a cluster.
    """

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from lakehouse_assets.tables.snapshot import arrow_filesystem

        fs, root = arrow_filesystem(staging_uri, storage)
        source = pq.ParquetFile(fs.open_input_file(f"{root}/in/rows.parquet"))
        mapper = Mapper(dataset, content_hash, queries, seen)
        for batch in batches:
            for group in batch.column("group").to_pylist():
                name = f"out/part-{group:06d}.parquet"
                rows = 0
                buffer: list[Row] = []
                with fs.open_output_stream(f"{root}/{name}") as sink:
                    writer = pq.ParquetWriter(sink, ROW_SCHEMA, compression="zstd")
                    fields = source.read_row_group(group, columns=["fields"]).column("fields")
                    for produced in mapper.rows(header, fields.to_pylist()):
                        buffer.append(produced)
                        if len(buffer) >= CHUNK_ROWS:
                            writer.write_table(_row_table(buffer))
                            rows += len(buffer)
                            buffer.clear()
                    if buffer:
                        writer.write_table(_row_table(buffer))
                        rows += len(buffer)
                    writer.close()
                yield pa.RecordBatch.from_pydict(
                    {"uri": [f"{staging_uri.rstrip('/')}/{name}"], "rows": [rows]},
                    schema=pa.schema([("uri", pa.string()), ("rows", pa.int64())]),
                )

    return run


def _row_table(rows: Sequence[Row]) -> pa.Table:
    columns = list(zip(*rows, strict=True))
    return pa.Table.from_arrays(
        [pa.array(col, type=ROW_SCHEMA.field(i).type) for i, col in enumerate(columns)],
        schema=ROW_SCHEMA,
    )


@dataclass
class MappingResult:
    content_hash: str
    skipped: bool = False
    engine: str = "local"
    csv_rows: int = 0
    statements: int = 0
    tombstones: int = 0
    map_seconds: float = 0.0
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "content_hash": self.content_hash,
            "skipped": self.skipped,
            "engine": self.engine,
            "csv_rows": self.csv_rows,
            "statements": self.statements,
            "tombstones": self.tombstones,
            "map_seconds": round(self.map_seconds, 3),
            "seconds": round(self.seconds, 3),
        }


def _previous_statements(ds: DatasetContext, origin: str) -> list[Row]:
    """Tombstones for everything an earlier version of the mapping produced."""
    from lakehouse_assets.flush import ensure_flush
    from lakehouse_assets.query import live_statements, to_statements

    ensure_flush(ds)
    now = iso(cv.utcnow())
    table = live_statements(ds, origin=origin)
    return [statement_row(s, ds.name, origin, deleted_at=now) for s in to_statements(table)]


def process_mapping(
    ds: DatasetContext, content_hash: str, *, force: bool = False, spark: bool | None = None
) -> MappingResult:
    """Map the archived CSV into the journal (skipped when fresh, unless ``force``).

    ``spark``: True/False to choose the engine; None picks Spark for CSVs of
    at least ``LAKEHOUSE_MAPPING_SPARK_MIN_BYTES``.
    """
    content_hash = cv.checksum(content_hash)
    clock = time.monotonic()
    result = MappingResult(content_hash)
    queries = load_mapping(ds, content_hash)
    if not force and is_fresh(ds, content_hash):
        result.skipped = True
        return result
    origin = mapping_origin(content_hash)
    size = ds.archive.get(content_hash).size
    use_spark = spark if spark is not None else size >= ds.settings.mapping_spark_min_bytes
    result.engine = "spark" if use_spark else "local"
    with ds.job(MAPPING_JOB) as job, ds.operation_lock(f"mapping-{content_hash[:16]}"):
        previously = ds.core_tags.get(cv.mapping_processed_tag(content_hash)) is not None
        tombstones = _previous_statements(ds, origin) if previously else []
        with BulkWriter(ds, origin) as bulk:
            # tombstones first: a statement the new version makes again is newer, so live
            if tombstones:
                bulk.add_rows(tombstones)
            result.tombstones = len(tombstones)
            if use_spark:
                result.csv_rows, result.statements, result.map_seconds = _map_spark(
                    ds, content_hash, queries, bulk
                )
            else:
                result.csv_rows, result.statements = _map_local(ds, content_hash, queries, bulk)
        ds.core_tags.touch(cv.mapping_processed_tag(content_hash))
        result.seconds = time.monotonic() - clock
        job.run.stats = result.as_dict()
    return result


def _open_text(ds: DatasetContext, content_hash: str) -> Any:
    # as followthemoney opens a CSV: text mode, universal newlines, UTF-8
    return io.TextIOWrapper(ds.archive.open(content_hash), encoding="utf-8")


def _map_local(
    ds: DatasetContext, content_hash: str, queries: list[dict[str, Any]], bulk: BulkWriter
) -> tuple[int, int]:
    mapper = Mapper(ds.name, content_hash, queries, bulk.seen)
    rows = statements = 0
    with _open_text(ds, content_hash) as text:
        reader = csv_rows(text)
        header = next(reader, [])
        chunk: list[Row] = []
        for raw in reader:
            rows += 1
            for produced in mapper.rows(header, [raw]):
                chunk.append(produced)
            if len(chunk) >= CHUNK_ROWS:
                bulk.add_rows(chunk)
                statements += len(chunk)
                chunk = []
        bulk.add_rows(chunk)
        statements += len(chunk)
    return rows, statements


def _map_spark(
    ds: DatasetContext, content_hash: str, queries: list[dict[str, Any]], bulk: BulkWriter
) -> tuple[int, int, float]:
    """Map a big CSV on Spark; returns (csv rows, statements, seconds until the
    mapped rows were ready).

    The driver stages the CSV's rows as Parquet row groups of ``CHUNK_ROWS``
    in the lake's ``_staging/`` area; a task per row group maps them with
    followthemoney and stages the journal rows beside them; the driver then
    writes those into the journal in the bulk's one transaction (the journal
    is the only thing the tasks must not touch: a mapping is all or nothing).
    """
    from lakehouse_assets import staging
    from lakehouse_assets.spark.session import get_spark, parallelism
    from lakehouse_assets.tables.snapshot import arrow_filesystem

    clock = time.monotonic()
    spark = get_spark(ds.settings)
    operation = f"mapping-{content_hash[:16]}"
    staging.clean_stale(ds, operation)  # a killed run's area (we hold the mapping's lock)
    storage = ds.store.storage_options()
    with staging.area(ds, operation) as uri:
        fs, root = arrow_filesystem(uri, storage)
        fs.create_dir(f"{root}/in", recursive=True)
        fs.create_dir(f"{root}/out", recursive=True)
        rows = groups = 0
        schema = pa.schema([("fields", pa.list_(pa.string()))])
        with _open_text(ds, content_hash) as text:
            reader = csv_rows(text)
            header = next(reader, [])
            with fs.open_output_stream(f"{root}/in/rows.parquet") as sink:
                writer = pq.ParquetWriter(sink, schema, compression="zstd")
                chunk: list[list[str]] = []
                for raw in reader:
                    chunk.append(raw)
                    if len(chunk) >= CHUNK_ROWS:
                        writer.write_table(pa.table({"fields": chunk}, schema=schema))
                        rows, groups, chunk = rows + len(chunk), groups + 1, []
                if chunk:
                    writer.write_table(pa.table({"fields": chunk}, schema=schema))
                    rows, groups = rows + len(chunk), groups + 1
                writer.close()
        if groups == 0:
            return 0, 0, time.monotonic() - clock
        # a task per row group, spread over the cores: each Python worker pays
        # followthemoney's set-up once
        tasks = max(1, min(groups, parallelism(spark) * 4, ds.settings.spark_shuffle_partitions))
        frame = spark.createDataFrame([(g,) for g in range(groups)], "group int").repartition(tasks)
        task = _spark_task(ds.name, content_hash, queries, header, bulk.seen, uri, storage)
        parts = frame.mapInArrow(task, "uri string, rows long").collect()
        mapped = time.monotonic() - clock
        statements = 0
        for part in sorted(parts, key=lambda p: p["uri"]):
            if not part["rows"]:
                continue
            part_fs, path = arrow_filesystem(part["uri"], storage)
            with part_fs.open_input_file(path) as fh:
                for batch in pq.ParquetFile(fh).iter_batches(batch_size=CHUNK_ROWS):
                    columns = [batch.column(name).to_pylist() for name in COLUMNS]
                    produced = list(zip(*columns, strict=True))
                    bulk.add_rows(produced)
                    statements += len(produced)
    return rows, statements, mapped
