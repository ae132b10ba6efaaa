"""Load test of ``lakehouse serve``: concurrent tenants writing, reading and deleting.

Starts a server on a fresh local lake (SQLite journal) on 127.0.0.1, then runs
``--tenants`` threads (each a tenant with its own token and entity ids) for
``--seconds``: each loop writes a few entities (NDJSON), reads one it wrote,
queries a few by id, or deletes one. Afterwards it checks that nothing
acknowledged was lost or doubled: the journal holds exactly the statements and
tombstones the server acknowledged, and after a flush (a job on the server's
worker) the tables hold exactly the live entities, each with its statements.
Prints p50/p99 per route, the request count, 5xx and any mismatch; exits 1 on
any 5xx or mismatch.

    python -m benchmarks.server_load --tenants 32 --seconds 60
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import httpx
import orjson

from lakehouse_assets import Lakehouse
from lakehouse_assets.tokens import issue_token

REPO = Path(__file__).resolve().parent.parent
SECRET = "load-test-secret-" + "x" * 32
DATASET = "load"


@dataclass
class Tenant:
    """What one tenant was told was done."""

    name: str
    written: dict[str, int] = field(default_factory=dict)  # entity id → statements
    deleted: dict[str, int] = field(default_factory=dict)  # entity id → tombstones
    seq: int = 0


@dataclass
class Tally:
    times: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    server_errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, route: str, seconds: float, res: httpx.Response) -> None:
        with self.lock:
            self.times[route].append(seconds)
            if res.status_code >= 500:
                self.server_errors.append(f"{route} {res.status_code} {res.text[:200]}")


def entity(tenant: Tenant) -> dict[str, object]:
    tenant.seq += 1
    return {
        "id": f"{tenant.name}-e{tenant.seq}",
        "schema": "Person",
        "properties": {"name": [f"Person {tenant.seq} of {tenant.name}"], "country": ["de"]},
    }


def run_tenant(url: str, tenant: Tenant, deadline: float, tally: Tally, seed: int) -> None:
    rng = random.Random(seed)
    token = issue_token(
        SECRET,
        tenant=tenant.name,
        datasets=[DATASET],
        actions=["read", "write"],
        expires=timedelta(hours=2),
    )
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300
    ) as client:

        def call(route: str, method: str, path: str, **kwargs: object) -> httpx.Response:
            started = time.perf_counter()
            res = client.request(method, path, **kwargs)  # type: ignore[arg-type]
            tally.add(route, time.perf_counter() - started, res)
            return res

        while time.monotonic() < deadline:
            live = [e for e in tenant.written if e not in tenant.deleted]
            roll = rng.random()
            if roll < 0.4 or not live:
                batch = [entity(tenant) for _ in range(rng.randint(1, 10))]
                body = b"".join(orjson.dumps(e) + b"\n" for e in batch)
                res = call("POST entities", "POST", f"/{DATASET}/_api/entities", content=body)
                if res.status_code == 200:
                    # 2 statements an entity (name, country) besides the id's
                    per = res.json()["statements"] // len(batch)
                    for e in batch:
                        tenant.written[str(e["id"])] = per
            elif roll < 0.65:
                call("GET entity", "GET", f"/{DATASET}/_api/entities/{rng.choice(live)}")
            elif roll < 0.85:
                ids = rng.sample(live, min(len(live), 5))
                res = call(
                    "POST query",
                    "POST",
                    f"/{DATASET}/_api/entities/query",
                    json={"entity_ids": ids},
                )
            else:
                victim = rng.choice(live)
                res = call("DELETE entity", "DELETE", f"/{DATASET}/_api/entities/{victim}")
                if res.status_code == 200:
                    tenant.deleted[victim] = int(res.text)


def start_server(
    lake: Lakehouse, state: Path, port: int, code: Path = REPO
) -> subprocess.Popen[bytes]:
    """``lakehouse serve`` on 127.0.0.1:``port`` with the package of the checkout ``code``
    (another checkout's for an A/B comparison), logging to ``state/server.log``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(code),
        "LAKEHOUSE_API_SECRET": SECRET,
        "LAKEHOUSE_API_STATE_DIR": str(state),
    }
    args = [sys.executable, "-m", "lakehouse_assets.cli", "--lake", lake.store.uri]
    args += ["--journal-url", lake.settings.resolved_journal_url(), "serve", "--port", str(port)]
    log = (state / "server.log").open("wb")
    # in the checkout: `-m` puts the working folder first on sys.path
    proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=code)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"the server did not start: see {state / 'server.log'}")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tenants", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="server-load-") as tmp:
        base = Path(tmp)
        lake = Lakehouse(base / "lake", journal_url=f"sqlite:///{base / 'journal.sqlite'}")
        lake.create_dataset(DATASET)
        (base / "state").mkdir()
        port = free_port()
        proc = start_server(lake, base / "state", port)
        url = f"http://127.0.0.1:{port}"
        tenants = [Tenant(f"t{i:02d}") for i in range(args.tenants)]
        tally = Tally()
        deadline = time.monotonic() + args.seconds
        threads = [
            threading.Thread(target=run_tenant, args=(url, t, deadline, tally, i))
            for i, t in enumerate(tenants)
        ]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        problems = check(url, tenants)
        proc.terminate()
        proc.wait(60)
    report(tally, elapsed, args, load_before, problems)
    if tally.server_errors or problems:
        raise SystemExit(1)


