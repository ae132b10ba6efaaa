"""Delta Sharing: the real connector (``delta-sharing`` 1.4, its own venv) against the
real server on 127.0.0.1, on a local lake and on the S3 server.

One lake and one server per module: two datasets (``alpha`` with three
versions of its tables, ``beta`` with one); what the connector reads is
compared with delta-rs's own read of the same table (``DeltaTable.to_pandas``:
rows and types), at the head, at an older version and at a timestamp.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from deltalake import DeltaTable

from lakehouse_assets import Lakehouse, Settings
from lakehouse_assets.sharing import issue, profile
from lakehouse_assets_tests.conftest import make_bucket, sample_entities
from lakehouse_assets_tests.helpers.server import REPO, SECRET, Server, running_server, s3_env
from lakehouse_assets_tests.helpers.sharing import assert_same_frame, connector

pytestmark = pytest.mark.slow

TABLES = ("statements", "translog", "changes")


@dataclass
class Shared:
    server: Server
    lake: Lakehouse
    base: Path
    #: ISO time between alpha's first and second version
    between: str

    def profile(self, datasets: tuple[str, ...] = ("alpha", "beta"), **kw: Any) -> Path:
        token, claims = issue(
            SECRET, tenant="analysts", datasets=list(datasets), expires=timedelta(hours=1)
        )
        return self.write_profile(token, claims["exp"], **kw)

    def write_profile(self, token: str, exp: int, name: str | None = None) -> Path:
        path = self.base / f"{name or os.urandom(4).hex()}.share"
        doc = profile(self.server.url + "/delta-sharing", token, exp)
        path.write_text(json.dumps(doc))
        return path

    def tables(self, dataset: str) -> list[str]:
        """The tables of a dataset that delta-rs finds."""
        ds = self.lake.dataset(dataset)
        where = (ds.statements_table, ds.translog_table, ds.changes_table)
        return [t for t, w in zip(TABLES, where, strict=True) if w.exists()]

    def table(self, dataset: str, table: str, version: int | None = None) -> DeltaTable:
        ds = self.lake.dataset(dataset)
        where = {"statements": ds.statements_table, "translog": ds.translog_table}.get(
            table, ds.changes_table
        )
        return DeltaTable(where.uri, version=version, storage_options=dict(where.storage_options))


def _build(lake: Lakehouse) -> str:
    """alpha: v0 (origin a), v1 (origin mapping:x1), v2 (a delete); beta: v0."""
    entities = [json.dumps(e).encode() for e in sample_entities()]
    alpha = lake.create_dataset("alpha")
    alpha.write_entities(entities[:5], origin="a")
    alpha.flush()
    time.sleep(1.2)
    between = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    time.sleep(1.2)
    alpha.write_entities(entities[5:], origin="mapping:x1")
    alpha.flush()
    alpha.delete_entity(str(sample_entities()[0]["id"]))
    alpha.flush()
    beta = lake.create_dataset("beta")
    beta.write_entities(entities[:3], origin="b")
    beta.flush()
    return between


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    base = tmp_path_factory.mktemp("sharing")
    lake = Lakehouse(base / "lake", journal_url=f"sqlite:///{base / 'journal.sqlite'}")
    between = _build(lake)
    (base / "state").mkdir()
    with running_server(lake, base / "state") as server:
        yield Shared(server, lake, base, between)


@pytest.mark.parametrize("delta", [None, False], ids=["format_chosen", "parquet_format"])
def test_the_connector_reads_every_table_as_delta_rs_does(
    shared: Shared, delta: bool | None
) -> None:
    """list_all_tables, then load_as_pandas of each table at the head, at version 0
    and at a timestamp, each equal to delta-rs's read (rows and types): with the
    format the connector and the server agree on (delta, read by delta-kernel)
    and with the parquet format (the connector's file-by-file read)."""
    names = [f"lake.{d}.{t}" for d in ("alpha", "beta") for t in shared.tables(d)]
    assert len(names) >= 4  # beta's first flush has no change feed yet
    ops: list[dict[str, Any]] = [{"op": "list_all_tables"}]
    ops += [{"op": "load", "table": n, "delta": delta} for n in names]
    ops += [
        {"op": "load", "table": f"lake.alpha.{t}", "version": 0, "delta": delta} for t in TABLES
    ]
    ops += [
        {"op": "load", "table": f"lake.alpha.{t}", "timestamp": shared.between, "delta": delta}
        for t in TABLES
    ]
    ops += [{"op": "version", "table": "lake.alpha.statements"}]
    results = connector(shared.profile(), ops, shared.base / f"all-{delta}")
    assert all(r["ok"] for r in results), [r.get("error") for r in results]
    assert sorted(results[0]["tables"]) == sorted(names)
    heads = results[1 : 1 + len(names)]
    for name, result in zip(names, heads, strict=True):
        _, dataset, table = name.split(".")
        assert_same_frame(result["frame"], shared.table(dataset, table).to_pandas())
    at_zero = results[1 + len(names) : 1 + len(names) + 3]
    at_time = results[1 + len(names) + 3 : 1 + len(names) + 6]
    for table, zero, timed in zip(TABLES, at_zero, at_time, strict=True):
        want = shared.table("alpha", table, version=0).to_pandas()
        assert_same_frame(zero["frame"], want)
        assert_same_frame(timed["frame"], want)
        assert len(zero["frame"]) < len(heads[TABLES.index(table)]["frame"])
    assert results[-1]["version"] == shared.table("alpha", "statements").version()


def test_the_answer_is_in_the_format_the_client_offers(shared: Shared) -> None:
    """``delta-sharing-capabilities``: delta offered (alone or beside parquet), a delta
    answer (the table's own protocol, metadata and add actions, their paths the
    signed URLs); nothing or parquet offered, parquet; neither, 400; the changes,
    parquet only."""
    token = json.loads(shared.profile(("alpha",)).read_text())["bearerToken"]
    base = "/delta-sharing/shares/lake/schemas/alpha/tables/statements"
    table = shared.table("alpha", "statements")
    header = "delta-sharing-capabilities"
    with shared.server.client(token) as c:
        for offered in ("responseformat=delta", "responseformat=delta,parquet;readerfeatures=x"):
            res = c.post(f"{base}/query", headers={header: offered})
            assert res.status_code == 200 and res.headers[header] == "responseformat=delta"
            lines = [json.loads(x) for x in res.text.splitlines()]
            protocol = table.protocol()
            assert lines[0] == {
                "protocol": {
                    "deltaProtocol": {
                        "minReaderVersion": protocol.min_reader_version,
                        "minWriterVersion": protocol.min_writer_version,
                    }
                }
            }
            meta = lines[1]["metaData"]
            assert meta["version"] == table.version()
            assert meta["deltaMetadata"]["id"] == table.metadata().id
            assert json.loads(meta["deltaMetadata"]["schemaString"]) == json.loads(
                table.schema().to_json()
            )
            adds = [line["file"]["deltaSingleAction"]["add"] for line in lines[2:]]
            assert len(adds) == len(table.file_uris())
            assert sorted(a["size"] for a in adds) == sorted(add_sizes(table))
            assert all(
                a["path"].startswith("http://127.0.0.1") and "sp=r&" in a["path"] for a in adds
            )
            assert c.get(adds[0]["path"]).content[:4] == b"PAR1"
            meta_res = c.get(f"{base}/metadata", headers={header: offered})
            assert meta_res.headers[header] == "responseformat=delta"
            assert [json.loads(x) for x in meta_res.text.splitlines()] == lines[:2]
        for parquet in ({}, {header: "responseformat=parquet"}):
            res = c.post(f"{base}/query", headers=parquet)
            assert res.headers[header] == "responseformat=parquet"
            assert '"deltaSingleAction"' not in res.text and '"url"' in res.text
        res = c.post(f"{base}/query", headers={header: "responseformat=arrow"})
        assert res.status_code == 400 and "arrow" in res.json()["message"]
        changes = "/delta-sharing/shares/lake/schemas/alpha/tables/changes/changes"
        res = c.get(
            changes, params={"startingVersion": 0}, headers={header: "responseformat=delta"}
        )
        assert res.status_code == 400 and "parquet response format only" in res.json()["message"]
        res = c.get(
            changes, params={"startingVersion": 0}, headers={header: "responseformat=delta,parquet"}
        )
        assert res.status_code == 200 and res.headers[header] == "responseformat=parquet"


def add_sizes(table: DeltaTable) -> list[int]:
    """The sizes of the table's files, from its own add actions."""
    from lakehouse_assets.tables.delta import add_actions_table

    return [int(s) for s in add_actions_table(table).column("size_bytes").to_pylist()]


def test_changes_where_served_and_refused_where_not(shared: Shared) -> None:
    """The change feed of an append-only range: the rows its versions added; a range
    with a commit that removes data: the connector's read fails with our 400."""
    head = shared.table("alpha", "changes").version()
    ops = [
        {"op": "changes", "table": "lake.alpha.changes", "starting_version": 1},
        {
            "op": "changes",
            "table": "lake.alpha.statements",
            "starting_version": 0,
            "ending_version": 1,
        },
    ]
    translog_removes = _removes_data(shared.table("alpha", "translog"))
    ops.append({"op": "changes", "table": "lake.alpha.translog", "starting_version": 0})
    results = connector(shared.profile(), ops, shared.base / "changes")
    feed, statements, translog = results
    assert feed["ok"] and statements["ok"], results
    for result, table, start, end in (
        (feed, "changes", 1, head),
        (statements, "statements", 0, 1),
    ):
        got = result["frame"]
        assert set(got["_change_type"]) == {"insert"}
        assert set(got["_commit_version"]) <= set(range(start, end + 1))
        before = shared.table("alpha", table, version=start - 1).to_pandas() if start else None
        after = shared.table("alpha", table, version=end).to_pandas()
        added = after if before is None else after.merge(before, how="left", indicator=True)
        if before is not None:
            added = added[added["_merge"] == "left_only"].drop(columns="_merge")
        data = got.drop(columns=["_change_type", "_commit_version", "_commit_timestamp"])
        assert_same_frame(data, added.astype(after.dtypes.to_dict()))
    assert translog_removes  # the delete's flush rewrote translog files
    assert not translog["ok"] and "has no change data feed" in translog["error"]


def _removes_data(dt: DeltaTable) -> bool:
    return any(
        h.get("operation") not in ("WRITE", "CREATE TABLE", "OPTIMIZE") for h in dt.history()
    ) or any("remove" in line for line in _log_lines(dt))


def _log_lines(dt: DeltaTable) -> list[str]:
    folder = Path(dt.table_uri.removeprefix("file://")) / "_delta_log"
    lines = []
    for path in folder.glob("*.json"):
        lines += [
            line
            for line in path.read_text().splitlines()
            if '"remove"' in line and '"dataChange":true' in line
        ]
    return lines


def test_a_token_sees_only_its_datasets(shared: Shared) -> None:
    """A profile for alpha lists alpha's tables only and cannot read beta's; the
    route answers 403 for beta whether or not it exists."""
    path = shared.profile(("alpha",))
    ops: list[dict[str, Any]] = [
        {"op": "list_all_tables"},
        {"op": "load", "table": "lake.beta.statements"},
    ]
    listed, beta = connector(path, ops, shared.base / "scope")
    assert sorted(listed["tables"]) == sorted(f"lake.alpha.{t}" for t in TABLES)
    assert not beta["ok"] and "403" in beta["error"]
    token = json.loads(path.read_text())["bearerToken"]
    with shared.server.client(token) as c:
        base = "/delta-sharing/shares/lake/schemas"
        assert [s["name"] for s in c.get(base).json()["items"]] == ["alpha"]
        for schema in ("beta", "nonexistent"):
            res = c.post(f"{base}/{schema}/tables/statements/query", json={})
            assert res.status_code == 403 and res.json()["errorCode"] == "PERMISSION_DENIED"
        # paging: one table a page, the token carries on
        first = c.get("/delta-sharing/shares/lake/all-tables", params={"maxResults": 1}).json()
        assert len(first["items"]) == 1 and first["nextPageToken"]
        seen = [first["items"][0]["name"]]
        token_ = first["nextPageToken"]
        while token_:
            page = c.get(
                "/delta-sharing/shares/lake/all-tables",
                params={"maxResults": 1, "pageToken": token_},
            ).json()
            seen += [t["name"] for t in page["items"]]
            token_ = page.get("nextPageToken")
        assert sorted(seen) == sorted(TABLES)
        # a profile token opens nothing of the tenant API (its audience)
        assert c.get("/alpha/_api/entities/stats").status_code == 401


def test_forged_expired_revoked_tokens_and_tampered_urls_are_refused(shared: Shared) -> None:
    url = "/delta-sharing/shares/lake/all-tables"
    now = int(time.time())
    claims = {"sub": "analysts", "datasets": ["*"], "actions": ["read"], "aud": "delta-sharing"}
    forged = jwt.encode({**claims, "exp": now + 600}, "x" * 40, algorithm="HS256")
    expired = jwt.encode({**claims, "exp": now - 10}, SECRET, algorithm="HS256")
    write_only = jwt.encode({**claims, "actions": ["write"], "exp": now + 600}, SECRET)
    for token, status in ((forged, 401), (expired, 401), ("not-a-jwt", 401), (write_only, 403)):
        with shared.server.client(token) as c:
            assert c.get(url).status_code == status
    with httpx.Client(base_url=shared.server.url) as anonymous:
        assert anonymous.get(url).status_code == 401

    # a file URL: HEAD and Range answered; tampered, or for another table: refused
    path = shared.profile(("alpha",), name="revoked")
    token = json.loads(path.read_text())["bearerToken"]
    with shared.server.client(token) as c:
        res = c.post("/delta-sharing/shares/lake/schemas/alpha/tables/statements/query", json={})
        assert res.status_code == 200 and res.headers["delta-table-version"]
        lines = [json.loads(x) for x in res.text.splitlines()]
        file = next(x["file"] for x in lines if "file" in x)
    with httpx.Client() as plain:  # a file URL needs no bearer token
        head = plain.head(file["url"])
        assert head.status_code == 200 and int(head.headers["content-length"]) == file["size"]
        part = plain.get(file["url"], headers={"Range": "bytes=0-3"})
        assert part.status_code == 206 and part.content == b"PAR1"
        assert part.headers["content-range"] == f"bytes 0-3/{file['size']}"
        # the whole file as the lake holds it; the footer by a suffix range (how
        # Parquet readers start); HEAD of a range; ETag → 304; past the end → 416
        whole = plain.get(file["url"])
        on_disk = shared.lake.store.read_bytes(f"alpha/entities/statements/{_granted(file)}")
        assert whole.status_code == 200 and whole.content == on_disk
        tail = plain.get(file["url"], headers={"Range": "bytes=-8"})
        assert tail.status_code == 206 and tail.content == on_disk[-8:]
        assert tail.content.endswith(b"PAR1")
        head = plain.head(file["url"], headers={"Range": "bytes=4-103"})
        assert head.status_code == 206 and head.headers["content-length"] == "100"
        assert head.headers["content-range"] == f"bytes 4-103/{file['size']}"
        etag = whole.headers["etag"]
        again = plain.get(file["url"], headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b""
        past = plain.get(file["url"], headers={"Range": f"bytes={file['size']}-"})
        assert past.status_code == 416
        assert past.headers["content-range"] == f"bytes */{file['size']}"
        prefix, _, query = file["url"].partition("?")
        params = dict(p.split("=", 1) for p in query.split("&"))
        tampered = dict(params, s=params["s"][:-2] + ("AA" if params["s"][-2:] != "AA" else "BB"))
        assert plain.get(prefix, params=tampered).status_code == 403
        fields = json.loads(base64.urlsafe_b64decode(params["g"] + "=" * (-len(params["g"]) % 4)))
        fields[0] = "beta"  # the same file name under another dataset: the signature fails
        forged_g = base64.urlsafe_b64encode(json.dumps(fields).encode()).decode().rstrip("=")
        assert plain.get(prefix, params=dict(params, g=forged_g)).status_code == 403

    # revoked: the token and the file URLs it was given stop working
    revoke = subprocess.run(
        [
            sys.executable,
            "-m",
            "lakehouse_assets.cli",
            "--lake",
            shared.lake.store.uri,
            "sharing",
            "revoke",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "PYTHONPATH": str(REPO),
            "LAKEHOUSE_API_SECRET": SECRET,
            "LAKEHOUSE_API_STATE_DIR": str(shared.server.state_dir),
        },
    )
    assert revoke.returncode == 0, revoke.stderr
    with shared.server.client(token) as c:
        assert c.get(url).status_code == 401
    with httpx.Client() as plain:
        assert plain.get(file["url"]).status_code == 403


def _granted(file: dict[str, Any]) -> str:
    """The table file's path a local file URL grants (the grant's third field)."""
    query = dict(p.split("=", 1) for p in file["url"].partition("?")[2].split("&"))
    grant = query["g"]
    return str(json.loads(base64.urlsafe_b64decode(grant + "=" * (-len(grant) % 4)))[2])


def test_an_expired_file_url_is_refused(shared: Shared, tmp_path: Path) -> None:
    from lakehouse_assets.sharing.urls import FileGrant, sign, url_key

    grant = FileGrant("alpha", "statements", "x.parquet", int(time.time()) - 1, None)
    url = f"{shared.server.url}/delta-sharing/files/{sign(url_key(SECRET), grant)}"
    res = httpx.get(url)
    assert res.status_code == 403 and "expired" in res.json()["message"]
    escape = FileGrant("alpha", "statements", "../../beta/x", int(time.time()) + 60, None)
    url = f"{shared.server.url}/delta-sharing/files/{sign(url_key(SECRET), escape)}"
    assert httpx.get(url).status_code == 403


def test_the_profile_command_writes_a_profile_the_connector_reads(
    shared: Shared, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lakehouse_assets.cli",
            "--lake",
            shared.lake.store.uri,
            "sharing",
            "profile",
            "--tenant",
            "analysts",
            "--dataset",
            "beta",
            "--expires",
            "2d",
            "--endpoint",
            shared.server.url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "LAKEHOUSE_API_SECRET": SECRET},
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["shareCredentialsVersion"] == 1
    assert doc["endpoint"] == shared.server.url + "/delta-sharing"
    assert doc["expirationTime"].endswith("Z")
    path = tmp_path / "beta.share"
    path.write_text(proc.stdout)
    (listed,) = connector(path, [{"op": "list_all_tables"}], tmp_path / "out")
    assert sorted(listed["tables"]) == sorted(f"lake.beta.{t}" for t in shared.tables("beta"))


@pytest.mark.s3
def test_the_connector_reads_an_s3_lake_through_presigned_urls(
    s3_settings: Settings, tmp_path: Path
) -> None:
    bucket = make_bucket(s3_settings)
    lake = Lakehouse(
        f"s3://{bucket}/lake",
        settings=s3_settings,
        journal_url=f"sqlite:///{tmp_path / 'journal.sqlite'}",
    )
    between = _build(lake)
    (tmp_path / "state").mkdir()
    env = s3_env(s3_settings, tmp_path / "cache")
    with running_server(lake, tmp_path / "state", **env) as server:
        s = Shared(server, lake, tmp_path, between)
        ops: list[dict[str, Any]] = [{"op": "load", "table": f"lake.alpha.{t}"} for t in TABLES]
        ops.append({"op": "load", "table": "lake.alpha.statements", "version": 0})
        ops.append({"op": "load", "table": "lake.alpha.statements", "timestamp": between})
        ops.append({"op": "changes", "table": "lake.alpha.changes", "starting_version": 0})
        ops.append({"op": "load", "table": "lake.alpha.statements", "delta": False})
        results = connector(s.profile(("alpha",)), ops, tmp_path / "out")
        assert all(r["ok"] for r in results), [r.get("error") for r in results]
        for table, result in zip(TABLES, results, strict=False):
            assert_same_frame(result["frame"], s.table("alpha", table).to_pandas())
        old = s.table("alpha", "statements", version=0).to_pandas()
        assert_same_frame(results[3]["frame"], old)
        assert_same_frame(results[4]["frame"], old)
        assert len(results[5]["frame"]) == len(s.table("alpha", "changes").to_pandas())
        # the loads above in the format the two agreed on (delta), this one in parquet
        assert_same_frame(results[6]["frame"], s.table("alpha", "statements").to_pandas())
        # the URLs are the S3 server's, presigned: no lake credentials travel
        token = json.loads(s.profile(("alpha",)).read_text())["bearerToken"]
        with server.client(token) as c:
            res = c.post("/delta-sharing/shares/lake/schemas/alpha/tables/statements/query")
            urls = [json.loads(x)["file"]["url"] for x in res.text.splitlines() if '"file"' in x]
        assert urls and all(u.startswith(str(s3_settings.s3_endpoint_url)) for u in urls)
        assert all("X-Amz-Signature=" in u for u in urls)  # V4: delta-kernel knows it
