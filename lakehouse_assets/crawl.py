"""Crawl: archive every matching file under a source prefix, one Document each.

The specification's crawl operation. The source is a local folder, a
``file://`` or an ``s3://`` prefix; its files are listed once, filtered by
``prefix`` / ``glob`` / ``exclude`` (fnmatch patterns on the path relative to
the source), then archived one by one (streamed, content-addressed) with a
Document entity in the journal. A file's archive key is its path relative to
the source, so a second crawl of the same source finds what it archived
before and, with ``skip_existing``, neither reads nor hashes it again,
unless the file changed since: its size and modification time (local) or
size and ETag (S3), recorded with the archived file, differ. A changed file
is archived again (a new checksum, a new Document; the earlier version stays
in the content-addressed archive).

A file that fails (unreadable, vanished between listing and reading) is
recorded with its reason in the job record and the crawl goes on; the job
record (``jobs/runs/crawl/{ts}.json``) carries the statistics.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lakehouse_assets import conventions as cv
from lakehouse_assets.access import SourceAccess, local_path
from lakehouse_assets.archive import DOCUMENT_MARK, FileMeta, document_entity, make_file_id
from lakehouse_assets.bulk import BulkWriter
from lakehouse_assets.errors import InvalidInputError, SourceNotFoundError
from lakehouse_assets.storage import LocalStore, S3Store, Store

if TYPE_CHECKING:
    from lakehouse_assets.context import DatasetContext

#: The job type of crawl runs (``jobs/runs/crawl/``).
CRAWL_JOB = "crawl"
#: ``FileMeta.extra`` key: the source file's fingerprint when it was archived.
FINGERPRINT = "source_fingerprint"


@dataclass
class CrawlResult:
    """What one crawl did (also written into its job record)."""

    source: str
    seen: int = 0
    archived: int = 0
    #: archived again: the file at a crawled path changed since
    updated: int = 0
    skipped: int = 0
    skipped_symlinks: int = 0
    failed: int = 0
    bytes: int = 0
    errors: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "seen": self.seen,
            "archived": self.archived,
            "updated": self.updated,
            "skipped": self.skipped,
            "skipped_symlinks": self.skipped_symlinks,
            "failed": self.failed,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
        }


def source_store(uri: str, ds: DatasetContext, access: SourceAccess) -> Store:
    """A store rooted at the crawl source (it must exist; nothing is created).

    A local folder must resolve (every symlink of its path followed) under
    the roots ``access`` allows; each file is checked again when it is read.
    """
    if uri.startswith("s3://"):
        access.check_remote(uri)
        return S3Store(uri, ds.settings)
    path = local_path(uri)
    if path is None:
        raise InvalidInputError(
            f"[dataset {ds.name!r}] cannot crawl {uri!r}: use a local folder, file:// or s3://"
        )
    access.folder(path, uri)
    return LocalStore(path)


def matches(path: str, glob: str | None, exclude: str | None) -> bool:
    """Whether a relative path passes the include glob and the exclude pattern."""
    name = path.rsplit("/", 1)[-1]
    if glob and not (fnmatch.fnmatch(path, glob) or fnmatch.fnmatch(name, glob)):
        return False
    return not (exclude and (fnmatch.fnmatch(path, exclude) or fnmatch.fnmatch(name, exclude)))


def list_source(
    store: Store, prefix: str | None, glob: str | None, exclude: str | None
) -> Iterator[str]:
    for path in store.list((prefix or "").strip("/")):
        if matches(path, glob, exclude):
            yield path


def changed(store: Store, path: str, previous: FileMeta) -> bool:
    """Whether the file at ``path`` may differ from what was archived from it: its
    fingerprint differs from the recorded one (or, for files archived before
    fingerprints were recorded, its size differs). A file gone since listing
    counts as changed: archiving it then fails and is recorded."""
    try:
        recorded = previous.extra.get(FINGERPRINT)
        if recorded is None:
            return store.size(path) != previous.size
        return bool(store.fingerprint(path) != recorded)
    except SourceNotFoundError:
        return True


def leaves(root: Path, path: str) -> str | None:
    """Where a path under a (resolved) local root really points, if outside it."""
    target = (root / path).resolve()
    return None if target.is_relative_to(root) else str(target)


def crawl(
    ds: DatasetContext,
    source_uri: str,
    *,
    prefix: str | None = None,
    glob: str | None = None,
    exclude: str | None = None,
    skip_existing: bool = True,
    follow_symlinks: bool = False,
    progress: Callable[[int], None] | None = None,
) -> CrawlResult:
    """Archive the matching files under ``source_uri`` (see the module docstring).

    A symlink whose target lies outside a local source folder is skipped (and
    listed in the job record) unless ``follow_symlinks``: a crawl archives
    the tree it was pointed at, not whatever a link in it reaches. Even
    followed, a link is never read into the lake's internals or the system
    trees (:meth:`SourceAccess.for_caller`).
    """
    clock = time.monotonic()
    access = SourceAccess.for_caller(ds.settings, ds.store, dataset=ds.name)
    store = source_store(source_uri, ds, access)
    result = CrawlResult(source=store.full_uri())
    with ds.job(CRAWL_JOB) as job:
        job.run.stats = {**result.as_dict(), "prefix": prefix, "glob": glob, "exclude": exclude}
        job.save()
        known: dict[str, FileMeta] = {}
        for meta in ds.archive.list() if skip_existing else ():
            if meta.file_id not in known or meta.updated_at > known[meta.file_id].updated_at:
                known[meta.file_id] = meta
        root = store.root.resolve() if isinstance(store, LocalStore) else None
        for path in list_source(store, prefix, glob, exclude):
            result.seen += 1
            uri = store.full_uri(path)
            outside = root is not None and not follow_symlinks and leaves(root, path)
            if outside:
                result.skipped_symlinks += 1
                result.errors.append(
                    {
                        "path": path,
                        "uri": uri,
                        "error": f"skipped: a symlink to {outside} outside the crawl root "
                        "(--follow-symlinks to archive it)",
                    }
                )
            elif (previous := known.get(make_file_id(path))) is not None and not changed(
                store, path, previous
            ):
                result.skipped += 1
            else:
                try:
                    extra = {DOCUMENT_MARK: True, FINGERPRINT: store.fingerprint(path)}
                    meta = ds.archive.put(
                        uri, key=path, name=Path(path).name, extra=extra, access=access
                    )
                except Exception as exc:  # noqa: BLE001
                    # one bad file must not end the crawl: record it and go on
                    result.failed += 1
                    result.errors.append(
                        {"path": path, "uri": uri, "error": f"{type(exc).__name__}: {exc}"}
                    )
                else:
                    ds.core_tags.touch(cv.ARCHIVE_LAST_UPDATED)
                    with BulkWriter(ds, CRAWL_JOB) as bulk:
                        bulk.add_entity(document_entity(meta))
                    if previous is None:
                        result.archived += 1
                    else:
                        result.updated += 1
                    result.bytes += meta.size
            if progress is not None:
                progress(1)
            if result.seen % 100 == 0:
                job.run.stats.update(result.as_dict())
                job.run.errors = list(result.errors)
                job.save()
        result.seconds = time.monotonic() - clock
        job.run.stats.update(result.as_dict())
        job.run.errors = list(result.errors)
    ds.core_tags.touch(cv.CRAWL_LAST_RUN)
    return result


def archive_file(
    ds: DatasetContext,
    uri: str,
    *,
    checksum: str | None = None,
    create_document: bool = False,
    follow_symlinks: bool = True,
    **kwargs: Any,
) -> FileMeta:
    """Archive one file; optionally write its Document entity to the journal.

    With ``follow_symlinks=False`` (the CLI's default) a local path that is
    a symlink is refused: naming a link archives what it points at.
    """
    path = local_path(uri)
    if not follow_symlinks and path is not None and path.is_symlink():
        raise InvalidInputError(
            f"{uri} is a symlink to {path.resolve()}: archive the target itself, "
            "or pass --follow-symlinks",
            dataset=ds.name,
        )
    if create_document:
        # tells the archive sensor the Document entity is already written
        kwargs["extra"] = {**(kwargs.get("extra") or {}), DOCUMENT_MARK: True}
    meta = ds.archive.put(uri, checksum=checksum, **kwargs)
    ds.core_tags.touch(cv.ARCHIVE_LAST_UPDATED)
    if create_document:
        with BulkWriter(ds, "archive") as bulk:
            bulk.add_entity(document_entity(meta))
    return meta
