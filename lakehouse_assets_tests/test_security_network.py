"""The network rule of source URIs (:mod:`lakehouse_assets.access`) and
non-UTF-8 text in entities.

A queued ``http(s)://`` source is the network version of reading
``/proc/self/environ``: from the consumer's host it could reach loopback
services, the cloud metadata service (169.254.169.254) or an internal network.
Every server here is a real HTTP(S) server on 127.0.0.1 in a thread of the
test process; no traffic goes to any other address (internal addresses other
than loopback are judged by the pure :func:`address_kind`). None needs Spark.
"""

from __future__ import annotations

import http.server
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from lakehouse_assets import conventions as cv
from lakehouse_assets.access import SourceAccess, address_kind
from lakehouse_assets.errors import (
    InvalidConfigError,
    InvalidInputError,
    InvalidSettingError,
    SourceUnreachableError,
)
from lakehouse_assets.lake import Dataset, Lakehouse
from lakehouse_assets.settings import Settings
from lakehouse_assets.sources import open_source

#: What a secret looks like: its bytes must never reach the lake.
SECRET = b"h2b-internal-secret-5c1e"


@dataclass
class Server:
    """A real HTTP server on 127.0.0.1: ``/secret`` answers the secret,
    ``/to?url`` redirects (302) to ``url``; every request path is recorded."""

    port: int
    requests: list[str] = field(default_factory=list)

    @property
    def netloc(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, path: str = "/secret", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


def serve(tls: ssl.SSLContext | None = None) -> Iterator[Server]:
    state = Server(port=0)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            state.requests.append(self.path)
            if self.path.startswith("/to?"):
                self.send_response(302)
                self.send_header("Location", self.path.removeprefix("/to?"))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(SECRET)))
            self.end_headers()
            self.wfile.write(SECRET)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def server() -> Iterator[Server]:
    yield from serve()


@pytest.fixture
def other_server() -> Iterator[Server]:
    yield from serve()


def localhost_only_127() -> None:
    """Skip a test that connects to ``localhost`` where it resolves to anything
    but 127.0.0.1 (no traffic to any other address, ``::1`` included)."""
    infos = socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)
    addresses = {str(info[4][0]) for info in infos}
    if addresses != {"127.0.0.1"}:
        pytest.skip(f"localhost resolves to {sorted(addresses)} here, not only 127.0.0.1")


def with_hosts(lake: Lakehouse, hosts: list[str]) -> Lakehouse:
    """The same lake (and journal) with ``LAKEHOUSE_SOURCE_HOSTS`` set to ``hosts``."""
    settings = lake.settings.model_copy(update={"source_hosts": hosts})
    return Lakehouse(lake.store.uri, settings=settings)


def lake_bytes(ds: Dataset) -> bytes:
    """Every byte the dataset holds in the lake (archive, queue records, ...)."""
    prefix = cv.dataset_path(ds.name) + "/"
    return b"".join(ds.store.read_bytes(p) for p in ds.store.list(prefix))


def consume(ds: Dataset, *uris: str) -> tuple[int, list[str]]:
    """Push a file UPSERT per URI as a tenant, consume; (applied, error per URI)."""
    items = [ds.queue.push("UPSERT", "file", {"uri": uri}, tenant="evil") for uri in uris]
    result = ds.queue.consume()
    errors = {f["id"]: f["error"] for f in result.failed}
    return result.applied, [errors.get(item.id, "") for item in items]


# --- the rule: which addresses are internal (pure, no network) ------------------------


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("169.254.169.254", "link-local"),  # cloud metadata (AWS, GCP, Azure, ...)
        ("fd00:ec2::254", "private"),  # AWS metadata over IPv6
        ("fe80::1%eth0", "link-local"),
        ("::ffff:169.254.169.254", "link-local"),  # IPv4-mapped
        ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 of 169.254.169.254
        ("2002:a9fe:a9fe::1", "link-local"),  # 6to4 of 169.254.169.254
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("0.0.0.0", "unspecified"),  # connecting to it reaches this host
        ("::", "unspecified"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("100.64.0.1", "non-public"),  # shared address space (carrier NAT)
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("not-an-address", "unparsable"),
        ("8.8.8.8", None),
        ("1.1.1.1", None),
        ("2606:4700:4700::1111", None),
    ],
)
def test_address_kind_names_every_internal_address(address: str, kind: str | None) -> None:
    assert address_kind(address) == kind


@pytest.mark.parametrize("address", ["240.0.0.1", "255.255.255.255", "192.0.0.8", "2001:db8::1"])
def test_reserved_and_documentation_addresses_are_not_public(address: str) -> None:
    """Ranges whose name differs across Python releases: never public, whatever their kind."""
    assert address_kind(address) is not None


