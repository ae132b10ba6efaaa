"""Benchmark: a statements table read through Delta Sharing beside delta-rs's local read.

Builds (once, cached under benchmarks/.data) a local lake with one dataset of
about ``--statements`` statements (kek.ftm.json scaled, one flush), starts
``lakehouse serve`` on 127.0.0.1 and reads the statements table into pandas:

- **sharing**: ``delta_sharing.load_as_pandas`` of ``lake.bench.statements``
  with a profile from this server (the connector in ``.venv-sharing``: ``make
  sharing-client``), every file fetched over HTTP from the signed route;
- **local**: ``DeltaTable(uri).to_pandas()`` in this process (delta-rs on the
  lake's folder).

Best of ``--runs`` each; prints rows/s side by side, the ratio and the load.

    python -m benchmarks.sharing --statements 1000000 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from deltalake import DeltaTable

from benchmarks import data
from benchmarks.server_load import SECRET, free_port, start_server
from lakehouse_assets import Lakehouse
from lakehouse_assets.sharing import issue, profile

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / "benchmarks" / ".data"
PYTHON = REPO / ".venv-sharing" / "bin" / "python"
DRIVER = REPO / "lakehouse_assets_tests" / "helpers" / "sharing_driver.py"


def build(statements: int) -> Lakehouse:
    """The lake with ``bench`` flushed (made once per size)."""
    root = CACHE / f"sharing-{statements}"
    lake = Lakehouse(root / "lake", journal_url=f"sqlite:///{root / 'journal.sqlite'}")
    if "bench" in lake.datasets() and lake.dataset("bench").statements_table.exists():
        return lake
    source = data.write(CACHE / f"kek-{statements}.ftm.json", statements)
    ds = lake.create_dataset("bench")
    started = time.perf_counter()
    with source.open("rb") as fh:
        ds.write_entities(fh, origin="bench")
    ds.flush()
    print(f"built {root} in {time.perf_counter() - started:.0f} s")
    return lake


def through_sharing(url: str, work: Path, runs: int) -> tuple[int, float]:
    token, claims = issue(SECRET, tenant="bench", datasets=["bench"], expires=timedelta(hours=1))
    path = work / "bench.share"
    path.write_text(json.dumps(profile(url + "/delta-sharing", token, claims["exp"])))
    spec = work / "spec.json"
    spec.write_text(json.dumps([{"op": "load", "table": "lake.bench.statements"}] * runs))
    out = work / "out"
    subprocess.run([str(PYTHON), str(DRIVER), str(path), str(spec), str(out)], check=True)
    results = json.loads((out / "results.json").read_text())
    bad = [r["error"] for r in results if not r["ok"]]
    if bad:
        raise SystemExit(f"the connector failed: {bad[0]}")
    return int(results[0]["rows"]), min(r["seconds"] for r in results)


def local(lake: Lakehouse, runs: int) -> tuple[int, float]:
    where = lake.dataset("bench").statements_table
    best, rows = float("inf"), 0
    for _ in range(runs):
        started = time.perf_counter()
        frame = DeltaTable(where.uri, storage_options=dict(where.storage_options)).to_pandas()
        best = min(best, time.perf_counter() - started)
        rows = len(frame)
    return rows, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--statements", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if not PYTHON.exists():
        raise SystemExit(f"{PYTHON} missing: run `make sharing-client`")
    lake = build(args.statements)
    with tempfile.TemporaryDirectory(prefix="bench-sharing-") as tmp:
        work = Path(tmp)
        port = free_port()
        proc = start_server(lake, work, port)
        try:
            shared_rows, shared_s = through_sharing(f"http://127.0.0.1:{port}", work, args.runs)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    local_rows, local_s = local(lake, args.runs)
    assert shared_rows == local_rows, (shared_rows, local_rows)
    print(f"{'read':<34}{'rows':>10}{'seconds':>10}{'rows/s':>12}")
    for name, rows, secs in (
        ("delta_sharing.load_as_pandas (HTTP)", shared_rows, shared_s),
        ("DeltaTable.to_pandas (local)", local_rows, local_s),
    ):
        print(f"{name:<34}{rows:>10}{secs:>10.2f}{rows / secs:>12,.0f}")
    print(f"ratio sharing/local: {local_s / shared_s:.2f}   load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
