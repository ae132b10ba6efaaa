"""Which files a source URI may name: the one file-access policy of the lakehouse.

Everything that reads a source the caller names (``archive add``, ``crawl``,
queued file UPSERTs, the Python API's :meth:`Archive.put`) goes through a
:class:`SourceAccess`:

* a remote source (``s3://``, ``http(s)://``) is read as given, except an
  ``s3://`` key inside the lake's own prefix (another dataset's files);
* a local path is resolved with **every** symlink component followed
  (``os.path.realpath``). Whose path it is decides where it may lie: a path
  the invoking user names on their own command line or Python call (the
  CLI, the Python API, a Dagster crawl the operator configured) is theirs to
  read wherever it is, as ``cat`` would; a path that arrives from someone
  else is not. The queue's items come from tenants, so it reads only under
  ``LAKEHOUSE_SOURCE_ROOTS`` (:attr:`Settings.source_roots`; none by
  default: a queued local path is refused); the HTTP server never takes a
  path at all (a tenant uploads bytes, read back only from the server's own
  staging folder, :meth:`SourceAccess.for_staged`);
* never, whoever names it: ``/proc``, ``/sys``, ``/dev`` (and any file on
  those file systems), the local lake's own folder, its journal (SQLite file
  and its ``-wal``/``-shm``/``-journal``, hard links included),
  ``lakehouse.env``, the cache folder (the Spark Connect token) and the
  server's state folder (staged uploads, jobs), and anything that is not a
  regular file.

A network source follows the caller's network rule (:meth:`SourceAccess.check_url`,
:meth:`SourceAccess.address_guard`):

* the queue (tenants' items) reads ``http(s)://`` sources only from public
  addresses: the host is resolved, **every** address it resolves to must be
  public (:func:`address_kind`: not loopback, link-local such as the cloud
  metadata service at 169.254.169.254, private, shared, multicast, reserved or
  unspecified, nor an IPv6 form embedding one), and the connection is made to
  the address that was checked, never to a second resolution (DNS rebinding);
  each redirect target is checked the same way. A host listed in
  ``LAKEHOUSE_SOURCE_HOSTS`` (:attr:`Settings.source_hosts`, ``host`` or
  ``host:port``, matched against the host as the URL names it) may be internal,
  e.g. an internal file server. The queue ignores proxy and ``.netrc`` settings
  of the environment: the address it checks is the address it connects to, and
  no operator credential goes out for a tenant's URL;
* a trusted caller (the CLI, the Python API, a Dagster crawl) reads any
  ``http(s)://`` URL it names, internal ones included, as ``requests`` would
  (environment proxies, ``.netrc``): it is the operator, who can read those
  anyway. Every caller follows at most :data:`MAX_REDIRECTS` redirects;
* ``s3://`` sources are read through the configured S3 endpoint (the
  operator's setting), never inside the lake's own prefix.

The check and the read cannot be raced apart: the resolved path is opened
one component at a time with ``O_NOFOLLOW`` (a component turned into a
symlink after the check fails the open), the file is opened non-blocking (a
FIFO swapped in does not hang), and ``fstat`` must show the same regular
file the check saw. Errors name the URI the caller gave and the rule it
broke; they never say where a symlink points nor carry the file's bytes,
and a path outside the roots is refused before its existence is looked at.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import ipaddress
import os
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final, Literal
from urllib.parse import unquote, urlparse, urlsplit

from lakehouse_assets.errors import InvalidConfigError, InvalidInputError, SourceNotFoundError
from lakehouse_assets.settings import Settings
from lakehouse_assets.storage import LocalStore, S3Store, Store, split_s3_uri

#: Trees no source is ever read from: kernel and device interfaces.
SYSTEM_TREES: Final = (Path("/proc"), Path("/sys"), Path("/dev"))
#: The files SQLite keeps beside a database.
SQLITE_SUFFIXES: Final = ("", "-wal", "-shm", "-journal")
#: The settings file of a working folder (it may hold S3 keys).
ENV_FILE: Final = "lakehouse.env"

#: Redirects a source URL may go through (each target checked by the same rule).
MAX_REDIRECTS: Final = 5

Caller = Literal["queue", "caller"]
#: Checks one connection before it carries a request: ``(host, port, address)``
#: as the URL names the host, its port and the IP address connected to.
AddressGuard = Callable[[str, int, str], None]

_DIR_FLAGS: Final = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def local_path(uri: str) -> Path | None:
    """The local path of a plain path or ``file://`` URI, else None."""
    if uri.startswith("file://"):
        return Path(unquote(urlparse(uri).path))
    if "://" in uri:
        return None
    return Path(uri).expanduser()


