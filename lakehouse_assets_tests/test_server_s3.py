"""The HTTP API on an S3 lake (the loopback moto server) with a PostgreSQL journal."""

from __future__ import annotations

import hashlib
from pathlib import Path

import orjson
import pytest

from lakehouse_assets import Lakehouse, Settings
from lakehouse_assets_tests.conftest import make_bucket
from lakehouse_assets_tests.helpers.server import running_server

pytestmark = [pytest.mark.s3, pytest.mark.postgres]


def test_writes_reads_and_files_on_s3_with_postgresql(
    s3_settings: Settings, postgres_database: str, tmp_path: Path
) -> None:
    bucket = make_bucket(s3_settings)
    lake = Lakehouse(f"s3://{bucket}/lake", settings=s3_settings, journal_url=postgres_database)
    lake.create_dataset("remote")
    (tmp_path / "state").mkdir()
    env = {
        "LAKEHOUSE_S3_ENDPOINT_URL": str(s3_settings.s3_endpoint_url),
        "LAKEHOUSE_S3_ACCESS_KEY_ID": "testing",
        "LAKEHOUSE_S3_SECRET_ACCESS_KEY": "testing",
        "LAKEHOUSE_CACHE_DIR": str(tmp_path / "cache"),
    }
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
