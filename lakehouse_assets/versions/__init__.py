"""Published versions of a dataset: manifests, a hash-linked chain, verify, as-of reads.

Each ``make`` (or Dagster ``index`` materialization) that changed what a
dataset publishes writes one **manifest** (the Lode seed: an immutable,
self-describing snapshot) and links it into the dataset's **chain** (the
Open Data Fabric seed: every block carries the hash of its parent)::

    {dataset}/versions/YYYY/MM/{snapshot_id}/manifest.json   the manifest
    {dataset}/versions/YYYY/MM/{snapshot_id}/index.json      index.json as published
    {dataset}/versions/chain/{sequence:010d}.json            chain entry: path + hash
    {dataset}/versions/latest.json                           head pointer (a hint)
    {dataset}/diffs/entities.ftm.json/{snapshot_id}.delta.json   entity changes
    {dataset}/diffs/entities.ftm.json/index.json             the diffs and their parents

**Linear history.** A chain entry is written put-if-absent; its sequence
number is the serialization point, so of two publishers racing for the same
sequence exactly one wins and the other re-reads the head and retries on it.
``latest.json`` is rewritten after the entry; a reader that finds a newer
entry than it names (a publisher died between the two writes) follows the
entries, so the pointer can lag but never lie.

**Hashes** are self-describing (multihash in multibase base16, as ODF does):
``f1220`` + 64 hex digits is SHA-256. A manifest's hash is SHA-256 over its
canonical JSON (sorted keys, no whitespace, UTF-8). The **logical hash** of a
version is SHA-256 over its live statements rendered in export order as
followthemoney's statement CSV: it is the hash of ``statements.csv`` (the
export is byte-identical to that rendering) and it does not change when
compact or optimize rewrite the table files.

**Tables.** A manifest names the Delta versions of the statements and
translog tables it was built from, each data file with size, SHA-256 and the
statistics the Delta log reports (row count, per-column min/max/null count),
and the Delta log entries added since its parent (so a rewritten log entry
is caught). Data files are immutable, so a file already hashed by the parent
is not read again. After publishing, a commit to the translog carries the
manifest hash in its commit metadata (an app transaction with the sequence
number makes it idempotent), tying the Delta history to the chain.

**Coverage.** Every file a reader trusts is named by the head or reported by
:func:`verify`: ``compact`` and ``optimize`` of a published dataset publish
the files they wrote (:func:`publish_relayout`: the head's statements,
exports and ``index.json`` carried over), ``make`` publishes whenever the
table files changed, and an export that differs from the head's manifest is
never fresh (:func:`published_intact`), whatever its tag says.

**As-of reads** load the tables at the versions a manifest names (delta-rs
time travel): :func:`snapshot_at`. ``vacuum`` removes files older than its
retention; an as-of read of a version whose files are gone says which
retention to set, or, when no vacuum is on record, that they were removed
outside the lakehouse (:class:`VersionDamagedError`).

The package, one concern a module, lowest first: :mod:`.hashes`, :mod:`.chain`
(the chain and its head), :mod:`.asof` (as-of reads), :mod:`.render` (logical
hash and exports of a snapshot), :mod:`.manifest`, :mod:`.diffs`,
:mod:`.feed` (followthemoney's metadata, yente's delta index),
:mod:`.publishing`, :mod:`.report`, :mod:`.coverage` and :mod:`.verification`
(``verify``), :mod:`.provenance` (``trace``). The layout paths live in
:mod:`lakehouse_assets.conventions`. This module re-exports the names callers
use; it imports what the single ``versions.py`` imported at its top (DuckDB,
pyarrow, delta-rs, orjson), never followthemoney or Spark.
"""

from __future__ import annotations

from lakehouse_assets.conventions import (
    CHAIN,
    DIFFS,
    LATEST,
    MANIFEST,
    chain_entry_path,
    diff_index_path,
    diff_path,
    latest_path,
)
from lakehouse_assets.tables.changes import changed_translog_rows
from lakehouse_assets.versions.asof import (
    VersionDamagedError,
    VersionExpiredError,
    snapshot_at,
    version_snapshot,
)
from lakehouse_assets.versions.chain import (
    Version,
    VersionNotFoundError,
    head,
    head_sequence,
    history,
    resolve,
)
from lakehouse_assets.versions.coverage import vacuum_ran
from lakehouse_assets.versions.diffs import (
    changes_between,
    diff_from_export,
    entity_changes,
    render_diff,
)
from lakehouse_assets.versions.feed import (
    DELTA_RETENTION,
    LAKEHOUSE_VERSION,
    catalog_entry,
    delta_retention,
    public_url,
)
from lakehouse_assets.versions.hashes import (
    SHA256_PREFIX,
    canonical_json,
    known_sha1,
    known_sha256,
    manifest_hash,
    multihash,
    sha256_of,
)
from lakehouse_assets.versions.manifest import (
    GRAPH_VOLATILE,
    MANIFEST_SCHEMA,
    build_manifest,
    graph_state_core,
    table_files,
    unchanged,
)
from lakehouse_assets.versions.provenance import trace
from lakehouse_assets.versions.publishing import (
    META_HASH,
    META_SEQUENCE,
    PUBLISH_ATTEMPTS,
    VERSION_APP_ID,
    PublishResult,
    covers,
    delta_tags,
    foreign_since_head,
    graph_unpublished,
    publish,
    publish_relayout,
    published_intact,
    trusted_export_state,
)
from lakehouse_assets.versions.render import logical_hash, render_export
from lakehouse_assets.versions.report import Problem, VerifyReport
from lakehouse_assets.versions.verification import verify

__all__ = [
    "DELTA_RETENTION",
    "LAKEHOUSE_VERSION",
    "catalog_entry",
    "delta_retention",
    "public_url",
    "CHAIN",
    "DIFFS",
    "GRAPH_VOLATILE",
    "LATEST",
    "MANIFEST",
    "MANIFEST_SCHEMA",
    "META_HASH",
    "META_SEQUENCE",
    "PUBLISH_ATTEMPTS",
    "SHA256_PREFIX",
    "VERSION_APP_ID",
    "Problem",
    "PublishResult",
    "VerifyReport",
    "Version",
    "VersionDamagedError",
    "VersionExpiredError",
    "VersionNotFoundError",
    "build_manifest",
    "canonical_json",
    "chain_entry_path",
    "changed_translog_rows",
    "changes_between",
    "covers",
    "delta_tags",
    "diff_from_export",
    "diff_index_path",
    "diff_path",
    "entity_changes",
    "foreign_since_head",
    "graph_state_core",
    "graph_unpublished",
    "head",
    "head_sequence",
    "history",
    "known_sha1",
    "known_sha256",
    "latest_path",
    "logical_hash",
    "manifest_hash",
    "multihash",
    "publish",
    "publish_relayout",
    "published_intact",
    "render_diff",
    "render_export",
    "resolve",
    "sha256_of",
    "snapshot_at",
    "version_snapshot",
    "table_files",
    "trace",
    "trusted_export_state",
    "unchanged",
    "vacuum_ran",
    "verify",
]