def sqlite_file(journal_url: str) -> Path | None:
    """The database file of a SQLite journal URL (None: not SQLite, or in memory)."""
    if not journal_url.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url

    try:
        database = make_url(journal_url).database
    except Exception:  # noqa: BLE001 - an unparsable URL names no file to protect
        return None
    if not database or database == ":memory:":
        return None
    if database.startswith("file:"):  # SQLite URI form: file:path?mode=...
        database = unquote(urlparse(database).path)
        if not database:
            return None
    return Path(database).expanduser()


_NAT64: Final = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
#: Special-purpose ranges some Python releases count as global (IETF protocol assignments).
_SPECIAL: Final = (ipaddress.ip_network("192.0.0.0/24"),)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries and reaches (mapped, 6to4, NAT64)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_kind(address: str) -> str | None:
    """Why an IP address is not public (``"loopback"``, ``"link-local"``, ...),
    None if it is: the network rule of the queue's ``http(s)://`` sources.

    A pure function (no network): a textual IPv4/IPv6 address, an IPv6 zone
    (``%eth0``) allowed; IPv6 forms that carry an IPv4 address
    (``::ffff:127.0.0.1``, 6to4, NAT64) are judged by that address too. An
    unparsable address is never public.
    """
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return "unparsable"
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            kind = address_kind(str(inner))
            if kind is not None:
                return kind
    for kind, flag in (
        ("unspecified", ip.is_unspecified),  # 0.0.0.0 and :: reach this host
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),  # 169.254.169.254: the cloud metadata service
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved or any(ip in net for net in _SPECIAL)),
        ("non-public", not ip.is_global),  # e.g. 100.64.0.0/10, shared address space
    ):
        if flag:
            return kind
    return None


def host_entry(entry: str) -> tuple[str, int | None]:
    """``(host, port)`` of a ``LAKEHOUSE_SOURCE_HOSTS`` entry (``host``,
    ``host:port``, ``[v6]:port``), the host lowercased without brackets or a
    trailing dot. ``ValueError`` for anything else."""
    text = entry.strip()
    try:
        parts = urlsplit(f"//{text}")
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"source host {entry!r} is not host[:port]: {exc}") from None
    host = (parts.hostname or "").rstrip(".")
    if not host or parts.path or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"source host {entry!r} is not host[:port]")
    return host, port


def _hosts(settings: Settings) -> tuple[tuple[str, int | None], ...]:
    try:
        return tuple(dict.fromkeys(host_entry(h) for h in settings.source_hosts))
    except ValueError as exc:
        raise InvalidConfigError(f"LAKEHOUSE_SOURCE_HOSTS: {exc}") from None


def _same_host(a: str, b: str) -> bool:
    a, b = a.strip("[]").rstrip(".").lower(), b.strip("[]").rstrip(".").lower()
    if a == b:
        return True
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


def _inside(path: Path, trees: Iterable[Path]) -> bool:
    return any(path == tree or path.is_relative_to(tree) for tree in trees)


def _real(path: Path) -> Path:
    """``path`` absolute with every symlink of it followed (missing parts kept as given)."""
    return Path(os.path.realpath(path.expanduser().absolute()))


