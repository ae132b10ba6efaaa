"""Open a source URI for streaming: local path, ``file://``, ``s3://``, ``http(s)://``.

Errors distinguish a source that does not exist (fix the input) from one that
cannot be reached right now (retry may help). Which sources may be read at
all is the caller's :class:`~lakehouse_assets.access.SourceAccess`: every
source goes through it here, the one place a source is opened.

An ``http(s)://`` source is fetched by a ``requests`` session that follows at
most :data:`~lakehouse_assets.access.MAX_REDIRECTS` redirects. For the queue
its connections are made by :func:`_connect_checked`: the host is resolved
once, every address is judged by the access's guard, and the socket connects
to a judged address (whose peer address is judged again), so neither a
redirect nor a DNS answer that changes between check and connect reaches an
address the rule refuses.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlparse

from lakehouse_assets.access import MAX_REDIRECTS, AddressGuard, SourceAccess, local_path
from lakehouse_assets.errors import SourceNotFoundError, SourceUnreachableError
from lakehouse_assets.settings import Settings
from lakehouse_assets.storage import s3_client, split_s3_uri

if TYPE_CHECKING:
    import requests
    from urllib3.connection import HTTPConnection

CHUNK = 1024 * 1024


def source_name(uri: str) -> str:
    """The file name part of a source URI or path."""
    parsed = urlparse(uri)
    path = parsed.path if parsed.scheme else uri
    return Path(unquote(path)).name or parsed.netloc or uri


@contextmanager
def open_source(uri: str, settings: Settings, access: SourceAccess) -> Iterator[IO[bytes]]:
    """A binary stream of a source's content, if ``access`` allows reading it."""
    path = local_path(uri)
    if path is not None:
        with access.open(path, uri) as fh:
            yield fh
        return
    access.check_remote(uri)
    scheme = urlparse(uri).scheme
    if scheme == "s3":
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = split_s3_uri(uri)
        try:
            obj = s3_client(settings).get_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404", "NoSuchBucket"):
                raise SourceNotFoundError(f"Source not found: {uri}") from exc
            raise SourceUnreachableError(f"Cannot read {uri}: {exc}") from exc
        except BotoCoreError as exc:
            raise SourceUnreachableError(f"Cannot reach {uri}: {exc}") from exc
        body = obj["Body"]
        try:
            yield body
        finally:
            body.close()
        return
    if scheme in ("http", "https"):
        import requests

        access.check_url(uri)
        with _http_session(access.address_guard(uri)) as session:
            try:
                resp = session.get(uri, stream=True, timeout=settings.http_timeout_seconds)
            except requests.TooManyRedirects:
                raise access.refuse(uri, f"redirects more than {MAX_REDIRECTS} times") from None
            except requests.exceptions.InvalidSchema:
                raise access.refuse(uri, "redirects to a URI that is not http(s)") from None
            except requests.RequestException as exc:
                raise SourceUnreachableError(f"Cannot reach {uri}: {exc}") from exc
            with resp:
                if resp.status_code == 404:
                    raise SourceNotFoundError(f"Source not found (HTTP 404): {uri}")
                if resp.status_code >= 400:
                    raise SourceUnreachableError(f"HTTP {resp.status_code} for {uri}")
                resp.raw.decode_content = True
                yield cast(IO[bytes], resp.raw)
        return
    raise SourceNotFoundError(f"Unsupported source URI scheme {scheme!r}: {uri}")


def _http_session(guard: AddressGuard | None) -> requests.Session:
    """A session following at most ``MAX_REDIRECTS`` redirects; with a guard,
    every connection it opens is checked (:func:`_connect_checked`) and the
    environment's proxies and ``.netrc`` are ignored (a proxy would hide the
    address; a ``.netrc`` password must not go out for a tenant's URL)."""
    import requests

    session = requests.Session()
    session.max_redirects = MAX_REDIRECTS
    if guard is None:
        return session
    session.trust_env = False
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        session.verify = bundle
    adapter = _guarded_adapter(guard)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _guarded_adapter(guard: AddressGuard) -> requests.adapters.HTTPAdapter:
    """A ``requests`` adapter whose urllib3 connections connect through the guard."""
    from requests.adapters import HTTPAdapter
    from urllib3.connection import HTTPConnection, HTTPSConnection
    from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

    class GuardedHTTPConnection(HTTPConnection):
        def _new_conn(self) -> socket.socket:
            return _connect_checked(self, super()._new_conn, guard)

    class GuardedHTTPSConnection(HTTPSConnection):
        def _new_conn(self) -> socket.socket:
            return _connect_checked(self, super()._new_conn, guard)

    class GuardedHTTPConnectionPool(HTTPConnectionPool):
        ConnectionCls = GuardedHTTPConnection

    class GuardedHTTPSConnectionPool(HTTPSConnectionPool):
        ConnectionCls = GuardedHTTPSConnection

    class GuardedAdapter(HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = {
                "http": GuardedHTTPConnectionPool,
                "https": GuardedHTTPSConnectionPool,
            }

    return GuardedAdapter()


def _connect_checked(
    conn: HTTPConnection, connect: Callable[[], socket.socket], guard: AddressGuard
) -> socket.socket:
    """Resolve ``conn``'s host once, judge every address, connect to a judged one.

    urllib3's own connect (``connect``: its error mapping, socket options,
    timeouts) is given the judged address instead of the name, so it does no
    second resolution; TLS still sends and verifies the name (``conn.host``).
    A name answering any refused address is refused whole. The connected
    socket's peer address is judged once more.
    """
    from urllib3.exceptions import NameResolutionError, NewConnectionError
    from urllib3.util.connection import allowed_gai_family

    name = conn._dns_host
    host, port = conn.host, int(conn.port)
    try:
        infos = socket.getaddrinfo(name, port, allowed_gai_family(), socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise NameResolutionError(host, conn, exc) from exc
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    for address in addresses:
        guard(host, port, address)
    failure: Exception = NewConnectionError(conn, f"{host} resolves to no address")
    for address in addresses:
        conn._dns_host = address
        try:
            sock = connect()
        except NewConnectionError as exc:
            failure = exc
            continue
        finally:
            conn._dns_host = name
        try:
            guard(host, port, str(sock.getpeername()[0]))
        except BaseException:
            sock.close()
            raise
        return sock
    raise failure


__all__ = ["CHUNK", "local_path", "open_source", "source_name"]