def test_a_literal_internal_address_is_refused_before_any_connection() -> None:
    """The metadata service named by address: refused by the pure pre-check
    (:meth:`SourceAccess.check_url`), so no connection is even tried."""
    access = SourceAccess.for_queue(Settings(source_hosts=[]))
    for uri in (
        "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "https://10.0.0.1:8443/",
        "http://[::ffff:127.0.0.1]:80/",
    ):
        with pytest.raises(InvalidInputError) as info:
            access.check_url(uri)
        message = str(info.value)
        assert uri in message and "LAKEHOUSE_SOURCE_HOSTS" in message
        assert len(message.splitlines()) == 1
    SourceAccess.for_queue(Settings()).check_url("https://example.org/a.pdf")  # public: fine
    # a trusted caller names what it reads
    SourceAccess.for_caller(Settings()).check_url("http://169.254.169.254/")


def test_source_hosts_setting_is_parsed_and_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_SOURCE_HOSTS", "127.0.0.1:8080, Files.Internal. [::1]:9000")
    assert Settings().source_hosts == ["127.0.0.1:8080", "files.internal", "[::1]:9000"]
    monkeypatch.setenv("LAKEHOUSE_SOURCE_HOSTS", '["a.example:1"]')
    assert Settings().source_hosts == ["a.example:1"]
    for bad in ("http://x/", "x:notaport", "user@x", "x:99999"):
        monkeypatch.setenv("LAKEHOUSE_SOURCE_HOSTS", bad)
        with pytest.raises(InvalidSettingError, match="source host"):
            Settings()
    # settings made without validation (model_copy) are checked where they are used
    unchecked = Settings(source_hosts=[]).model_copy(update={"source_hosts": ["http://x/"]})
    with pytest.raises(InvalidConfigError, match="LAKEHOUSE_SOURCE_HOSTS: .*'http://x/'"):
        SourceAccess.for_queue(unchecked)


# --- the queue: internal addresses refused, listed hosts allowed --------------------------


def test_the_queue_refuses_a_loopback_http_source(lake: Lakehouse, server: Server) -> None:
    """A service on the consumer's loopback, named by address or by ``localhost``:
    set aside with the rule, the secret never archived, and the server never
    even asked (the check comes before the connection)."""
    ds = with_hosts(lake, []).create_dataset("ssrf")
    literal, name = server.url(), server.url(host="localhost")
    applied, errors = consume(ds, literal, name)

    assert applied == 0
    assert f"source {literal!r} reaches {server.netloc} at a loopback address" in errors[0]
    assert f"source {name!r} reaches localhost:{server.port} at a loopback address" in errors[1]
    for error in errors:
        assert "LAKEHOUSE_SOURCE_HOSTS" in error and len(error.splitlines()) == 1
        assert SECRET.decode() not in error
    assert server.requests == []
    assert list(ds.archive.list()) == []
    assert SECRET not in lake_bytes(ds)


def test_a_host_in_source_hosts_may_be_internal(lake: Lakehouse, server: Server) -> None:
    """``LAKEHOUSE_SOURCE_HOSTS=127.0.0.1:PORT`` lets the queue read that server;
    a host is matched as the URL names it, so ``localhost:PORT`` (which resolves
    to loopback) stays refused, and so does another port."""
    ds = with_hosts(lake, [server.netloc]).create_dataset("internal")
    applied, errors = consume(
        ds, server.url(), server.url(host="localhost"), f"http://127.0.0.1:{server.port + 1}/x"
    )

    assert applied == 1 and errors[0] == ""
    assert "localhost" in errors[1] and "loopback address" in errors[1]
    assert "loopback address" in errors[2]
    [meta] = ds.archive.list()
    with ds.archive.open(meta.checksum) as fh:
        assert fh.read() == SECRET
    assert server.requests == ["/secret"]


def test_a_redirect_to_an_internal_address_is_refused(
    lake: Lakehouse, server: Server, other_server: Server
) -> None:
    """An allowed server redirecting to a loopback port that is not allowed: the
    redirect target is judged by the same rule and never contacted; a redirect
    that stays on the allowed server is followed."""
    ds = with_hosts(lake, [server.netloc]).create_dataset("redirect")
    away = server.url(f"/to?{other_server.url()}")
    home = server.url(f"/to?{server.url()}")
    applied, errors = consume(ds, away, home)

    assert applied == 1 and errors[1] == ""
    assert f"source {away!r} reaches {other_server.netloc} at a loopback address" in errors[0]
    assert other_server.requests == []
    assert [m.key for m in ds.archive.list()] == [home]


