"""The HTTP API on an S3 lake (the loopback moto server) with a PostgreSQL journal."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from lakehouse_assets import Lakehouse, Settings
from lakehouse_assets_tests.conftest import make_bucket
from lakehouse_assets_tests.helpers.server import running_server, s3_env

pytestmark = [pytest.mark.s3, pytest.mark.postgres]


def test_writes_reads_and_files_on_s3_with_postgresql(
    s3_settings: Settings, postgres_database: str, tmp_path: Path
) -> None:
    bucket = make_bucket(s3_settings)
    lake = Lakehouse(f"s3://{bucket}/lake", settings=s3_settings, journal_url=postgres_database)
    lake.create_dataset("remote")
    (tmp_path / "state").mkdir()
    env = s3_env(s3_settings, tmp_path / "cache")
    with running_server(lake, tmp_path / "state", **env) as server:
        with server.client(server.token(datasets=("remote",), actions=("read", "write"))) as c:
            rows = [
                {"id": "s3-a", "schema": "Person", "properties": {"name": ["A"]}},
                {"id": "s3-b", "schema": "Company", "properties": {"name": ["B Ltd"]}},
            ]
            body = b"".join(orjson.dumps(r) + b"\n" for r in rows)
            res = c.post("/remote/_api/entities", content=body)
            assert res.status_code == 200 and res.json()["entities"] == 2
            bad = c.post("/remote/_api/entities", content=body + b"{oops\n")
            assert bad.status_code == 422 and "line 3" in bad.text
            assert int(c.get("/remote/_api/journal/count").text) == res.json()["statements"]
            got = c.get("/remote/_api/entities/s3-b", params={"flush": "true"})
            assert got.status_code == 200 and got.json()["properties"]["name"] == ["B Ltd"]
            assert c.delete("/remote/_api/entities/s3-a").text == "2"

            data = bytes(range(256)) * 64
            digest = hashlib.sha256(data).hexdigest()
            up = c.post(
                "/remote/_api/archive", params={"name": "a.bin", "checksum": digest}, content=data
            )
            assert up.status_code == 201, up.text
            whole = c.get(f"/remote/_api/archive/{digest}/data")
            assert whole.content == data and whole.headers["etag"] == f'"{digest}"'
            part = c.get(
                f"/remote/_api/archive/{digest}/data", headers={"Range": "bytes=1000-1099"}
            )
            assert part.status_code == 206 and part.content == data[1000:1100]
        assert list((tmp_path / "state" / "staging").iterdir()) == []


def _route_of(path: str, templates: list[tuple[str, re.Pattern[str]]]) -> str | None:
    for template, pattern in templates:
        if pattern.fullmatch(path):
            return template
    return None


def _templates(openapi: dict[str, Any]) -> list[tuple[str, re.Pattern[str]]]:
    """The schema's paths as patterns, the literal ones first (``/x/_api/versions``
    must not count as the entity route ``/x/_api/entities/{entity_id}``)."""
    found = []
    for template in openapi["paths"]:
        parts = re.split(r"\{[^}]+\}", template)
        regex = "[^/]+".join(re.escape(part) for part in parts)
        found.append((template, re.compile(regex)))
    return sorted(found, key=lambda item: (item[0].count("{"), -len(item[0])))


@pytest.mark.slow
def test_every_route_answers_on_s3_with_postgresql(
    s3_settings: Settings, postgres_database: str, tmp_path: Path
) -> None:
    """Each route of the OpenAPI schema (every method) called at least once on an S3
    lake with a PostgreSQL journal, with its answer checked: the tables, exports,
    versions, graph index, archive, queue and operations all live in the bucket."""
    import pyarrow as pa

    bucket = make_bucket(s3_settings)
    lake = Lakehouse(f"s3://{bucket}/lake", settings=s3_settings, journal_url=postgres_database)
    lake.create_dataset("every")
    (tmp_path / "state").mkdir()
    env = s3_env(s3_settings, tmp_path / "cache")
    called: set[tuple[str, str]] = set()
    with running_server(lake, tmp_path / "state", **env) as server:
        openapi = httpx.get(f"{server.url}/openapi.json").json()
        templates = _templates(openapi)
        # the Delta Sharing routes have their S3 test in test_sharing (the real connector)
        expected = {
            (method.upper(), path)
            for path, item in openapi["paths"].items()
            for method in item
            if method in ("get", "post", "delete", "head", "put")
            and not path.startswith("/delta-sharing/")
        }

        def record(request: httpx.Request) -> None:
            route = _route_of(request.url.path, templates)
            if route is not None:
                called.add((request.method, route))

        token = server.token(datasets=("every",), actions=("admin",))
        c = httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=300,
            event_hooks={"request": [record]},
        )
        with c:
            # --- writes ----------------------------------------------------------
            entities = [
                {"id": "e-ann", "schema": "Person", "properties": {"name": ["Ann"]}},
                {"id": "e-co", "schema": "Company", "properties": {"name": ["Co Ltd"]}},
                {
                    "id": "e-own",
                    "schema": "Ownership",
                    "properties": {"owner": ["e-ann"], "asset": ["e-co"]},
                },
            ]
            res = c.post(
                "/every/_api/entities", content=b"".join(orjson.dumps(e) + b"\n" for e in entities)
            )
            assert res.status_code == 200 and res.json()["entities"] == 3
            stmt = {"entity_id": "e-ann", "schema": "Person", "prop": "country", "value": "fr"}
            res = c.post("/every/_api/statements", content=orjson.dumps(stmt) + b"\n")
            assert res.status_code == 200 and res.json()["statements"] == 1
            sink = pa.BufferOutputStream()
            table = pa.Table.from_pylist(
                [{"entity_id": "e-arrow", "schema": "Person", "prop": "name", "value": "Arrow",
                  "origin": "peer", "dataset": "every"}]
            )  # fmt: skip
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            arrow = {"Content-Type": "application/vnd.apache.arrow.stream"}
            res = c.post(
                "/every/_api/journal/bulk", content=sink.getvalue().to_pybytes(), headers=arrow
            )
            assert res.status_code == 200 and res.text == "1", res.text
            assert int(c.get("/every/_api/journal/count").text) >= 8
            queued = {"action": "UPSERT", "resource": "entity", "payload": entities[0]}
            assert c.post("/every/_api/queue", json=queued).status_code == 201
            assert c.get("/every/_api/queue").json() == {"pending": 1}

            # --- the archive -------------------------------------------------------
            data = b"bytes in a bucket\n" * 100
            digest = hashlib.sha256(data).hexdigest()
            up = c.post(
                "/every/_api/archive", params={"name": "n.txt", "file_id": "n.txt"}, content=data
            )
            assert up.status_code == 201 and up.json()["checksum"] == digest
            assert [
                m["checksum"]
                for m in map(orjson.loads, c.get("/every/_api/archive").text.splitlines())
            ] == [digest]
            assert c.get(f"/every/_api/archive/{digest}").json()["file_id"] == "n.txt"
            assert [m["file_id"] for m in c.get(f"/every/_api/archive/{digest}/files").json()] == [
                "n.txt"
            ]
            assert c.head(f"/every/_api/archive/{digest}/data").headers["etag"] == f'"{digest}"'
            part = c.get(f"/every/_api/archive/{digest}/data", headers={"Range": "bytes=0-4"})
            assert part.status_code == 206 and part.content == data[:5]

            # --- the peer's flush, then make (a job), reads --------------------------
            res = c.post("/every/_api/entities/flush")
            assert res.status_code == 200 and int(res.text) >= 8, res.text
            res = c.post("/every/_api/operations", json={"name": "make"})
            assert res.status_code == 202, res.text
            done = _wait(c, res.headers["location"])
            assert done["state"] == "succeeded", (done, server.log.read_text()[-3000:])
            assert any(j["id"] == done["id"] for j in c.get("/every/_api/operations").json())
            got = c.get("/every/_api/entities/e-ann")
            assert got.status_code == 200 and got.json()["properties"]["country"] == ["fr"]
            query = {"query": {}, "schemata": ["Person"], "flush_first": False}
            found = [
                orjson.loads(x)
                for x in c.post("/every/_api/entities/query", json=query).text.splitlines()
            ]
            assert sorted(e["id"] for e in found) == ["e-ann", "e-arrow"]
            rows = [
                orjson.loads(x)
                for x in c.post(
                    "/every/_api/entities/statements/query", json=query
                ).text.splitlines()
            ]
            assert {r["entity_id"] for r in rows} == {"e-ann", "e-arrow"}
            assert c.get("/every/_api/entities/statements/version").text.isdigit()
            assert c.get("/every/_api/entities/stats").json()["entity_count"] == 4
            streamed = c.get("/every/_api/entities").text.splitlines()
            assert len(streamed) == 4
            for name in ("statements.csv", "entities.ftm.json", "statistics.json", "index.json"):
                res = c.get(f"/every/_api/exports/{name}")
                assert (
                    res.status_code == 200
                    and res.headers["etag"] == f'"{hashlib.sha256(res.content).hexdigest()}"'
                )
                assert c.head(f"/every/_api/exports/{name}").status_code == 200
            assert c.get("/every/entities.ftm.json").text.splitlines() == streamed
            for peer in (
                "/every/entities.ftm.json",
                "/every/index.json",
                "/every/exports/statistics.json",
            ):
                head = c.head(peer)
                assert head.status_code == 200 and head.headers["etag"] and not head.content
            assert c.get("/every/index.json").json()["name"] == "every"
            assert c.get("/every/exports/statements.csv").text.startswith('"canonical_id",')
            refs = c.get("/every/_api/entities/e-co/refs", params={"direction": "in"}).json()
            assert refs and all(b"e-own" in orjson.dumps(r) for r in refs), refs
            around = c.get(
                "/every/_api/entities/e-ann/neighbours", params={"depth": 2}
            ).text.splitlines()
            assert {orjson.loads(x)["id"] for x in around} >= {"e-ann", "e-own"}
            assert c.get("/every/_api/trace/e-ann").json()

            # --- deletes, a second version, the diff ---------------------------------
            own = [r for r in rows if r["entity_id"] == "e-ann" and r["prop"] == "country"][0]
            assert c.delete(f"/every/_api/entities/e-ann/statements/{own['id']}").text == "1"
            assert c.delete("/every/_api/entities/e-arrow").text == "1"
            assert c.post("/every/_api/entities/merge").text == "ok"
            res = c.post("/every/_api/operations", json={"name": "make"})
            assert _wait(c, res.headers["location"])["state"] == "succeeded"
            versions = c.get("/every/_api/versions").json()
            assert len(versions) >= 2
            diff = c.get(
                "/every/_api/diff",
                params={"from": versions[-2]["sequence"], "to": versions[-1]["sequence"]},
            )
            ops = {
                orjson.loads(x)["entity"]["id"]: orjson.loads(x)["op"]
                for x in diff.text.splitlines()
            }
            assert ops["e-arrow"] == "DEL" and ops["e-ann"] == "MOD", ops
            feed = c.get("/every/diffs/entities.ftm.json/index.json")
            assert feed.status_code == 200 and feed.json()["versions"], feed.text
            newest = max(feed.json()["versions"])  # yente's {version: URL of its delta}
            name = feed.json()["versions"][newest].rsplit("/", 1)[-1]
            delta = c.get(f"/every/diffs/entities.ftm.json/{name}")
            lines = [orjson.loads(x) for x in delta.text.splitlines()]
            assert delta.status_code == 200 and {x["op"] for x in lines} <= {"ADD", "MOD", "DEL"}
            assert c.head("/every/diffs/entities.ftm.json/index.json").status_code == 200
            catalog = c.get("/index.json").json()
            assert [d["name"] for d in catalog["datasets"]] == ["every"], catalog
            assert c.head("/index.json").status_code == 200
            status = c.get("/every/_api/status").json()
            assert (
                status["journal_pending"] == 0
                and status["version"]["sequence"] == versions[-1]["sequence"]
            )
            deleted = c.delete(f"/every/_api/archive/{digest}/n.txt")
            assert (
                deleted.status_code == 200
                and c.get(f"/every/_api/archive/{digest}/files").json() == []
            )

            # --- the reverse proxy's check, and the health and docs --------------------
            check = httpx.get(
                f"{server.url}/_auth/validate",
                headers={
                    "Authorization": f"Bearer {token}",
                    "X-Original-URI": "/every/_api/versions",
                    "X-Original-Method": "GET",
                },
            )
            assert check.status_code == 200
            called.add(("GET", "/_auth/validate"))
            for path in ("/health",):
                assert httpx.get(f"{server.url}{path}").status_code == 200
                called.add(("GET", path))
    missing = sorted(expected - called)
    assert not missing, f"routes never called on S3: {missing}"


def _wait(c: httpx.Client, location: str, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        state: dict[str, Any] = c.get(location).json()
        if state["state"] not in ("queued", "running") or time.monotonic() > deadline:
            return state
        time.sleep(0.3)
