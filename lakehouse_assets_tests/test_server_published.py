"""Published files over the server, for yente and browsers: the catalog and dataset
``index.json``, ``entities.ftm.json`` and the delta feed at their lake paths,
anonymous only for ``LAKEHOUSE_PUBLIC_DATASETS``; yente's own updater loads a
dataset from the server's URLs, then applies a later version as a delta."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from lakehouse_assets import Lakehouse, Settings
from lakehouse_assets import conventions as cv
from lakehouse_assets_tests.conftest import free_port, sample_entities
from lakehouse_assets_tests.helpers.data import entities_of, normal
from lakehouse_assets_tests.helpers.server import running_server
from lakehouse_assets_tests.test_feed import run_yente, yente_python

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.slow


def test_yente_loads_a_public_dataset_from_the_server_then_a_delta(
    spark: SparkSession, tmp_path: Path
) -> None:
    python = yente_python()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    lake = Lakehouse(
        tmp_path / "lake",
        settings=Settings(public_url=url),
        journal_url=f"sqlite:///{tmp_path / 'journal.sqlite'}",
    )
    entities = sample_entities()
    feed = lake.create_dataset("feed", title="Feed")
    feed.write_entities([json.dumps(e).encode() for e in entities[:4]], origin="a")
    feed.make()
    private = lake.create_dataset("private")
    private.write_entities([json.dumps(e).encode() for e in entities[:2]], origin="a")
    private.make()
    (tmp_path / "state").mkdir()
    env = {"LAKEHOUSE_PUBLIC_DATASETS": "feed", "LAKEHOUSE_PUBLIC_URL": url}
    with running_server(lake, tmp_path / "state", port=port, **env) as server:
        with httpx.Client(base_url=url) as anonymous:
            catalog = anonymous.get("/index.json")
            assert catalog.status_code == 200
            assert [d["name"] for d in catalog.json()["datasets"]] == ["feed"]
            again = anonymous.get("/index.json", headers={"If-None-Match": catalog.headers["etag"]})
            assert again.status_code == 304
            index = anonymous.get("/feed/index.json").json()
            assert index["entities_url"] == f"{url}/feed/{cv.ENTITIES_JSON}"
            assert index["delta_url"].startswith(f"{url}/feed/diffs/")
            part = anonymous.get("/feed/entities.ftm.json", headers={"Range": "bytes=0-0"})
            assert part.status_code == 206 and part.content == b"{"
            assert anonymous.get("/private/index.json").status_code == 401
            assert anonymous.get("/private/diffs/entities.ftm.json/index.json").status_code == 401
            assert anonymous.get("/feed/diffs/entities.ftm.json/..%2Fx.delta.json").status_code in (
                404,
                422,
            )
        token = server.token(datasets=("private",), actions=("read",))
        with server.client(token) as c:
            names = [d["name"] for d in c.get("/index.json").json()["datasets"]]
            assert names == ["private"]  # a token's catalog: its datasets
            assert c.get("/private/index.json").status_code == 200

        state = tmp_path / "yente-state.json"
        loaded = run_yente(python, f"{url}/index.json", "feed", state)
        assert loaded["incremental"] is False and loaded["refused"] == 0
        assert len(loaded["entities"]) == 4

        feed.write_entities([json.dumps(e).encode() for e in entities[4:]], origin="a")
        feed.make()
        result = run_yente(python, f"{url}/index.json", "feed", state)
        assert result["incremental"] is True, result["delta_versions"]
        assert result["ops"]["ADD"] == len(entities) - 4 and result["refused"] == 0
        head = entities_of((tmp_path / "lake" / "feed" / cv.ENTITIES_JSON).read_bytes())
        assert {k: normal(v) for k, v in result["entities"].items()} == head
        delta = result["delta_versions"][-1]
        with httpx.Client(base_url=url) as anonymous:
            feed_index = anonymous.get("/feed/diffs/entities.ftm.json/index.json").json()
            file = anonymous.get(feed_index["versions"][delta])
            assert file.status_code == 200 and file.headers["etag"]
