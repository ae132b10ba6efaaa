"""With a Dagster instance configured, the server's operations are Dagster runs in it."""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
import orjson

from lakehouse_assets import Lakehouse
from lakehouse_assets_tests.helpers.server import running_server


def test_optimize_runs_as_a_dagster_run_in_the_instance(tmp_path: Path) -> None:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    lake = Lakehouse(tmp_path / "lake", journal_url=f"sqlite:///{tmp_path / 'journal.sqlite'}")
    lake.create_dataset("runs")
    (tmp_path / "state").mkdir()
    with running_server(lake, tmp_path / "state", DAGSTER_HOME=str(home)) as server:
        with server.client(server.token(datasets=("runs",), actions=("write", "operate"))) as c:
            rows = [
                {"id": f"d{i}", "schema": "Person", "properties": {"name": [f"D {i}"]}}
                for i in range(3)
            ]
            c.post("/runs/_api/entities", content=b"".join(orjson.dumps(r) + b"\n" for r in rows))
            # the peer's flush: a run of flush_job, its count from the run's materialization
            assert c.post("/runs/_api/entities/flush").text == "6"
            res = c.post("/runs/_api/operations", json={"name": "optimize"})
            assert res.status_code == 202, res.text
            job = res.json()
            assert job["dagster_job"] == "optimize_job" and job["dagster_run_id"]
        with server.client(server.token(datasets=("runs",), actions=("read",))) as reader:
            deadline = time.monotonic() + 180
            while True:
                answer = reader.get(res.headers["location"])
                assert answer.status_code == 200, (answer.text, server.log.read_text()[-3000:])
                state = answer.json()
                if state["state"] not in ("queued", "running"):
                    break
                assert time.monotonic() < deadline, state
                time.sleep(0.3)
        assert state["state"] == "succeeded", state
        assert state["dagster_status"] == "SUCCESS", server.log.read_text()[-4000:]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_run_by_id(job["dagster_run_id"])
        assert run is not None and run.job_name == "optimize_job"
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags["dagster/partition"] == "runs" and run.tags["lakehouse/trigger"] == "api"
        materialized = instance.get_latest_materialization_event(dg.AssetKey("optimize"))
        assert materialized is not None and materialized.run_id == run.run_id
