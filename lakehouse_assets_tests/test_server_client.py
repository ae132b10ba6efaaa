"""``RemoteLakehouse`` against a real ``lakehouse serve``: the facade's methods over HTTP."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from lakehouse_assets import Lakehouse
from lakehouse_assets.errors import DatasetNotFoundError, InvalidInputError, SourceNotFoundError
from lakehouse_assets.server.client import RemoteAccessError, RemoteLakehouse
from lakehouse_assets_tests.conftest import run_python
from lakehouse_assets_tests.helpers.server import REPO, Server, running_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("client")
    lake = Lakehouse(base / "lake", journal_url=f"sqlite:///{base / 'journal.sqlite'}")
    lake.create_dataset("gamma")
    lake.create_dataset("delta")
    lake.create_dataset("epsilon")  # the CLI's
    (base / "state").mkdir()
    with running_server(lake, base / "state") as srv:
        yield srv


@pytest.fixture(scope="module")
def remote(server: Server) -> Iterator[RemoteLakehouse]:
    with RemoteLakehouse(server.url, token=server.token(datasets=("gamma",))) as lake:
        yield lake


def test_the_client_imports_no_server(tmp_path: Path) -> None:
    done = run_python(
        "import sys, lakehouse_assets.server.client; "
        "assert 'fastapi' not in sys.modules and 'lakehouse_assets.server.app' not in sys.modules",
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0


def test_write_read_delete(remote: RemoteLakehouse) -> None:
    ds = remote.dataset("gamma")
    done = ds.write_entities(
        [
            {"id": "r-ann", "schema": "Person", "properties": {"name": ["Ann Remote"]}},
            b'{"id": "r-co", "schema": "Company", "properties": {"name": ["Remote Co"]}}',
        ],
        origin="remote",
    )
    assert done.entities == 2 and done.count >= 4
    assert ds.add_entity({"id": "r-bob", "schema": "Person", "properties": {"name": ["Bob"]}}) >= 2
    with ds.bulk() as bulk:
        bulk.add_entity({"id": "r-eve", "schema": "Person", "properties": {"name": ["Eve"]}})
        bulk.add_statement(
            {"entity_id": "r-eve", "schema": "Person", "prop": "country", "value": "fr"}
        )
    assert bulk.entities == 1 and bulk.count >= 3

    ann = ds.get_entity("r-ann", flush=True)
    assert ann is not None and ann.caption == "Ann Remote" and ann.schema.name == "Person"
    assert ds.get_entity("nobody") is None
    eve = ds.get_entity("r-eve")
    assert eve is not None and eve.get("country") == ["fr"]

    from ftmq.query import P, Query

    found = list(ds.query(Query().where(P(name="Remote Co"))))
    assert [e.id for e in found] == ["r-co"]
    assert sorted(e.id or "" for e in ds.query(schemata=["Person"])) == ["r-ann", "r-bob", "r-eve"]

    assert ds.delete_entity("r-bob") >= 2
    assert ds.get_entity("r-bob", flush=True) is None

    # no Spark here: a small flush runs on the driver; make and stream_entities
    # are tested in test_server_api (the one make of the server tests)
    ds.add_entity({"id": "r-late", "schema": "Person", "properties": {"name": ["Late"]}})
    assert ds.flush()["new"] >= 2
    assert ds.status()["journal_pending"] == 0
    with pytest.raises(SourceNotFoundError, match="entities"):
        list(ds.stream_entities())


def test_files(remote: RemoteLakehouse, tmp_path: Path) -> None:
    ds = remote.dataset("gamma")
    path = tmp_path / "note.txt"
    path.write_bytes(b"remote bytes\n" * 1000)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    meta = ds.add_file(path, checksum=digest)
    assert meta.checksum == digest and meta.name == "note.txt" and meta.size == 13000
    assert ds.get_file(digest).file_id == meta.file_id
    assert b"".join(ds.open_file(digest)) == path.read_bytes()
    with pytest.raises(InvalidInputError, match="checksum mismatch"):
        ds.add_file(path, checksum="1" * 64, name="other.txt")


def test_errors_are_the_lakehouse_errors(server: Server, remote: RemoteLakehouse) -> None:
    ds = remote.dataset("gamma")
    with pytest.raises(InvalidInputError, match="line 2"):
        ds.write_entities([{"id": "ok", "schema": "Person"}, {"id": "x", "schema": "Nope"}])
    with pytest.raises(RemoteAccessError, match="403"):
        remote.dataset("delta")
    with pytest.raises(DatasetNotFoundError):
        RemoteLakehouse(server.url, token=server.token()).dataset("missing")
    reader = RemoteLakehouse(server.url, token=server.token(actions=("read",)))
    with pytest.raises(RemoteAccessError, match="403"):
        reader.dataset("gamma").add_entity({"id": "n", "schema": "Person"})
    expired = RemoteLakehouse(server.url, token=server.token(expires=timedelta(seconds=-1)))
    with pytest.raises(RemoteAccessError, match="401"):
        expired.dataset("gamma")
    with pytest.raises(ValueError, match="http"):
        RemoteLakehouse("ftp://example.org")


# --- the CLI over HTTP: `lakehouse --lake http://… ` with LAKEHOUSE_TOKEN ----------------


def test_the_cli_speaks_to_a_server_by_its_url(server: Server, tmp_path: Path) -> None:
    """A tenant's commands over HTTP print what the local ones print; the lake's own
    commands say they need the lake's storage; no token, a read token: one line."""
    import json

    from click.testing import CliRunner

    from lakehouse_assets.cli import cli

    runner = CliRunner()
    env = {"LAKEHOUSE_TOKEN": server.token(datasets=("epsilon",)), "LAKEHOUSE_LAKE_URI": None}

    def run(*args: str, token: str | None = None, input: str | None = None) -> Any:
        environ = {**env, "LAKEHOUSE_TOKEN": token} if token is not None else env
        return runner.invoke(
            cli, ["--lake", server.url, "-d", "epsilon", *args], env=environ, input=input
        )

    entities = tmp_path / "entities.ftm.json"
    entities.write_text(
        '{"id": "cli-ann", "schema": "Person", "properties": {"name": ["Ann Cli"]}}\n'
        '{"id": "cli-co", "schema": "Company", "properties": {"name": ["Cli Co"]}}\n'
    )
    res = run("entities", "write", "-i", str(entities), "--origin", "cli")
    assert res.exit_code == 0, res.output
    assert "wrote 2 entities" in res.stderr and "by tenant tester" in res.stderr
    res = run("get", "cli-ann", "--flush")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["properties"]["name"] == ["Ann Cli"]
    res = run("query", "-s", "Company", "--no-flush")
    assert [json.loads(line)["id"] for line in res.stdout.splitlines()] == ["cli-co"]
    res = run("get", "nobody")
    assert res.exit_code == 1 and "no entity 'nobody'" in res.stderr

    statements = tmp_path / "statements.csv"
    statements.write_text(
        "entity_id,schema,prop,value\ncli-ann,Person,country,fr\n"  # followthemoney's columns
    )
    res = run("statements", "write", "-i", str(statements))
    assert res.exit_code == 0, res.output
    assert "wrote 1 statements" in res.stderr

    doc = tmp_path / "report.txt"
    doc.write_bytes(b"a report over HTTP\n")
    digest = hashlib.sha256(doc.read_bytes()).hexdigest()
    res = run("archive", "add", str(doc))
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["checksum"] == digest
    res = run("archive", "get", digest[:12])
    assert res.exit_code == 0 and json.loads(res.stdout)["name"] == "report.txt"
    res = run("archive", "cat", digest[:12])
    assert res.stdout_bytes == doc.read_bytes()
    assert any(
        json.loads(line)["checksum"] == digest for line in run("archive", "ls").stdout.splitlines()
    )
    res = run("archive", "add", "https://example.org/a.pdf")
    assert res.exit_code == 2 and "queue push" in res.stderr

    res = run("queue", "push", "UPSERT", "entity", '{"id": "q1", "schema": "Person"}')
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["tenant"] == "tester"

    res = run("entities", "delete", "cli-co")
    assert res.exit_code == 0 and "cli-co: 2 statements tombstoned" in res.stderr
    res = run("flush", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["new"] == 1  # the country; `get --flush` moved the rest
    res = run("status")
    assert json.loads(res.stdout)["journal_pending"] == 0

    res = run("verify")
    assert res.exit_code == 2 and "works on the lake's storage itself" in res.stderr
    res = run("get", "cli-ann", token="")
    assert res.exit_code == 2 and "LAKEHOUSE_TOKEN" in res.stderr
    reader = server.token(datasets=("epsilon",), actions=("read",))
    res = run("entities", "write", "-i", str(entities), token=reader)
    assert res.exit_code == 1 and "403" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output
