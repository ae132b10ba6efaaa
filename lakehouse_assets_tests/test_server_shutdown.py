"""``lakehouse serve`` stops gracefully (a request in flight at SIGTERM completes) and
runs as several worker processes that share the jobs' state."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from lakehouse_assets import Lakehouse
from lakehouse_assets_tests.helpers.server import running_server


def test_sigterm_lets_the_request_in_flight_finish(tmp_path: Path) -> None:
    lake = Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{tmp_path / 'journal.sqlite'}")
    lake.create_dataset("alpha")
    (tmp_path / "state").mkdir()
    chunk = b"z" * 4096
    sent = threading.Event()

    def slow_body() -> Iterator[bytes]:
        for i in range(10):
            yield chunk
            if i == 2:
                sent.set()
            time.sleep(0.15)

    with running_server(lake, tmp_path / "state") as server:
        answer: list[httpx.Response] = []
        with server.client(server.token()) as client:
            upload = threading.Thread(
                target=lambda: answer.append(
                    client.post(
                        "/alpha/_api/archive", params={"name": "slow.bin"}, content=slow_body()
                    )
                )
            )
            upload.start()
            assert sent.wait(10)
            os.killpg(server.proc.pid, signal.SIGTERM)
            upload.join(30)
        # uvicorn re-raises the signal once it has shut down: killed by SIGTERM, after
        # the request finished and the app's shutdown (the worker's) ran
        assert server.proc.wait(30) in (0, -signal.SIGTERM)
        assert answer and answer[0].status_code == 201, answer
        assert answer[0].json()["checksum"] == hashlib.sha256(chunk * 10).hexdigest()
        log = server.log.read_text()
        assert "Shutting down" in log and "Finished server process" in log
        assert list((tmp_path / "state" / "staging").iterdir()) == []


def test_two_workers_share_the_jobs_state(tmp_path: Path) -> None:
    lake = Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{tmp_path / 'journal.sqlite'}")
    lake.create_dataset("alpha")
    (tmp_path / "state").mkdir()
    with running_server(lake, tmp_path / "state", workers=2) as server:
        with server.client(server.token(actions=("write", "operate", "read"))) as client:
            body = b'{"id": "w1", "schema": "Person", "properties": {"name": ["W"]}}\n'
            assert client.post("/alpha/_api/entities", content=body).status_code == 200
            jobs = [client.post("/alpha/_api/operations", json={"name": "flush"}) for _ in range(3)]
            assert all(res.status_code == 202 for res in jobs)
            for res in jobs:  # each state read may land on either process
                deadline = time.monotonic() + 60
                while (job := client.get(res.headers["location"]).json())["state"] != "succeeded":
                    assert job["state"] in ("queued", "running") and time.monotonic() < deadline
                    time.sleep(0.1)
            assert client.get("/alpha/_api/entities/w1").json()["id"] == "w1"
        pids = {line.split("[")[-1].rstrip("]") for line in server.log.read_text().splitlines()
                if "Started server process" in line}  # fmt: skip
        assert len(pids) == 2
