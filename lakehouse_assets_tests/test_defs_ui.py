"""End to end: the real UI server + daemon on a real lake, read back through GraphQL.

One ``dagster dev`` (webserver + daemon, own process group, stopped by PID)
serves the code location of ``workspace.yaml`` on a loopback port, with a
fresh instance (the project's ``dagster.yaml``) and a fresh lake. Sensors run
every few seconds. A file added to a dataset's archive must, on its own, flow
through the archive sensor, its Document job, the journal sensor and the
automation sensor into new exports. A headless Chromium then opens the asset
graph page and keeps a screenshot in ``test-artifacts/``.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests

from lakehouse_assets import conventions as cv
from lakehouse_assets.lake import Lakehouse
from lakehouse_assets_tests.conftest import REPO, free_port, sample_entities, spawn, stop_process
from lakehouse_assets_tests.helpers.defs import KEYS

DATASET = "ui_e2e"
ARTIFACTS = REPO / "test-artifacts"

MATERIALIZATIONS = """
query ($key: AssetKeyInput!, $partitions: [String!]) {
  assetOrError(assetKey: $key) {
    ... on Asset {
      assetMaterializations(partitions: $partitions, limit: 20) { timestamp runId partition }
    }
  }
}
"""

RUNS = """
query {
  runsOrError(limit: 100) {
    ... on Runs {
      results { runId jobName status startTime endTime tags { key value } }
    }
  }
}
"""

RUN_EVENTS = """
query ($runId: ID!) {
  logsForRun(runId: $runId) {
    ... on EventConnection { events { __typename } }
  }
}
"""


@dataclass
class Server:
    url: str
    lake: Lakehouse
    home: Path
    log: Path
    proc: subprocess.Popen[bytes]
    cache: Path

    def graphql(self, query: str, **variables: Any) -> dict[str, Any]:
        response = requests.post(
            f"{self.url}/graphql", json={"query": query, "variables": variables}, timeout=30
        )
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body["errors"]
        return dict(body["data"])

    def materialized_at(self, key: str) -> list[float]:
        """Timestamps (seconds) of the asset's materializations of our dataset."""
        data = self.graphql(MATERIALIZATIONS, key={"path": [key]}, partitions=[DATASET])
        asset = data["assetOrError"] or {}
        return sorted(float(m["timestamp"]) / 1000 for m in asset.get("assetMaterializations", []))

    def runs(self) -> list[dict[str, Any]]:
        return list(self.graphql(RUNS)["runsOrError"]["results"])


