"""Benchmark: the HTTP API beside the in-process Python API, on the same lake.

Makes ``--entities`` Person entities (3 statements each), then, on one local
lake with a SQLite journal, for each side in turn:

- bulk write: all entities in one call (``Dataset.write_entities`` / one
  ``POST /_api/entities``), entities a second, into a dataset of its own;
- get: ``--gets`` point reads of random entities after a flush (p50, p99);
- query: every entity streamed (``Dataset.query`` / ``POST /_api/entities/query``);
- export: ``entities.ftm.json`` read whole (the store / ``GET /_api/exports/...``),
  MB a second; and streamed as entities (``Dataset.stream_entities`` /
  ``RemoteDataset.stream_entities``: what a tenant consumes), entities a second.

Prints a table with both sides, the ratio and the machine's load average.

    python -m benchmarks.server_vs_inprocess --entities 100000 --gets 300
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import httpx
import orjson

from benchmarks.server_load import SECRET, free_port, start_server
from lakehouse_assets import Lakehouse
from lakehouse_assets import conventions as cv
from lakehouse_assets.server.client import RemoteLakehouse
from lakehouse_assets.tokens import issue_token

REPO = Path(__file__).resolve().parent.parent


def lines(n: int) -> bytes:
    return b"".join(
        orjson.dumps(
            {
                "id": f"p{i}",
                "schema": "Person",
                "properties": {"name": [f"Person number {i}"], "country": ["de"]},
            }
        )
        + b"\n"
        for i in range(n)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entities", type=int, default=100_000)
    parser.add_argument("--gets", type=int, default=300)
    args = parser.parse_args()
    load_before = os.getloadavg()
    body = lines(args.entities)
    rows: list[tuple[str, float, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="server-bench-") as tmp:
        base = Path(tmp)
        lake = Lakehouse(base / "lake", journal_url=f"sqlite:///{base / 'journal.sqlite'}")
        local = lake.create_dataset("local_side")
        remote = lake.create_dataset("http_side")
        (base / "state").mkdir()
        port = free_port()
        proc = start_server(lake, base / "state", port)
        token = issue_token(
            SECRET, tenant="bench", datasets=["*"], actions=["admin"], expires=timedelta(hours=3)
        )
        http = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=3600,
        )
        try:
            # warm both sides (imports, followthemoney's model, connections)
            warm = lake.create_dataset("warm")
            warm.write_entities(lines(10).splitlines(keepends=True))
            http.post("/warm/_api/entities", content=lines(10))
            warm.get_entity("p1", flush=True)
            http.get("/warm/_api/entities/p1", params={"flush": "true"})
            sum(1 for _ in warm.query(flush=False))
            http.post("/warm/_api/entities/query", json={})
            started = time.perf_counter()
            local.write_entities(body.splitlines(keepends=True))
            t_local = time.perf_counter() - started
            started = time.perf_counter()
            res = http.post("/http_side/_api/entities", content=body)
            t_http = time.perf_counter() - started
            assert res.status_code == 200, res.text
            rows.append(
                ("bulk write, entities/s", args.entities / t_local, args.entities / t_http, "")
            )

            for ds in (local, remote):
                ds.make()  # flush + exports (Spark), outside the timings
            rng = random.Random(1)
            ids = [f"p{rng.randrange(args.entities)}" for _ in range(args.gets)]
            local_times, http_times = [], []
            for entity_id in ids:
                started = time.perf_counter()
                assert local.get_entity(entity_id) is not None
                local_times.append(time.perf_counter() - started)
                started = time.perf_counter()
                assert http.get(f"/http_side/_api/entities/{entity_id}").status_code == 200
                http_times.append(time.perf_counter() - started)
            for q, name in ((0.5, "get p50, ms"), (0.99, "get p99, ms")):
                lo = sorted(local_times)[int(q * (len(ids) - 1))] * 1000
                hi = sorted(http_times)[int(q * (len(ids) - 1))] * 1000
                rows.append((name, lo, hi, f"+{hi - lo:.1f} ms"))

            started = time.perf_counter()
            n_local = sum(1 for _ in local.query(flush=False))
            t_local = time.perf_counter() - started
            started = time.perf_counter()
            n_http = 0
            with http.stream("POST", "/http_side/_api/entities/query", json={}) as res:
                for line in res.iter_lines():
                    n_http += bool(line)
            t_http = time.perf_counter() - started
            assert n_local == n_http == args.entities, (n_local, n_http)
            rows.append(("query stream, entities/s", n_local / t_local, n_http / t_http, ""))

            path = cv.dataset_path("local_side", cv.ENTITIES_JSON)
            started = time.perf_counter()
            size = 0
            with local.store.open_read(path) as fh:
                while chunk := fh.read(1024 * 1024):
                    size += len(chunk)
            t_local = time.perf_counter() - started
            http.get("/http_side/_api/exports/entities.ftm.json", headers={"Range": "bytes=0-0"})
            started = time.perf_counter()
            got = 0
            with http.stream("GET", "/http_side/_api/exports/entities.ftm.json") as res:
                for chunk in res.iter_bytes(1024 * 1024):
                    got += len(chunk)
            t_http = time.perf_counter() - started
            rows.append(("export read, MB/s", size / t_local / 1e6, got / t_http / 1e6, ""))

            # what a tenant consumes: the export's entities as dicts, on both sides
            client = RemoteLakehouse(f"http://127.0.0.1:{port}", token=token)
            started = time.perf_counter()
            n_local = sum(1 for _ in local.stream_entities())
            t_local = time.perf_counter() - started
            started = time.perf_counter()
            n_http = sum(1 for _ in client.dataset("http_side").stream_entities())
            t_http = time.perf_counter() - started
            client.close()
            assert n_local == n_http == args.entities, (n_local, n_http)
            rows.append(("export stream, entities/s", n_local / t_local, n_http / t_http, ""))
        finally:
            http.close()
            proc.terminate()
            proc.wait(60)
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        f"{args.entities} entities ({args.entities * 3} statements), commit {commit}, "
        f"load {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"{'measure':<26} {'in-process':>12} {'HTTP':>12} {'HTTP/in-process':>16}")
    for name, lo, hi, note in rows:
        ratio = hi / lo if lo else float("nan")
        print(f"{name:<26} {lo:>12.1f} {hi:>12.1f} {ratio:>16.2f} {note}")


if __name__ == "__main__":
    main()