@dataclass(frozen=True)
class SourceAccess:
    """The allowed roots of one kind of caller, and what no caller may read.

    Build it with :meth:`for_caller` or :meth:`for_queue`; every path in it
    is resolved already.
    """

    #: who reads: ``queue`` (tenants' items) or ``caller`` (CLI, API)
    caller: Caller
    #: folders local sources may lie under; None: anywhere (the caller's own paths)
    roots: tuple[Path, ...] | None
    #: trees never read (system trees, the local lake, the cache and server state folders)
    never_trees: tuple[Path, ...]
    #: single files never read (the journal and its side files, lakehouse.env)
    never_files: tuple[Path, ...]
    #: ``(bucket, prefix)`` of an s3:// lake: its keys are never a source
    lake_s3: tuple[str, str] | None = None
    #: the dataset the reads are for (named in errors)
    dataset: str | None = None
    #: ``(host, port)`` a queued URL may reach although internal (port None: any)
    hosts: tuple[tuple[str, int | None], ...] = ()

    @classmethod
    def for_caller(
        cls, settings: Settings, store: Store | None = None, *, dataset: str | None = None
    ) -> SourceAccess:
        """The access of a caller naming its own paths (CLI, Python API, a Dagster
        crawl): any local file but the never-read ones."""
        return cls._build("caller", None, settings, store, dataset)

    @classmethod
    def for_queue(
        cls, settings: Settings, store: Store | None = None, *, dataset: str | None = None
    ) -> SourceAccess:
        """The queue's access: the configured roots only (none by default)."""
        return cls._build("queue", list(settings.source_roots), settings, store, dataset)

    @classmethod
    def for_staged(
        cls, settings: Settings, store: Store | None, folder: Path, *, dataset: str | None = None
    ) -> SourceAccess:
        """The HTTP server's access to the uploads it staged: only files in
        ``folder`` (inside its state folder, which every other caller is refused)."""
        access = cls._build("caller", [folder], settings, store, dataset)
        state = _real(settings.api_state_path)
        return dataclasses.replace(
            access, never_trees=tuple(t for t in access.never_trees if t != state)
        )

    @classmethod
    def _build(
        cls,
        caller: Caller,
        roots: Iterable[str | Path] | None,
        settings: Settings,
        store: Store | None,
        dataset: str | None,
    ) -> SourceAccess:
        trees = [*SYSTEM_TREES, _real(settings.cache_path), _real(settings.api_state_path)]
        lake_s3 = None
        if isinstance(store, LocalStore):
            trees.append(_real(store.root))
        elif isinstance(store, S3Store):
            lake_s3 = (store.bucket, store.prefix)
        files = [(Path.cwd() / ENV_FILE).absolute()]
        journal = sqlite_file(settings.journal_url or "")
        if journal is None and not settings.journal_url and not settings.is_s3:
            journal = Path(settings.lake_uri.removeprefix("file://")) / "journal.sqlite"
        if journal is not None:
            files += [journal.with_name(journal.name + s) for s in SQLITE_SUFFIXES]
        return cls(
            caller=caller,
            roots=(
                None
                if roots is None
                else tuple(dict.fromkeys(_real(Path(r)) for r in roots if str(r).strip()))
            ),
            never_trees=tuple(dict.fromkeys(trees)),
            never_files=tuple(dict.fromkeys(_real(f) for f in files)),
            lake_s3=lake_s3,
            dataset=dataset,
            hosts=_hosts(settings),
        )

    # --- the rules ------------------------------------------------------------

    def refuse(self, uri: str, why: str) -> InvalidInputError:
        return InvalidInputError(f"source {uri!r} {why}", dataset=self.dataset)

    def _where(self) -> str:
        configured = [str(r) for r in self.roots or ()]
        if self.caller == "queue":
            if not configured:
                return (
                    "the queue reads local files only under LAKEHOUSE_SOURCE_ROOTS, and none is set"
                )
            return f"the queue reads local files only under {', '.join(configured)}"
        return f"local sources must lie under {', '.join(configured)}"

    def check_remote(self, uri: str) -> None:
        """Refuse an ``s3://`` source inside the lake's own prefix."""
        if self.lake_s3 is None or not uri.startswith("s3://"):
            return
        bucket, key = split_s3_uri(uri)
        lake_bucket, prefix = self.lake_s3
        if bucket == lake_bucket and (not prefix or key == prefix or key.startswith(prefix + "/")):
            raise self.refuse(uri, "lies inside the lake itself: its files are never a source")

    # --- the network rule -------------------------------------------------------

    def _listed(self, host: str, port: int) -> bool:
        return any(
            _same_host(host, allowed) and (allowed_port is None or allowed_port == port)
            for allowed, allowed_port in self.hosts
        )

    def check_url(self, uri: str) -> None:
        """Refuse an ``http(s)://`` URL the caller's rule refuses before any
        connection (a literal internal address); names are judged when they
        are resolved (:meth:`address_guard`)."""
        try:
            parts = urlsplit(uri)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise self.refuse(uri, f"is not a valid URL: {exc}") from None
        host = parts.hostname
        if not host:
            raise self.refuse(uri, "names no host")
        if self.caller != "queue":
            return
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return  # a name: resolved and judged on connection
        self._check_address(uri, host, port, host)

    def address_guard(self, uri: str) -> AddressGuard | None:
        """The check every connection made for ``uri`` (redirects included)
        passes before it carries a request; None for a trusted caller, who
        may reach any address."""
        if self.caller != "queue":
            return None

        def guard(host: str, port: int, address: str) -> None:
            self._check_address(uri, host, port, address)

        return guard

    def _check_address(self, uri: str, host: str, port: int, address: str) -> None:
        if self._listed(host, port):
            return
        kind = address_kind(address)
        if kind is None:
            return
        shown = f"[{host}]" if ":" in host else host
        raise self.refuse(
            uri,
            f"reaches {shown}:{port} at a {kind} address: the queue reads http(s) sources "
            "only from public addresses or from hosts listed in LAKEHOUSE_SOURCE_HOSTS",
        )

    # --- local files ---------------------------------------------------------------

    def check_path(self, path: Path, uri: str) -> Path:
        """The resolved path if the rules allow it (existence not checked yet)."""
        real = _real(path)
        if _inside(real, self.never_trees) or real in self.never_files:
            raise self.refuse(
                uri,
                "is never read as a source (/proc, /sys, /dev, the lake's own folder, "
                "its journal, lakehouse.env, the cache and server state folders are off limits)",
            )
        if self.roots is not None and not _inside(real, self.roots):
            raise self.refuse(uri, f"resolves outside the allowed source folders: {self._where()}")
        return real

    def _forbidden_ids(self) -> set[tuple[int, int]]:
        """(device, inode) of the never-read files that exist: catches hard links."""
        ids = set()
        for path in self.never_files:
            with contextlib.suppress(OSError):
                info = os.stat(path)
                ids.add((info.st_dev, info.st_ino))
        return ids

    def _system_devices(self) -> set[int]:
        """Devices of the system trees that are mounts of their own (proc, sysfs, devtmpfs)."""
        devices = set()
        for tree in SYSTEM_TREES:
            with contextlib.suppress(OSError):
                if os.path.ismount(tree):
                    devices.add(os.stat(tree).st_dev)
        return devices

    def _check_file(self, info: os.stat_result, uri: str) -> None:
        if not stat.S_ISREG(info.st_mode):
            raise self.refuse(uri, "is not a regular file")
        if info.st_dev in self._system_devices() or (
            (info.st_dev, info.st_ino) in self._forbidden_ids()
        ):
            raise self.refuse(uri, "is never read as a source (a system or lakehouse file)")

    def folder(self, path: Path, uri: str) -> Path:
        """A local folder to crawl: resolved, allowed, and a directory."""
        real = self.check_path(path, uri)
        if not real.is_dir():
            raise SourceNotFoundError(
                f"[dataset {self.dataset!r}] crawl source is not a folder: {uri}"
            )
        return real

    def open(self, path: Path, uri: str) -> IO[bytes]:
        """Open a local source for reading, race-safely (see the module docstring)."""
        real = self.check_path(path, uri)
        try:
            before = os.stat(real)
        except FileNotFoundError:
            raise SourceNotFoundError(f"Source file not found: {uri}") from None
        except OSError as exc:
            raise self.refuse(uri, f"cannot be read: {exc.strerror}") from None
        self._check_file(before, uri)
        fd = _open_no_symlinks(real, uri, self)
        try:
            after = os.fstat(fd)
            if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):
                raise self.refuse(uri, "changed while it was opened")
            self._check_file(after, uri)
            os.set_blocking(fd, True)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise


