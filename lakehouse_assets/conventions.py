"""Every path and tag name of the storage layout, and the names that build them.

Nothing outside this module spells a path of the lake. All names that end up
in a path (dataset, tenant, tag key, file id, checksum, origin, job type) are
validated here *before* a path is built, so nothing can escape the lake
(``..``, absolute paths, separators, NUL bytes are all rejected)::

    lakehouse/
    ├── index.json                       catalog index
    ├── config.yml                       catalog configuration
    ├── versions/YYYY/MM/{timestamp}/    versioned catalog snapshots
    ├── .changes/{dataset}               rewritten after each move of a dataset's core tag
    ├── .queue-changes/{dataset}         rewritten after each item pushed to a dataset's queue
    └── {dataset}/
        ├── config.yml                   dataset configuration
        ├── index.json                   dataset index with statistics
        ├── .LOCK                        dataset-wide lock
        ├── archive/{ch[0:2]}/{ch[2:4]}/{ch[4:6]}/{checksum}/
        │   ├── data                     raw file content (stored once)
        │   ├── {file_id}.json           file metadata (one per source path)
        │   └── {origin}.txt             extracted text (one per engine)
        ├── entities/
        │   ├── statements/origin={origin}/*.parquet   Delta table
        │   ├── translog/*.parquet                      Delta table
        │   └── changes/*.parquet                       Delta table: the flush's change feed
        ├── entities.ftm.json            aggregated entities export
        ├── mappings/{content_hash}/mapping.yml, versions/{timestamp}.yml
        ├── exports/statements.csv, statistics.json, graph.cypher
        ├── exports/_state/state.json, entities-{id}.parquet   incremental exports' state
        ├── versions/YYYY/MM/{snapshot_id}/manifest.json, index.json   a published version
        ├── versions/chain/{sequence}.json, versions/latest.json       the version chain
        ├── diffs/entities.ftm.json/{snapshot_id}.delta.json           entity changes
        ├── locks/{tenant}/{operation}
        ├── tags/{tenant}/{key}
        ├── queue/{tenant}/{uuid7}.json  pending queue items (UPSERT/DELETE × entity/file)
        ├── queue/_done/{tenant}/{uuid7}.json, queue/_failed/{tenant}/{uuid7}.json
        ├── jobs/runs/{job_type}/{timestamp}.json
        ├── graph/by_source/prop={prop}/*.parquet  Delta table: edges sorted by source
        ├── graph/by_target/prop={prop}/*.parquet  Delta table: edges sorted by target
        ├── graph/tombstones/*.parquet, graph/state.json
        ├── checks/{name}.json           last data-check results, by the snapshot they judged
        ├── resolver/judgements/*.parquet    Delta table: a collection's nomenklatura judgements
        ├── resolver/canonical/*.parquet     Delta table: entity id -> canonical id, from them
        ├── resolver/built.json          what a collection's tables were last built from
        └── _staging/{operation}-{run id}/  intermediate files of a running operation
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final

from lakehouse_assets.errors import InvalidNameError

# --- names ------------------------------------------------------------------

#: FollowTheMoney dataset names: lowercase letters, digits and underscores.
DATASET_NAME: Final = re.compile(r"^[a-z0-9_]{1,128}$")
#: Tenants are app or person names; a hyphen is allowed (``open-aleph``).
TENANT_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9_\-]{0,63}$")
#: One segment of a tag key or job type; may not start with a dot, so
#: ``.`` and ``..`` can never be a segment.
SEGMENT: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
#: File ids are single path segments of the same shape.
FILE_ID: Final = SEGMENT
#: Archive checksums are SHA-256 hex digests.
CHECKSUM: Final = re.compile(r"^[0-9a-f]{64}$")
#: Origins become a Delta partition value (``origin=...``): a colon is allowed
#: for ``mapping:{hash}``, a slash or anything path-like is not.
ORIGIN: Final = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@\-]{0,254}$")

#: The lakehouse is its own tenant; its tags are the core tags of the spec.
LAKEHOUSE_TENANT: Final = "lakehouse"
#: Origin used when a tenant does not name one.
DEFAULT_ORIGIN: Final = "default"
#: Queue item ids: RFC 9562 UUIDv7 in canonical lowercase form, so that their
#: string order is their time order.
QUEUE_ITEM_ID: Final = re.compile(
    r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$"
)


def _check(kind: str, value: object, pattern: re.Pattern[str], hint: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidNameError(f"Invalid {kind} {value!r}: {hint}")
    return value


#: Names of the lake's own folders that a dataset name could spell: a dataset
#: ``versions`` would be the catalog's snapshot folder (verify failed on every file).
RESERVED_DATASET_NAMES: Final = frozenset({"versions"})


def dataset_name(value: object) -> str:
    """Validate a dataset name (FtM naming: ``[a-z0-9_]``, 1-128 chars, not a
    name of the lake's own folders)."""
    name = _check("dataset name", value, DATASET_NAME, "use lowercase letters, digits and '_'")
    if name in RESERVED_DATASET_NAMES:
        raise InvalidNameError(
            f"Invalid dataset name {name!r}: the lake keeps its catalog's versions there; "
            "choose another name"
        )
    return name


def is_dataset_folder(name: str) -> bool:
    """Whether a top-level folder of the lake can be a dataset's (its name is a
    dataset name, not one of the lake's own folders such as ``versions/``)."""
    return bool(DATASET_NAME.fullmatch(name)) and name not in RESERVED_DATASET_NAMES


def tenant_name(value: object) -> str:
    """Validate a tenant name (``[a-z0-9_-]``, starting with a letter/digit)."""
    return _check(
        "tenant name",
        value,
        TENANT_NAME,
        "use lowercase letters, digits, '_' and '-' (max 64 chars)",
    )


def tag_key(value: object) -> str:
    """Validate a tag key: ``/``-separated segments, none empty or dotted."""
    if not isinstance(value, str) or not value or len(value) > 512:
        raise InvalidNameError(f"Invalid tag key {value!r}: must be 1-512 chars")
    for segment in value.split("/"):
        _check(
            "tag key",
            segment,
            SEGMENT,
            f"segment {segment!r} must be letters, digits, '_', '-', '.' and not start with '.'",
        )
    return value


def file_id(value: object) -> str:
    """Validate a file id (one path segment, not starting with a dot)."""
    return _check("file id", value, FILE_ID, "use letters, digits, '_', '-', '.' (no '/')")


def checksum(value: object) -> str:
    """Validate a SHA-256 hex checksum (lowercase, 64 chars)."""
    return _check("checksum", value, CHECKSUM, "expected a lowercase SHA-256 hex digest")


#: The longest value of each statement field the journal stores: the same rule
#: on every backend (PostgreSQL enforces its column sizes, SQLite would store
#: anything), checked before any write (see ``entities.check_statement``).
FIELD_LIMITS: dict[str, int] = {
    "entity_id": 1024,
    "canonical_id": 1024,
    "prop": 255,
    "schema": 255,
    "origin": 255,
    "lang": 16,
    "first_seen": 32,
    "last_seen": 32,
}


def origin(value: object) -> str:
    """Validate an origin (becomes the ``origin=`` partition of the table)."""
    return _check(
        "origin",
        value,
        ORIGIN,
        "use letters, digits, '_', '.', ':', '@', '-' (no '/')",
    )


def text(value: object, kind: str, limit: int) -> str:
    """Validate a text given as input that is stored or looked up as is: a
    non-empty string of valid Unicode (no lone surrogate, such as the one
    Python makes of a non-UTF-8 byte of a command-line argument: it could not
    be stored, hashed nor sent to a journal), no NUL, at most ``limit``
    characters."""
    if not isinstance(value, str) or not value:
        raise InvalidNameError(f"Invalid {kind} {value!r}: must be a non-empty string")
    shown = value if len(value) <= 80 else value[:80] + "…"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidNameError(
            f"Invalid {kind} {shown!r}: not valid UTF-8 ({exc.reason} at character "
            f"{exc.start}; a non-UTF-8 byte in a command-line argument makes one)"
        ) from None
    if "\x00" in value:
        raise InvalidNameError(f"Invalid {kind} {shown!r}: contains a NUL character")
    if len(value) > limit:
        raise InvalidNameError(
            f"Invalid {kind} {shown!r}: {len(value)} characters long (at most {limit})"
        )
    return value


def entity_id(value: object, kind: str = "entity id") -> str:
    """Validate an entity id (or a statement id) given as input: the one rule of
    every entry point (CLI, Python API, queue) before anything is looked up or
    stored: :func:`text` with the journal's limit, ``FIELD_LIMITS["entity_id"]``."""
    return text(value, kind, FIELD_LIMITS["entity_id"])


def queue_item_id(value: object) -> str:
    """Validate a queue item id (a lowercase UUIDv7)."""
    return _check("queue item id", value, QUEUE_ITEM_ID, "expected a lowercase UUIDv7")


def text_engine(value: object) -> str:
    """Validate the name of a text extraction engine (the ``{origin}`` of ``{origin}.txt``)."""
    return _check(
        "text engine",
        value,
        ORIGIN,
        "use letters, digits, '_', '.', ':', '@', '-' (no '/')",
    )


def job_type(value: object) -> str:
    """Validate a job type (one path segment)."""
    return _check("job type", value, SEGMENT, "use letters, digits, '_', '-', '.'")


# --- time -------------------------------------------------------------------


def utcnow() -> datetime:
    """Timezone-aware now in UTC; every timestamp the lake stores is UTC."""
    return datetime.now(UTC)


def path_timestamp(ts: datetime | None = None) -> str:
    """A sortable, path-safe timestamp: ``20261122T101112123456Z``."""
    ts = (ts or utcnow()).astimezone(UTC)
    return ts.strftime("%Y%m%dT%H%M%S%fZ")


def version_id(ts: datetime) -> str:
    """A published version's id as followthemoney spells one: ``YYYYMMDDHHMMSS-tag``
    (:class:`followthemoney.dataset.versions.Version`), here with the microseconds
    as a fixed-width tag (``20261122101112-123456``).

    yente orders versions by comparing these strings; fixed widths make string
    order time order, and a version's time is strictly after its parent's
    (:func:`~lakehouse_assets.versions.build_manifest`), so it is chain order.
    """
    ts = ts.astimezone(UTC)
    return f"{ts:%Y%m%d%H%M%S}-{ts.microsecond:06d}"


# --- catalog paths ----------------------------------------------------------

CATALOG_INDEX: Final = "index.json"
CATALOG_CONFIG: Final = "config.yml"
VERSIONS: Final = "versions"


#: The lake's change markers: one small file per dataset, rewritten after any of
#: its core tags moved, so one listing of this folder tells a sensor which
#: datasets changed (a dot: never a dataset name, skipped by the catalog).
CHANGES: Final = ".changes"


#: The lake's queue markers: one small file per dataset, rewritten after each
#: item pushed to its queue, so the queue sensor lists this one folder per tick
#: instead of every dataset's queue (apart from the core-tag markers: a push
#: moves no tag, and must not wake the tag sensors).
QUEUE_CHANGES: Final = ".queue-changes"


def queue_marker(dataset: str) -> str:
    """``.queue-changes/{dataset}``: its write time and fingerprint move with each push."""
    return f"{QUEUE_CHANGES}/{dataset_name(dataset)}"


#: The Dagster dynamic partitions of the datasets (one per dataset, by name):
#: named here so the CLI can delete a deleted dataset's partition too.
DAGSTER_PARTITIONS: Final = "datasets"


def change_marker(dataset: str) -> str:
    """``.changes/{dataset}``: its write time and fingerprint move with the dataset's tags."""
    return f"{CHANGES}/{dataset_name(dataset)}"


def catalog_version(filename: str, ts: datetime | None = None) -> str:
    """``versions/YYYY/MM/{timestamp}/{filename}`` of the catalog."""
    ts = ts or utcnow()
    return f"{VERSIONS}/{ts:%Y}/{ts:%m}/{path_timestamp(ts)}/{filename}"


# --- dataset paths ----------------------------------------------------------

CONFIG: Final = "config.yml"
INDEX: Final = "index.json"
LOCK: Final = ".LOCK"
ARCHIVE: Final = "archive"
BLOB: Final = "data"
STATEMENTS_TABLE: Final = "entities/statements"
TRANSLOG_TABLE: Final = "entities/translog"
#: the flush's change feed: what each translog version made live or dead
CHANGES_TABLE: Final = "entities/changes"
ENTITIES_JSON: Final = "entities.ftm.json"
MAPPINGS: Final = "mappings"
EXPORTS: Final = "exports"
STATEMENTS_CSV: Final = "exports/statements.csv"
STATISTICS_JSON: Final = "exports/statistics.json"
GRAPH_CYPHER: Final = "exports/graph.cypher"
GRAPH_GRAPHML: Final = "exports/graph.graphml"
#: the Neo4j bulk-import files (one CSV per schema, ``neo4j_import.sh``)
GRAPH_NEO4J: Final = "exports/neo4j"
#: what an incremental export starts from: the last export's per-entity byte
#: lengths and statistics contributions (``entities-{id}.parquet``) and the
#: state naming it (``state.json``, its versions and checksums)
EXPORT_STATE: Final = "exports/_state"
LOCKS: Final = "locks"
TAGS: Final = "tags"
QUEUE: Final = "queue"
JOB_RUNS: Final = "jobs/runs"
#: Intermediate files of running operations (see :mod:`lakehouse_assets.staging`).
STAGING: Final = "_staging"
CHECKS: Final = "checks"
#: The graph index (see :mod:`lakehouse_assets.graph`).
GRAPH_BY_SOURCE: Final = "graph/by_source"
GRAPH_BY_TARGET: Final = "graph/by_target"
GRAPH_TOMBSTONES: Final = "graph/tombstones"
GRAPH_STATE: Final = "graph/state.json"
#: A collection's judgements (nomenklatura's resolver table, every row with its
#: history) and the canonical ids they give (see :mod:`lakehouse_assets.collections`).
RESOLVER_JUDGEMENTS: Final = "resolver/judgements"
RESOLVER_CANONICAL: Final = "resolver/canonical"
#: What a collection's statements were last built from: each leaf's table
#: versions and the canonical-id table's version (whether a build is due).
COLLECTION_BUILT_FROM: Final = "resolver/built.json"


def check_cache(dataset: str, name: str) -> str:
    """``{dataset}/checks/{name}.json``: the last results of a group of data checks."""
    return dataset_path(dataset, CHECKS, f"{job_type(name)}.json")


def dataset_path(dataset: str, *parts: str) -> str:
    """Join a (validated) dataset name with layout parts into a lake path."""
    return "/".join((dataset_name(dataset), *parts))


def archive_dir(dataset: str, sha256: str) -> str:
    """``{dataset}/archive/{ch[0:2]}/{ch[2:4]}/{ch[4:6]}/{checksum}``."""
    ch = checksum(sha256)
    return dataset_path(dataset, ARCHIVE, ch[0:2], ch[2:4], ch[4:6], ch)


def archive_blob(dataset: str, sha256: str) -> str:
    """Path of the raw content, stored once per checksum."""
    return f"{archive_dir(dataset, sha256)}/{BLOB}"


def archive_meta(dataset: str, sha256: str, fid: str) -> str:
    """Path of one file's metadata (one per source path)."""
    return f"{archive_dir(dataset, sha256)}/{file_id(fid)}.json"


#: Suffix of extracted text files in an archive folder (``{origin}.txt``).
TEXT_SUFFIX: Final = ".txt"


def archive_text(dataset: str, sha256: str, engine_origin: str) -> str:
    """Path of text extracted from a file by one engine."""
    return f"{archive_dir(dataset, sha256)}/{text_engine(engine_origin)}{TEXT_SUFFIX}"


def mapping_config(dataset: str, content_hash: str) -> str:
    return dataset_path(dataset, MAPPINGS, checksum(content_hash), "mapping.yml")


def mappings_prefix(dataset: str) -> str:
    return dataset_path(dataset, MAPPINGS) + "/"


def mapping_version(dataset: str, content_hash: str, ts: datetime | None = None) -> str:
    return dataset_path(
        dataset, MAPPINGS, checksum(content_hash), "versions", f"{path_timestamp(ts)}.yml"
    )


def dataset_version(dataset: str, filename: str, ts: datetime | None = None) -> str:
    """``{dataset}/versions/YYYY/MM/{timestamp}/{filename}``."""
    ts = ts or utcnow()
    name = file_id(filename)
    return dataset_path(dataset, VERSIONS, f"{ts:%Y}", f"{ts:%m}", path_timestamp(ts), name)


def lock_path(dataset: str, tenant: str, operation: str) -> str:
    """``{dataset}/locks/{tenant}/{operation}`` — one lock per operation."""
    return dataset_path(dataset, LOCKS, tenant_name(tenant), job_type(operation))


def tag_path(dataset: str, tenant: str, key: str) -> str:
    """``{dataset}/tags/{tenant}/{key}``; tenants are namespaced."""
    return dataset_path(dataset, TAGS, tenant_name(tenant), tag_key(key))


def tags_prefix(dataset: str, tenant: str) -> str:
    return dataset_path(dataset, TAGS, tenant_name(tenant)) + "/"


def job_run_path(dataset: str, kind: str, ts: datetime | None = None) -> str:
    """``{dataset}/jobs/runs/{job_type}/{timestamp}.json``."""
    return dataset_path(dataset, JOB_RUNS, job_type(kind), f"{path_timestamp(ts)}.json")


#: Folders of ``queue/`` for items applied and items set aside; a tenant name
#: never starts with ``_``, so they can never be a tenant's folder.
QUEUE_DONE: Final = "_done"
QUEUE_FAILED: Final = "_failed"


def queue_item(dataset: str, tenant: str, item_id: str) -> str:
    """``{dataset}/queue/{tenant}/{uuid7}.json``: a pending item."""
    return dataset_path(dataset, QUEUE, tenant_name(tenant), f"{file_id(item_id)}.json")


def queue_prefix(dataset: str, tenant: str | None = None) -> str:
    """``{dataset}/queue/`` or, with a tenant, ``{dataset}/queue/{tenant}/``."""
    if tenant is None:
        return dataset_path(dataset, QUEUE) + "/"
    return dataset_path(dataset, QUEUE, tenant_name(tenant)) + "/"


def queue_done(dataset: str, tenant: str, item_id: str) -> str:
    """``{dataset}/queue/_done/{tenant}/{uuid7}.json``: the record of an applied item."""
    return dataset_path(
        dataset, QUEUE, QUEUE_DONE, tenant_name(tenant), f"{queue_item_id(item_id)}.json"
    )


def queue_failed(dataset: str, tenant: str, item_id: str) -> str:
    """``{dataset}/queue/_failed/{tenant}/{uuid7}.json``: an item set aside, with its error."""
    return dataset_path(
        dataset, QUEUE, QUEUE_FAILED, tenant_name(tenant), f"{queue_item_id(item_id)}.json"
    )


# --- version paths ----------------------------------------------------------
# The published versions of a dataset (see lakehouse_assets.versions).

CHAIN: Final = "chain"
LATEST: Final = "latest.json"
MANIFEST: Final = "manifest.json"
DIFFS: Final = "diffs/entities.ftm.json"


def chain_entry_path(dataset: str, sequence: int) -> str:
    return dataset_path(dataset, VERSIONS, CHAIN, f"{sequence:010d}.json")


def latest_path(dataset: str) -> str:
    return dataset_path(dataset, VERSIONS, LATEST)


def diff_path(dataset: str, snapshot_id: str) -> str:
    return dataset_path(dataset, DIFFS, f"{file_id(snapshot_id)}.delta.json")


def diff_index_path(dataset: str) -> str:
    return dataset_path(dataset, DIFFS, "index.json")


def _table_dir(table: str) -> str:
    """The folder of a table a manifest names (``statements``, ``translog``, ``changes``)."""
    return {"statements": STATEMENTS_TABLE, "changes": CHANGES_TABLE}.get(table, TRANSLOG_TABLE)


# --- tags -------------------------------------------------------------------
# The core tags of the specification, set by the operations that own them.

JOURNAL_LAST_UPDATED: Final = "journal/last_updated"
JOURNAL_LAST_FLUSHED: Final = "journal/last_flushed"
STATEMENTS_LAST_UPDATED: Final = "statements/last_updated"
STATEMENTS_OPTIMIZED: Final = "statements/store_optimized"
ARCHIVE_LAST_UPDATED: Final = "archive/last_updated"
EXPORTS_STATEMENTS: Final = "exports/statements"
EXPORTS_ENTITIES: Final = "exports/entities_json"
EXPORTS_STATISTICS: Final = "exports/statistics"
EXPORTS_INDEX: Final = "exports/index"
#: graph.cypher, graph.graphml and the Neo4j bulk CSVs (written together).
EXPORTS_GRAPH: Final = "exports/graph"
#: A collection's judgements changed (load, decide): its statements are stale.
RESOLVER_LAST_UPDATED: Final = "resolver/last_updated"
CRAWL_LAST_RUN: Final = "operations/crawl/last_run"
#: Any mapping of the dataset stored or changed (what the mapping sensor watches).
MAPPINGS_LAST_UPDATED: Final = "mappings/last_updated"


def mapping_updated_tag(content_hash: str) -> str:
    """``mappings/{hash}/last_updated``: when the stored mapping last changed."""
    return f"mappings/{checksum(content_hash)}/last_updated"


def mapping_processed_tag(content_hash: str) -> str:
    """``mappings/{hash}/last_processed``."""
    return f"mappings/{checksum(content_hash)}/last_processed"
