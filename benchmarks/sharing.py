"""Benchmark: a statements table read through Delta Sharing beside delta-rs's local read.

Builds (once, cached under benchmarks/.data) a local lake with one dataset of
about ``--statements`` statements (kek.ftm.json scaled, one flush), starts
``lakehouse serve`` on 127.0.0.1 and reads the statements table into pandas:

- **sharing**: ``delta_sharing.load_as_pandas`` of ``lake.bench.statements``
  with a profile from this server (the connector in ``.venv-sharing``: ``make
  sharing-client``), every file fetched over HTTP from the signed route, in
  the response format the two agree on (delta: delta-kernel reads the files);
- **parquet**: the same with ``use_delta_format=False`` (the parquet response
  format: the connector reads and converts file by file);
- **kernel-local**, **parquet-local**: the connector's own two readers (its
  delta-kernel scan, its per-file reader of the parquet format) on the same
  files on this disk, no HTTP and no server (:mod:`benchmarks.sharing_local`):
  the most any server could give each format;
- **local**: ``DeltaTable(uri).to_pandas()`` (delta-rs on the lake's folder).

Honest on a shared machine: each round runs every read, in alternating order,
each in a fresh process of its own venv that reads twice and times the second
read (imports, the first connection and the page cache warm for all alike). Prints
the best and the median of ``--rounds`` for each, their ratios, the median of
the rounds' own ratios (the two reads of a round share the machine's load), the
server's file requests per read, the load before and after, the commit.
``--baseline CHECKOUT`` adds a second server running that checkout's package
on the same lake, read in the same rounds (before/after a change of the
server, under the same load).

    python -m benchmarks.sharing --statements 1000000 --rounds 5 [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from benchmarks import data
from benchmarks.server_load import SECRET, free_port, start_server
from lakehouse_assets import Lakehouse
from lakehouse_assets.sharing import PREFIX, issue, profile

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


def sharing_read(
    profile_path: Path, work: Path, delta: bool | None = None
) -> tuple[int, float, float]:
    """The connector's second ``load_as_pandas`` in a fresh process: (rows, seconds,
    CPU seconds of all its threads); ``delta`` is its ``use_delta_format``."""
    spec = work / "spec.json"
    load = {"op": "load", "table": "lake.bench.statements", "delta": delta}
    spec.write_text(json.dumps([load] * 2))
    out = work / "out"
    subprocess.run([str(PYTHON), str(DRIVER), str(profile_path), str(spec), str(out)], check=True)
    results = json.loads((out / "results.json").read_text())
    bad = [r["error"] for r in results if not r["ok"]]
    if bad:
        raise SystemExit(f"the connector failed: {bad[0]}")
    last = results[1]
    return int(last["rows"]), float(last["seconds"]), float(last["cpu_seconds"])


def local_read(lake: Lakehouse) -> tuple[int, float, float]:
    """delta-rs's second ``to_pandas`` in a fresh process: (rows, seconds, CPU seconds)."""
    where = lake.dataset("bench").statements_table
    args = [sys.executable, "-m", "benchmarks.sharing", "--local-read", where.uri]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(args, check=True, capture_output=True, text=True, env=env)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return int(got["rows"]), float(got["seconds"]), float(got["cpu_seconds"])


def _local_child(uri: str) -> None:
    """``--local-read``: read twice, print the second read's rows, seconds, CPU seconds."""
    for _ in range(2):
        started, cpu = time.perf_counter(), time.process_time()
        frame = DeltaTable(uri).to_pandas()
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(json.dumps({"rows": len(frame), "seconds": seconds, "cpu_seconds": cpu}))


def connector_local_read(kind: str, lake: Lakehouse, work: Path) -> tuple[int, float, float]:
    """The connector's own reader of ``kind`` (``delta``: delta-kernel; ``parquet``: its
    per-file reader) on the table's files on this disk, no server
    (:mod:`benchmarks.sharing_local`): (rows, seconds, CPU seconds)."""
    dt = DeltaTable(lake.dataset("bench").statements_table.uri)
    listing = work / "files.json"
    if not listing.exists():
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
        root = Path(dt.table_uri.removeprefix("file://"))
        files = [
            {
                "path": str(root / a["path"]),
                "size": int(a["size_bytes"]),
                "partitionValues": {
                    k.removeprefix("partition."): v
                    for k, v in a.items()
                    if k.startswith("partition.")
                },
            }
            for a in actions
        ]
        schema = dt.schema().to_json()
        listing.write_text(json.dumps({"files": files, "schema": schema}))
    script = REPO / "benchmarks" / "sharing_local.py"
    args = [str(PYTHON), "-P", str(script), kind, dt.table_uri, str(listing)]
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the connector's {kind} reader failed: {done.stderr[-3000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    return int(got["rows"]), float(got["seconds"]), float(got["cpu_seconds"])