def wait_for(what: str, condition: Callable[[], bool], server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(2)
    tail = server.log.read_text(errors="replace")[-4000:]
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; server log tail:\n{tail}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("ui")
    home = root / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster_home" / "dagster.yaml", home / "dagster.yaml")
    lake = Lakehouse(root / "lake")
    ds = lake.create_dataset(DATASET, title="UI end to end")
    with ds.bulk(origin="sample") as bulk:
        for entity in sample_entities():
            bulk.add_entity(entity)
    port = free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "LAKEHOUSE_LAKE_URI": str(root / "lake"),
        "LAKEHOUSE_SENSOR_INTERVAL_SECONDS": "3",
        "LAKEHOUSE_SPARK_SHUFFLE_PARTITIONS": "2",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("LAKEHOUSE_JOURNAL_URL", None)
    # make ui's own script: it starts a Spark Connect server for the runs
    env.pop("LAKEHOUSE_SPARK_REMOTE", None)
    env["LAKEHOUSE_SPARK_CONNECT_PORT"] = str(free_port())
    env["LAKEHOUSE_CACHE_DIR"] = str(root / "cache")
    env.update(LAKE=str(root / "lake"), VENV=str(Path(sys.executable).parent.parent))
    env["UI_PORT"] = str(port)
    log = root / "dagster.log"
    with log.open("wb") as out:
        proc = spawn(
            ["sh", str(REPO / "lakehouse_assets" / "sample" / "ui.sh")],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    srv = Server(f"http://127.0.0.1:{port}", lake, home, log, proc, root / "cache")
    try:
        wait_for("the UI server", lambda: _up(srv.url), srv, 180)
        yield srv
    finally:
        stop_process(proc, timeout=90)
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(log, ARTIFACTS / "dagster-dev.log")


def _up(url: str) -> bool:
    try:
        return requests.get(f"{url}/server_info", timeout=2).ok
    except requests.RequestException:
        return False


def test_new_archive_file_flows_to_the_exports(server: Server) -> None:
    # 1. the dataset becomes a partition, its journal is reported, and
    #    automation materializes the chain through the index on its own
    wait_for("the first index", lambda: bool(server.materialized_at("index")), server, 300)
    first = {k: server.materialized_at(k) for k in ("entities_ftm_json", "index")}

    # 2. a tenant archives a file (no Document entity of its own)
    ds = server.lake.dataset(DATASET)
    source = server.home.parent / "letter.txt"
    source.write_text("Dear ACME, ...")
    meta = ds.add_file(str(source))
    added = datetime.now(UTC).timestamp()

    def refreshed() -> bool:
        return all(
            (times := server.materialized_at(k)) and times[-1] > max(first[k][-1], added)
            for k in ("entities_ftm_json", "index")
        )

    wait_for("exports after the new archive file", refreshed, server, 300)
    assert server.materialized_at("archive")[-1] > added - 1
    assert server.materialized_at("journal")[-1] > added

    # the new file's Document entity is in the export
    lines = ds.store.read_bytes(cv.dataset_path(DATASET, cv.ENTITIES_JSON)).splitlines()
    docs = [orjson.loads(line) for line in lines if meta.checksum.encode() in line]
    assert [d["schema"] for d in docs] == ["Document"]

    # every run succeeded, and runs of the dataset never overlapped
    runs = [r for r in server.runs() if _tag(r, "dagster/partition") == DATASET]
    assert {r["jobName"] for r in runs} >= {"archive_documents", "__ASSET_JOB"}
    finished = [r for r in runs if r["status"] in ("SUCCESS", "FAILURE", "CANCELED")]
    assert all(r["status"] == "SUCCESS" for r in finished), runs
    spans = sorted((r["startTime"], r["endTime"]) for r in finished if r["startTime"])
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert start >= end, f"overlapping runs of {DATASET}: {spans}"


def _tag(run: dict[str, Any], key: str) -> str | None:
    return next((t["value"] for t in run["tags"] if t["key"] == key), None)


# --- a real browser ---------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


SKIP_DIALOG = """
for (const b of document.querySelectorAll('button')) {
  if (b.innerText.trim() === 'Skip') { b.click(); return true; }
}
return false;
"""


class WebDriver:
    """The few W3C WebDriver calls we need, straight to chromedriver."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        caps = {
            "capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {
                        "binary": CHROMIUM,
                        "args": [
                            "--headless=new",
                            "--no-sandbox",
                            "--disable-gpu",
                            "--disable-dev-shm-usage",
                            "--window-size=1600,1000",
                        ],
                    },
                }
            }
        }
        body = requests.post(f"{self.base}/session", json=caps, timeout=60).json()
        self.session = body["value"]["sessionId"]

    def call(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        url = f"{self.base}/session/{self.session}{path}"
        response = requests.request(method, url, json=payload, timeout=60)
        return response.json()["value"]

    def script(self, source: str) -> Any:
        return self.call("POST", "/execute/sync", {"script": source, "args": []})

    def text(self) -> str:
        return str(self.script("return document.body.innerText"))

    def shows(self, names: tuple[str, ...]) -> bool:
        """All names on the page (first dismissing the UI's one-time welcome dialog)."""
        self.script(SKIP_DIALOG)
        text = self.text()
        return all(n in text for n in names)

    def close(self) -> None:
        requests.delete(f"{self.base}/session/{self.session}", timeout=30)


NEEDS_BROWSER = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="Chromium/chromedriver not installed (apt-get install chromium chromium-driver; "
    ".ci/run installs them)",
)


@pytest.fixture
def browser(server: Server) -> Iterator[WebDriver]:
    """A headless Chromium through its own chromedriver, both stopped after the test."""
    port = free_port()
    driver_proc = spawn(
        [str(CHROMEDRIVER), f"--port={port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for("chromedriver", lambda: _up_driver(port), server, 30)
        driver = WebDriver(port)
        try:
            yield driver
        finally:
            driver.close()
    finally:
        stop_process(driver_proc)


def keep_screenshot(driver: WebDriver, name: str, settle: float) -> None:
    """A picture of the page once it settled, kept in ``test-artifacts/``."""
    time.sleep(settle)  # the graph's layout and statuses, the metadata table
    png = base64.b64decode(driver.call("GET", "/screenshot"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / name).write_bytes(png)


@NEEDS_BROWSER
def test_asset_graph_in_a_real_browser(server: Server, browser: WebDriver) -> None:
    browser.call("POST", "/url", {"url": f"{server.url}/asset-groups"})
    names = tuple(sorted(KEYS))
    wait_for("the asset graph", lambda: browser.shows(names), server, 90)
    keep_screenshot(browser, "asset-graph.png", settle=5)


@NEEDS_BROWSER
def test_partition_page_shows_the_metadata(server: Server, browser: WebDriver) -> None:
    """An operator opens `statements` for one dataset: the partition's materialization
    with its counts, table version, URI and row count is on the page."""
    wait_for(
        "statements of the dataset",
        lambda: bool(server.materialized_at("statements")),
        server,
        300,
    )
    url = f"{server.url}/assets/statements?view=partitions&partition={DATASET}"
    browser.call("POST", "/url", {"url": url})
    expected = (DATASET, "new_statements", "delta_version", "dagster/uri", "dagster/row_count")
    wait_for("the partition's metadata", lambda: browser.shows(expected), server, 90)
    text = browser.text()
    assert "journal_rows_flushed" in text and "rows_by_origin" in text
    keep_screenshot(browser, "asset-partition.png", settle=3)


def test_server_operations_are_queued_runs_the_daemon_starts(server: Server) -> None:
    """``lakehouse serve`` with LAKEHOUSE_API_DAGSTER_URL: a make submitted over HTTP is
    a run queued in the webserver's instance, started by the daemon (a run worker of
    the code location, as a run launched from the UI), and the job reports it."""
    from lakehouse_assets_tests.helpers.server import running_server

    name = "api_queued"
    ds = server.lake.create_dataset(name)
    ds.add_entity({"id": "q-ann", "schema": "Person", "properties": {"name": ["Ann Queued"]}})
    state = server.home.parent / "api-state"
    state.mkdir()
    with (
        running_server(
            server.lake,
            state,
            DAGSTER_HOME=str(server.home),
            LAKEHOUSE_API_DAGSTER_URL=server.url,
            LAKEHOUSE_CACHE_DIR=str(server.cache),
        ) as api,
        api.client(api.token(datasets=(name,), actions=("read", "operate"))) as client,
    ):
        res = client.post(f"/{name}/_api/operations", json={"name": "make"})
        assert res.status_code == 202, res.text
        job = res.json()
        assert job["dagster_mode"] == "queued" and job["dagster_job"] == "refresh_dataset"
        run_id = job["dagster_run_id"]

        def done() -> bool:
            answer = client.get(res.headers["location"]).json()
            return answer["state"] not in ("queued", "running")

        wait_for("the queued make run", done, server, 300)
        answer = client.get(res.headers["location"]).json()
        assert answer["state"] == "succeeded", (answer, api.log.read_text()[-3000:])
        assert answer["dagster_status"] == "SUCCESS"
        assert answer["result"]["materializations"]["entities_ftm_json"]
        entity = client.get(f"/{name}/_api/entities/q-ann").json()
        assert entity["properties"]["name"] == ["Ann Queued"]
    runs = {run["runId"]: run for run in server.runs()}
    run = runs[run_id]
    assert run["jobName"] == "refresh_dataset" and run["status"] == "SUCCESS"
    tags = {tag["key"]: tag["value"] for tag in run["tags"]}
    assert tags["lakehouse/trigger"] == "api" and tags["dagster/partition"] == name
    assert tags["lakehouse/tenant"] == "tester"
    # queued, then started by the daemon: not executed in the server's process
    events = server.graphql(RUN_EVENTS, runId=run_id)["logsForRun"]["events"]
    kinds = {event["__typename"] for event in events}
    assert {"RunEnqueuedEvent", "RunStartingEvent"} <= kinds, sorted(kinds)
    assert server.lake.dataset(name).version() is not None  # the run published a version


def _up_driver(port: int) -> bool:
    try:
        return bool(
            requests.get(f"http://127.0.0.1:{port}/status", timeout=2).json()["value"]["ready"]
        )
    except (requests.RequestException, ValueError, KeyError):
        return False


def test_stopping_make_ui_stops_everything_it_started(server: Server) -> None:
    """SIGTERM to ``make ui``'s script stops dg dev, the webserver, the daemon,
    their code servers and the Spark Connect server it started: nothing lingers."""
    from lakehouse_assets.settings import Settings
    from lakehouse_assets.spark import connect

    settings = Settings(cache_dir=str(server.cache))
    port = int(_env_of(server.proc.pid)["LAKEHOUSE_SPARK_CONNECT_PORT"])
    assert connect.status(settings, port).running
    children = _descendants(server.proc.pid)
    commands = " | ".join(children.values())
    assert "dg dev" in commands or "/dg " in commands, commands
    assert len(children) >= 3, commands  # dg dev, the webserver, the daemon (+ code servers)

    os.kill(server.proc.pid, signal.SIGTERM)
    assert server.proc.wait(timeout=90) != 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.5)
    assert not [children[pid] for pid in children if _alive(pid)]
    assert not connect.status(settings, port).running


def _env_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _descendants(root: int) -> dict[int, str]:
    """Every live descendant of ``root`` with its command line (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                try:
                    cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                found[child] = cmd.decode(errors="replace").strip()
                frontier.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
