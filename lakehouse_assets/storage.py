"""One store per lake URI: a local folder or an ``s3://bucket/prefix``.

The store speaks lake-relative paths (built by :mod:`conventions`) and hides
the difference between a file system and an object store. Two guarantees
matter to everything above it:

* ``write_bytes`` is atomic: a reader sees the old content or the new, never
  half a file (temp file + rename locally; a single PUT on S3).
* ``put_if_absent`` creates a key only if it does not exist yet (hard link
  locally, ``If-None-Match: *`` on S3), and ``replace_if_match`` replaces a
  key only if it is still the version the caller read (compare-and-swap: an
  ETag ``If-Match`` on S3, a content check under ``flock`` of the folder
  locally). Locks are built on these two.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from lakehouse_assets.errors import (
    ConfigurationError,
    InvalidNameError,
    SourceNotFoundError,
)
from lakehouse_assets.settings import Settings


def _clean(path: str) -> str:
    """Refuse any path that could leave the lake, whatever built it.

    A trailing slash (a prefix) is allowed; empty, ``.`` and ``..`` segments,
    absolute paths, backslashes and NUL bytes are not.
    """
    if "\x00" in path or path.startswith("/") or "\\" in path:
        raise InvalidNameError(f"Unsafe lake path {path!r}")
    segments = path.removesuffix("/").split("/")
    if any(seg in ("", ".", "..") for seg in segments):
        raise InvalidNameError(f"Unsafe lake path {path!r}")
    return path


@dataclass(frozen=True, slots=True)
class Versioned:
    """The content of a key and the version token a conditional write compares."""

    data: bytes
    etag: str
    modified: datetime


@dataclass(frozen=True, slots=True)
class Entry:
    """One file of a listing, with what the listing itself tells (no read, no HEAD)."""

    path: str
    size: int
    #: when the store last wrote it (local mtime; S3 LastModified), epoch seconds
    modified: float
    #: changes when the content may have changed (as :meth:`Store.fingerprint`)
    fingerprint: str


class Store(ABC):
    """Read and write lake-relative paths on one backend."""

    uri: str

    @abstractmethod
    def exists(self, path: str) -> bool: ...

    @abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """Whole content; ``SourceNotFoundError`` if missing."""

    @abstractmethod
    def write_bytes(self, path: str, data: bytes) -> None:
        """Atomic replace of the whole content."""

    @abstractmethod
    def put_if_absent(self, path: str, data: bytes) -> bool:
        """Create ``path`` only if absent; return whether this call created it."""

    @abstractmethod
    def read_versioned(self, path: str) -> Versioned | None:
        """Content and version token of ``path``, or None if it does not exist."""

    @abstractmethod
    def replace_if_match(self, path: str, data: bytes, etag: str) -> bool:
        """Replace ``path`` only if it still has version ``etag``; return whether it did."""

    @abstractmethod
    def put_file(self, path: str, local: Path) -> None:
        """Move/upload a finished local file to ``path`` atomically."""

    @abstractmethod
    def open_read(self, path: str) -> IO[bytes]:
        """A binary stream of the content (constant memory)."""

    @abstractmethod
    def delete(self, path: str) -> None:
        """Remove ``path`` if it exists."""

    def delete_many(self, paths: Iterable[str]) -> int:
        """Remove each of ``paths`` (those that exist); how many were asked for."""
        n = 0
        for path in paths:
            self.delete(path)
            n += 1
        return n

    def remove_empty_folders(self, prefix: str) -> None:
        """Remove the folders left empty under ``prefix`` (an object store has none)."""
        return None

    @abstractmethod
    def list(self, prefix: str) -> Iterator[str]:
        """All paths under ``prefix`` (recursive), lake-relative, sorted."""

    @abstractmethod
    def entries(self, prefix: str) -> Iterator[Entry]:
        """Like :meth:`list`, with each file's size, write time and fingerprint."""

    @abstractmethod
    def size(self, path: str) -> int: ...

    @abstractmethod
    def fingerprint(self, path: str) -> str:
        """What changes when the file's content may have changed, without reading it:
        size and modification time (local), size and ETag (S3)."""

    @abstractmethod
    def full_uri(self, path: str = "") -> str:
        """Absolute URI of a lake path, for engines (Spark, delta-rs, DuckDB)."""

    @abstractmethod
    def storage_options(self) -> dict[str, str]:
        """Options for delta-rs / object_store to reach this lake."""

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8")

    def write_text(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    def list_dirs(self, prefix: str, *, empty: bool = False) -> builtins.list[str]:
        """Names of the direct children of ``prefix`` that hold anything.

        ``empty``: also the empty folders (a local lake has them, e.g. a staging
        area whose run was killed before writing; an object store has none).
        """
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        names = {p[len(prefix) :].split("/", 1)[0] for p in self.list(prefix)}
        return sorted(n for n in names if n)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: Mode of files written into a local lake (0644 under the usual umask).
_FILE_MODE = 0o666 & ~_umask()


class LocalStore(Store):
    """A lake in a local folder."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(str(root).removeprefix("file://")).expanduser().resolve()
        for folder in (self.root, *self.root.parents):
            if folder.exists() and not folder.is_dir():
                raise ConfigurationError(
                    f"lake {self.root}: {folder} is a file, not a folder; "
                    "give a folder (or s3://bucket/prefix) as the lake"
                )
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = str(self.root)

    def _path(self, path: str) -> Path:
        return self.root / _clean(path)

    def exists(self, path: str) -> bool:
        return self._path(path).exists()

    def read_bytes(self, path: str) -> bytes:
        try:
            return self._path(path).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise SourceNotFoundError(f"Not found in lake {self.uri}: {path}") from exc

    def _tempfile(self, target: Path) -> tuple[int, str]:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.fchmod(fd, _FILE_MODE)  # mkstemp makes 0600; lake files are shared
        return fd, name

    def _write_temp(self, target: Path, data: bytes) -> Path:
        """Durably write ``data`` to a temp file beside ``target``."""
        fd, tmp = self._tempfile(target)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return Path(tmp)

    def write_bytes(self, path: str, data: bytes) -> None:
        target = self._path(path)
        tmp = self._write_temp(target, data)
        try:
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def put_if_absent(self, path: str, data: bytes) -> bool:
        target = self._path(path)
        tmp = self._write_temp(target, data)
        try:
            os.link(tmp, target)  # atomic, fails if target exists
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
        return True

    @contextmanager
    def _folder_lock(self, target: Path) -> Iterator[None]:
        """Exclusive ``flock`` of the folder holding ``target`` (all processes on this host)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def read_versioned(self, path: str) -> Versioned | None:
        target = self._path(path)
        try:
            with target.open("rb") as fh:
                data = fh.read()
                mtime = os.fstat(fh.fileno()).st_mtime
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
        return Versioned(data, _content_tag(data), datetime.fromtimestamp(mtime, UTC))

    def replace_if_match(self, path: str, data: bytes, etag: str) -> bool:
        target = self._path(path)
        with self._folder_lock(target):
            try:
                current = target.read_bytes()
            except FileNotFoundError:
                return False
            if _content_tag(current) != etag:
                return False
            self.write_bytes(path, data)
            return True

    def put_file(self, path: str, local: Path) -> None:
        target = self._path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(local, _FILE_MODE)
        try:
            os.replace(local, target)
        except OSError:  # other device: copy next to target, then rename
            fd, tmp = self._tempfile(target)
            os.close(fd)
            shutil.copyfile(local, tmp)
            os.replace(tmp, target)
            Path(local).unlink(missing_ok=True)

    def open_read(self, path: str) -> IO[bytes]:
        try:
            return self._path(path).open("rb")
        except (FileNotFoundError, IsADirectoryError) as exc:
            raise SourceNotFoundError(f"Not found in lake {self.uri}: {path}") from exc

    def delete(self, path: str) -> None:
        self._path(path).unlink(missing_ok=True)

    def remove_empty_folders(self, prefix: str) -> None:
        """Bottom up: each folder under ``prefix`` (and ``prefix``) that holds
        nothing; a folder that does (an atomic write in progress) stays."""
        base = self._path(prefix.rstrip("/"))
        if not base.is_dir():
            return
        for dirpath, _dirs, _files in os.walk(base, topdown=False):
            with contextlib.suppress(OSError):  # not empty
                os.rmdir(dirpath)

    def list(self, prefix: str) -> Iterator[str]:
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        if base.is_file():
            yield prefix
            return
        if not base.is_dir():
            return
        found = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue  # an atomic write in progress
                full = Path(dirpath) / name
                found.append(full.relative_to(self.root).as_posix())
        yield from sorted(found)

    def list_dirs(self, prefix: str, *, empty: bool = False) -> builtins.list[str]:
        """Direct children of ``prefix`` that hold anything (one directory read, no walk);
        with ``empty``, empty folders too (what a clean-up must also see)."""
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        if not base.is_dir():
            return []
        return sorted(
            e.name
            for e in os.scandir(base)
            if (e.is_file() and not (e.name.startswith(".") and e.name.endswith(".tmp")))
            or (e.is_dir() and (empty or any(os.scandir(e.path))))
        )

    def entries(self, prefix: str) -> Iterator[Entry]:
        for path in self.list(prefix):
            try:
                info = self._path(path).stat()
            except FileNotFoundError:  # removed since the walk
                continue
            yield Entry(
                path,
                info.st_size,
                info.st_mtime,
                f"size={info.st_size};mtime_ns={info.st_mtime_ns}",
            )

    def _stat(self, path: str) -> os.stat_result:
        try:
            return self._path(path).stat()
        except FileNotFoundError as exc:
            raise SourceNotFoundError(f"Not found in lake {self.uri}: {path}") from exc

    def size(self, path: str) -> int:
        return self._stat(path).st_size

    def fingerprint(self, path: str) -> str:
        return self.stat_fingerprint(self._stat(path))

    @staticmethod
    def stat_fingerprint(info: os.stat_result) -> str:
        """:meth:`fingerprint` from a ``stat`` already made (a caller that needs the
        size too stats once)."""
        return f"size={info.st_size};mtime_ns={info.st_mtime_ns}"

    def full_uri(self, path: str = "") -> str:
        return str(self._path(path)) if path else str(self.root)

    def storage_options(self) -> dict[str, str]:
        return {}

    def local_path(self, path: str) -> Path:
        """The file-system path of a lake path (local lakes only)."""
        return self._path(path)


def _content_tag(data: bytes) -> str:
    """The local stand-in for an ETag: a hash of the content."""
    return hashlib.sha256(data).hexdigest()


#: Error codes S3-compatible servers answer a failed precondition with.
PRECONDITION_FAILED = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


def s3_client(settings: Settings) -> Any:
    """A boto3 S3 client configured from settings (endpoint, keys, region).

    Signature V4 for presigned URLs too (botocore presigns with V2 unless told):
    AWS retires V2, and delta-kernel (Delta Sharing's delta format) knows a
    presigned URL by its ``X-Amz-Signature``."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - boto3 is a dependency
        from lakehouse_assets.errors import MissingDependencyError

        raise MissingDependencyError("s3:// needs boto3: pip install boto3") from exc
    return boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=settings.s3_secret_access_key,
        region_name=settings.s3_region,
        config=Config(retries={"max_attempts": 5, "mode": "standard"}, signature_version="s3v4"),
    )


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` → ``("bucket", "a/b")``."""
    rest = uri.removeprefix("s3://")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ConfigurationError(f"Invalid S3 URI {uri!r}: no bucket")
    return bucket, key.strip("/")


class S3Store(Store):
    """A lake under ``s3://bucket/prefix`` on any S3-compatible server."""

    def __init__(self, uri: str, settings: Settings) -> None:
        self.settings = settings
        self.bucket, self.prefix = split_s3_uri(uri)
        self.uri = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.client = s3_client(settings)

    def _key(self, path: str) -> str:
        path = _clean(path)
        return f"{self.prefix}/{path}" if self.prefix else path

    def _is_missing(self, exc: Exception) -> bool:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        return code in ("404", "NoSuchKey", "NotFound")

    def exists(self, path: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(path))
            return True
        except ClientError as exc:
            if self._is_missing(exc):
                return False
            raise

    def read_bytes(self, path: str) -> bytes:
        with self.open_read(path) as fh:
            return fh.read()

    def write_bytes(self, path: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data)

    def put_if_absent(self, path: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(
                Bucket=self.bucket, Key=self._key(path), Body=data, IfNoneMatch="*"
            )
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") in PRECONDITION_FAILED:
                return False
            raise

    def read_versioned(self, path: str) -> Versioned | None:
        from botocore.exceptions import ClientError

        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self._key(path))
        except ClientError as exc:
            if self._is_missing(exc):
                return None
            raise
        with obj["Body"] as body:
            data = body.read()
        return Versioned(data, str(obj["ETag"]), obj["LastModified"].astimezone(UTC))

    def replace_if_match(self, path: str, data: bytes, etag: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data, IfMatch=etag)
            return True
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in PRECONDITION_FAILED or self._is_missing(exc):
                return False
            raise

    def put_file(self, path: str, local: Path) -> None:
        # upload_file streams in parts; the object appears only when complete.
        self.client.upload_file(str(local), self.bucket, self._key(path))
        Path(local).unlink(missing_ok=True)

    def open_read(self, path: str) -> IO[bytes]:
        from botocore.exceptions import ClientError

        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self._key(path))
        except ClientError as exc:
            if self._is_missing(exc):
                raise SourceNotFoundError(f"Not found in lake {self.uri}: {path}") from exc
            raise
        body: IO[bytes] = obj["Body"]
        return body

    def delete(self, path: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(path))

    def delete_many(self, paths: Iterable[str]) -> int:
        """Up to 1,000 keys a request (S3's ``DeleteObjects``), not one request each."""
        keys = [self._key(p) for p in paths]
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            done = self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
            failed = done.get("Errors") or []
            if failed:
                first = failed[0]
                raise OSError(
                    f"could not delete {len(failed)} object(s) in {self.uri}, "
                    f"e.g. {first.get('Key')}: {first.get('Code')} {first.get('Message')}"
                )
        return len(keys)

    def list(self, prefix: str) -> Iterator[str]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            for obj in page.get("Contents", []):
                yield obj["Key"][strip:]

    def entries(self, prefix: str) -> Iterator[Entry]:
        full = self._key(prefix) if prefix else (f"{self.prefix}/" if self.prefix else "")
        strip = len(self.prefix) + 1 if self.prefix else 0
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            for obj in page.get("Contents", []):
                size = int(obj.get("Size", 0))
                etag = str(obj.get("ETag", "")).strip(chr(34))
                yield Entry(
                    obj["Key"][strip:],
                    size,
                    obj["LastModified"].timestamp(),
                    f"size={size};etag={etag}",
                )

    def list_dirs(self, prefix: str, *, empty: bool = False) -> builtins.list[str]:
        """Direct children of ``prefix`` (a delimited listing, not every key); S3 has
        no empty folders, so ``empty`` changes nothing."""
        full = (
            self._key(prefix.rstrip("/")) + "/"
            if prefix
            else (f"{self.prefix}/" if self.prefix else "")
        )
        names: set[str] = set()
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full, Delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                names.add(common["Prefix"][len(full) :].rstrip("/"))
            for obj in page.get("Contents", []):
                names.add(obj["Key"][len(full) :])
        names.discard("")
        return sorted(names)

    def _head(self, path: str) -> dict[str, Any]:
        from botocore.exceptions import ClientError

        try:
            return dict(self.client.head_object(Bucket=self.bucket, Key=self._key(path)))
        except ClientError as exc:
            if self._is_missing(exc):
                raise SourceNotFoundError(f"Not found in lake {self.uri}: {path}") from exc
            raise

    def size(self, path: str) -> int:
        return int(self._head(path)["ContentLength"])

    def fingerprint(self, path: str) -> str:
        head = self._head(path)
        return f"size={int(head['ContentLength'])};etag={head.get('ETag', '').strip(chr(34))}"

    def full_uri(self, path: str = "") -> str:
        return f"s3://{self.bucket}/{self._key(path)}" if path else self.uri

    def storage_options(self) -> dict[str, str]:
        opts = {"AWS_REGION": self.settings.s3_region}
        if self.settings.s3_endpoint_url:
            opts["AWS_ENDPOINT_URL"] = self.settings.s3_endpoint_url
            if self.settings.s3_endpoint_url.startswith("http://"):
                opts["AWS_ALLOW_HTTP"] = "true"
        if self.settings.s3_access_key_id:
            opts["AWS_ACCESS_KEY_ID"] = self.settings.s3_access_key_id
        if self.settings.s3_secret_access_key:
            opts["AWS_SECRET_ACCESS_KEY"] = self.settings.s3_secret_access_key
        return opts


def check_lake_uri(uri: str) -> str:
    """A lake URI a store can open: a local folder, ``file://`` or ``s3://``.

    Checked before anything looks for the lake, so ``--lake ftp://…`` says the
    scheme is unsupported instead of suggesting to create a lake there.
    """
    if "://" in uri and not uri.startswith(("s3://", "file://")):
        raise ConfigurationError(
            f"Unsupported lake URI {uri!r}: use a local folder, file:// or s3://"
        )
    return uri


def open_store(settings: Settings) -> Store:
    """The store for ``settings.lake_uri`` (local folder or s3://)."""
    uri = check_lake_uri(settings.lake_uri)
    if uri.startswith("s3://"):
        return S3Store(uri, settings)
    return LocalStore(uri)