def _cpu_of(pid: int) -> float:
    """A process's CPU seconds so far (user + system, from /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _commit() -> str:
    """This checkout's commit ("?" for a copy outside git, not the repository around it)."""
    top = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--show-toplevel", "--short", "HEAD"],
        capture_output=True,
        text=True,
    ).stdout.split()
    return top[1] if len(top) == 2 and Path(top[0]).resolve() == REPO else "?"


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--statements", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="a checkout whose server to read too")
    parser.add_argument("--local-read", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.local_read:
        _local_child(args.local_read)
        return
    if not PYTHON.exists():
        raise SystemExit(f"{PYTHON} missing: run `make sharing-client`")
    lake = build(args.statements)
    files = len(DeltaTable(lake.dataset("bench").statements_table.uri).file_uris())
    kinds = ["sharing", "parquet", "kernel-local", "parquet-local", "local"]
    kinds += ["baseline"] if args.baseline else []
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    #: CPU seconds of a read: the reader's process, and for sharing the server's too
    cpus: dict[str, list[float]] = {kind: [] for kind in kinds}
    served: dict[str, list[float]] = {kind: [] for kind in kinds}
    rows: dict[str, int] = {}
    started = datetime.now(UTC)
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="bench-sharing-") as tmp:
        work = Path(tmp)
        servers = {"sharing": (work / "this", REPO)}
        if args.baseline:
            servers["baseline"] = (work / "baseline", args.baseline.resolve())
        procs, profiles, pids = [], {}, {}
        token, claims = issue(
            SECRET, tenant="bench", datasets=["bench"], expires=timedelta(hours=3)
        )
        try:
            for name, (state, code) in servers.items():
                state.mkdir()
                port = free_port()
                procs.append(start_server(lake, state, port, code))
                pids[name] = procs[-1].pid
                profiles[name] = state / "bench.share"
                endpoint = f"http://127.0.0.1:{port}{PREFIX}"
                profiles[name].write_text(json.dumps(profile(endpoint, token, claims["exp"])))
            for i in range(args.rounds):
                order = kinds if i % 2 == 0 else kinds[::-1]
                for name in order:
                    server = "sharing" if name == "parquet" else name
                    before = _cpu_of(pids[server]) if server in pids else 0.0
                    if name == "local":
                        got = local_read(lake)
                    elif name.endswith("-local"):
                        reader = {"kernel-local": "delta", "parquet-local": "parquet"}[name]
                        got = connector_local_read(reader, lake, work)
                    else:
                        delta = False if name in ("parquet", "baseline") else None
                        got = sharing_read(profiles[server], work, delta)
                    rows[name] = got[0]
                    times[name].append(got[1])
                    cpus[name].append(got[2])
                    # the server served two reads: the untimed first and the timed second
                    if server in pids:
                        served[name].append((_cpu_of(pids[server]) - before) / 2)
                done = ", ".join(f"{k} {times[k][-1]:.2f} s" for k in kinds)
                print(f"round {i + 1}: {done}, load {_load()}", flush=True)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)
        log = (work / "this" / "server.log").read_text(errors="replace")
    requests = sum(f" {PREFIX}/files/" in line for line in log.splitlines())
    assert len(set(rows.values())) == 1, rows
    n = rows["local"]
    print(
        f"\n{started:%Y-%m-%d %H:%M} UTC, commit {_commit()}, {n:,} statements in {files} files, "
        f"{args.rounds} rounds; load {load_before} before, {_load()} after"
    )
    print(f"{'read':<36}{'best s':>8}{'median s':>10}{'best rows/s':>13}{'median rows/s':>15}")
    labels = {
        "sharing": "load_as_pandas, delta format (HTTP)",
        "parquet": "load_as_pandas, parquet format",
        "baseline": "the same, the baseline's server",
        "kernel-local": "delta-kernel, the files on disk",
        "parquet-local": "connector's file reader, on disk",
        "local": "DeltaTable.to_pandas (local)",
    }
    for name in kinds:
        label = labels[name]
        best, median = min(times[name]), statistics.median(times[name])
        print(f"{label:<36}{best:>8.2f}{median:>10.2f}{n / best:>13,.0f}{n / median:>15,.0f}")
    local = times["local"]
    for name in (k for k in kinds if k != "local"):
        mine = times[name]
        rounds = [lo / sh for sh, lo in zip(mine, local, strict=True)]
        print(
            f"ratio {name}/local (rows/s): best {min(local) / min(mine):.2f}, "
            f"median {statistics.median(local) / statistics.median(mine):.2f}, "
            f"median of the rounds' ratios {statistics.median(rounds):.2f}"
        )
    # this server served the sharing and the parquet reads, two per round each
    print(f"server: {requests / (4 * args.rounds):.0f} file requests per read ({files} files)")
    for name in kinds:
        cpu = statistics.median(cpus[name])
        extra = ""
        if served[name]:
            by_server = statistics.median(served[name])
            extra = f" + the server's {by_server:.2f} s = {cpu + by_server:.2f} s"
        print(f"CPU per read (median), {labels[name]}: {cpu:.2f} s{extra}")


if __name__ == "__main__":
    main()