def test_redirects_are_bounded(server: Server) -> None:
    """At most a few redirects, for every caller; the error names the URI and the rule."""
    uri = server.url("/to?/to?/to?/to?/to?/to?/to?/secret")
    for access in (
        SourceAccess.for_queue(Settings(source_hosts=[server.netloc])),
        SourceAccess.for_caller(Settings()),
    ):
        with (
            pytest.raises(InvalidInputError, match="redirects more than 5 times"),
            open_source(uri, Settings(), access),
        ):
            pass


def test_a_name_is_resolved_once_and_the_checked_address_connected(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard resolves the name, judges every address and hands urllib3 the
    judged address: no second lookup that a DNS rebinding could answer
    differently. (The resolver is the real one, only watched.)"""
    localhost_only_127()
    lookups: list[str] = []
    real = socket.getaddrinfo

    def watched(host: str, *args: object, **kwargs: object) -> object:
        lookups.append(host)
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", watched)
    settings = Settings(source_hosts=["localhost"])
    with open_source(
        server.url(host="localhost"), settings, SourceAccess.for_queue(settings)
    ) as fh:
        assert fh.read() == SECRET
    names = [h for h in lookups if address_kind(h) == "unparsable"]
    assert names == ["localhost"]


# --- a trusted caller reads what it names ----------------------------------------------


def test_cli_archive_add_reads_an_internal_url(
    tmp_path: Path, server: Server, other_server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's own ``archive add`` keeps reading internal URLs (an internal
    file server, a service on this host), redirects included."""
    from lakehouse_assets.cli import cli

    monkeypatch.delenv("LAKEHOUSE_SOURCE_HOSTS", raising=False)
    lake = tmp_path / "lake"
    Lakehouse(lake).create_dataset("cli")
    base = ["--lake", str(lake), "-d", "cli"]
    runner = CliRunner()
    for uri in (server.url("/file"), server.url(f"/to?{other_server.url('/file')}")):
        res = runner.invoke(cli, [*base, "archive", "add", uri])
        assert res.exit_code == 0, res.output
    ds = Lakehouse(lake).dataset("cli")
    assert {m.size for m in ds.archive.list()} == {len(SECRET)}
    assert len(list(ds.archive.list())) == 2


# --- https: the name is verified though the checked address is connected ------------------


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed: no certificate for the HTTPS server")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    for state in serve(context):
        yield state, cert


def test_https_to_a_listed_host_verifies_the_name(
    tls_server: tuple[Server, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connecting to the judged address keeps TLS honest: the certificate is
    checked against the URL's name (``localhost``), so the listed host is read;
    the same server by a name its certificate does not carry fails the TLS
    check, and an unlisted one is refused before TLS."""
    localhost_only_127()
    server, cert = tls_server
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(cert))
    settings = Settings(source_hosts=["localhost", "127.0.0.1"])
    access = SourceAccess.for_queue(settings)
    uri = f"https://localhost:{server.port}/secret"
    with open_source(uri, settings, access) as fh:
        assert fh.read() == SECRET
    with (
        pytest.raises(SourceUnreachableError, match="certificate verify failed"),
        open_source(f"https://127.0.0.1:{server.port}/secret", settings, access),
    ):
        pass
    unlisted = SourceAccess.for_queue(Settings(source_hosts=[]))
    with (
        pytest.raises(InvalidInputError, match="loopback address"),
        open_source(uri, settings, unlisted),
    ):
        pass


# --- non-UTF-8 text in entities (the Python API) ----------------------------------------


def test_an_entity_value_with_a_lone_surrogate_is_refused(
    journal_url: str, tmp_path: Path, dataset_name: str
) -> None:
    """``'\\udcff'`` (what Python makes of a non-UTF-8 byte) in a property value
    or a statement given to the Python API: one line naming the entity and the
    property, nothing stored (followthemoney would have dropped it silently)."""
    ds = Lakehouse(tmp_path / "lake", journal_url=journal_url).create_dataset(dataset_name)
    with pytest.raises(InvalidInputError) as info:
        ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["a\udcffb"]}})
    message = str(info.value)
    assert "entity 'p1'" in message and "'name'" in message and "not valid UTF-8" in message
    assert len(message.splitlines()) == 1
    message.encode("utf-8")  # the message itself can be printed
    with pytest.raises(InvalidInputError, match="entity id: is not valid UTF-8"):
        ds.add_entity({"id": "p\udcff", "schema": "Person", "properties": {"name": ["Ann"]}})
    with pytest.raises(InvalidInputError, match="value is not valid UTF-8"), ds.bulk() as bulk:
        bulk.add_statement(
            {"entity_id": "p2", "schema": "Person", "prop": "name", "value": "\udcff"}
        )
    assert ds.stored_statements("p1") == [] and ds.stored_statements("p2") == []
    ds.add_entity({"id": "p1", "schema": "Person", "properties": {"name": ["Ann"]}})
    assert [s.value for s in ds.stored_statements("p1") if s.prop == "name"] == ["Ann"]