def check(url: str, tenants: list[Tenant]) -> list[str]:
    """The journal, then the flushed tables, against what was acknowledged."""
    token = issue_token(
        SECRET, tenant="checker", datasets=[DATASET], actions=["admin"], expires=timedelta(hours=1)
    )
    problems = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=600) as c:
        acked_rows = sum(sum(t.written.values()) + sum(t.deleted.values()) for t in tenants)
        journal = int(c.get(f"/{DATASET}/_api/journal/count").text)
        if journal != acked_rows:
            problems.append(f"journal holds {journal} rows, {acked_rows} were acknowledged")
        job = c.post(f"/{DATASET}/_api/operations", json={"name": "flush"}).json()
        while job["state"] in ("queued", "running"):
            time.sleep(0.5)
            job = c.get(f"/{DATASET}/_api/operations/{job['id']}").json()
        if job["state"] != "succeeded":
            problems.append(f"flush {job['state']}: {job.get('error')}")
        expected = {e: n for t in tenants for e, n in t.written.items() if e not in t.deleted}
        # every live statement (the entity query's to_statement_dict leaves out the id's)
        res = c.post(f"/{DATASET}/_api/entities/statements/query", json={})
        found: dict[str, int] = defaultdict(int)
        seen: set[str] = set()
        for line in res.text.splitlines():
            data = orjson.loads(line)
            if data["id"] in seen:
                problems.append(f"statement {data['id']} streamed twice")
            seen.add(data["id"])
            found[data["entity_id"]] += 1
        lost = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        if lost:
            problems.append(f"{len(lost)} acknowledged entities missing, e.g. {lost[:3]}")
        if extra:
            problems.append(
                f"{len(extra)} entities deleted or never acknowledged, e.g. {extra[:3]}"
            )
        wrong = [e for e in expected if e in found and found[e] != expected[e]]
        if wrong:
            shown = [(e, expected[e], found[e]) for e in wrong[:3]]
            problems.append(f"{len(wrong)} entities with other statement counts, e.g. {shown}")
    return problems


def report(
    tally: Tally,
    elapsed: float,
    args: argparse.Namespace,
    load_before: tuple[float, float, float],
    problems: list[str],
) -> None:
    total = sum(len(v) for v in tally.times.values())
    print(
        f"{args.tenants} tenants, {elapsed:.1f} s, {total} requests ({total / elapsed:.0f}/s); "
        f"load {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"{'route':<16} {'n':>7} {'p50 ms':>9} {'p99 ms':>9}")
    for route, times in sorted(tally.times.items()):
        ordered = sorted(times)
        p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
        print(
            f"{route:<16} {len(times):>7} {statistics.median(times) * 1000:>9.1f} "
            f"{p99 * 1000:>9.1f}"
        )
    print(f"5xx: {len(tally.server_errors)}")
    for line in tally.server_errors[:5]:
        print("  ", line)
    print("acknowledged writes: " + ("all present, none doubled" if not problems else "PROBLEMS"))
    for problem in problems:
        print("  ", problem)


if __name__ == "__main__":
    main()
