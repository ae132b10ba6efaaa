"""Content-addressed source files, their metadata and their extracted text.

A blob is stored once at ``archive/{ch[0:2]}/{ch[2:4]}/{ch[4:6]}/{checksum}/data``;
each source path that points at it gets its own ``{file_id}.json`` beside it,
and each text extraction engine (OCR, Tika, ...) its ``{engine}.txt`` (UTF-8).
Text belongs to the content, not to a source path: it stays as long as the
blob does (deleting metadata never removes the blob, see :meth:`Archive.delete`).
Content is streamed through SHA-256 into a staging file (constant memory for
files of any size) and only moved into place once the checksum is known and,
if the caller gave one, verified: a mismatch stores nothing.
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
import mimetypes
import os
import tempfile
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from lakehouse_assets import conventions as cv
from lakehouse_assets.access import SourceAccess
from lakehouse_assets.errors import (
    ChecksumMismatchError,
    InvalidInputError,
    SourceNotFoundError,
)
from lakehouse_assets.settings import Settings
from lakehouse_assets.sources import CHUNK, open_source, source_name
from lakehouse_assets.storage import LocalStore, Store

if TYPE_CHECKING:
    # followthemoney is imported where the Document entity is made
    from followthemoney.proxy import EntityProxy


class FileMeta(BaseModel):
    """Metadata of one archived source file (one per source path)."""

    file_id: str
    checksum: str
    key: str = Field(description="The source path or URI the tenant named the file by.")
    name: str
    mimetype: str
    size: int
    created_at: datetime
    updated_at: datetime
    extra: dict[str, Any] = Field(default_factory=dict)


def make_file_id(key: str) -> str:
    """A stable file id for a source path: the same path maps to the same entry."""
    return hashlib.sha1(key.encode("utf-8")).hexdigest()


class Archive:
    """The archive of one dataset."""

    def __init__(self, store: Store, dataset: str, settings: Settings) -> None:
        self.store = store
        self.dataset = cv.dataset_name(dataset)
        self.settings = settings

    def _stage(self) -> tuple[int, Path]:
        """A staging file on the same device as the lake when it is local."""
        if isinstance(self.store, LocalStore):
            folder = self.store.local_path(cv.dataset_path(self.dataset, cv.ARCHIVE))
            folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=".upload-", suffix=".tmp", dir=folder)
        else:
            fd, name = tempfile.mkstemp(prefix="lakehouse-upload-", suffix=".tmp")
        return fd, Path(name)

    def put(
        self,
        uri: str,
        *,
        checksum: str | None = None,
        file_id: str | None = None,
        key: str | None = None,
        name: str | None = None,
        mimetype: str | None = None,
        extra: dict[str, Any] | None = None,
        access: SourceAccess | None = None,
    ) -> FileMeta:
        """Archive the file at ``uri`` and return its metadata.

        Args:
            uri: local path, ``file://``, ``s3://`` or ``http(s)://`` URI.
            checksum: expected SHA-256; a mismatch raises and stores nothing.
            file_id: explicit metadata id (default: derived from ``key``).
            key: the path the tenant knows the file by (default: ``uri``).
            access: which sources may be read (default: the caller's own,
                :meth:`SourceAccess.for_caller`: any local file but the lake's
                internals and system trees; see :mod:`access`).
        """
        if access is None:
            access = SourceAccess.for_caller(self.settings, self.store, dataset=self.dataset)
        if checksum is not None:
            checksum = cv.checksum(checksum.lower())
        key = key or uri
        fid = cv.file_id(file_id or make_file_id(key))
        digest = hashlib.sha256()
        size = 0
        fd, staging = self._stage()
        try:
            with os.fdopen(fd, "wb") as out, open_source(uri, self.settings, access) as src:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
            actual = digest.hexdigest()
            if checksum is not None and checksum != actual:
                raise ChecksumMismatchError(
                    f"[dataset {self.dataset!r}, file {uri!r}] checksum mismatch: "
                    f"expected {checksum}, content has {actual}; nothing was stored"
                )
            blob = cv.archive_blob(self.dataset, actual)
            if not self.store.exists(blob):
                self.store.put_file(blob, staging)
        finally:
            staging.unlink(missing_ok=True)
        now = cv.utcnow()
        meta_path = cv.archive_meta(self.dataset, actual, fid)
        created = now
        with contextlib.suppress(SourceNotFoundError):
            created = FileMeta.model_validate_json(self.store.read_bytes(meta_path)).created_at
        fname = name or source_name(uri)
        meta = FileMeta(
            file_id=fid,
            checksum=actual,
            key=key,
            name=fname,
            mimetype=mimetype or mimetypes.guess_type(fname)[0] or "application/octet-stream",
            size=size,
            created_at=created,
            updated_at=now,
            extra=extra or {},
        )
        self.store.write_text(meta_path, meta.model_dump_json(indent=2))
        return meta

    def files(self, checksum: str) -> list[FileMeta]:
        """Every metadata entry of a blob (one per source path)."""
        prefix = cv.archive_dir(self.dataset, cv.checksum(checksum)) + "/"
        return [
            FileMeta.model_validate_json(self.store.read_bytes(p))
            for p in self.store.list(prefix)
            if p.endswith(".json")
        ]

    def get(self, checksum: str) -> FileMeta:
        """Metadata of a blob (the most recently updated entry).

        Raises ``SourceNotFoundError`` (a ``FileNotFoundError``) if unknown.
        """
        found = self.files(checksum)
        if not found:
            raise SourceNotFoundError(
                f"No file with checksum {checksum} in dataset {self.dataset!r}"
            )
        return max(found, key=lambda m: m.updated_at)

    def open(self, checksum: str) -> IO[bytes]:
        """Stream a blob's content."""
        return self.store.open_read(cv.archive_blob(self.dataset, cv.checksum(checksum)))

    def exists(self, checksum: str) -> bool:
        return self.store.exists(cv.archive_blob(self.dataset, cv.checksum(checksum)))

    def resolve(self, prefix: str) -> str:
        """The full checksum of the one archived blob whose checksum starts with
        ``prefix`` (the demo and ``archive ls`` show 12 characters)."""
        value = prefix.strip().lower()
        if len(value) == 64:
            return cv.checksum(value)
        if len(value) < 4 or any(c not in "0123456789abcdef" for c in value):
            raise InvalidInputError(
                f"checksum prefix {prefix!r}: give at least 4 hex characters of a SHA-256",
                dataset=self.dataset,
            )
        # blobs live under archive/{aa}/{bb}/{cc}/{checksum}/: list the folder of the prefix
        matches = {m.checksum for m in self.list() if m.checksum.startswith(value)}
        if not matches:
            raise SourceNotFoundError(
                f"No file with a checksum starting {value!r} in dataset {self.dataset!r}"
            )
        if len(matches) > 1:
            raise InvalidInputError(
                f"checksum prefix {value!r} is ambiguous: {len(matches)} files match "
                f"({', '.join(sorted(m[:16] for m in matches))}); give more characters",
                dataset=self.dataset,
            )
        return matches.pop()

    def list(self) -> Iterator[FileMeta]:
        """All file metadata entries of the dataset."""
        prefix = cv.dataset_path(self.dataset, cv.ARCHIVE) + "/"
        for path in self.store.list(prefix):
            if path.endswith(".json"):
                yield FileMeta.model_validate_json(self.store.read_bytes(path))

    def delete(self, file_id: str, checksum: str | None = None) -> FileMeta:
        """Remove one metadata entry; the blob stays (as the spec says).

        So does the blob's extracted text: it belongs to the content, which
        remains readable by checksum even after its last metadata entry goes.
        """
        fid = cv.file_id(file_id)
        candidates = self.files(checksum) if checksum else list(self.list())
        for meta in candidates:
            if meta.file_id == fid:
                self.store.delete(cv.archive_meta(self.dataset, meta.checksum, fid))
                return meta
        raise SourceNotFoundError(f"No file with id {fid} in dataset {self.dataset!r}")

    # --- extracted text ({engine}.txt beside the blob) -----------------------

    def put_text(self, checksum: str, origin: str, text: str) -> str:
        """Store the text an engine (``origin``) extracted from an archived file.

        ``checksum`` may be a unique prefix (as for :meth:`resolve`); the blob
        must be in the archive. An engine's earlier text is replaced (atomic).
        Returns the full checksum.
        """
        cv.text_engine(origin)
        full = self.resolve(checksum)
        path = cv.archive_text(self.dataset, full, origin)
        if not self.exists(full):
            raise SourceNotFoundError(
                f"No file with checksum {full} in dataset {self.dataset!r}: "
                "archive the file before adding its text"
            )
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidInputError(
                f"text of engine {origin!r} for {full[:16]}… is not valid Unicode "
                f"({exc.reason} at character {exc.start})",
                dataset=self.dataset,
            ) from exc
        self.store.write_bytes(path, data)
        return full

    def get_text(self, checksum: str, origin: str) -> str:
        """The text ``origin`` extracted from a file; ``SourceNotFoundError`` if none."""
        cv.text_engine(origin)
        full = self.resolve(checksum)
        path = cv.archive_text(self.dataset, full, origin)
        try:
            data = self.store.read_bytes(path)
        except SourceNotFoundError:
            have = self.texts(full)
            raise SourceNotFoundError(
                f"No text of engine {origin!r} for checksum {full} in dataset "
                f"{self.dataset!r}"
                + (f" (engines with text: {', '.join(have)})" if have else " (it has no text)")
            ) from None
        return data.decode("utf-8")

    def texts(self, checksum: str) -> builtins.list[str]:
        """The engines that have text for a file, sorted (the file must be archived)."""
        full = self.resolve(checksum)
        if not self.exists(full):
            raise SourceNotFoundError(f"No file with checksum {full} in dataset {self.dataset!r}")
        prefix = cv.archive_dir(self.dataset, full) + "/"
        names = (p[len(prefix) :] for p in self.store.list(prefix))
        return sorted(
            n.removesuffix(cv.TEXT_SUFFIX)
            for n in names
            if "/" not in n and n.endswith(cv.TEXT_SUFFIX)
        )


#: ``FileMeta.extra`` key set on files whose Document entity the writer made.
DOCUMENT_MARK = "document_entity"


def document_entity(meta: FileMeta) -> EntityProxy:
    """The FtM Document entity of an archived file (id: its checksum)."""
    from followthemoney import model

    proxy = model.make_entity("Document")
    proxy.id = meta.checksum
    proxy.add("contentHash", meta.checksum)
    proxy.add("fileName", meta.name)
    proxy.add("mimeType", meta.mimetype)
    proxy.add("fileSize", meta.size)
    if "://" in meta.key:
        proxy.add("sourceUrl", meta.key, quiet=True)
    return proxy
