"""The HTTP API against a real ``lakehouse serve`` (uvicorn on 127.0.0.1) with httpx.

One server for the module, over a local lake with a SQLite journal and two
datasets (``alpha``, ``beta``): tokens of both shapes and every scope boundary,
the writes, reads, archive and exports, and the bad input that changes nothing.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import jwt
import orjson
import pytest

from lakehouse_assets import Lakehouse
from lakehouse_assets.server.client import RemoteLakehouse
from lakehouse_assets_tests.helpers.server import REPO, SECRET, Server, running_server

ENTITIES = [
    {
        "id": "p-ann",
        "schema": "Person",
        "properties": {"name": ["Ann Smith"], "nationality": ["de"]},
    },
    {"id": "p-bob", "schema": "Person", "properties": {"name": ["Bob Jones"]}},
    {"id": "c-acme", "schema": "Company", "properties": {"name": ["ACME Ltd."]}},
]
UPLOAD_LIMIT = 64 * 1024
BODY_LIMIT = 256 * 1024


def ndjson(rows: list[dict[str, object]]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("server")
    lake = Lakehouse(base / "lake", journal_url=f"sqlite:///{base / 'journal.sqlite'}")
    lake.create_dataset("alpha", title="Alpha")
    lake.create_dataset("beta", title="Beta")
    state = base / "state"
    state.mkdir()
    with running_server(
        lake,
        state,
        LAKEHOUSE_API_MAX_UPLOAD_BYTES=str(UPLOAD_LIMIT),
        LAKEHOUSE_API_MAX_BODY_BYTES=str(BODY_LIMIT),
        LAKEHOUSE_API_QUERY_MAX_IN_VALUES="5",
        LAKEHOUSE_API_UPLOAD_TIMEOUT_SECONDS="2",
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def admin(server: Server) -> Iterator[httpx.Client]:
    with server.client(server.token(actions=("admin",))) as client:
        yield client


def pending(client: httpx.Client, dataset: str) -> int:
    res = client.get(f"/{dataset}/_api/journal/count")
    assert res.status_code == 200, res.text
    return int(res.text)


def peer_token(methods: list[str], prefixes: list[str], **claims: object) -> str:
    payload = {
        "methods": methods,
        "prefixes": prefixes,
        "exp": datetime.now(UTC) + timedelta(minutes=5),
    }
    return jwt.encode({**payload, **claims}, SECRET, algorithm="HS256")


# --- the app itself -------------------------------------------------------------


def test_health_docs_and_request_ids(server: Server) -> None:
    with server.client() as client:
        res = client.get("/health", headers={"X-Request-ID": "abc-123"})
        assert res.status_code == 200 and res.json()["status"] == "ok"
        assert res.headers["x-request-id"] == "abc-123" and res.headers["x-lakehouse-version"]
        assert (
            len(client.get("/health", headers={"X-Request-ID": "bad id!"}).headers["x-request-id"])
            == 32
        )
        paths = client.get("/openapi.json").json()["paths"]
        for path in (
            "/{dataset}/_api/entities",
            "/{dataset}/_api/entities/query",
            "/{dataset}/_api/entities/{entity_id}",
            "/{dataset}/_api/archive",
            "/{dataset}/_api/operations",
            "/{dataset}/_api/exports/{name}",
            "/_auth/validate",
        ):
            assert path in paths
        assert client.get("/docs").status_code == 200
    # the log holds the request id and never the token
    token = server.token()
    with server.client(token) as client:
        client.get("/alpha/_api/status", headers={"X-Request-ID": "find-me-42"})
    time.sleep(0.2)
    log = server.log.read_text()
    assert "[find-me-42]" in log and "/alpha/_api/status 200" in log
    assert token not in log


def test_serve_refuses_without_a_secret(tmp_path: Path) -> None:
    lake = Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{tmp_path / 'j.sqlite'}")
    lake.create_dataset("alpha")
    env = {"PYTHONPATH": str(REPO), "LAKEHOUSE_API_SECRET": "short", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "lakehouse_assets.cli", "--lake", str(tmp_path / "lake"), "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "LAKEHOUSE_API_SECRET" in lines[0], done.stderr


def test_tokens_issue_prints_a_scoped_token(tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(REPO), "LAKEHOUSE_API_SECRET": SECRET, "PATH": "/usr/bin:/bin"}
    args = [sys.executable, "-m", "lakehouse_assets.cli", "tokens", "issue", "--tenant", "aleph"]
    done = subprocess.run(
        [*args, "--dataset", "news_*", "--scope", "read", "--expires", "1h"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    claims = jwt.decode(done.stdout.strip(), SECRET, algorithms=["HS256"])
    assert claims["sub"] == "aleph" and claims["datasets"] == ["news_*"]
    assert claims["actions"] == ["read"] and 3500 < claims["exp"] - time.time() <= 3600
    bad = subprocess.run(
        [*args, "--dataset", "x", "--scope", "read", "--expires", "forever"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--expires" in bad.stderr


# --- tokens and scopes ------------------------------------------------------------


def test_missing_expired_forged_tokens_are_401(server: Server) -> None:
    expired = server.token(expires=timedelta(seconds=-5))
    forged = jwt.encode(
        {"sub": "tester", "datasets": ["*"], "actions": ["admin"], "exp": time.time() + 60},
        "another-secret-" + "x" * 40,
        algorithm="HS256",
    )
    unsigned = jwt.encode(
        {"sub": "tester", "datasets": ["*"], "actions": ["admin"], "exp": time.time() + 60},
        None,
        algorithm="none",
    )
    no_exp = jwt.encode({"sub": "tester", "datasets": ["*"], "actions": ["read"]}, SECRET)
    for token in (None, expired, forged, unsigned, no_exp, "not-a-jwt"):
        with server.client(token) as client:
            res = client.get("/alpha/_api/status")
            assert res.status_code == 401, (token, res.text)
            assert res.headers["www-authenticate"] == "Bearer"
            # before the dataset is even looked at: unknown datasets are 401 too
            assert client.get("/nope/_api/status").status_code == 401


def _cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    """``lakehouse ARGS`` with the server's secret and state folder (its revocation list)."""
    env = {
        "PYTHONPATH": str(REPO),
        "LAKEHOUSE_API_SECRET": SECRET,
        "LAKEHOUSE_API_STATE_DIR": str(server.state_dir),
        "PATH": "/usr/bin:/bin",
    }
    cmd = [sys.executable, "-m", "lakehouse_assets.cli", "--lake", server.lake.store.uri, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_a_revoked_tenant_token_is_401_from_the_next_request(server: Server) -> None:
    """``lakehouse tokens revoke`` (the token, or the id ``tokens issue`` printed)
    ends a token before its expiry; other tokens, and ids-less older ones, go on."""
    revoked, other = server.token(actions=("read",)), server.token(actions=("read",))
    issued = _cli(
        server,
        "tokens",
        "issue",
        "--tenant",
        "tester",
        "--dataset",
        "alpha",
        "--scope",
        "read",
        "--expires",
        "1h",
    )
    assert issued.returncode == 0, issued.stderr
    by_id, token_id = issued.stdout.strip(), issued.stderr.strip().rsplit(" ", 1)[-1]
    assert jwt.decode(by_id, SECRET, algorithms=["HS256"])["jti"] == token_id
    legacy = jwt.encode(  # as tokens were before they had ids
        {"sub": "tester", "datasets": ["*"], "actions": ["read"], "exp": time.time() + 600},
        SECRET,
    )
    proxied = {"X-Original-URI": "/alpha/_api/status", "X-Original-Method": "GET"}
    for token in (revoked, other, by_id, legacy):
        with server.client(token) as client:
            assert client.get("/alpha/_api/status").status_code == 200
    assert _cli(server, "tokens", "revoke", revoked).returncode == 0
    assert _cli(server, "tokens", "revoke", token_id).returncode == 0
    for token in (revoked, by_id):
        with server.client(token) as client:
            res = client.get("/alpha/_api/status")
            assert res.status_code == 401 and res.headers["www-authenticate"] == "Bearer"
            assert client.get("/_auth/validate", headers=proxied).status_code == 401
            assert client.get("/index.json").status_code == 401
    for token in (other, legacy):
        with server.client(token) as client:
            assert client.get("/alpha/_api/status").status_code == 200
            assert client.get("/_auth/validate", headers=proxied).status_code == 200
    no_id = _cli(server, "tokens", "revoke", legacy)
    assert no_id.returncode == 2 and "no id" in no_id.stderr
    forged = jwt.encode({"jti": "x", "exp": time.time() + 60}, "y" * 40, algorithm="HS256")
    assert _cli(server, "tokens", "revoke", forged).returncode == 2


def test_scope_boundaries(server: Server) -> None:
    read = server.token(datasets=("alpha",), actions=("read",))
    write = server.token(datasets=("alpha",), actions=("write",))
    globbed = server.token(datasets=("al*",), actions=("read",))
    body = ndjson(ENTITIES[:1])
    with server.client(read) as client:
        assert client.get("/alpha/_api/status").status_code == 200
        assert client.post("/alpha/_api/entities", content=body).status_code == 403
        assert client.delete("/alpha/_api/entities/p-ann").status_code == 403
        assert client.post("/alpha/_api/operations", json={"name": "flush"}).status_code == 403
        assert client.get("/beta/_api/status").status_code == 403
        assert client.post("/alpha/_api/entities/query", json={}).status_code == 200
    with server.client(write) as client:
        assert client.get("/alpha/_api/status").status_code == 403
        assert client.post("/beta/_api/entities", content=body).status_code == 403
        assert client.post("/alpha/_api/entities/flush").status_code == 403
    with server.client(globbed) as client:
        assert client.get("/alpha/_api/status").status_code == 200
        assert client.get("/beta/_api/status").status_code == 403
    # nothing was written by the refused requests
    with server.client(server.token()) as client:
        assert pending(client, "alpha") == 0 and pending(client, "beta") == 0


def test_peer_token_shape(server: Server) -> None:
    reader = peer_token(["GET", "HEAD"], ["/alpha/"])
    writer = peer_token(["*"], ["/alpha/_api/entities"], sub="aleph")
    with server.client(reader) as client:
        assert client.get("/alpha/_api/status").status_code == 200
        assert client.get("/beta/_api/status").status_code == 403
        assert client.post("/alpha/_api/entities", content=b"").status_code == 403
    with server.client(writer) as client:
        res = client.post("/alpha/_api/entities", content=b"")
        assert res.status_code == 200
        assert {k: res.json()[k] for k in ("entities", "statements", "tenant")} == {
            "entities": 0,
            "statements": 0,
            "tenant": "aleph",  # the peer token's sub
        }
        assert client.get("/alpha/_api/status").status_code == 403
    empty = peer_token([], [])
    with server.client(empty) as client:
        assert client.get("/alpha/_api/status").status_code == 403


def test_auth_validate_for_a_reverse_proxy(server: Server) -> None:
    def check(token: str | None, method: str, uri: str) -> int:
        headers = {"X-Original-Method": method, "X-Original-URI": uri}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return httpx.get(f"{server.url}/_auth/validate", headers=headers).status_code

    ours = server.token(datasets=("alpha",), actions=("read",))
    peer = peer_token(["GET"], ["/alpha/"])
    assert check(None, "GET", "/alpha/_api/status") == 401
    assert check("garbage", "GET", "/alpha/_api/status") == 401
    for token in (ours, peer):
        assert check(token, "GET", "/alpha/_api/status?x=1") == 200
        assert check(token, "POST", "/alpha/_api/entities") == 403
        assert check(token, "GET", "/beta/_api/status") == 403
        # a traversal is judged where it lands
        assert check(token, "GET", "/alpha/../beta/_api/status") == 403
        assert check(token, "GET", "/alpha/%2e%2e/beta/_api/status") == 403


# --- writes and reads -------------------------------------------------------------


def test_write_get_query_delete(server: Server, admin: httpx.Client) -> None:
    assert admin.get("/alpha/_api/entities/statements/version").text == ""  # no table yet
    res = admin.post("/alpha/_api/entities", content=ndjson(ENTITIES), params={"origin": "crawl"})
    assert res.status_code == 200, res.text
    assert res.json()["entities"] == 3 and res.json()["statements"] >= 6
    assert pending(admin, "alpha") == res.json()["statements"]
    # unflushed: not in the tables yet; flush=true moves the journal first
    assert admin.get("/alpha/_api/entities/p-ann").status_code == 404
    got = admin.get("/alpha/_api/entities/p-ann", params={"flush": "true"})
    assert got.status_code == 200, got.text
    assert got.json()["properties"]["name"] == ["Ann Smith"] and got.json()["schema"] == "Person"
    assert pending(admin, "alpha") == 0
    assert int(admin.get("/alpha/_api/entities/statements/version").text) >= 0

    # a query streamed as NDJSON (the peer's body: an ftmq Query.to_dict())
    from ftmq.query import P, Query

    body = {"query": Query().where(P(name="Bob Jones")).to_dict()}
    res = admin.post("/alpha/_api/entities/query", json=body)
    assert res.status_code == 200 and res.headers["content-type"] == "application/x-ndjson"
    lines = [orjson.loads(line) for line in res.text.splitlines()]
    assert [line["id"] for line in lines] == ["p-bob"] and lines[0]["statements"]
    res = admin.post("/alpha/_api/entities/query", json={"schemata": ["Company"]})
    assert [orjson.loads(x)["id"] for x in res.text.splitlines()] == ["c-acme"]
    res = admin.post("/alpha/_api/entities/statements/query", json={"entity_ids": ["p-ann"]})
    statements = [orjson.loads(x) for x in res.text.splitlines()]
    assert {s["entity_id"] for s in statements} == {"p-ann"} and len(statements) >= 2

    # delete one statement, then the whole entity
    name = next(s for s in statements if s["prop"] == "nationality")
    res = admin.delete(f"/alpha/_api/entities/p-ann/statements/{name['id']}")
    assert res.status_code == 200 and res.text == "1"
    assert admin.delete("/alpha/_api/entities/p-ann/statements/nope").status_code == 404
    got = admin.get("/alpha/_api/entities/p-ann", params={"flush": "true"}).json()
    assert "nationality" not in got["properties"]
    res = admin.delete("/alpha/_api/entities/p-bob")
    assert res.status_code == 200 and int(res.text) >= 2
    assert admin.get("/alpha/_api/entities/p-bob", params={"flush": "true"}).status_code == 404


def test_statements_write(admin: httpx.Client) -> None:
    rows = [
        {"entity_id": "s-1", "schema": "Person", "prop": "name", "value": "Sam"},
        {"entity_id": "s-1", "schema": "Person", "prop": "country", "value": "fr"},
    ]
    res = admin.post("/beta/_api/statements", content=ndjson(rows))
    assert res.status_code == 200
    assert res.json()["statements"] == 2 and res.json()["tenant"] == "tester"
    got = admin.get("/beta/_api/entities/s-1", params={"flush": "true"}).json()
    assert got["properties"]["name"] == ["Sam"]


def test_bad_lines_are_422_naming_the_line_and_write_nothing(admin: httpx.Client) -> None:
    before = pending(admin, "beta")
    good = orjson.dumps(ENTITIES[0])
    for bad, what in (
        (b"{not json", "line 2"),
        (orjson.dumps({"id": "x", "schema": "NoSuchSchema", "properties": {}}), "line 2"),
        (b"[1, 2]", "line 2"),
    ):
        res = admin.post("/beta/_api/entities", content=good + b"\n" + bad + b"\n" + good)
        assert res.status_code == 422, res.text
        assert what in res.json()["detail"]
    row = {"entity_id": "s-2", "schema": "Person", "prop": "name", "value": "Z"}
    bad_row = {"entity_id": "s-2", "schema": "Person", "prop": "noSuchProp", "value": "Z"}
    res = admin.post("/beta/_api/statements", content=ndjson([row, row, bad_row]))
    assert res.status_code == 422 and "line 3" in res.json()["detail"]
    assert pending(admin, "beta") == before


def test_bad_input(server: Server, admin: httpx.Client) -> None:
    assert admin.get("/nosuch/_api/status").status_code == 404
    assert admin.get("/Bad-Name/_api/status").status_code == 422
    assert (
        admin.post("/alpha/_api/entities", params={"origin": "a/b"}, content=b"").status_code == 422
    )
    assert admin.get("/alpha/_api/entities/" + "x" * 5000).status_code == 422
    assert admin.get("/alpha/_api/archive/not-a-checksum").status_code == 422
    before = pending(admin, "alpha")
    big = ndjson(ENTITIES) * (BODY_LIMIT // len(ndjson(ENTITIES)) + 1)
    assert admin.post("/alpha/_api/entities", content=big).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit stops the stream
        for _ in range(BODY_LIMIT // 1024 + 2):
            yield b" " * 1024

    assert admin.post("/alpha/_api/entities", content=chunks()).status_code == 413
    assert pending(admin, "alpha") == before
    # query caps (LAKEHOUSE_API_QUERY_MAX_IN_VALUES=5 here) and malformed bodies
    from ftmq.query import P, Query

    many = Query().where(P(name__in=[str(i) for i in range(6)])).to_dict()
    res = admin.post("/alpha/_api/entities/query", json={"query": many})
    assert res.status_code == 422 and "maximum is 5" in res.text
    assert admin.post("/alpha/_api/entities/query", json={"query": {"q": 1}}).status_code == 422
    assert admin.post("/alpha/_api/entities/query", json={"nope": 1}).status_code == 422
    assert admin.post("/alpha/_api/entities/query", content=b"{").status_code == 422
    res = admin.post("/alpha/_api/entities/query", json={"schemata": ["NoSuchSchema"]})
    assert res.status_code == 422
    assert list((server.state_dir / "staging").iterdir()) == []


# --- the archive --------------------------------------------------------------------


def test_archive_upload_download_delete(server: Server, admin: httpx.Client) -> None:
    data = bytes(range(256)) * 100
    digest = hashlib.sha256(data).hexdigest()
    res = admin.post(
        "/alpha/_api/archive",
        params={"name": "report.pdf", "checksum": digest},
        content=data,
        headers={"Content-Type": "application/pdf"},
    )
    assert res.status_code == 201, res.text
    meta = res.json()
    assert meta["checksum"] == digest and meta["size"] == len(data)
    assert meta["name"] == "report.pdf" and meta["mimetype"] == "application/pdf"
    assert admin.get(f"/alpha/_api/archive/{digest}").json()["file_id"] == meta["file_id"]
    listed = [orjson.loads(x) for x in admin.get("/alpha/_api/archive").text.splitlines()]
    assert [m["checksum"] for m in listed] == [digest]

    res = admin.get(f"/alpha/_api/archive/{digest}/data")
    assert res.status_code == 200 and res.content == data
    assert res.headers["etag"] == f'"{digest}"'
    assert (
        admin.get(
            f"/alpha/_api/archive/{digest}/data", headers={"If-None-Match": f'"{digest}"'}
        ).status_code
        == 304
    )
    part = admin.get(f"/alpha/_api/archive/{digest}/data", headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == data[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{len(data)}"
    tail = admin.get(f"/alpha/_api/archive/{digest}/data", headers={"Range": "bytes=-5"})
    assert tail.status_code == 206 and tail.content == data[-5:]
    bad = admin.get(f"/alpha/_api/archive/{digest}/data", headers={"Range": f"bytes={len(data)}-"})
    assert bad.status_code == 416
    # HEAD: the GET's status and headers, of the whole file or of the range, no body
    head = admin.head(f"/alpha/_api/archive/{digest}/data")
    assert head.status_code == 200 and head.headers["content-length"] == str(len(data))
    assert head.headers["etag"] == f'"{digest}"' and head.content == b""
    head = admin.head(f"/alpha/_api/archive/{digest}/data", headers={"Range": "bytes=10-19"})
    assert head.status_code == 206 and head.headers["content-range"] == f"bytes 10-19/{len(data)}"
    assert head.headers["content-length"] == "10"

    # wrong checksum, oversize, a path for a name: refused, nothing stored
    wrong = admin.post(
        "/alpha/_api/archive", params={"name": "x.txt", "checksum": "0" * 64}, content=b"hello"
    )
    assert wrong.status_code == 422 and "checksum mismatch" in wrong.text
    assert (
        admin.post(
            "/alpha/_api/archive", params={"name": "big.bin"}, content=b"x" * (UPLOAD_LIMIT + 1)
        ).status_code
        == 413
    )
    for name in ("../../etc/passwd", "a/b", ".."):
        assert (
            admin.post("/alpha/_api/archive", params={"name": name}, content=b"x").status_code
            == 422
        )
    listed = admin.get("/alpha/_api/archive").text.splitlines()
    assert len(listed) == 1
    assert list((server.state_dir / "staging").iterdir()) == []

    # a read token cannot upload; delete the metadata entry
    with server.client(server.token(actions=("read",))) as reader:
        assert (
            reader.post("/alpha/_api/archive", params={"name": "r.txt"}, content=b"r").status_code
            == 403
        )
    res = admin.delete(f"/alpha/_api/archive/{digest}/{meta['file_id']}")
    assert res.status_code == 200 and res.json()["file_id"] == meta["file_id"]
    assert admin.get(f"/alpha/_api/archive/{digest}").status_code == 404


# --- operations and exports ----------------------------------------------------------


def wait_for(client: httpx.Client, location: str, timeout: float = 240) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(location).json()
        if job["state"] in ("succeeded", "failed", "cancelled"):
            return dict(job)
        assert time.monotonic() < deadline, job
        time.sleep(0.2)


def test_operations_and_exports(server: Server, admin: httpx.Client) -> None:
    admin.post("/alpha/_api/entities", content=ndjson(ENTITIES))
    with server.client(server.token(actions=("read",))) as reader:
        assert reader.post("/alpha/_api/operations", json={"name": "make"}).status_code == 403
    res = admin.post("/alpha/_api/operations", json={"name": "MakeJob"})
    assert res.status_code == 202, res.text
    job = res.json()
    assert job["state"] in ("queued", "running") and job["operation"] == "make"
    assert res.headers["location"] == f"/alpha/_api/operations/{job['id']}"
    with server.client(server.token(actions=("read",))) as reader:
        done = wait_for(reader, res.headers["location"])
    assert done["state"] == "succeeded", done
    assert set(done["result"]["written"]) >= {"statements", "entities", "statistics", "index"}  # type: ignore[index]
    assert job["id"] in [j["id"] for j in admin.get("/alpha/_api/operations").json()]
    assert admin.post("/alpha/_api/operations", json={"name": "CrawlJob"}).status_code == 400
    assert (
        admin.post("/alpha/_api/operations", json={"name": "export", "kinds": ["x"]}).status_code
        == 422
    )
    assert admin.get("/alpha/_api/operations/nothex").status_code == 422
    assert admin.get(f"/alpha/_api/operations/{'0' * 32}").status_code == 404
    assert admin.get(f"/beta/_api/operations/{job['id']}").status_code == 404

    for name, peer_path in (
        ("statements.csv", "/alpha/exports/statements.csv"),
        ("entities.ftm.json", "/alpha/entities.ftm.json"),
        ("statistics.json", "/alpha/exports/statistics.json"),
        ("index.json", "/alpha/index.json"),
    ):
        res = admin.get(f"/alpha/_api/exports/{name}")
        assert res.status_code == 200, (name, res.text)
        etag = f'"{hashlib.sha256(res.content).hexdigest()}"'
        assert res.headers["etag"] == etag
        assert admin.get(peer_path).content == res.content
        again = admin.get(f"/alpha/_api/exports/{name}", headers={"If-None-Match": etag})
        assert again.status_code == 304 and not again.content
        part = admin.get(peer_path, headers={"Range": "bytes=0-9"})
        assert part.status_code == 206 and part.content == res.content[:10]
    entities = admin.get("/alpha/_api/exports/entities.ftm.json").text.splitlines()
    assert {orjson.loads(x)["id"] for x in entities} == {"p-ann", "p-bob", "c-acme"}
    assert admin.get("/alpha/_api/exports/secrets.txt").status_code == 422
    assert admin.get("/alpha/exports/../config.yml").status_code == 404
    assert admin.get("/beta/_api/exports/statements.csv").status_code == 404

    streamed = [orjson.loads(x) for x in admin.get("/alpha/_api/entities").text.splitlines()]
    assert {e["id"] for e in streamed} == {"p-ann", "p-bob", "c-acme"}
    with RemoteLakehouse(server.url, token=server.token(actions=("read",))) as remote:
        assert list(remote.dataset("alpha").stream_entities()) == streamed
    assert admin.get("/alpha/_api/entities/stats").status_code == 200
    versions = admin.get("/alpha/_api/versions").json()
    assert versions and versions[-1]["sequence"] >= 1
    status = admin.get("/alpha/_api/status").json()
    assert status["journal_pending"] == 0 and status["tenant"] == "tester"
    assert status["version"]["sequence"] == versions[-1]["sequence"]
    as_of = admin.get("/alpha/_api/entities/c-acme", params={"as_of": versions[-1]["sequence"]})
    assert as_of.status_code == 200 and as_of.json()["id"] == "c-acme"

    # an export as it was at a version, re-made
    head = versions[-1]["sequence"]
    current = admin.get("/alpha/_api/exports/entities.ftm.json").content
    then = admin.get("/alpha/_api/exports/entities.ftm.json", params={"as_of": head})
    assert then.status_code == 200 and then.headers["etag"].strip('"') == (
        hashlib.sha256(then.content).hexdigest()
    )
    # the same entities (the re-made lines may differ from Spark's export in
    # last_change, for an entity written twice: seen, not this issue's)
    assert {orjson.loads(x)["id"] for x in then.content.splitlines()} == {
        orjson.loads(x)["id"] for x in current.splitlines()
    }
    assert admin.get("/alpha/_api/exports/index.json", params={"as_of": head}).status_code == 422
    assert admin.get("/alpha/_api/exports/statements.csv", params={"as_of": 999}).status_code == 404
    assert list((server.state_dir / "staging").iterdir()) == []

    # the graph index (make built it) and the version diff
    res = admin.get("/alpha/_api/entities/c-acme/refs", params={"direction": "both"})
    assert res.status_code == 200 and res.json() == []
    assert (
        admin.get("/alpha/_api/entities/c-acme/refs", params={"direction": "up"}).status_code == 422
    )
    around = admin.get("/alpha/_api/entities/c-acme/neighbours", params={"depth": 2})
    assert [orjson.loads(x)["id"] for x in around.text.splitlines()] == ["c-acme"]
    assert (
        admin.get("/alpha/_api/entities/c-acme/neighbours", params={"depth": 9}).status_code == 422
    )
    res = admin.get("/alpha/_api/diff", params={"from": head, "to": head})
    assert res.status_code == 400 and "newer" in res.json()["detail"]
    if head > 1:
        res = admin.get("/alpha/_api/diff", params={"from": head - 1, "to": head})
        assert res.status_code == 200 and all(orjson.loads(x)["op"] for x in res.text.splitlines())
    assert admin.get("/alpha/_api/diff", params={"from": 999, "to": head}).status_code == 404
    assert admin.get("/alpha/_api/entities/c-acme", params={"as_of": 999}).status_code == 404

    # the peer's flush answers the count of new statements once its job is done
    admin.post(
        "/alpha/_api/entities",
        content=ndjson([{"id": "p-new", "schema": "Person", "properties": {"name": ["New"]}}]),
    )
    res = admin.post("/alpha/_api/entities/flush")
    assert res.status_code == 200 and int(res.text) >= 1
    assert pending(admin, "alpha") == 0


def test_queue_push(server: Server, admin: httpx.Client) -> None:
    item = {"action": "UPSERT", "resource": "entity", "payload": ENTITIES[2]}
    res = admin.post("/beta/_api/queue", json=item)
    assert res.status_code == 201, res.text
    assert res.json()["tenant"] == "tester" and res.json()["action"] == "UPSERT"
    assert admin.get("/beta/_api/queue").json() == {"pending": 1}
    bad = {"action": "UPSERT", "resource": "entity", "payload": {"id": "x", "schema": "Nope"}}
    assert admin.post("/beta/_api/queue", json=bad).status_code == 422
    for uri in ("/etc/passwd", "file:///etc/passwd", "relative.txt"):
        local = {"action": "UPSERT", "resource": "file", "payload": {"uri": uri}}
        assert admin.post("/beta/_api/queue", json=local).status_code == 422
    url = {"action": "UPSERT", "resource": "file", "payload": {"uri": "https://example.org/a.pdf"}}
    assert admin.post("/beta/_api/queue", json=url).status_code == 201
    with server.client(server.token(actions=("read",))) as reader:
        assert reader.post("/beta/_api/queue", json=item).status_code == 403
    assert admin.get("/beta/_api/queue").json() == {"pending": 2}


def raw_request(server: Server, head: str, body: bytes, *, wait: float) -> bytes:
    """Send a request's head and part of its body on a bare socket; what came back
    within ``wait`` seconds (the socket then closes: the client goes away)."""
    import socket

    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as sock:
        sock.sendall(head.encode() + b"\r\n\r\n" + body)
        try:
            return sock.recv(65536)
        except TimeoutError:
            return b""


def test_stalled_and_vanished_clients_leave_nothing(server: Server, admin: httpx.Client) -> None:
    token = server.token(actions=("write", "read"))
    before = (pending(admin, "alpha"), admin.get("/alpha/_api/archive").text)
    line = orjson.dumps(ENTITIES[0]) + b"\n"
    for path in ("/alpha/_api/entities", "/alpha/_api/archive?name=cut.bin"):
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Length: {len(line) * 100}"
        )
        # stalled: the server gives up after LAKEHOUSE_API_UPLOAD_TIMEOUT_SECONDS (2 s here)
        answer = raw_request(server, head, line * 10, wait=10)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        # vanished: the client closes mid-body
        raw_request(server, head, line * 10, wait=0.3)
    time.sleep(0.5)
    assert (pending(admin, "alpha"), admin.get("/alpha/_api/archive").text) == before
    assert list((server.state_dir / "staging").iterdir()) == []


def test_the_peers_arrow_journal_bulk(server: Server, admin: httpx.Client) -> None:
    """A batch as the peer's ApiJournalStore sends it (its columns, Arrow IPC)."""
    import pyarrow as pa

    def stream(rows: list[dict[str, object]]) -> bytes:
        sink = pa.BufferOutputStream()
        table = pa.Table.from_pylist(rows)
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return bytes(sink.getvalue().to_pybytes())

    def row(prop: str, value: str, **extra: object) -> dict[str, object]:
        return {
            "shard": "0a", "id": "peer-made-id", "entity_id": "arrow-1", "dataset": "beta",
            "bucket": "thing", "origin": "peer", "schema": "Person", "prop": prop,
            "value": value, "external": False, "fragment": "", "deleted_at": None,
            "first_seen": datetime.now(UTC), "last_seen": datetime.now(UTC), **extra,
        }  # fmt: skip

    arrow = {"Content-Type": "application/vnd.apache.arrow.stream"}
    before = pending(admin, "beta")
    bad = stream([row("name", "Arrow Ann"), row("name", "X", fragment="f1")])
    res = admin.post("/beta/_api/journal/bulk", content=bad, headers=arrow)
    assert res.status_code == 422 and "line 2" in res.text
    assert (
        admin.post("/beta/_api/journal/bulk", content=b"garbage", headers=arrow).status_code == 422
    )
    assert pending(admin, "beta") == before
    good = stream([row("name", "Arrow Ann"), row("nationality", "fr")])
    res = admin.post("/beta/_api/journal/bulk", content=good, headers=arrow)
    assert res.status_code == 200 and res.text == "2"
    got = admin.get("/beta/_api/entities/arrow-1", params={"flush": "true"}).json()
    assert got["properties"] == {"name": ["Arrow Ann"], "nationality": ["fr"]}
    assert got["origin"] == ["peer"]