def _open_no_symlinks(real: Path, uri: str, access: SourceAccess) -> int:
    """Open a resolved path walking it from ``/`` with ``O_NOFOLLOW`` on every part."""
    parts = real.parts
    dir_fd = os.open(parts[0], _DIR_FLAGS)
    try:
        for name in parts[1:-1]:
            try:
                next_fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                raise _open_error(exc, uri, access) from None
            os.close(dir_fd)
            dir_fd = next_fd
        try:
            return os.open(parts[-1], _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise _open_error(exc, uri, access) from None
    finally:
        os.close(dir_fd)


def _open_error(exc: OSError, uri: str, access: SourceAccess) -> Exception:
    if exc.errno == errno.ENOENT:
        return SourceNotFoundError(f"Source file not found: {uri}")
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        return access.refuse(uri, "changed while it was opened (a symlink appeared)")
    return access.refuse(uri, f"cannot be read: {exc.strerror}")


def read_regular(path: Path, limit: int | None = None) -> bytes | None:
    """The bytes (at most ``limit``) of a file that is itself a regular file,
    never a symlink's target.

    None if ``path`` is a symlink or not a regular file (a queue item planted
    as a link is reported, its target never read). ``FileNotFoundError`` if
    it is gone.
    """
    try:
        fd = os.open(path, _FILE_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            return None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as fh:
        return fh.read() if limit is None else fh.read(limit)


__all__ = [
    "MAX_REDIRECTS",
    "AddressGuard",
    "SourceAccess",
    "address_kind",
    "host_entry",
    "local_path",
    "read_regular",
    "sqlite_file",
]
